"""``kvgate fleet up|down``: a local fleet of engine replicas behind a gateway.

``kvgate fleet up --replicas 4 --executor sim --policy prefix_affinity`` starts the fleet,
prints the gateway's URL and waits; Ctrl-C stops every process it started. With
``--detach`` it returns once the fleet is ready; ``kvgate fleet down`` stops it later.
The state directory (``--state-dir``, else ``$KVGATE_FLEET_DIR``, else
``/tmp/kvgate-fleet-<uid>``) must be this user's alone (``loadtests.local_fleet``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from engine.eviction import EVICTION_POLICIES
from kvwire.arg_types import positive_float, positive_int
from loadtests.local_fleet import (
    FleetCancelled,
    FleetError,
    LocalFleet,
    LocalFleetSpec,
    stop_recorded,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="fleet_command", required=True)
    up = sub.add_parser("up", help="start a fleet and wait (Ctrl-C stops it)")
    d = LocalFleetSpec()
    up.add_argument("--replicas", type=int, default=d.replicas)
    up.add_argument("--executor", choices=("sim", "torch"), default=d.executor)
    up.add_argument("--policy", default="round_robin", help="policy name (preset defaults)")
    up.add_argument("--profile", default=d.profile, help="sim cost profile name or YAML path")
    up.add_argument("--kv-cache-gib", type=positive_float, default=d.kv_cache_gib)
    up.add_argument("--eviction", choices=EVICTION_POLICIES, default=d.eviction)
    up.add_argument("--max-num-seqs", type=positive_int, default=d.max_num_seqs)
    up.add_argument("--port", type=_port_or_any, default=8000,
                    help="gateway port (0: any free port)")
    up.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for every `kvgate engine` (e.g. --engine-arg=--model "
                         "--engine-arg=DIR for the torch executor)")
    up.add_argument("--detach", action="store_true", help="return once the fleet is ready")
    up.add_argument("--no-kv-events", dest="kv_events", action="store_false",
                    help="the engines publish no KV events (by default they do, and the "
                         "gateway subscribes for the policies that read them: cost, "
                         "kv_events)")
    down = sub.add_parser("down", help="stop the fleet started with --detach")
    for p in (up, down):
        p.add_argument("--state-dir", type=Path, default=None,
                       help="where the fleet's config, logs and state file live")


def _port_or_any(text: str) -> int:
    """A TCP port, or 0 for any free one."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1-65535 (or 0: any free one), "
                                         f"got {value}")
    return value


def _up(args: argparse.Namespace) -> int:
    spec = LocalFleetSpec(replicas=args.replicas, policy={"name": args.policy},
                          executor=args.executor, profile=args.profile,
                          kv_cache_gib=args.kv_cache_gib, eviction=args.eviction,
                          max_num_seqs=args.max_num_seqs, gateway_port=args.port,
                          engine_args=tuple(args.engine_arg), kv_events=args.kv_events)
    try:
        fleet = LocalFleet(spec, args.state_dir)
    except ValueError as exc:  # the spec (--replicas 0, ...)
        print(f"kvgate fleet up: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        fleet.cancel()  # still starting: start stops what it began at its next step

    # Explicit handlers: a shell may start background jobs with SIGINT ignored. SIGHUP (the
    # terminal closed) too, unless ignored (nohup): the fleet's processes run in sessions
    # of their own, which no hangup reaches, and would be left running.
    signals = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signals.append(signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    try:
        fleet.start()
    except FleetCancelled:
        _restore(previous)
        print("kvgate fleet up: stopped before the fleet was ready", file=sys.stderr)
        return 130
    except (FleetError, ValueError) as exc:
        _restore(previous)
        print(f"kvgate fleet up: {exc}", file=sys.stderr)
        return 1
    print(f"gateway {fleet.gateway_url}  (policy {args.policy})")
    for i, url in enumerate(fleet.engine_urls):
        print(f"  r{i} {url}")
    print(f"logs and config in {fleet.dir}")
    if args.detach:
        fleet.detach()
        _restore(previous)
        return 0
    print("Ctrl-C stops the fleet", flush=True)
    try:
        while not stop.wait(0.5):
            if not fleet.alive():
                print("a fleet process exited; stopping the rest", file=sys.stderr)
                return 1
    finally:
        fleet.stop()
        _restore(previous)
    print("fleet stopped")
    return 0


def _restore(handlers: Mapping[signal.Signals, Any]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def run(args: argparse.Namespace) -> int:
    if args.fleet_command == "up":
        return _up(args)
    try:
        stopped = stop_recorded(args.state_dir)
    except FleetError as exc:
        print(f"kvgate fleet down: {exc}", file=sys.stderr)
        return 1
    if not stopped.recorded:
        print("no fleet recorded")
        return 0
    gone = ", ".join(map(str, stopped.gone))
    if stopped.stopped:
        print(f"stopped {stopped.stopped} processes"
              + (f"; those recorded as pids {gone} had already ended" if gone else ""))
    else:
        print("the recorded fleet had already stopped"
              + (f" (none of pids {gone} runs it); " if gone else "; ")
              + "removed its record")
    return 0
