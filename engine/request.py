"""One request's state inside the engine core, and what the core reports about it."""

from __future__ import annotations

import enum
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kvwire.block_hashing import BlockHash, block_hashes


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request generation limits and sampling, as vLLM's. ``max_tokens`` counts output
    tokens; until ``min_tokens`` of them, the end-of-sequence and ``stop_token_ids`` neither
    end the request nor (where the executor samples from logits) get sampled.

    The sampling fields (``top_k``, ``top_p``, ``min_p``, the penalties, ``logit_bias`` as
    (token id, bias) pairs) are applied by an executor that samples from logits; the
    simulated executor draws its tokens from the seed alone. Without a ``seed`` such an
    executor samples afresh each time; the simulated one derives a seed from the prompt.

    ``pooling``: the request ends when its prompt is computed, with no output token and
    finish reason ``stop`` (an embedding: the prompt's cost is a prefill); the sampling
    fields are then unused.

    ``logprobs``: each output token comes with its log-probability and that many of the
    most likely alternatives (None: none; 0: the sampled token's alone).
    ``prompt_logprobs``: so does each prompt token after the first (vLLM's field); such a
    request reads nothing from the prefix cache (cached positions have no logits), as
    vLLM's, and caches its own blocks as any other."""

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    pooling: bool = False
    min_tokens: int = 0
    top_k: int = 0  # 0 (or -1): every token
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # which of a request's ``n`` sampled sequences this is: without a seed, the simulated
    # executor's seed derived from the prompt differs per sequence, so they differ as
    # vLLM's do (0 for a greedy one: those are alike there too)
    sequence: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        # NaN and inf are refused first, with one message for every field: some checks
        # below would let them through (NaN < 0 is false; inf fits temperature's range),
        # and the others would name a range (the HTTP layer refuses them too)
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens ({self.max_tokens})], "
                             f"got {self.min_tokens}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (off) or >= 1, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        bad = next(((t, b) for t, b in self.logit_bias if not math.isfinite(b)), None)
        if bad is not None:
            raise ValueError(f"logit_bias must hold finite biases, got {bad[1]} for token "
                             f"{bad[0]}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be None or >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be None or >= 0, got "
                             f"{self.prompt_logprobs}")

    @property
    def filters(self) -> bool:
        """Whether any field beyond temperature and seed changes what is sampled."""
        return bool(self.top_k > 0 or self.top_p < 1 or self.min_p > 0
                    or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1 or self.logit_bias or self.min_tokens)


def default_seed(prompt_token_ids: Sequence[int]) -> int:
    """A seed derived from the prompt (its length and last 32 tokens): the same prompt
    yields the same sim output without a caller-provided seed."""
    tail = prompt_token_ids[-32:]
    data = struct.pack(f"<I{len(tail)}I", len(prompt_token_ids), *tail)
    return zlib.crc32(data)


class Request:
    """Mutable per-request state owned by the scheduler.

    Token regions::

        all_token_ids:   [0, num_prompt_tokens) prompt | [num_prompt_tokens, ...) output
        KV computed:     [0, num_computed_tokens)
        block_hashes:    one per full block of all_token_ids known so far
        cached blocks:   [0, num_cached_blocks) of block_table registered in the cache
    """

    __slots__ = (
        "adapter",
        "all_token_ids",
        "arrival_time",
        "block_hashes",
        "block_table",
        "cache_salt",
        "finish_reason",
        "finish_time",
        "first_scheduled_time",
        "first_token_time",
        "model_id",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_recorded_blocks",
        "params",
        "prompt_logprobs",
        "request_id",
        "seed",
        "status",
        "waiting_credit",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        model_id: str,
        block_size: int,
        cache_salt: str | None = None,
        adapter: str | None = None,
        block_hashes: Sequence[BlockHash] | None = None,
    ) -> None:
        """``block_hashes`` lets a caller pass precomputed hashes of the prompt's full
        blocks (e.g. memoized for shared documents); they must have been computed with
        the same ``model_id``, ``block_size``, ``cache_salt`` and ``adapter``."""
        if len(prompt_token_ids) == 0:
            raise ValueError("prompt must contain at least one token")
        self.request_id = request_id
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.all_token_ids)
        self.params = params if params is not None else SamplingParams()
        self.model_id = model_id
        self.cache_salt = cache_salt
        self.adapter = adapter
        n_full = self.num_prompt_tokens // block_size
        if block_hashes is None:
            self.block_hashes = _hash(self.all_token_ids, block_size, self, None)
        else:
            if len(block_hashes) != n_full:
                raise ValueError(
                    f"block_hashes has {len(block_hashes)} entries, prompt has {n_full} "
                    f"full blocks of {block_size}"
                )
            self.block_hashes = list(block_hashes)
        seed = self.params.seed
        self.seed = (default_seed(self.all_token_ids) + self.params.sequence) & 0xFFFFFFFF \
            if seed is None else seed
        self.status = Status.WAITING
        self.block_table: list[int] = []
        # prompt tokens found cached when queued, left out of the waiting-tokens gauge
        self.waiting_credit = 0
        self.num_computed_tokens = 0
        self.num_cached_blocks = 0
        # blocks [0, num_recorded_blocks) whose use the eviction policy was told of
        self.num_recorded_blocks = 0
        self.num_cached_tokens = -1  # prefix hit at first schedule; -1 until then
        self.num_preemptions = 0
        # with ``params.prompt_logprobs``: the entries of prompt tokens [1, 1 + len) so far
        self.prompt_logprobs: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.arrival_time = 0.0
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    def append_output(self, token_id: int, block_size: int) -> None:
        """Append a generated token; hash the block it completes, if any."""
        toks = self.all_token_ids
        toks.append(token_id)
        n = len(toks)
        if n % block_size == 0 and len(self.block_hashes) == n // block_size - 1:
            parent = self.block_hashes[-1] if self.block_hashes else None
            self.block_hashes.extend(_hash(toks[n - block_size :], block_size, self, parent))

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.value}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )


def _hash(
    tokens: Sequence[int], block_size: int, req: Request, parent: BlockHash | None
) -> list[BlockHash]:
    return block_hashes(
        tokens,
        block_size,
        model_id=req.model_id,
        cache_salt=req.cache_salt,
        adapter=req.adapter,
        parent=parent,
    )


class TokenLogprob(NamedTuple):
    """One token's log-probability under the distribution it was drawn from (a prompt
    token's: the one its position predicted), and the ``SamplingParams.logprobs`` (or
    ``prompt_logprobs``) most likely tokens of that distribution as
    (token id, log-probability), most likely first. ``rank``: the token's place in that
    distribution (1: the most likely), where reported (prompt tokens)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one step produced for one request. Times are in the driver's clock (the
    ``now`` it passed to ``EngineCore.step`` plus the step's seconds). ``logprobs`` has
    one entry per new token where the request asked for them (``SamplingParams.logprobs``),
    else none; ``prompt_logprobs`` one per prompt token after the first, on the output of
    the first token of a request that asked for them (``SamplingParams.prompt_logprobs``),
    else None."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
