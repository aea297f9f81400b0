"""Background loops that keep the ``Fleet`` current: health checks and metric scrapes.

Both loops are owned by ``Monitor``: started in the app's lifespan, cancelled and awaited
on shutdown. Each replica (each server, for the data-parallel ranks of one) has its own
schedule: every interval, a check (a scrape) of it starts unless its previous one, bounded by
its timeout, is still running. So one slow replica never delays the others, and no replica
has two of the monitor's checks (or two scrapes) in flight. Each replica's call comes at its
own phase of the interval (from a hash of its id), and at most ``STARTS_PER_TURN`` start in
one turn of the event loop: a fleet of thousands is checked over the interval, never all at
once (4,096 checks started together held the loop for over a second). A replica that leaves
the fleet (or stops being healthy, for scrapes) has its check or scrape in flight given up
and none started; one that joins at run time is checked at once, as its schedule's check
(``check_joined``), and taken up by the loops from the next interval.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeGuard

import aiohttp
import orjson

from gateway.config import DEFAULT_HEALTH_PATH, HealthConfig, ScrapeConfig
from gateway.data_parallel import group_of
from gateway.fleet import Fleet, ModelInfo, ReplicaState
from gateway.kv_capacity_estimate import CapacityEstimator, Mark
from gateway.log_throttle import LogThrottle
from gateway.periodic import stop_tasks
from gateway.replica_metrics import ScrapedMetrics, parse_metrics, parse_rank_metrics, stale_copy
from gateway.upstream_http import CA_FILE_HINT
from kvwire.media_parts import shown

log = logging.getLogger("kvgate.monitor")

# a replica's /v1/models is read up to these bounds (a LoRA server may list thousands of
# adapters): what routing keeps of it stays small, for every worker to share; a model past
# them is not refused (``Fleet.models_cut``)
MODELS_BYTES = 1 << 20
MAX_MODELS = 1024
# an id (a ``root``, a ``parent``) is kept whole up to this length, never cut: a cut id is a
# name no replica serves. Longer ids are left out of what routing knows, with a warning
# (``_routable``), and a request naming one is told why it is refused
# (``intake.check_model``). Real names fit with room (a Hugging Face repo id is an owner, a
# slash and a name of at most 96 characters; an adapter named by its path, a few hundred),
# and 1,024 ids of 1,024 characters are the 1 MiB a listing is read to anyway
MODEL_ID_CHARS = 1024
# a listed model's other fields (``owned_by``, ``created``...) are kept for /v1/models up
# to this length; longer, the gateway writes its own
CARD_CHARS = 2048
# fields of a listed model not kept: vLLM's ``permission`` list (~300 characters a model,
# left out of OpenAI's model object, read by no client) would triple what each listed model
# costs in the snapshot the box's worker processes share (``box_feed``)
_CARD_LEFT_OUT = frozenset({"permission"})
_INFO_FIELDS = ("root", "parent", "max_model_len")  # ``ModelInfo``'s own, in its order
_SKIPPED_LOG_S = 60.0  # a warning of ids left out, at most once a minute
HEALTH_BYTES = 64 << 10  # a /health answer is read this far at most (its status counts)
MODELS_PATH = "/v1/models"  # asked where /health is not found
_PARSE_INLINE_BYTES = 256 << 10  # a /metrics page past this is parsed on a thread
_SAID_CHARS = 240  # of a parser's error, in a log line
_MODELS_ROUND_S = 1.0  # the least time between two model rounds asked for by requests
# the gateway's own calls read their answers as sent: asked unencoded (aiohttp offers gzip
# by default, and prometheus-client's /metrics app, which SGLang mounts, gzips for anyone
# who accepts it: every scrape of such a replica read compressed bytes as text)
_UNENCODED = {"accept-encoding": "identity"}
# the checks (scrapes) one turn of the event loop starts at most, and the least time the
# loops sleep between two batches of starts: a start costs ~0.3 ms of the loop (a refused
# connection, its error counted), so a turn holds it for ~10 ms at most
STARTS_PER_TURN = 32
_STEP_S = 0.005

Key = tuple[int, ...]  # which replica a call is for (``_key``)
Call = Callable[[list[ReplicaState]], Awaitable[None]]


def model_info(listed: dict[str, object]) -> ModelInfo:
    """A /v1/models entry's fields beyond its id, where they have the types vLLM gives;
    its others (and those of these it gave otherwise: an adapter's null ``max_model_len``)
    kept as JSON text (``ModelInfo.card``) up to ``CARD_CHARS``, but vLLM's
    ``permission`` list (``_CARD_LEFT_OUT``)."""
    root, parent, length = listed.get("root"), listed.get("parent"), listed.get("max_model_len")
    info = ModelInfo(root if _routable(root) else None,
                     parent if _routable(parent) else None,
                     length if type(length) is int and length > 0 else None)
    kept = {"id", *_CARD_LEFT_OUT, *(key for key, value in zip(_INFO_FIELDS, info,
                                                              strict=False)
                                    if value is not None)}
    rest = {key: value for key, value in listed.items() if key not in kept}
    card = orjson.dumps(rest).decode() if rest else None
    return info if card is None or len(card) > CARD_CHARS else info._replace(card=card)


def _routable(name: object) -> TypeGuard[str]:
    """Whether ``name`` is a string the gateway keeps whole (``MODEL_ID_CHARS``)."""
    return isinstance(name, str) and len(name) <= MODEL_ID_CHARS


class _Inflater:
    """A decoder of a /metrics page sent ``gzip`` or ``deflate`` though the gateway asks
    for it unencoded (a server or proxy that compresses anyway: its bytes were read as
    text, an unparsable page every scrape): a gzip or zlib stream, or a raw deflate one
    (as some servers send ``deflate``), a gzip of several members read through (bytes
    after a member that begin none are left, as gzip readers leave padding); its output
    bounded (``decompress``'s ``limit``)."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(wbits=47)  # a gzip or a zlib header, told apart
        self._begun = False  # output came: the stream's kind is known
        self._next_member = False  # the stream so far ended with a whole gzip member
        self._ended = False  # what follows is left

    def decompress(self, data: bytes, limit: int) -> bytes:
        """The page's next bytes from ``data``, up to ``limit``, and one byte more when
        there was more (the caller refuses a page past its bound); zlib.error where the
        bytes are no such stream."""
        out = b""
        while data and not self._ended and len(out) <= limit:
            try:
                out += self._d.decompress(data, limit + 1 - len(out))
            except zlib.error:
                if self._next_member:
                    self._ended = True  # padding after the last member
                    break
                if self._begun:
                    raise
                self._d = zlib.decompressobj(wbits=-15)  # no header: raw deflate
                self._begun = True
                continue
            self._begun, self._next_member = True, False
            data = self._d.unconsumed_tail
            if not data and self._d.eof and self._d.unused_data:
                data = self._d.unused_data  # the next gzip member
                self._d = zlib.decompressobj(wbits=47)
                self._next_member = True
        return out[:limit + 1]


def _inflater(coding: str) -> _Inflater | None:
    """``_Inflater`` for a page sent ``gzip`` or ``deflate``; None for an unencoded one;
    ValueError naming any other coding."""
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip", "deflate"):
        return _Inflater()
    raise ValueError(f"the page is encoded {coding[:40]!r}, which the gateway does not "
                     "decode (it asks for it unencoded)")


class Monitor:
    def __init__(self, fleet: Fleet, session: aiohttp.ClientSession, health: HealthConfig,
                 scrape: ScrapeConfig, capacity: CapacityEstimator | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.fleet = fleet
        self.capacity = capacity  # told each scrape, to estimate KV capacity
        self.session = session
        # how https replicas' certificates are checked (``upstream_http.replica_tls``):
        # aiohttp's ``ssl`` argument, True for the system's CAs
        self.tls: ssl.SSLContext | bool = True if tls is None else tls
        self.health_cfg = health
        self.scrape_cfg = scrape
        self._tasks: list[asyncio.Task[None]] = []  # the two loops
        # the check, the scrape of each replica running
        self._checks = _Schedule("health", health.interval_s)
        self._scrapes = _Schedule("scrape", scrape.interval_s)
        self._models_round: asyncio.Task[None] | None = None  # ``refresh_all_models``
        self._models_round_at = -math.inf  # when the last one started
        # one model list taken at a time, the loop handed back after each: a round's
        # answers (600 replicas of 300 adapters) arrive together and would otherwise all
        # be read in one pass of the loop (``refresh_models``)
        self._taking = asyncio.Lock()
        self._skipped_log = LogThrottle(_SKIPPED_LOG_S)  # ids over ``MODEL_ID_CHARS``
        # the data-parallel replicas warned of their ranks, with the size each was warned
        # at (``_check_ranks``): those still in the fleet
        self._ranks_told: dict[str, int] = {}
        # the replicas whose /v1/models refused the gateway (401/403: a key it lacks, the
        # clients holding it), by id: listed under the models their /metrics name
        # (``_list_scraped``) until a listing is answered
        self._keyless: dict[str, ReplicaState] = {}

    async def start(self) -> None:
        """One health round (so /ready is right from the start), then the loops."""
        await self.health_round()
        if self.scrape_cfg.enabled:
            await self.scrape_round()
        self._tasks = [asyncio.create_task(
            self._checks.run(self._health_jobs, self._check_all, self._still_checked),
            name="kvgate-health")]
        if self.scrape_cfg.enabled:
            self._tasks.append(asyncio.create_task(
                self._scrapes.run(self._scrape_jobs, self._scrape, self._still_scraped),
                name="kvgate-scrape"))

    async def stop(self) -> None:
        """The loops first (no check starts after), then the checks and scrapes running."""
        if self._models_round is not None:
            self._tasks.append(self._models_round)
            self._models_round = None
        await stop_tasks(self._tasks)
        self._tasks = []
        await self._checks.stop()
        await self._scrapes.stop()

    async def refresh_all_models(self) -> None:
        """Every healthy replica's model list asked for again: a request named a model
        none of them listed (an adapter loaded at run time, a replica restarted with
        another model). Callers share one round, the one running or the next; a round
        starts at most once every ``_MODELS_ROUND_S``, so requests for unknown models cost
        the replicas little, and a caller waits at most that long for the next one: an
        adapter loaded just after a round (one a request for a misspelt model asked for)
        is found by its first request, not refused from lists older than it. A follower
        worker's monitor, never started, does only this (``box_feed``): a flood for a
        model nobody serves costs each replica a listing a second per worker."""
        task = self._models_round
        if task is None or task.done():
            wait_s = self._models_round_at + _MODELS_ROUND_S - time.monotonic()
            task = self._models_round = asyncio.create_task(
                self._models_of_all(max(wait_s, 0.0)), name="kvgate-models-round")
        await asyncio.shield(task)

    async def _models_of_all(self, after_s: float) -> None:
        if after_s > 0:
            await asyncio.sleep(after_s)
        self._models_round_at = time.monotonic()
        # at most STARTS_PER_TURN asks started a turn of the loop, as health checks are
        # (each costs ~0.2 ms: 600 replicas' at once held the loop ~0.1 s)
        # gathered, not a task group: one ask failing leaves the others to finish
        asks: list[asyncio.Task[None]] = []
        try:
            for i, states in enumerate(servers(s for s in self.fleet if s.healthy), 1):
                asks.append(asyncio.create_task(self.refresh_models(*states),
                                                name=f"kvgate-models {states[0].id}"))
                if i % STARTS_PER_TURN == 0:
                    await asyncio.sleep(0)
            results = await asyncio.gather(*asks, return_exceptions=True)
        except BaseException:  # cancelled (the monitor stops): so is every ask started
            for ask in asks:
                ask.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
            raise
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise failed[0]

    # -- health ---------------------------------------------------------------------------
    async def health_round(self) -> None:
        """Every replica's /health: once a server, whose answer counts for each of its
        data-parallel ranks (one API process serves them all). Awaited whole: the first
        round, before the loop starts (``start``)."""
        await asyncio.gather(*(self.check_one(*states) for states in servers(self.fleet)))

    def _health_jobs(self) -> dict[Key, list[ReplicaState]]:
        """An interval's health checks: one of every server."""
        return {_key(states): states for states in servers(self.fleet)}

    def _still_checked(self, states: Sequence[ReplicaState]) -> bool:
        """Whether a server read at its interval's start is in the fleet still."""
        return all(self._current(s) for s in states)

    async def _check_all(self, states: Sequence[ReplicaState]) -> None:
        await self.check_one(*states)

    async def check_joined(self, state: ReplicaState, *ranks: ReplicaState) -> None:
        """``check_one`` of a server just added (``ranks``: its other data-parallel ranks),
        run as its schedule's check: the health loop starts none while it runs (two could
        answer out of order, a late failure counted after a later pass ejecting it)."""
        states = [state, *ranks]
        await self._checks.now(_key(states), states, self._check_all)

    async def check_one(self, state: ReplicaState, *ranks: ReplicaState) -> None:
        """``state``'s /health, counted for it and for ``ranks`` (the other data-parallel
        ranks of its server), then its model list where the answer calls for one. A
        replica's ``api_key_file`` is looked at first, read again where it changed (a
        rotated Secret; ``ReplicaState.recheck_key``, at most every ``KEY_RECHECK_S``)."""
        for one in (state, *ranks):
            one.recheck_key()
        ok, error = await self._probe(state)
        checked = [s for s in (state, *ranks) if self._current(s)]
        listing = []
        for one in checked:
            if self._counted(one, ok, error):
                listing.append(one)
        if listing:
            await self.refresh_models(*listing)

    async def _probe(self, state: ReplicaState) -> tuple[bool, str | None]:
        """``state``'s health: a 200 at ``health.path``; where that is the default
        ``/health`` and answers 404 (a server without one: Ollama's), a 200 at
        ``/v1/models``, which every OpenAI-compatible server has (a wrong base URL misses
        both)."""
        status, error = await self._get(state, self.health_cfg.path)
        if status == 404 and self.health_cfg.path == DEFAULT_HEALTH_PATH:
            status, also = await self._get(state, MODELS_PATH)
            error = None if status == 200 else f"{error}; {also}"
        return status == 200, error

    async def _get(self, state: ReplicaState, path: str) -> tuple[int | None, str | None]:
        """What ``path`` on ``state``'s server answered (None: nothing), and why that is
        no 200."""
        cfg = self.health_cfg
        status, error = None, None
        url = f"{state.config.base_url}{path}"  # named in each failure: where it went
        try:
            async with asyncio.timeout(cfg.timeout_s):
                async with self.session.get(url, headers=state.credentials | _UNENCODED,
                                            allow_redirects=False, ssl=self.tls) as resp:
                    read = 0  # a body without end (a URL that reaches a stream) is left
                    async for chunk in resp.content.iter_chunked(1 << 16):
                        read += len(chunk)
                        if read > HEALTH_BYTES:
                            break
                    status = resp.status
                    if status != 200:
                        error = f"GET {url} answered {status}"
        except TimeoutError:
            status, error = None, f"GET {url} timed out after {cfg.timeout_s} s"
        except aiohttp.ClientConnectorCertificateError as exc:
            status, error = None, f"GET {url} failed: {exc.__class__.__name__}: {exc}; " \
                f"{CA_FILE_HINT}"
        except aiohttp.ClientError as exc:
            status, error = None, f"GET {url} failed: {exc.__class__.__name__}: {exc}"
        return status, error

    def _counted(self, state: ReplicaState, ok: bool, error: str | None) -> bool:
        """Count a check of ``state``; whether its model list is due now."""
        cfg = self.health_cfg
        changed = self.fleet.record_health(state.id, ok, error, cfg.failures_to_eject,
                                           cfg.successes_to_readmit)
        if changed is not None:
            log.warning("replica %s is now %s%s", state.id,
                        "healthy" if changed else "unhealthy", f" ({error})" if error else "")
        # a replica back in the fleet may serve other models (a restart, a new deployment)
        return ok and (bool(changed) or not state.model_info
                       or time.monotonic() - state.models_at > cfg.models_refresh_s)

    async def refresh_models(self, state: ReplicaState, *ranks: ReplicaState) -> None:
        """``state``'s /v1/models, taken as what it and ``ranks`` (the other data-parallel
        ranks of its server) serve."""
        try:
            async with asyncio.timeout(self.health_cfg.timeout_s):
                async with self.session.get(f"{state.config.base_url}/v1/models",
                                            headers=state.credentials | _UNENCODED,
                                            allow_redirects=False, ssl=self.tls) as resp:
                    if resp.status != 200:
                        self._refused(state, "/v1/models", resp.status)
                        if resp.status in (401, 403):
                            for one in (state, *ranks):
                                self._keyless[one.id] = one
                                self._list_scraped(one, again=True)
                        return
                    raw = bytearray()
                    async for chunk in resp.content.iter_chunked(1 << 16):
                        raw += chunk
                        if len(raw) > MODELS_BYTES:
                            break
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.info("replica %s: /v1/models failed: %s", state.id, exc)
            return
        for one in (state, *ranks):
            self._keyless.pop(one.id, None)
        async with self._taking:
            self._take_models(state, (state, *ranks), raw)
            await asyncio.sleep(0)  # the next list is read in a later pass of the loop

    def _take_models(self, state: ReplicaState, every: tuple[ReplicaState, ...],
                     raw: bytearray) -> None:
        """``state``'s answer to /v1/models (``raw``, cut past ``MODELS_BYTES``), taken as
        what each of ``every`` serves."""
        if len(raw) > MODELS_BYTES:  # the models it listed before stay known, and
            for one in every:  # a model not among them is still sent to it
                one.models_cut = True
                one.models_at = time.monotonic()
            log.warning("replica %s: /v1/models is over %d bytes; models not known "
                        "are sent to it too", state.id, MODELS_BYTES)
            self.fleet.changed()
            return
        try:
            data = orjson.loads(raw)
        except ValueError as exc:
            log.info("replica %s: /v1/models failed: %s", state.id, exc)
            return
        items = data.get("data") if isinstance(data, dict) else None
        if isinstance(items, list):
            listed = [m for m in items if isinstance(m, dict) and "id" in m]
            too_long = [m for m in listed if not _routable(str(m["id"]))]
            if too_long:
                self._skipped(state, [str(m["id"]) for m in too_long])
                listed = [m for m in listed if _routable(str(m["id"]))]
            if len(listed) > MAX_MODELS:
                log.warning("replica %s serves %d models; routing knows its first %d and "
                            "sends it the others too", state.id, len(listed), MAX_MODELS)
            info = {str(m["id"]): model_info(m) for m in listed[:MAX_MODELS]}
            for one in every:
                one.model_info = dict(info)
                one.models_cut = len(listed) > MAX_MODELS
                one.models_at = time.monotonic()
            self.fleet.changed()

    def _list_scraped(self, state: ReplicaState, again: bool = False) -> None:
        """``state``, whose /v1/models refused the gateway, listed under the models its
        last scrape names (the ``model_name`` label of vLLM's and SGLang's series, on a
        page served without a key): its served model, nothing /v1/models tells beyond the
        id (no ``max_model_len``); where the page shows LoRA adapters, models it does not
        name are sent to it too (``models_cut``). ``again``: taken anew (a model list is
        due), else only where the names changed. A page naming none: nothing changes."""
        scraped = state.scraped
        if scraped is None or not scraped.model_names or not self._current(state):
            return
        names = [n for n in scraped.model_names if _routable(n)][:MAX_MODELS]
        cut = scraped.serves_adapters or len(names) < len(scraped.model_names)
        changed = list(state.model_info) != names or state.models_cut != cut
        if not names or not (changed or again):
            return
        if changed:
            log.info("replica %s: its /v1/models refused the gateway, so it is listed under "
                     "the model(s) its /metrics name: %s%s; set its api_key in the "
                     "gateway's config for its own list", state.id,
                     ", ".join(shown(n, 80) for n in names[:8]),
                     " (its LoRA adapters, unnamed, are sent to it too)" if cut else "")
        state.model_info = dict.fromkeys(names, ModelInfo())
        state.models_cut = cut
        state.models_at = time.monotonic()
        self.fleet.changed()

    def _skipped(self, state: ReplicaState, ids: list[str]) -> None:
        """A warning (at most one a ``_SKIPPED_LOG_S``) of ``state``'s ids too long to
        route by, named by their start."""
        held = self._skipped_log.due()
        if held is not None:
            log.warning("replica %s lists %d model(s) whose id is over %d characters: "
                        "left out of its models, and requests naming them are refused "
                        "(the first: %s)%s", state.id,
                        len(ids), MODEL_ID_CHARS, shown(ids[0], 80),
                        f"; {held} such listing(s) since the last warning" if held else "")

    def _current(self, state: ReplicaState) -> bool:
        """Whether ``state`` is still the fleet's replica of its id: one removed while
        probed, or removed and added again under its id (a StatefulSet pod back at a new
        address), must not take the old address's answer for the new replica's."""
        return self.fleet.get(state.id) is state

    def _scrape_failed(self, state: ReplicaState) -> None:
        state.scrape_failures += 1
        if state.scrape_failures == self.scrape_cfg.stale_after_failures \
                and state.scraped is not None and not state.scraped.stale \
                and self._current(state):
            log.warning("replica %s: %d scrapes failed in a row: its last load figures are "
                        "dropped", state.id, state.scrape_failures)
            self.fleet.record_scrape(state.id, stale_copy(state.scraped))

    @staticmethod
    def _refused(state: ReplicaState, path: str, status: int) -> None:
        """A non-200 to one of the gateway's own calls: never silent. 401/403 means the
        replica wants a key the gateway lacks, or another (``ReplicaState.auth_refused``:
        its key file is read again where it changed)."""
        if status in (401, 403):
            state.auth_refused(path, status)
            return
        error = f"{path} answered {status}"
        if state.last_error != error:
            log.warning("replica %s: %s", state.id, error)
        state.last_error = error

    # -- scrapes --------------------------------------------------------------------------
    async def scrape_round(self) -> None:
        """Every healthy replica's /metrics, once a page: the data-parallel ranks of one
        replica (``gateway.data_parallel``) share one read and one parse of it. Awaited
        whole: the first round, before the loop starts (``start``)."""
        await asyncio.gather(*(self._scrape(states) for states in self._pages()))

    def _scrape_jobs(self) -> dict[Key, list[ReplicaState]]:
        """An interval's scrapes: one of every page."""
        return {_key(states): states for states in self._pages()}

    def _still_scraped(self, states: Sequence[ReplicaState]) -> bool:
        """Whether a page's replicas read at its interval's start are healthy still."""
        return all(s.healthy and self._current(s) for s in states)

    def _pages(self) -> list[list[ReplicaState]]:
        """The healthy replicas, grouped by the /metrics page that tells of them."""
        pages: dict[tuple[str, int], list[ReplicaState]] = {}
        groups = {group_of(s.id) for s in self.fleet if s.config.data_parallel_rank is not None}
        # a replica gone from the fleet is told again when it comes back
        self._ranks_told = {g: n for g, n in self._ranks_told.items() if g in groups}
        if self._keyless:
            self._keyless = {i: s for i, s in self._keyless.items() if self._current(s)}
        for s in self.fleet:
            if s.healthy:
                page = (s.id if s.config.data_parallel_rank is None else s.config.base_url,
                        s.config.data_parallel_size)
                pages.setdefault(page, []).append(s)
        return list(pages.values())

    async def scrape_one(self, state: ReplicaState) -> None:
        await self._scrape([state])

    async def _scrape(self, states: Sequence[ReplicaState]) -> None:
        """Scrape one replica's /metrics (or its ranks': ``states`` then holds them): read
        up to ``max_bytes`` (decoded leniently), parsed off the event loop when large; a
        failure is counted, and after ``stale_after_failures`` in a row its last load
        figures are dropped."""
        cfg = self.scrape_cfg
        first = states[0]
        marks = [self.capacity.mark(s.id) if self.capacity is not None else None
                 for s in states]
        try:
            async with asyncio.timeout(cfg.timeout_s):
                async with self.session.get(f"{first.config.base_url}/metrics",
                                            headers=first.credentials | _UNENCODED,
                                            allow_redirects=False, ssl=self.tls) as resp:
                    if resp.status != 200:
                        for state in states:
                            self._refused(state, "/metrics", resp.status)
                            self._scrape_failed(state)
                        return
                    raw = bytearray()
                    inflate = _inflater(resp.headers.get("content-encoding", ""))
                    async for chunk in resp.content.iter_chunked(1 << 16):
                        if inflate is not None:  # (its output bounded as the page is)
                            chunk = inflate.decompress(chunk, cfg.max_bytes - len(raw))
                        raw += chunk
                        if len(raw) > cfg.max_bytes:
                            raise ValueError(f"the page is over {cfg.max_bytes} bytes")
        except (TimeoutError, aiohttp.ClientError, ValueError, zlib.error) as exc:
            for state in states:
                # once per run of failures (a broken /metrics fails every scrape, each
                # second)
                log.log(logging.INFO if state.scrape_failures == 0 else logging.DEBUG,
                        "replica %s: /metrics failed: %s", state.id, exc)
                self._scrape_failed(state)
            return
        text = raw.decode("utf-8", errors="replace")
        try:
            pages = await asyncio.to_thread(_parse, text, states) \
                if len(raw) > _PARSE_INLINE_BYTES else _parse(text, states)
        except Exception as exc:  # the parser raises more than ValueError on odd input
            # the parser's message quotes the line it stopped at: an HTML page minified
            # onto one line was logged whole, at every scrape
            said = repr(exc)
            said = said if len(said) <= _SAID_CHARS else f"{said[:_SAID_CHARS]}..."
            for state in states:
                log.log(logging.WARNING if state.scrape_failures == 0 else logging.DEBUG,
                        "replica %s: unparsable /metrics: %s", state.id, said)
                self._scrape_failed(state)
            return
        snapshots, named = pages
        if named is not None:
            self._check_ranks(first.id, first.config.data_parallel_size, named)
        for state, metrics, mark in zip(states, snapshots, marks, strict=True):
            await self._scraped(state, metrics, mark)

    def _check_ranks(self, rank_id: str, size: int, named: frozenset[str]) -> None:
        """Warn once per replica and size whose /metrics name other ranks than its
        ``data_parallel_size`` (a size that is not the server's: requests pinned to a rank
        it does not have are refused there)."""
        group = group_of(rank_id)
        expected = frozenset(str(k) for k in range(size))
        if named == expected or self._ranks_told.get(group) == size:
            return
        self._ranks_told[group] = size
        if not named:  # a server that labels no sample with its rank: supported
            log.info("replica %s: its /metrics name no data-parallel rank; each of its %d "
                     "ranks is given an even share of its counts", group, size)
            return
        log.warning("replica %s: data_parallel_size is %d, but its /metrics name ranks %s: "
                    "set data_parallel_size to its server's --data-parallel-size "
                    "(--dp-size)", group, size, _ranks_shown(named))

    async def _scraped(self, state: ReplicaState, metrics: ScrapedMetrics,
                       mark: Mark | None) -> None:
        state.scrape_failures = 0
        if not self._current(state):
            return
        if self.fleet.record_scrape(state.id, metrics):
            log.warning("replica %s restarted (its counters went back)", state.id)
            await self.refresh_models(state)  # it may serve other models now
        elif self._keyless.get(state.id) is state:
            self._list_scraped(state)
        if self.capacity is not None:
            self.capacity.observe(state.id, metrics, mark)


class _Schedule:
    """Each replica's own schedule for one kind of call (health checks, scrapes): at most
    one call in flight per key, each in a task kept here until it ends; every interval, a
    call of each replica at its phase of the interval (``run``)."""

    def __init__(self, what: str, interval_s: float, per_turn: int = STARTS_PER_TURN) -> None:
        self.what = what
        self.interval_s = interval_s
        self.per_turn = per_turn
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._phases: dict[Key, float] = {}  # of the keys of the last interval

    async def run(self, jobs: Callable[[], dict[Key, list[ReplicaState]]], call: Call,
                  still: Callable[[list[ReplicaState]], bool]) -> None:
        """Until cancelled, from one interval on: ``jobs()`` read at each interval's start
        (``plan``), and each of them started at its phase of the interval (``Round``),
        unless its previous call still runs or ``still`` no longer holds for it (a replica
        gone, or no longer healthy, since the interval began). An interval the event loop
        could not keep up with ends when its last call started: the next begins then."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        while True:
            began = max(began + self.interval_s, loop.time())
            await asyncio.sleep(began - loop.time())
            try:
                round_ = self.plan(jobs(), began)
                while not round_.done():
                    for key, states in round_.starts(loop.time()):
                        if key not in self._running and still(states):
                            self._start(key, states, call)
                    if not round_.done():  # due already (held back by the bound per
                        # turn): the next turn; else when due, a step on at least
                        wait_s = round_.next_at() - loop.time()
                        await asyncio.sleep(0 if wait_s <= 0 else max(wait_s, _STEP_S))
            except Exception:  # a bug in one interval must not end the loop
                log.exception("%s round failed", self.what)

    def plan(self, jobs: dict[Key, list[ReplicaState]], began: float) -> Round:
        """The interval beginning at ``began`` (loop time) with ``jobs``: the calls running
        for keys no longer among them are given up (a replica gone, or added again:
        another state under its id, another key)."""
        for key, task in list(self._running.items()):
            if key not in jobs:
                task.cancel()  # it leaves ``_running`` as it ends
        known = self._phases
        self._phases = {key: known[key] if key in known else phase(states[0].id)
                        for key, states in jobs.items()}
        return Round(jobs, self._phases, began, self.interval_s, self.per_turn)

    async def now(self, key: Key, states: list[ReplicaState], call: Call) -> None:
        """``call`` for ``states`` at once, as the call of ``key`` (``run`` starts none
        for it while it runs), awaited to its end; the one running for ``key`` already,
        if any, is awaited instead. Cancelling the caller cancels it."""
        task = self._running.get(key) or self._start(key, states, call)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise

    def _start(self, key: Key, states: list[ReplicaState], call: Call) -> asyncio.Task[None]:
        task = asyncio.create_task(self._run(call, states),
                                   name=f"kvgate-{self.what} {states[0].id}")
        self._running[key] = task
        task.add_done_callback(functools.partial(self._ended, key))
        return task

    async def _run(self, call: Call, states: list[ReplicaState]) -> None:
        try:
            await call(states)
        except Exception:  # a bug in one call must not go unseen, nor stop the others
            log.exception("%s of replica %s failed", self.what, states[0].id)

    def _ended(self, key: Key, task: asyncio.Task[None]) -> None:
        if self._running.get(key) is task:
            del self._running[key]

    async def stop(self) -> None:
        await stop_tasks(list(self._running.values()))


class Round:
    """One interval of a schedule: each job due at ``began + phase * interval_s``, handed
    out in that order, at most ``per_turn`` at a time. Plain arithmetic on the times it is
    given: no clock of its own."""

    def __init__(self, jobs: dict[Key, list[ReplicaState]], phases: dict[Key, float],
                 began: float, interval_s: float, per_turn: int) -> None:
        self._jobs = jobs
        # the jobs in the order they are due; [0, _next) handed out, [_next, len) to come
        self._order = sorted(jobs, key=phases.__getitem__)
        self._due = [began + phases[key] * interval_s for key in self._order]
        self._next = 0
        self._per_turn = per_turn

    def starts(self, now: float) -> list[tuple[Key, list[ReplicaState]]]:
        """The jobs due by ``now`` not handed out yet, the first ``per_turn`` of them."""
        first = self._next
        last = min(first + self._per_turn, len(self._order))
        while self._next < last and self._due[self._next] <= now:
            self._next += 1
        return [(key, self._jobs[key]) for key in self._order[first:self._next]]

    def done(self) -> bool:
        return self._next == len(self._order)

    def next_at(self) -> float:
        """When the next job to hand out is due (``done()`` must be false)."""
        return self._due[self._next]


def phase(replica_id: str) -> float:
    """Where in each interval a replica's calls come, in [0, 1): from a hash of its id, so
    the same every interval (its calls an interval apart) and across restarts, and a
    fleet's replicas spread evenly over the interval."""
    digest = hashlib.blake2b(replica_id.encode("utf-8", "surrogatepass"),
                             digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)  # 53 bits: below 1.0


def _key(states: Sequence[ReplicaState]) -> Key:
    """Which replica a call is for: the very states (a replica removed and added again
    under its id is another), alive while their call runs, so never one's id reused."""
    return tuple(id(state) for state in states)


def servers(states: Iterable[ReplicaState]) -> list[list[ReplicaState]]:
    """``states`` grouped by the server that answers for them: the data-parallel ranks of
    one replica together (``gateway.data_parallel``), every other replica alone."""
    grouped: dict[tuple[str, str | None], list[ReplicaState]] = {}
    for state in states:
        key = (group_of(state.id), state.config.base_url) \
            if state.config.data_parallel_rank is not None else (state.id, None)
        grouped.setdefault(key, []).append(state)
    return list(grouped.values())


def _ranks_shown(named: frozenset[str], shown: int = 8) -> str:
    """The ranks a page names, for a log line: the first ``shown`` (a page may name
    thousands, or labels that are no number: those quoted, cut short), then how many more."""
    ranks = sorted(named, key=lambda r: (len(r), r))
    text = ", ".join(r if r.isascii() and r.isdigit() and len(r) <= 12 else repr(r[:24])
                     for r in ranks[:shown])
    more = f" and {len(ranks) - shown} more" if len(ranks) > shown else ""
    return text + more if text else "none"


def _parse(text: str, states: Sequence[ReplicaState]
           ) -> tuple[list[ScrapedMetrics], frozenset[str] | None]:
    """``states``' snapshots of one /metrics page: a replica's, or each of its
    data-parallel ranks' own (then with the ranks the page names)."""
    first = states[0].config
    if first.data_parallel_rank is None:
        return [parse_metrics(text)], None
    pages = parse_rank_metrics(text, first.data_parallel_size)
    ranks = [s.config.data_parallel_rank for s in states]
    return [pages.snapshots[rank] for rank in ranks if rank is not None], pages.named
