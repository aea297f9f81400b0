"""Continuous batching scheduler.

Each step spends a token budget (``max_num_batched_tokens``): running requests first, in
order (decodes take one token, unfinished prefills take the next chunk), then waiting
requests FCFS, each after a prefix-cache lookup, while fewer than ``max_num_seqs`` run.
A prompt longer than the remaining budget is prefilled in chunks over several steps. When
a running request cannot get blocks, the most recently admitted running request is
preempted: its blocks are freed and it goes back to the front of the waiting queue, to be
recomputed (its own freed blocks are usually still cached and hit again).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from engine.executor import Batch, SeqWork
from engine.kv_manager import KVCacheManager
from engine.request import Request, Status


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192

    def __post_init__(self) -> None:
        for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")


@dataclass(slots=True)
class EngineStats:
    """Monotonic counters (tokens unless named otherwise) plus one gauge.

    ``prompt_tokens`` counts a request's prompt once, when its prefill completes (its
    first token, or a pooling request's output), as vLLM v1 does: a request still
    prefilling, or aborted before then, is not in it.

    ``prefix_cache_queries``/``hits`` count each request's first admission only (as
    vLLM's metrics do); lookups made when a preempted request is readmitted go to the
    ``recompute_*`` counters. A request that skips reading the prefix cache (one asking
    for its prompt's log probabilities) counts in neither, as in vLLM.
    """

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    recompute_queries: int = 0
    recompute_hits: int = 0
    num_preemptions: int = 0
    num_requests_added: int = 0
    num_requests_finished: int = 0
    num_requests_aborted: int = 0
    num_steps: int = 0
    num_batched_tokens: int = 0
    # the finished requests that ran (a prefill and any decode: vLLM's
    # request_inference_time_seconds), and the seconds they ran in all, each from its first
    # scheduling to its finish
    ran_requests: int = 0
    ran_seconds: float = 0.0
    # Gauge: prompt tokens of unfinished requests whose KV is not computed yet, less those
    # a waiting request found in the prefix cache when it was queued (or queued again,
    # preempted).
    prompt_tokens_waiting: int = 0


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    batch: Batch
    requests: tuple[Request, ...]
    num_new_tokens: tuple[int, ...]
    newly_admitted: tuple[Request, ...]


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = EngineStats()

    def add(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)
        self.stats.num_requests_added += 1
        p = req.num_prompt_tokens
        self.stats.prompt_tokens_waiting += p - min(req.num_computed_tokens, p)
        self._credit_cached(req)

    def _credit_cached(self, req: Request) -> None:
        """Take what the prefix cache holds of a queued request's prompt off the gauge:
        it will most likely be a hit, so the gauge counts the tokens left to prefill (the
        credit is settled at admission)."""
        p = req.num_prompt_tokens
        todo = p - min(req.num_computed_tokens, p)
        hits = len(self.kv.lookup(req)) * self.kv.block_size if todo == p else 0
        req.waiting_credit = min(todo, hits)
        self.stats.prompt_tokens_waiting -= req.waiting_credit

    def _preempt(self, req: Request) -> None:
        """Free ``req``'s blocks and queue it again at the front; the caller credits its
        cached prompt (:meth:`_credit_cached`) once the step's allocations are done."""
        self.kv.free(req)
        p = req.num_prompt_tokens
        self.stats.prompt_tokens_waiting += min(req.num_computed_tokens, p)
        req.num_computed_tokens = 0
        req.status = Status.PREEMPTED
        req.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(req)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        kv = self.kv
        stats = self.stats
        running = self.running
        sched: list[Request] = []
        counts: list[int] = []
        victims: list[Request] = []

        # [0, i) of running is scheduled; victims are taken from the end.
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(len(req.all_token_ids) - req.num_computed_tokens, budget)
            while not kv.allocate(req, n):
                victim = running.pop()
                self._preempt(victim)
                victims.append(victim)
                if victim is req:
                    break
            else:
                sched.append(req)
                counts.append(n)
                budget -= n
                i += 1
                continue
            break
        # a victim's freed blocks stay cached (tail first to go): what this step's
        # allocations left of its prompt is credited as for a request queued anew
        for victim in victims:
            self._credit_cached(victim)
        preempted = bool(victims)

        admitted: list[Request] = []
        waiting = self.waiting
        max_seqs = self.config.max_num_seqs
        while waiting and budget > 0 and not preempted and len(running) < max_seqs:
            req = waiting[0]
            hits = kv.lookup(req)
            n_hit_tokens = len(hits) * kv.block_size
            n = min(len(req.all_token_ids) - n_hit_tokens, budget)
            if not kv.allocate(req, n, hits):
                break
            waiting.popleft()
            p = req.num_prompt_tokens
            stats.prompt_tokens_waiting -= min(n_hit_tokens, p) - req.waiting_credit
            req.waiting_credit = 0
            # a request that skips reading the prefix cache (prompt_logprobs) is no query
            # of it, as in vLLM: its prompt would only dilute the hit rate
            reads_cache = kv.reads_prefix_cache(req)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = n_hit_tokens
                if reads_cache:
                    stats.prefix_cache_queries += p
                    stats.prefix_cache_hits += n_hit_tokens
            elif reads_cache:
                stats.recompute_queries += len(req.all_token_ids)
                stats.recompute_hits += n_hit_tokens
            req.status = Status.RUNNING
            running.append(req)
            admitted.append(req)
            sched.append(req)
            counts.append(n)
            budget -= n

        seqs = []
        for req, n in zip(sched, counts, strict=True):
            start = req.num_computed_tokens
            toks = req.all_token_ids
            seqs.append(
                SeqWork(
                    req.request_id,
                    toks[start : start + n],
                    start,
                    tuple(req.block_table),
                    start + n == len(toks) and not req.params.pooling,
                    req.seed,
                    req.params.temperature,
                    req.params,
                    toks,
                    req.num_prompt_tokens,
                )
            )
        return SchedulerOutput(Batch(tuple(seqs)), tuple(sched), tuple(counts), tuple(admitted))

    def finish_many(self, reqs: Sequence[Request], status: Status) -> None:
        """Remove running or waiting requests and free their blocks, in the order given
        (the order their blocks go to the eviction queue): the gauges and counters end as
        if each were finished alone, and ``waiting`` is rebuilt at most once, so that
        aborting thousands of queued requests costs one pass over it, not one each.
        ValueError, with nothing changed, for a request finished already or given twice."""
        gone: set[int] = set()
        num_running = num_waiting = 0
        for req in reqs:
            if req.status is Status.RUNNING:
                num_running += 1
            elif req.status in (Status.WAITING, Status.PREEMPTED):
                num_waiting += 1
            else:
                raise ValueError(f"request {req.request_id} is already {req.status.value}")
            if id(req) in gone:
                raise ValueError(f"request {req.request_id} is given twice")
            gone.add(id(req))
        running, waiting = self.running, self.waiting
        kept_running = [r for r in running if id(r) not in gone] if num_running else running
        if len(running) - len(kept_running) != num_running:
            raise ValueError(f"{num_running} of the requests to finish are running, "
                             f"{len(running) - len(kept_running)} of them in the batch")
        if num_waiting:
            kept_waiting = [r for r in waiting if id(r) not in gone]
            if len(waiting) - len(kept_waiting) != num_waiting:
                raise ValueError(f"{num_waiting} of the requests to finish are waiting, "
                                 f"{len(waiting) - len(kept_waiting)} of them in the queue")
            waiting.clear()
            waiting.extend(kept_waiting)
        if num_running:
            running[:] = kept_running
        stats = self.stats
        kv = self.kv
        for req in reqs:
            p = req.num_prompt_tokens
            stats.prompt_tokens_waiting -= p - min(req.num_computed_tokens, p) \
                - req.waiting_credit
            req.waiting_credit = 0
            kv.free(req)
            req.status = status
        if status is Status.ABORTED:
            stats.num_requests_aborted += len(reqs)
        else:
            stats.num_requests_finished += len(reqs)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
