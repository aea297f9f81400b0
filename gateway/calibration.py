"""Token units: how many of a replica's tokens one of the gateway's tokens is worth.

The gateway's tokenizer may not be the replicas' (the built-in BPE counts 2-6x more tokens
than a Llama-3 tokenizer on the same text), yet capacities, scraped queues and cached-token
counts come in the replicas' tokens. Every replica answers with ``usage.prompt_tokens``;
set against the gateway's own count for the same prompt, that gives each replica its own
ratio per model::

    replica's ratio = sum(its prompt tokens) / sum(gateway prompt tokens)   (decayed sums)

and the model's ratio is the weighted median of its replicas' ratios, each replica weighing
as many answers as it gave, at most ``min_samples`` (``_combine``). ``Fleet`` divides
replica figures by it, so every token count a policy sees is in gateway tokens. One
replica cannot move it far (had the sums been the model's alone, one replica telling
``usage.prompt_tokens`` 12x the truth would move the ratio 12x for every replica, and
shrink their capacities in gateway tokens 12-fold): with three or more replicas that have
answered ``min_samples`` times, one such liar moves nothing (the median is an honest
replica's); with two, no answer says which one is right, and the ratio is the
geometric mean of theirs: a replica off by a factor ``f`` moves it by ``sqrt(f)`` (a 12x
lie: 3.5x; as no ratio past ``MAX_RATIO`` is believed, an honest ratio ``h`` is moved to
``sqrt(h * MAX_RATIO)`` at most, ``sqrt(h / MAX_RATIO)`` at least). A replica that has
answered fewer than ``min_samples`` times weighs less than one that has (a newcomer's first
odd answer moves nothing), and one that leaves the fleet takes its sums with it
(``forget``).

Until ``min_samples`` answers of a model were seen the ratio is 1 (no conversion), or the
mean of other models' learned ones. An answer whose ratio is past ``MAX_RATIO`` either way
is not taken: no two tokenizers differ that much. Past a replica's first ``min_samples``
answers, one counts in its sums as a prompt of at most ``MAX_WEIGHT`` times its mean prompt
(its own ratio kept): one odd answer on a prompt a thousand times the usual one outweighed
every other answer, and held the ratio near its own for hundreds of them. The mean follows
the prompts as they are (uncapped), so prompts that grow for good soon weigh in full again.
A replica's first ``min_samples`` answers have no mean to go by yet: they are kept, and
weighed together (``_first_weights``), each as a prompt of at most ``MAX_WEIGHT`` times
their median prompt, and one whose ratio is past ``FIRST_SPREAD`` times their median ratio
either way not at all; until the last of them comes, so weighed they are its ratio in the
median, with the weight of their number.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

MAX_RATIO = 16.0  # replica tokens per gateway token believed, and its inverse
MAX_WEIGHT = 2.0  # one answer weighs as a prompt of at most this many mean prompts
FIRST_SPREAD = 4.0  # the first answers' ratios taken, around their median, either way
# a replica that has not answered a model for this many of the model's answers per kept
# replica gives its place to a new one when the model's table is full
IDLE_ANSWERS = 16


@dataclass(slots=True)
class _Sums:
    """One replica's answers for one model."""

    replica: float = 0.0
    gateway: float = 0.0
    samples: int = 0
    answers: float = 0.0  # decayed as the sums are: answers taken ...
    prompts: float = 0.0  # ... and their gateway tokens, whole (the mean prompt's)
    # the first answers, (replica tokens, gateway tokens), until ``min_samples`` came
    first: list[tuple[int, int]] = field(default_factory=list)
    last: int = 0  # the model's ``taken`` at this replica's latest answer


@dataclass(slots=True)
class _Model:
    """A model's replicas (the least recently answered first) and their combined ratio."""

    replicas: dict[str | None, _Sums] = field(default_factory=dict)
    held: int = 0  # answers in ``replicas``, first answers included
    taken: int = 0  # every answer taken, for good
    ratio: float = 1.0  # the replicas' combined, as of ``stale`` answers ago
    weight: float = 0.0  # its decayed answers: its share in other models' fallback
    stale: int = 0


def _held(sums: _Sums) -> int:
    """The answers ``sums`` holds, its first ones included."""
    return sums.samples + len(sums.first)


def _first_weights(first: list[tuple[int, int]]) -> list[float]:
    """The weight (gateway tokens) each first answer counts with in its replica's ratio:
    none past ``FIRST_SPREAD`` of their median ratio, at most ``MAX_WEIGHT`` median
    prompts."""
    median = statistics.median(r / g for r, g in first)
    cap = MAX_WEIGHT * statistics.median(g for _, g in first)
    return [min(g, cap) if 1.0 / FIRST_SPREAD <= r / g / median <= FIRST_SPREAD else 0.0
            for r, g in first]


def _own_ratio(sums: _Sums, min_samples: int) -> tuple[float, int]:
    """A replica's ratio and its weight in the median: its answers, at most
    ``min_samples``; while it has fewer, its first answers' ratio as they will be weighed."""
    if sums.samples >= min_samples:
        return sums.replica / sums.gateway, min_samples
    weights = _first_weights(sums.first)
    replica = sum(r / g * w for (r, g), w in zip(sums.first, weights, strict=True))
    return replica / sum(weights), len(sums.first)


def _weighted_median(votes: list[tuple[float, int]]) -> float:
    """The ratio below and above which half the weight lies, of (ratio, weight) pairs;
    where half lies exactly below, the geometric mean of the ratios either side."""
    votes.sort()
    half = sum(w for _, w in votes) / 2
    below = 0
    for i, (ratio, weight) in enumerate(votes):
        below += weight
        if below > half:
            return ratio
        if below == half:
            return math.sqrt(ratio * votes[i + 1][0])
    raise ValueError(f"no votes to combine: {votes!r}")


class TokenCalibration:
    """Replica tokens per gateway token, per model (``None``: requests with no model),
    from each replica's answers (``None``: one not named)."""

    def __init__(self, min_samples: int = 8, decay: float = 0.995, max_models: int = 256,
                 max_replicas: int = 64) -> None:
        if max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {max_models!r}")
        if max_replicas < 1:
            raise ValueError(f"max_replicas must be >= 1, got {max_replicas!r}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples!r}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.min_samples = min_samples
        self.decay = decay
        self.max_models = max_models
        self.max_replicas = max_replicas  # per model
        self._models: dict[str | None, _Model] = {}
        self._fallback: float | None = None  # the learned models' mean, None: to compute

    def observe(self, model: str | None, replica_tokens: int, gateway_tokens: int,
                replica: str | None = None) -> None:
        """One prompt ``replica`` answered: it counted ``replica_tokens``, the gateway
        ``gateway_tokens`` (exact or estimated)."""
        if replica_tokens <= 0 or gateway_tokens <= 0 \
                or not 1.0 / MAX_RATIO <= replica_tokens / gateway_tokens <= MAX_RATIO:
            return
        entry = self._entry(model)
        sums = entry.replicas.pop(replica, None)
        if sums is None:
            if len(entry.replicas) >= self.max_replicas:
                oldest = next(iter(entry.replicas))
                if entry.taken - entry.replicas[oldest].last \
                        < IDLE_ANSWERS * self.max_replicas:
                    return  # a full table of replicas that all answer: this one waits
                entry.held -= _held(entry.replicas.pop(oldest))
            sums = _Sums()
        entry.replicas[replica] = sums
        entry.held += 1
        entry.taken += 1
        entry.stale += 1
        sums.last = entry.taken
        if sums.samples >= self.min_samples:  # the mean of the answers before this one
            self._add(sums, replica_tokens, gateway_tokens,
                      min(gateway_tokens, MAX_WEIGHT * sums.prompts / sums.answers))
        else:
            sums.first.append((replica_tokens, gateway_tokens))
            if len(sums.first) >= self.min_samples:
                for (r, g), weight in zip(sums.first, _first_weights(sums.first),
                                          strict=True):
                    self._add(sums, r, g, weight)
                sums.first = []
        # while a replica's weight grows, at once; then every so many answers as there are
        # replicas: each answered about once since (the cost of a sort, spread over them)
        if sums.samples <= self.min_samples or entry.stale >= len(entry.replicas):
            self._combine(entry)

    def _entry(self, model: str | None) -> _Model:
        """``model``'s entry, made the latest; bounded: when full, a new model takes the
        place of one answered too seldom to have learned, else of the one answered longest
        ago (the first names seen kept theirs for good: adapters loaded and unloaded at run
        time filled it, and no model after them learned its ratio)."""
        entry = self._models.pop(model, None)
        if entry is None:
            if len(self._models) >= self.max_models:
                del self._models[next((m for m, e in self._models.items()
                                       if e.held < self.min_samples),
                                      next(iter(self._models)))]
                self._fallback = None
            entry = _Model()
        self._models[model] = entry
        return entry

    def _add(self, sums: _Sums, replica_tokens: int, gateway_tokens: int, weight: float
             ) -> None:
        """One answer into ``sums``, weighing as a prompt of ``weight`` gateway tokens."""
        decay = self.decay
        sums.answers = sums.answers * decay + 1.0
        sums.prompts = sums.prompts * decay + gateway_tokens
        sums.replica = sums.replica * decay + replica_tokens / gateway_tokens * weight
        sums.gateway = sums.gateway * decay + weight
        sums.samples += 1

    def _combine(self, entry: _Model) -> None:
        """The model's ratio: the weighted median of its replicas' (``_weighted_median``),
        each weighing its answers, at most ``min_samples``; a replica still in its first
        answers by their ratio as they would be weighed (``_first_weights``)."""
        votes = [_own_ratio(sums, self.min_samples) for sums in entry.replicas.values()]
        entry.ratio = _weighted_median(votes)
        entry.weight = sum(s.answers + len(s.first) for s in entry.replicas.values())
        entry.stale = 0
        self._fallback = None

    def forget(self, replica: str | None) -> None:
        """Drop ``replica``'s answers, of every model (it left the fleet)."""
        for model, entry in list(self._models.items()):
            sums = entry.replicas.pop(replica, None)
            if sums is None:
                continue
            entry.held -= _held(sums)
            if entry.replicas:
                self._combine(entry)
            else:
                del self._models[model]
                self._fallback = None

    def __len__(self) -> int:
        """Models with answers kept (``max_models`` at most)."""
        return len(self._models)

    def ratio(self, model: str | None = None) -> float:
        """Replica tokens per gateway token for ``model`` (the mean over models when it has
        none of its own yet; 1 before any)."""
        entry = self._models.get(model)
        if entry is not None and entry.held >= self.min_samples:
            return entry.ratio
        if self._fallback is None:
            known = [e for e in self._models.values() if e.held >= self.min_samples]
            total = sum(e.weight for e in known)
            self._fallback = sum(e.ratio * e.weight for e in known) / total if known \
                else 1.0
        return self._fallback

    def learned(self, model: str | None = None) -> bool:
        """True once ``ratio(model)`` rests on answers (the model's own, or other
        models'), rather than the 1 assumed before any."""
        entry = self._models.get(model)
        if entry is not None and entry.held >= self.min_samples:
            return True
        return any(e.held >= self.min_samples for e in self._models.values())

    def to_gateway(self, replica_tokens: float, model: str | None = None) -> int:
        return round(replica_tokens / self.ratio(model))

    def replica_ratios(self, model: str | None = None) -> dict[str | None, float]:
        """Each replica's own ratio for ``model``, as it weighs in the median (its first
        answers' while it has fewer than ``min_samples``)."""
        entry = self._models.get(model)
        if entry is None:
            return {}
        return {r: _own_ratio(s, self.min_samples)[0] for r, s in entry.replicas.items()}

    def own_ratios(self, replica: str) -> dict[str, float]:
        """``replica``'s own ratio for each model it answered (as it weighs in that
        model's median), by model (``"null"``: requests with no model)."""
        out: dict[str, float] = {}
        for model, entry in self._models.items():
            sums = entry.replicas.get(replica)
            if sums is not None:
                out["null" if model is None else model] = round(
                    _own_ratio(sums, self.min_samples)[0], 4)
        return out

    def snapshot(self) -> dict[str, float]:
        """Learned ratios by model (``"null"``: requests with no model)."""
        return {"null" if m is None else m: round(e.ratio, 4)
                for m, e in self._models.items() if e.held >= self.min_samples}
