"""The ``sim`` executor: no model. Step time from the roofline cost model; next tokens
derived deterministically from the sequence's seed and the position being generated."""

from __future__ import annotations

from engine.cost_model import CostModel
from engine.executor import Batch, StepResult

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
        lo, span = self._lo, self._span
        for s in batch.seqs:
            n = len(s.token_ids)
            pairs.append((s.start, n))
            if s.sample:
                next_tokens[s.request_id] = lo + sim_token(s.seed, s.start + n, span)
        self.num_steps += 1
        return StepResult(next_tokens, self.cost_model.step_seconds(pairs))
