"""The contract between the engine's scheduler and an executor (``sim`` or ``torch``).

The scheduler decides, each step, which tokens of which requests to compute and where
their KV lives; an executor computes them (or models how long that would take) and
returns the next token of every sequence that reached the end of its known tokens.

Index regions of one sequence in a step::

    all tokens of the request:  [0 ............................... len(all_tokens))
    already in the KV cache:    [0, start)                (prefix hit or earlier steps)
    computed this step:         [start, start + len(token_ids)) == [start, context_len)
    block table covers:         [0, context_len)  ->  block_ids[i] holds positions
                                [i * block_size, (i + 1) * block_size)

Prompt log-probabilities (``params.prompt_logprobs`` set): position ``j``'s logits predict
token ``j + 1``, so a chunk computing ``[start, context_len)`` yields prompt tokens
``[start + 1, min(context_len + 1, num_prompt))`` (:attr:`SeqWork.prompt_tokens`); token 0
is predicted by nothing. The scheduler never gives such a request a prefix hit, so its
chunks cover every prompt token in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.request import SamplingParams, TokenLogprob


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's share of a step."""

    request_id: str
    token_ids: Sequence[int]
    start: int
    block_ids: Sequence[int]
    sample: bool
    seed: int = 0
    temperature: float = 0.0
    # what an executor sampling from logits also reads: the request's parameters (its
    # seed counts only where ``params.seed`` is set), its tokens so far (prompt, then
    # output from ``num_prompt``) for the penalties and ``min_tokens``
    params: SamplingParams | None = None
    history: Sequence[int] = ()
    num_prompt: int = 0

    @property
    def context_len(self) -> int:
        return self.start + len(self.token_ids)

    @property
    def prompt_tokens(self) -> range:
        """The indices of the prompt tokens whose log-probabilities this chunk yields:
        none unless ``params.prompt_logprobs`` is set."""
        if self.params is None or self.params.prompt_logprobs is None:
            return range(0)
        return range(self.start + 1, min(self.context_len + 1, self.num_prompt))


@dataclass(frozen=True, slots=True)
class Batch:
    seqs: tuple[SeqWork, ...]

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)


@dataclass(frozen=True, slots=True)
class StepResult:
    """``next_tokens`` has one entry per sequence with ``sample=True``; ``seconds`` is the
    step's duration: modeled (sim) or measured (torch); ``logprobs`` one entry per sampled
    sequence whose ``params.logprobs`` is set; ``prompt_logprobs`` one entry per sequence
    whose :attr:`SeqWork.prompt_tokens` is not empty: one ``TokenLogprob`` (with its
    ``rank`` and ``params.prompt_logprobs`` alternatives) per token of that range, in
    order."""

    next_tokens: dict[str, int]
    seconds: float
    logprobs: dict[str, TokenLogprob] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[TokenLogprob, ...]] = field(default_factory=dict)


class Executor(Protocol):
    block_size: int
    eos_token_id: int | None

    def execute(self, batch: Batch) -> StepResult:
        """Compute one step. Must not keep references to ``batch`` after returning."""
        ...


@dataclass(frozen=True, slots=True)
class ExecutorInfo:
    """What the engine needs to know about the model behind an executor.

    ``model_id`` seeds the block hash chain (name and revision); ``num_blocks`` is the KV
    pool the executor allocated (or models); ``model_name`` is the default served name;
    ``embedding_dim`` is the width of the vectors ``/v1/embeddings`` returns, ``None``
    where the executor serves no embeddings.
    """

    model_name: str
    model_id: str
    num_blocks: int
    max_model_len: int
    kv_bytes_per_token: int
    embedding_dim: int | None = None

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.embedding_dim is not None and self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1, got {self.embedding_dim}")
