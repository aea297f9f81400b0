"""The fleet's prefix caches flushed in one call: ``POST /flush_cache`` on the admin
listener, as SGLang's router fans it out to its workers (RL trainers call it after a
weight update: a cached prefix computed by the old weights is wrong for the new ones).

Each healthy replica's server is asked once (a data-parallel replica's ranks share one
call: SGLang and vLLM clear every rank's cache on it): ``POST /flush_cache`` (SGLang,
which refuses with a 400 while requests run) or ``POST /reset_prefix_cache`` (vLLM, which
serves it only when started with ``VLLM_SERVER_DEV_MODE=1``); the kvgate engine serves
both. The path its scraped dialect names goes first, the other when that one is a 404 or
405. Unhealthy replicas are not asked (they get no traffic; one back from a restart has
an empty cache anyway) and are listed as skipped.

A replica whose cache was flushed is told to the fleet (``Fleet.flushed``), whose
``gateway.state.policy_listener`` tells the routing policy as of a restarted replica
(``ReplicaReset``): its model of the replica's cache and its KV event index entries are
dropped, so no request is routed toward a prefix the replica no longer holds. (A replica's
KV events say the same where it publishes them.) With ``--workers N`` worker 0, which
serves the admin API, counts the flush in its snapshot and the other workers tell their
own policies when they apply it (``gateway.box_feed``); other gateway copies (``peers``)
are not told.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

import aiohttp

from gateway.fleet import ReplicaState
from gateway.monitor import servers
from gateway.state import GatewayState

FLUSH_TIMEOUT_S = 30.0  # for one server's answer
SGLANG_PATH = "/flush_cache"
VLLM_PATH = "/reset_prefix_cache"
_SAID_BYTES = 512  # of a refusal's body, in its error
_UNSERVED = (404, 405)  # the path is not this server's: the other is tried
_UNENCODED = {"accept-encoding": "identity"}


@dataclass(slots=True)
class FlushSummary:
    """What one flush did, replica by replica (fleet ids)."""

    flushed: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)  # replica, error
    skipped: list[dict[str, str]] = field(default_factory=list)  # replica, reason

    @property
    def status_code(self) -> int:
        """200 when every healthy replica flushed; 502 when one failed; 503 when none was
        healthy to ask."""
        if self.failed:
            return 502
        return 200 if self.flushed else 503

    def as_json(self) -> dict[str, object]:
        asked = len(self.flushed) + len(self.failed)
        ok = self.status_code == 200
        return {
            # SGLang router's fields, for clients that read them
            "status": "success" if ok else "failed",
            "message": f"flushed the prefix cache of {len(self.flushed)} of {asked} "
                       f"healthy replicas" if asked else "no healthy replica to flush",
            "flushed": self.flushed, "failed": self.failed, "skipped": self.skipped,
        }


def paths_for(state: ReplicaState) -> tuple[str, str]:
    """The flush paths to try on ``state``'s server, the likelier first."""
    dialect = state.scraped.dialect if state.scraped is not None else None
    return (SGLANG_PATH, VLLM_PATH) if dialect == "sglang" else (VLLM_PATH, SGLANG_PATH)


async def flush_replicas(gw: GatewayState, session: aiohttp.ClientSession,
                         tls: ssl.SSLContext | bool = True) -> FlushSummary:
    """Flush every healthy replica's prefix cache (``session``: the gateway's own client;
    ``tls``: how https replicas' certificates are checked, the health checks' way) and
    tell the policy which caches are empty now."""
    summary = FlushSummary()
    asked: list[list[ReplicaState]] = []
    for group in servers(gw.fleet):
        if any(s.healthy for s in group):
            asked.append(group)
        else:
            summary.skipped += [{"replica": s.id, "reason": "unhealthy"} for s in group]
    errors = await asyncio.gather(*(_flush(session, group[0], tls) for group in asked))
    for group, error in zip(asked, errors, strict=True):
        for state in group:
            if error is not None:
                summary.failed.append({"replica": state.id, "error": error})
                continue
            summary.flushed.append(state.id)
            if gw.fleet.get(state.id) is state:  # (not removed meanwhile)
                gw.fleet.flushed(state.id)
    return summary


async def _flush(session: aiohttp.ClientSession, state: ReplicaState,
                 tls: ssl.SSLContext | bool) -> str | None:
    """Ask ``state``'s server to flush its prefix cache: None when it did, else why not."""
    first, second = paths_for(state)
    url = state.config.base_url
    said = ""
    for path in (first, second):
        try:
            async with asyncio.timeout(FLUSH_TIMEOUT_S):
                async with session.post(f"{url}{path}", headers=state.credentials | _UNENCODED,
                                        allow_redirects=False, ssl=tls) as resp:
                    if 200 <= resp.status < 300:
                        return None
                    body = await resp.content.read(_SAID_BYTES)
                    said = f"{path} answered {resp.status}: " \
                           f"{body.decode(errors='replace').strip()!r}"
                    if resp.status not in _UNSERVED:
                        return said
        except TimeoutError:
            return f"{path} timed out after {FLUSH_TIMEOUT_S} s"
        except aiohttp.ClientError as exc:
            return f"{path} failed: {exc.__class__.__name__}: {exc}"
    return f"serves neither {first} nor {second} (vLLM serves {VLLM_PATH} when started " \
           f"with VLLM_SERVER_DEV_MODE=1); {said}"
