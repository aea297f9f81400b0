"""Token units: how many of a replica's tokens one of the gateway's tokens is worth.

The gateway's tokenizer may not be the replicas' (the built-in BPE counts 2-6x more tokens
than a Llama-3 tokenizer on the same text), yet capacities, scraped queues and cached-token
counts come in the replicas' tokens. Every replica answers with ``usage.prompt_tokens``;
set against the gateway's own count for the same prompt, that gives a ratio per model::

    ratio = sum(replica prompt tokens) / sum(gateway prompt tokens)      (decayed sums)

``Fleet`` divides replica figures by it, so every token count a policy sees is in gateway
tokens. Until ``min_samples`` answers were seen the ratio is 1 (no conversion). An answer
whose ratio is past ``MAX_RATIO`` either way is not taken: no two tokenizers differ that
much, and one absurd ``usage`` from one replica moved every replica's figures for
thousands of answers. Past ``min_samples`` answers, one counts in the sums as a prompt of
at most ``MAX_WEIGHT`` times the mean prompt (its own ratio kept): one odd answer on a
prompt a thousand times the usual one outweighed every other answer, and held the ratio
near its own for hundreds of them. The mean follows the prompts as they are (uncapped),
so prompts that grow for good soon weigh in full again. The first ``min_samples``
answers have no mean to go by yet: they are kept, and weighed together once the last of
them comes, each as a prompt of at most ``MAX_WEIGHT`` times their median prompt, and one
whose ratio is past ``FIRST_SPREAD`` times their median ratio either way not at all (one
odd answer among them, taken whole, held the first ratio near its own for a thousand
more; weighed as two prompts of nine, still near half its own).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

MAX_RATIO = 16.0  # replica tokens per gateway token believed, and its inverse
MAX_WEIGHT = 2.0  # one answer weighs as a prompt of at most this many mean prompts
FIRST_SPREAD = 4.0  # the first answers' ratios taken, around their median, either way


@dataclass(slots=True)
class _Sums:
    replica: float = 0.0
    gateway: float = 0.0
    samples: int = 0
    answers: float = 0.0  # decayed as the sums are: answers taken ...
    prompts: float = 0.0  # ... and their gateway tokens, whole (the mean prompt's)
    # the first answers, (replica tokens, gateway tokens), until ``min_samples`` came
    first: list[tuple[int, int]] = field(default_factory=list)


class TokenCalibration:
    """Replica tokens per gateway token, per model (``None``: requests with no model)."""

    def __init__(self, min_samples: int = 8, decay: float = 0.995, max_models: int = 256
                 ) -> None:
        if max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {max_models!r}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples!r}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.min_samples = min_samples
        self.decay = decay
        self.max_models = max_models
        self._sums: dict[str | None, _Sums] = {}

    def observe(self, model: str | None, replica_tokens: int, gateway_tokens: int) -> None:
        """One answered prompt: the replica counted ``replica_tokens``, the gateway
        ``gateway_tokens`` (exact or estimated)."""
        if replica_tokens <= 0 or gateway_tokens <= 0 \
                or not 1.0 / MAX_RATIO <= replica_tokens / gateway_tokens <= MAX_RATIO:
            return
        # the table in answering order, the latest last; bounded: when full, a new model
        # takes the place of one answered too seldom to have learned, else of the one
        # answered longest ago (the first names seen kept theirs for good: adapters loaded
        # and unloaded at run time filled it, and no model after them learned its ratio)
        sums = self._sums.pop(model, None)
        if sums is None:
            if len(self._sums) >= self.max_models:
                del self._sums[next((m for m, s in self._sums.items()
                                     if s.samples < self.min_samples),
                                    next(iter(self._sums)))]
            sums = _Sums()
        self._sums[model] = sums
        if sums.samples >= self.min_samples:  # the mean of the answers before this one
            self._add(sums, replica_tokens, gateway_tokens,
                      min(gateway_tokens, MAX_WEIGHT * sums.prompts / sums.answers))
            return
        sums.first.append((replica_tokens, gateway_tokens))
        if len(sums.first) < self.min_samples:
            return
        # each counted as an answer, and for the mean prompt; in the ratio, only those
        # near the median ratio, none weighing more than MAX_WEIGHT median prompts
        median = statistics.median(r / g for r, g in sums.first)
        cap = MAX_WEIGHT * statistics.median(g for _, g in sums.first)
        for replica, gateway in sums.first:
            near = 1.0 / FIRST_SPREAD <= replica / gateway / median <= FIRST_SPREAD
            self._add(sums, replica, gateway, min(gateway, cap) if near else 0.0)
        sums.first = []

    def _add(self, sums: _Sums, replica_tokens: int, gateway_tokens: int, weight: float
             ) -> None:
        """One answer into ``sums``, weighing as a prompt of ``weight`` gateway tokens."""
        decay = self.decay
        sums.answers = sums.answers * decay + 1.0
        sums.prompts = sums.prompts * decay + gateway_tokens
        sums.replica = sums.replica * decay + replica_tokens / gateway_tokens * weight
        sums.gateway = sums.gateway * decay + weight
        sums.samples += 1

    def __len__(self) -> int:
        """Models with answers kept (``max_models`` at most)."""
        return len(self._sums)

    def ratio(self, model: str | None = None) -> float:
        """Replica tokens per gateway token for ``model`` (the mean over models when it has
        none of its own yet; 1 before any)."""
        sums = self._sums.get(model)
        if sums is None or sums.samples < self.min_samples:
            known = [s for s in self._sums.values() if s.samples >= self.min_samples]
            if not known:
                return 1.0
            return sum(s.replica for s in known) / sum(s.gateway for s in known)
        return sums.replica / sums.gateway

    def learned(self, model: str | None = None) -> bool:
        """True once ``ratio(model)`` rests on answers (the model's own, or other
        models'), rather than the 1 assumed before any."""
        sums = self._sums.get(model)
        if sums is not None and sums.samples >= self.min_samples:
            return True
        return any(s.samples >= self.min_samples for s in self._sums.values())

    def to_gateway(self, replica_tokens: float, model: str | None = None) -> int:
        return round(replica_tokens / self.ratio(model))

    def snapshot(self) -> dict[str, float]:
        """Learned ratios by model, for ``/admin/replicas`` and ``/admin/explain``."""
        return {str(m): round(s.replica / s.gateway, 4) for m, s in self._sums.items()
                if s.samples >= self.min_samples}
