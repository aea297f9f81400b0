"""``kvgate demo``: round robin, prefix affinity and cost (the default policy) on a small
local sim fleet.

Starts 8 sim replicas behind the gateway for each policy in turn (publishing KV events, as
kvgate's engine does in ``deploy/``: ``cost`` reads what each caches from them), replays
the scaled contract library with Locust for ``--duration`` seconds, and prints the
engines' token hit rate and the client-side time to first token; a plot and a Markdown
report are saved.
About 4 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvwire.arg_types import positive_float, positive_int
from loadtests.report import table
from loadtests.run import SCALED_CONTRACTS, RunConfig, duration_seconds, run_stoppably
from loadtests.run import run as run_load

DEMO_POLICIES = ("round_robin", "prefix_affinity", "cost")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=duration_seconds, default=45.0,
                        help="seconds per policy (at least 1; Locust runs the nearest whole "
                        "second)")
    parser.add_argument("--replicas", type=positive_int, default=RunConfig().replicas)
    parser.add_argument("--rate", type=positive_float, default=RunConfig().rate,
                        help="target requests/s")
    parser.add_argument("--out", type=Path, default=Path("kvgate-demo"),
                        help="folder for the plot, report and JSON")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def versus_round_robin(name: str, result: dict[str, Any], rr: dict[str, Any]) -> str:
    """One line: how much more of the prompts ``name`` served from cache than round robin,
    the prefill it saved on its own prompt tokens (each run is sent the requests its
    clients were free to send: as many prompt tokens only while neither queues), and its
    p95 time to first token against round robin's."""
    mine, theirs = result["token_hit_rate"], rr["token_hit_rate"]  # None: nothing counted
    if mine is None:
        hits = "token hit rate not measured (its engines counted no cache lookup)"
    elif theirs:
        hits = f"{mine / theirs:.1f}x the cached prompt tokens of round_robin"
    else:
        hits = f"token hit rate {mine:.2f} against round_robin's " + (
            "0.00" if theirs is not None else "not measured")
    # round robin's prefill share of the prompt tokens, on this policy's prompt tokens
    rr_prefill = round(rr["prefill_tokens"] / rr["prompt_tokens"] * result["prompt_tokens"]) \
        if rr["prompt_tokens"] else 0
    return (f"{name}: {hits}, {rr_prefill - result['prefill_tokens']:,} "
            f"fewer prefill tokens on its {result['prompt_tokens']:,} prompt tokens, p95 time "
            f"to first token {_seconds(result['ttft_p95_s'])} against "
            f"{_seconds(rr['ttft_p95_s'])}.")


def demo_config(args: argparse.Namespace) -> RunConfig:
    """The demo's load run: kvgate's engines, publishing their KV events."""
    return RunConfig(policies=DEMO_POLICIES, duration_s=args.duration,
                     replicas=args.replicas, rate=args.rate, workload=dict(SCALED_CONTRACTS),
                     kv_events=True)


def run(args: argparse.Namespace) -> int:
    cfg = demo_config(args)
    try:  # the results go there minutes from now: a folder that cannot be made is named now
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"kvgate demo: --out {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    docs, hot = SCALED_CONTRACTS["num_docs"], SCALED_CONTRACTS["hot_docs"]
    print(f"kvgate demo: {cfg.replicas} simulated Llama-3-8B replicas, a library of {docs} "
          f"contracts ({hot} hot ones get 80% of the questions), {cfg.rate:g} questions/s, "
          f"{cfg.duration_s:g} s per policy.", file=sys.stderr)
    # a signal (Ctrl-C, SIGTERM, the terminal closing) only cancels: a fleet starting stops
    # at its next step, the load at its next progress report
    try:
        out = run_stoppably(lambda progress: run_load(cfg, args.out,
                                                      args.out / "results.json", progress))
    except ValueError as exc:  # a fleet that cannot be built (no replicas, ...)
        print(f"kvgate demo: {exc}", file=sys.stderr)
        return 2
    if out is None:
        print("\nkvgate demo: stopped", file=sys.stderr)
        return 130
    print(file=sys.stderr)
    policies = out["policies"]
    if policies:
        print(table(policies))
    rr = policies.get("round_robin")
    if rr is not None:
        print()
        for name in DEMO_POLICIES[1:]:
            if name in policies:
                print(versus_round_robin(name, policies[name], rr))
    for name, why in out["failed"].items():
        print(f"kvgate demo: {name} failed: {why}", file=sys.stderr)
    if policies:
        print(f"plot: {args.out / 'hit_rate_ttft.png'}  report: {args.out / 'report.md'}")
    return 1 if out["failed"] else 0
