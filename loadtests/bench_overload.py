"""Overload benchmark: a local fleet offered ten times what it can serve.

``python -m loadtests.bench_overload [--factor 10] [--seconds 10]`` starts a local fleet
(simulated engines that sleep their modeled time, so the fleet's capacity is the modeled
GPUs', not this machine's) behind a gateway with admission limits, measures the fleet's
capacity with a closed loop, then offers ``factor`` x that rate as Poisson arrivals and
prints JSON: how many requests were answered and how fast, how many were refused with 429
and how fast, client timeouts, and the gateway's peak resident memory. A gateway that
holds is one whose answered requests (at least ``--answered-share``) arrive within the
client's timeout, whose refusals come at once, and whose memory stays under ``--rss-mb``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from loadtests.json_out import print_json
from loadtests.local_fleet import LocalFleet, LocalFleetSpec

WORDS = ["the", "parties", "agree", "that", "term", "of", "this", "agreement", "shall", "be",
         "five", "years", "and", "either", "party", "may", "end", "it", "with", "notice",
         "in", "writing"]


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class PeakRSS:
    """Samples a process's resident memory every 0.1 s in a thread; ``peak`` in MB."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss_mb(self.pid))


def body(rng: random.Random, words: int, max_tokens: int) -> dict[str, Any]:
    prompt = " ".join(rng.choice(WORDS) for _ in range(words))
    return {"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens}


async def one(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
              timeout_s: float) -> tuple[str, float]:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=payload) as r:
                await r.read()
                outcome = str(r.status)
    except TimeoutError:
        outcome = "timeout"
    except aiohttp.ClientError as exc:
        outcome = f"error:{exc.__class__.__name__}"
    return outcome, time.perf_counter() - started


async def capacity(url: str, seconds: float, concurrency: int, words: int,
                   max_tokens: int) -> float:
    """Completions per second the fleet serves to a closed loop of ``concurrency``."""
    rng = random.Random(1)
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            outcome, _ = await one(session, url, body(rng, words, max_tokens), 120)
            done += outcome == "200"

    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return done / (time.perf_counter() - started)


async def overload(url: str, rate: float, seconds: float, timeout_s: float, words: int,
                   max_tokens: int) -> list[tuple[str, float]]:
    rng = random.Random(2)
    tasks = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        at = 0.0
        while at < seconds:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(
                one(session, url, body(rng, words, max_tokens), timeout_s)))
            at += rng.expovariate(rate)
        return list(await asyncio.gather(*tasks))


def summarize(results: list[tuple[str, float]], timeout_s: float) -> dict[str, Any]:
    ok = sorted(s for o, s in results if o == "200")
    refused = sorted(s for o, s in results if o == "429")
    other: dict[str, int] = {}
    for o, _ in results:
        if o not in ("200", "429"):
            other[o] = other.get(o, 0) + 1
    answered = len(results) - len(refused)  # every request not refused at the door

    def pct(values: list[float], q: float) -> float | None:
        # interpolated between the two nearest ranks, as the load runs' percentiles are
        # (the lower rank alone put p95 of 10 answers on the 9th slowest)
        return round(float(np.percentile(values, 100 * q)), 3) if values else None

    return {
        "sent": len(results), "ok": len(ok), "refused_429": len(refused), "other": other,
        "answered_within_timeout_share": round(len(ok) / answered, 4) if answered else None,
        "ok_latency_s": {"p50": pct(ok, 0.5), "p95": pct(ok, 0.95), "max": pct(ok, 1.0)},
        "refusal_latency_s": {"p50": pct(refused, 0.5), "p99": pct(refused, 0.99)},
        "client_timeout_s": timeout_s,
        "mean_ok_latency_s": round(statistics.fmean(ok), 3) if ok else None,
    }


def run(args: argparse.Namespace, max_in_flight: int) -> dict[str, Any]:
    """One fleet, its capacity, then ``factor`` x that offered."""
    profile = str(Path(__file__).parent / "profiles" / "llama3-8b-l4.yaml")
    spec = LocalFleetSpec(replicas=args.replicas, max_num_seqs=16, profile=profile,
                          kv_cache_gib=4, engine_args=("--model-name", "sim-model"),
                          gateway_config={"limits": {"max_in_flight": max_in_flight}})
    with LocalFleet(spec) as fleet:
        url = f"{fleet.gateway_url}/v1/completions"
        pid = fleet.gateway_pid
        assert pid is not None
        cap = asyncio.run(capacity(url, 6.0, 128, args.words, args.max_tokens))
        rate = args.factor * cap
        with PeakRSS(pid) as rss:
            results = asyncio.run(overload(url, rate, args.seconds, args.timeout, args.words,
                                           args.max_tokens))
    report: dict[str, Any] = {
        "replicas": args.replicas, "max_in_flight": max_in_flight,
        "capacity_rps": round(cap, 2), "offered_rps": round(rate, 2),
        "seconds": args.seconds, **summarize(results, args.timeout),
        "gateway_rss_peak_mb": round(rss.peak, 1), "rss_bound_mb": args.rss_mb,
    }
    share = report["answered_within_timeout_share"]
    refusals = report["refusal_latency_s"]["p99"]
    report["holds"] = bool(share is not None and share >= args.answered_share
                           and report["gateway_rss_peak_mb"] <= args.rss_mb
                           and (refusals is None or refusals < 0.5))
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--factor", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=30.0, help="the client's timeout, s")
    ap.add_argument("--max-in-flight", type=int, nargs="+", default=[64, 100_000],
                    help="the gateway's limits.max_in_flight, one run each (the default "
                         "compares a limit with practically none)")
    ap.add_argument("--words", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rss-mb", type=float, default=300.0)
    ap.add_argument("--answered-share", type=float, default=0.95)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    runs = [run(args, limit) for limit in args.max_in_flight]
    report: dict[str, Any] = {"runs": runs}
    print_json(report, args.json_path)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
