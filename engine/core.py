"""The synchronous, clock-agnostic engine core: scheduler + KV cache + executor.

The driver owns the clock. It passes ``now`` to :meth:`EngineCore.add_request` and
:meth:`EngineCore.step`; a step's outputs are stamped ``now + seconds`` where ``seconds``
is the executor's (modeled or measured) step duration. The HTTP server passes
``time.monotonic()`` and, for the sim executor, sleeps for the modeled duration; the
offline simulator passes virtual time and advances it by ``StepOutput.seconds``.

Typical loop::

    core.add_request(req, now=t)
    while core.has_unfinished():
        out = core.step(now=t)
        t += out.seconds
        for o in out.outputs: ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from engine.eviction import check_eviction_name
from engine.executor import Executor
from engine.kv_manager import KVCacheManager
from engine.request import Request, RequestOutput, SamplingParams, Status, TokenLogprob
from engine.scheduler import EngineStats, Scheduler, SchedulerConfig


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """``model_id`` seeds the block hash chain (name and revision)."""

    model_id: str
    num_blocks: int
    block_size: int = 16
    eviction: str = "lru"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    # False: outputs only for a request's first token and its finish (the offline
    # simulator needs nothing else and saves the per-token objects).
    emit_every_token: bool = True

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        check_eviction_name(self.eviction)

    @property
    def scheduler(self) -> SchedulerConfig:
        return SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens, self.max_model_len)


class StepFailed(Exception):
    """The executor raised on a step's batch. The batch's requests (``request_ids``) were
    aborted, their blocks freed and nothing of the step kept, so the core goes on with the
    rest; ``cause`` is what the executor raised."""

    def __init__(self, cause: Exception, request_ids: tuple[str, ...]) -> None:
        super().__init__(f"a step of {len(request_ids)} requests failed: {cause!r}")
        self.cause = cause
        self.request_ids = request_ids


@dataclass(frozen=True, slots=True)
class CoreGauges:
    """The core's gauges and counters (``stats``, a copy) as they were at one moment."""

    num_running: int
    num_waiting: int
    kv_usage: float
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class StepOutput:
    outputs: list[RequestOutput]
    seconds: float
    num_seqs: int
    num_tokens: int


class EngineCore:
    def __init__(self, executor: Executor, config: EngineConfig) -> None:
        if executor.block_size != config.block_size:
            raise ValueError(
                f"executor block_size {executor.block_size} != config {config.block_size}"
            )
        held = getattr(executor, "num_blocks", None)  # an executor that holds the KV cache
        if held is not None and held < config.num_blocks:
            # block ids past its cache fail every step that is handed one, and three failed
            # steps in a row stop the engine
            raise ValueError(f"executor holds {held} KV blocks, fewer than config num_blocks "
                             f"{config.num_blocks}")
        self.executor = executor
        self.config = config
        self.kv = KVCacheManager(config.num_blocks, config.block_size, config.eviction)
        self.scheduler = Scheduler(config.scheduler, self.kv)
        self.requests: dict[str, Request] = {}
        # Set by a driver that runs a step in another thread, for as long as it runs: the
        # core as it was before it, for readers on the driver's own thread (/metrics),
        # who would otherwise read it half-way through the step (see :meth:`read_gauges`).
        self.step_gauges: CoreGauges | None = None
        # Executors may stop on several ids (``eos_token_ids``) or one (``eos_token_id``).
        eos = executor.eos_token_id
        self._eos_ids: frozenset[int] = frozenset(
            getattr(executor, "eos_token_ids", None) or (() if eos is None else (eos,)))

    @property
    def stats(self) -> EngineStats:
        return self.scheduler.stats

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def make_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        cache_salt: str | None = None,
        adapter: str | None = None,
        block_hashes: list[bytes] | None = None,
    ) -> Request:
        """A request keyed for this engine's model identity and block size."""
        return Request(
            request_id,
            prompt_token_ids,
            params,
            model_id=self.config.model_id,
            block_size=self.config.block_size,
            cache_salt=cache_salt,
            adapter=adapter,
            block_hashes=block_hashes,
        )

    def validate(self, num_prompt_tokens: int, max_tokens: int, *,
                 pooling: bool = False) -> None:
        """ValueError if a request of this shape can never run here. A ``pooling``
        request (no output token) may fill the whole context."""
        limit = self.config.max_model_len
        if pooling:
            if num_prompt_tokens > limit:
                raise ValueError(f"input has {num_prompt_tokens} tokens; the maximum "
                                 f"context length is {limit} tokens")
            max_tokens = 0
        elif num_prompt_tokens >= limit:
            raise ValueError(
                f"prompt has {num_prompt_tokens} tokens; the maximum context length is "
                f"{limit} tokens including at least one output token"
            )
        need = min(num_prompt_tokens + max_tokens, limit)
        capacity = self.config.num_blocks * self.config.block_size
        if need > capacity:
            raise ValueError(
                f"request needs up to {need} tokens of KV cache; the cache holds {capacity}"
            )

    def add_request(self, req: Request, now: float = 0.0) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        if req.model_id != self.config.model_id:
            raise ValueError(f"request keyed for model {req.model_id!r}, engine serves "
                             f"{self.config.model_id!r}")
        self.validate(req.num_prompt_tokens, req.params.max_tokens,
                      pooling=req.params.pooling)
        req.arrival_time = now
        self.requests[req.request_id] = req
        self.scheduler.add(req)

    def abort_request(self, request_id: str, now: float = 0.0) -> bool:
        """Drop a request wherever it is. Returns False if it is unknown or finished."""
        return self.abort_requests((request_id,), now) == 1

    def abort_requests(self, request_ids: Iterable[str], now: float = 0.0) -> int:
        """Drop requests wherever they are, in one pass over the queues (aborting many
        one by one costs a search of the waiting queue each); ids unknown or finished are
        skipped. Returns how many were dropped."""
        reqs: list[Request] = []
        for request_id in request_ids:
            req = self.requests.pop(request_id, None)
            if req is None:
                continue
            req.finish_time = now
            req.finish_reason = "abort"
            reqs.append(req)
        if reqs:
            self.scheduler.finish_many(reqs, Status.ABORTED)
        return len(reqs)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def gauges(self) -> CoreGauges:
        """The gauges and counters now (cheap: a copy of a dozen counters)."""
        return CoreGauges(len(self.scheduler.running), len(self.scheduler.waiting),
                          self.kv.usage(), dataclasses.replace(self.stats))

    def read_gauges(self) -> CoreGauges:
        """What a reader sees: the ones held while a step runs (``step_gauges``), so that
        it sees the step whole or not at all, else those of now."""
        held = self.step_gauges
        return self.gauges() if held is None else held

    def step(self, now: float = 0.0) -> StepOutput:
        """Schedule one batch, execute it, and apply its results. :class:`StepFailed`
        when the executor raises: the batch's requests are aborted (the blocks the step
        wrote were never cached, so no lookup reads them)."""
        sched = self.scheduler.schedule()
        if not sched.requests:
            return StepOutput([], 0.0, 0, 0)
        for req in sched.newly_admitted:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
        try:
            result = self.executor.execute(sched.batch)
        except Exception as exc:
            ids = tuple(req.request_id for req in sched.requests)
            self.abort_requests(ids, now)
            raise StepFailed(exc, ids) from exc
        end = now + result.seconds
        outputs = self._update(sched.requests, sched.num_new_tokens, result.next_tokens, end,
                               result.logprobs, result.prompt_logprobs)
        stats = self.stats
        stats.num_steps += 1
        n_tokens = sched.batch.num_tokens
        stats.num_batched_tokens += n_tokens
        return StepOutput(outputs, result.seconds, len(sched.requests), n_tokens)

    def _update(
        self,
        reqs: tuple[Request, ...],
        counts: tuple[int, ...],
        next_tokens: dict[str, int],
        end: float,
        logprobs: dict[str, TokenLogprob],
        prompt_logprobs: dict[str, tuple[TokenLogprob, ...]],
    ) -> list[RequestOutput]:
        kv = self.kv
        bs = self.config.block_size
        stats = self.stats
        eos_ids = self._eos_ids
        max_len = self.config.max_model_len
        every = self.config.emit_every_token
        outputs: list[RequestOutput] = []
        finished: list[Request] = []
        for req, n in zip(reqs, counts, strict=True):
            old = req.num_computed_tokens
            new = old + n
            req.num_computed_tokens = new
            p = req.num_prompt_tokens
            if old < p:
                stats.prompt_tokens_waiting -= min(new, p) - old
                chunk = prompt_logprobs.get(req.request_id)
                if chunk:
                    _keep_prompt_logprobs(req, old + 1, chunk)
            kv.cache_computed(req)
            if new != len(req.all_token_ids):
                continue
            if req.params.pooling:  # prompt computed: done, with no output token
                stats.prompt_tokens += p
                req.finish_reason = "stop"
                req.finish_time = end
                finished.append(req)
                outputs.append(RequestOutput(req.request_id, (), "stop", p,
                                             req.num_cached_tokens, 0, req.arrival_time,
                                             req.first_scheduled_time, None, end))
                continue
            tok = next_tokens[req.request_id]
            req.append_output(tok, bs)
            stats.generation_tokens += 1
            first = req.first_token_time is None
            if first:  # its prefill done: the prompt counts now (vLLM: at its first token)
                req.first_token_time = end
                stats.prompt_tokens += p
            params = req.params
            reason = None
            if ((tok in eos_ids and not params.ignore_eos) or tok in params.stop_token_ids) \
                    and req.num_output_tokens > params.min_tokens:
                reason = "stop"
            elif req.num_output_tokens >= params.max_tokens or len(req.all_token_ids) >= max_len:
                reason = "length"
            if reason is not None:
                req.finish_reason = reason
                req.finish_time = end
                finished.append(req)
            elif not (every or first):
                continue
            logprob = logprobs.get(req.request_id)
            outputs.append(
                RequestOutput(
                    req.request_id,
                    (tok,),
                    reason,
                    p,
                    req.num_cached_tokens,
                    req.num_output_tokens,
                    req.arrival_time,
                    req.first_scheduled_time,
                    req.first_token_time,
                    req.finish_time,
                    () if logprob is None else (logprob,),
                    tuple(req.prompt_logprobs) if first and params.prompt_logprobs is not None
                    else None,
                )
            )
        if finished:
            self.scheduler.finish_many(finished, Status.FINISHED)
            for req in finished:
                del self.requests[req.request_id]
                if req.first_scheduled_time is not None:
                    stats.ran_requests += 1
                    stats.ran_seconds += end - req.first_scheduled_time
        return outputs

    def reset_prefix_cache(self) -> int:
        """Forget all cached prefixes; returns how many block hashes were dropped. A
        running request's blocks, uncached now, are cached again from its first block as
        it goes on: its next blocks' hashes chain on blocks no longer stored, so caching
        only those would store blocks no lookup reaches (and events whose parent the
        subscribers just dropped)."""
        dropped = self.kv.reset_prefix_cache()
        for req in self.requests.values():
            req.num_cached_blocks = 0
        return dropped

    def check_integrity(self) -> None:
        self.kv.check_integrity()
        sched = self.scheduler
        n = len(sched.running) + len(sched.waiting)
        if n != len(self.requests):
            raise AssertionError(f"{n} queued requests but {len(self.requests)} tracked")
        expected = sum(
            r.num_prompt_tokens - min(r.num_computed_tokens, r.num_prompt_tokens)
            - r.waiting_credit for r in self.requests.values()
        )
        if expected != self.stats.prompt_tokens_waiting:
            raise AssertionError(
                f"prompt_tokens_waiting {self.stats.prompt_tokens_waiting} != {expected}"
            )


def _keep_prompt_logprobs(req: Request, first: int, chunk: tuple[TokenLogprob, ...]) -> None:
    """Add a step's entries for prompt tokens ``[first, first + len(chunk))`` to those
    ``req`` holds for ``[1, 1 + len(req.prompt_logprobs))``: a chunk recomputed after a
    preemption brings only entries the request has already."""
    have = req.prompt_logprobs
    skip = 1 + len(have) - first  # entries of the chunk held already
    if skip < 0:
        raise AssertionError(f"request {req.request_id}: prompt log probabilities of tokens "
                             f"[{1 + len(have)}, {first}) were never computed")
    have.extend(chunk[skip:])
