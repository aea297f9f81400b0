"""The ``sim`` executor: no model. Step time from the roofline cost model; next tokens
derived deterministically from the sequence's seed and the position being generated.

Its log-probabilities are a stand-in, not a model's: its tokens are drawn uniformly from
its token range, so each has the log-probability of that distribution, ``-log(span)``;
with every token equally likely, the "most likely" alternatives it names are the drawn
token and the ids after it (wrapping within the range). A prompt token stands in the same
way, as if drawn there: that log-probability, rank 1 (first among its ties), and the ids
after it as its alternatives."""

from __future__ import annotations

import math

from engine.cost_model import CostModel
from engine.executor import Batch, StepResult
from engine.request import TokenLogprob

_MASK = (1 << 64) - 1


def mix64(seed: int, position: int) -> int:
    """A splitmix64-style mix of (seed, position) to 64 bits: the sim's deterministic
    randomness (its tokens and its embeddings)."""
    x = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & _MASK
    x ^= x >> 29
    return x


def sim_token(seed: int, position: int, vocab_size: int) -> int:
    """:func:`mix64` of (seed, position), reduced to ``[0, vocab_size)``."""
    return mix64(seed, position) % vocab_size


class SimExecutor:
    """Implements :class:`engine.executor.Executor`.

    ``token_range`` restricts generated ids to ``[lo, hi)`` (e.g. to keep them decodable
    by a tokenizer); ``eos_token_id`` is still honoured if it falls in that range.
    """

    def __init__(
        self,
        cost_model: CostModel,
        *,
        block_size: int = 16,
        eos_token_id: int | None = None,
        token_range: tuple[int, int] = (0, 32000),
    ) -> None:
        lo, hi = token_range
        if not 0 <= lo < hi:
            raise ValueError(f"token_range must satisfy 0 <= lo < hi, got {token_range}")
        self.cost_model = cost_model
        self.block_size = block_size
        self.eos_token_id = eos_token_id
        self._lo = lo
        self._span = hi - lo
        self.num_steps = 0

    def execute(self, batch: Batch) -> StepResult:
        pairs = []
        next_tokens: dict[str, int] = {}
        logprobs: dict[str, TokenLogprob] = {}
        prompt_logprobs: dict[str, tuple[TokenLogprob, ...]] = {}
        lo, span = self._lo, self._span
        for s in batch.seqs:
            n = len(s.token_ids)
            pairs.append((s.start, n))
            if s.sample:
                token = lo + sim_token(s.seed, s.start + n, span)
                next_tokens[s.request_id] = token
                if s.params is not None and s.params.logprobs is not None:
                    logprobs[s.request_id] = self._logprob(token, s.params.logprobs)
            tokens = s.prompt_tokens
            if tokens and s.params is not None and s.params.prompt_logprobs is not None:
                k = s.params.prompt_logprobs
                prompt_logprobs[s.request_id] = tuple(
                    self._logprob(s.history[i], k, rank=1) for i in tokens)
        self.num_steps += 1
        return StepResult(next_tokens, self.cost_model.step_seconds(pairs), logprobs,
                          prompt_logprobs)

    def _logprob(self, token: int, k: int, rank: int | None = None) -> TokenLogprob:
        """The uniform draw's log-probability, and ``k`` tied alternatives: ``token`` (where
        it is in the range) and the ids after it."""
        lp = -math.log(self._span)
        first = token - self._lo
        return TokenLogprob(lp, tuple((self._lo + (first + i) % self._span, lp)
                                      for i in range(min(k, self._span))), rank)
