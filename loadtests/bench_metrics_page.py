"""How long a ``GET /metrics`` page holds the gateway's event loop, in process.

    python -m loadtests.bench_metrics_page [--replicas 100,1000] [--workers 8] [--json out.json]

For each fleet size, a gateway's metrics with every replica's series in use (three route
reasons answered, one first byte) are written out as a page two ways:
``whole_on_loop_ms`` writes it all on the event loop (``generate_latest`` of
``exposed``); ``page_longest_hold_ms`` is the longest the loop waited between two turns
while ``GatewayMetrics.page`` wrote it (five pages; ``idle_longest_hold_ms``: the same
with no page written, the floor). With ``--workers N`` the first fleet size is measured
again as N worker processes' files (prometheus-client's multiprocess mode: the page sums
every worker's file). Each case runs in a process of its own: the multiprocess mode is
chosen when prometheus-client is imported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.json_out import print_json

PAGES = 5


def _metrics(replicas: int) -> Any:
    from gateway.config import ReplicaConfig
    from gateway.fleet import Fleet
    from gateway.metrics import GatewayMetrics

    fleet = Fleet([ReplicaConfig(f"r{i}", f"http://127.0.0.1:{9000 + i}")
                   for i in range(replicas)])
    metrics = GatewayMetrics(fleet)
    for i in range(replicas):
        for route in metrics.routes[:3]:
            metrics.request_done(f"r{i}", route, "200")
        metrics.first_byte(f"r{i}", 0.1)
    return metrics


async def _longest_hold_s(metrics: Any, pages: int) -> float:
    """The longest gap between two turns of a task that only yields, while ``pages``
    pages are written (none: for as long as five yields of 10 ms)."""
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    if pages:
        for _ in range(pages):
            await metrics.page()
    else:
        for _ in range(5):
            await asyncio.sleep(0.01)
    done = True
    await task
    return max(gaps)


def measure_case(replicas: int, workers: int) -> dict[str, Any]:
    """One case, in this process (``PROMETHEUS_MULTIPROC_DIR`` already set when
    ``workers``): the worker's files are copied to stand for the other workers'."""
    from prometheus_client import generate_latest

    metrics = _metrics(replicas)
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if workers > 1 and folder:
        for path in list(Path(folder).glob("*.db")):
            for worker in range(1, workers):
                shutil.copy(path, path.with_name(f"{path.stem}_{worker}.db"))
    generate_latest(metrics.exposed)  # warm
    start = time.perf_counter()
    size = len(generate_latest(metrics.exposed))
    whole_s = time.perf_counter() - start
    idle_s = asyncio.run(_longest_hold_s(metrics, 0))
    hold_s = asyncio.run(_longest_hold_s(metrics, PAGES))
    return {"replicas": replicas, "workers": workers, "page_bytes": size,
            "whole_on_loop_ms": round(whole_s * 1000, 1),
            "page_longest_hold_ms": round(hold_s * 1000, 1),
            "idle_longest_hold_ms": round(idle_s * 1000, 1)}


def _run_case(replicas: int, workers: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-metrics-") as folder:
        if workers > 1:
            env["PROMETHEUS_MULTIPROC_DIR"] = folder
        done = subprocess.run(
            [sys.executable, "-m", "loadtests.bench_metrics_page", "--case",
             f"{replicas}:{workers}"], env=env, check=True, capture_output=True, text=True,
            timeout=600)
    case: dict[str, Any] = json.loads(done.stdout)
    return case


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--replicas {text!r}: give fleet sizes of 1 or "
                                         "more, separated by commas")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench_metrics_page",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=_sizes, default=[100, 1000])
    parser.add_argument("--workers", type=int, default=8,
                        help="also measure the first fleet size as this many workers' "
                        "files (1: not)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:  # one case, in the process the parent started for it
        replicas, workers = (int(part) for part in args.case.split(":"))
        print(json.dumps(measure_case(replicas, workers)))
        return 0
    if args.workers < 1:
        parser.error(f"--workers must be 1 or more, got {args.workers}")
    cases = [_run_case(n, 1) for n in args.replicas]
    if args.workers > 1:
        cases.append(_run_case(args.replicas[0], args.workers))
    print_json({"pages": PAGES, "cases": cases}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
