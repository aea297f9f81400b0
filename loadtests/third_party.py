"""Routers of other projects, run by the load test in front of the same fleet as kvgate.

A policy named ``<router>:<policy>`` in ``loadtests.run --policies`` starts that router in
front of the fleet's engines instead of a kvgate gateway, and the same Locust load goes
through it:

* ``sglang:<policy>``: SGLang's router (the ``sglang-router`` program of the
  ``sglang-router`` package): ``cache_aware``, ``round_robin``, ``power_of_two``,
  ``random``.
* ``vllm:<policy>``: vLLM's router (the ``vllm-router`` program of the ``vllm-router``
  package): ``cache_aware``, ``kv_aware`` (fed by the engines' KV events, which the fleet
  then publishes; it tokenizes through the engines' ``/tokenize``), ``consistent_hash``,
  ``power_of_two``, ``round_robin``, ``sticky_least_loaded``, ``random``.

Install each where it cannot clash with this project's packages (a virtual environment of
its own) and name the program with ``--sglang-router PATH`` / ``--vllm-router PATH`` or
``$KVGATE_SGLANG_ROUTER`` / ``$KVGATE_VLLM_ROUTER``, or put it on PATH. Each router's own
settings stay at their defaults, as a user would start it.

A third-party router is only run with no network beyond loopback, so nothing it does can
leave the machine: the load test refuses to start one while any network interface but
``lo`` is present. Run it in a network namespace of its own::

    unshare -rn sh -c 'ip link set lo up && python -m loadtests.run --policies \\
        cost,sglang:cache_aware --sglang-router /opt/sglang/bin/sglang-router ...'
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtests.local_fleet import (
    ENGINE_BLOCK_SIZE,
    end_session,
    free_port,
    scope_cancel,
    wait_ready,
)


@dataclass(frozen=True, slots=True)
class RouterKind:
    """A router of another project: its program, where to find it, its policies."""

    name: str
    program: str  # the program's name on PATH
    env: str  # the environment variable that may name the program's path
    policies: tuple[str, ...]
    kv_event_policies: tuple[str, ...] = ()  # those fed by the engines' KV events
    kv_event_encoding: str = "array"  # the form of those events it reads


KINDS: dict[str, RouterKind] = {
    "sglang": RouterKind("sglang", "sglang-router", "KVGATE_SGLANG_ROUTER",
                         ("cache_aware", "round_robin", "power_of_two", "random")),
    "vllm": RouterKind("vllm", "vllm-router", "KVGATE_VLLM_ROUTER",
                       ("cache_aware", "kv_aware", "consistent_hash", "power_of_two",
                        "round_robin", "sticky_least_loaded", "random"),
                       kv_event_policies=("kv_aware",), kv_event_encoding="map"),
}


class ThirdPartyError(RuntimeError):
    """A third-party router could not be run; the message says why."""


@dataclass(frozen=True, slots=True)
class ThirdPartyRouter:
    """``router:policy``, as named in ``--policies``."""

    router: str
    policy: str

    @property
    def name(self) -> str:
        return f"{self.router}:{self.policy}"

    @property
    def kind(self) -> RouterKind:
        return KINDS[self.router]

    @property
    def needs_kv_events(self) -> bool:
        """Whether the engines must publish KV events for this policy."""
        return self.policy in self.kind.kv_event_policies


@dataclass(frozen=True, slots=True)
class Worker:
    """An engine as a router is told of it: its URL and, where the engines publish them,
    its KV event and replay endpoints."""

    url: str
    kv_events: str | None = None
    kv_events_replay: str | None = None


def parse(name: str) -> ThirdPartyRouter | None:
    """The third-party router a ``--policies`` entry names, or None for a kvgate policy."""
    router, sep, policy = name.partition(":")
    kind = KINDS.get(router) if sep else None
    if kind is None:
        return None
    if policy not in kind.policies:
        raise ValueError(f"{router} has no policy {policy!r} (known: "
                         f"{', '.join(kind.policies)})")
    return ThirdPartyRouter(router, policy)


def find_program(router: str, given: str | None = None) -> str | None:
    """``router``'s program: ``given``, else its environment variable, else PATH."""
    kind = KINDS[router]
    return given or os.environ.get(kind.env) or shutil.which(kind.program)


def require_program(router: str, given: str | None = None) -> str:
    """``find_program``, or an error that says how to name the program, or which named
    path is not a program (checked before any fleet starts, not by the start of the
    router in front of one)."""
    path = find_program(router, given)
    kind = KINDS[router]
    if path is None:
        raise ThirdPartyError(f"{kind.program} was not found: pass --{kind.program} PATH, "
                              f"set {kind.env} or put it on PATH")
    if shutil.which(path) is None:  # a path named (option or variable) but not a program
        where = f"--{kind.program}" if given else kind.env
        raise ThirdPartyError(f"{where} {path!r} is not an executable file")
    return path


def outside_interfaces() -> list[str]:
    """Network interfaces other than loopback in this process's network namespace."""
    return sorted(name for _, name in socket.if_nameindex() if name != "lo")


def require_isolation() -> None:
    """Raise unless this process's network namespace has loopback alone."""
    others = outside_interfaces()
    if others:
        raise ThirdPartyError(
            f"a third-party router runs only without network, but this namespace has "
            f"{', '.join(others)}: run the load test under "
            "`unshare -rn sh -c 'ip link set lo up && python -m loadtests.run ...'`")


def argv(router: ThirdPartyRouter, program: str, host: str, port: int,
         workers: Sequence[Worker], model: str) -> list[str]:
    """The command line that starts ``router`` on ``host:port`` in front of ``workers``,
    which serve ``model``."""
    urls = [w.url for w in workers]
    if router.router == "sglang":
        return [program, "launch", "--host", host, "--port", str(port), "--worker-urls",
                *urls, "--policy", router.policy, "--log-level", "warn"]
    if router.router == "vllm":
        out = [program, "--host", host, "--port", str(port), "--worker-urls", *urls,
               "--policy", router.policy, "--log-level", "warning"]
        if router.needs_kv_events:
            missing = [w.url for w in workers if not w.kv_events]
            if missing:
                raise ValueError(f"{router.name} reads KV events, but these engines publish "
                                 f"none: {', '.join(missing)}")
            for w in workers:
                out += ["--kv-event-source", f"{w.url}={w.kv_events}"]
                if w.kv_events_replay:
                    out += ["--kv-event-replay-source", f"{w.url}={w.kv_events_replay}"]
            out += ["--kv-event-block-size", str(ENGINE_BLOCK_SIZE), "--kv-event-model", model]
        return out
    raise ValueError(f"unknown router {router.router!r}")


def ready(url: str, workers: int) -> bool:
    """Whether the router at ``url`` is up with every one of its ``workers`` healthy (not
    ``/health``: these routers answer it before they have registered them)."""
    try:
        with urllib.request.urlopen(f"{url}/workers", timeout=1.0) as resp:
            listed = json.loads(resp.read()).get("workers", [])
    except (OSError, ValueError):
        return False
    return sum(1 for w in listed if w.get("is_healthy", True)) >= workers


def served_model(engine_url: str, timeout: float = 5.0) -> str:
    """The model an engine serves (the first of its ``/v1/models``): what requests through
    a router that does not rewrite names must carry."""
    with urllib.request.urlopen(f"{engine_url}/v1/models", timeout=timeout) as resp:
        return str(json.loads(resp.read())["data"][0]["id"])


@contextlib.contextmanager
def running(router: ThirdPartyRouter, program: str, workers: Sequence[Worker], model: str,
            workdir: Path, host: str = "127.0.0.1", timeout_s: float = 60.0,
            grace_s: float = 10.0) -> Iterator[str]:
    """Start ``router`` in front of ``workers`` (serving ``model``), wait until it is
    ``ready`` (a ``FleetError`` if it exits first or is not within ``timeout_s``; a
    ``FleetCancelled`` once the ``cancel_scope()`` it runs in is cancelled: Ctrl-C), yield
    its URL; stop it on the way out: SIGTERM, then SIGKILL after ``grace_s`` to it and to
    every process it started (its session's: ``local_fleet.end_session``)."""
    require_isolation()
    port = free_port(host)
    log = workdir / f"{router.router}-{router.policy}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv(router, program, host, port, workers, model), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        url = f"http://{host}:{port}"
        wait_ready(router.name, proc, log, lambda: ready(url, len(workers)), timeout_s,
                   f"at {url}", scope_cancel())
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        end_session(proc, time.monotonic() + grace_s)
