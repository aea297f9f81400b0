"""``kvgate demo``: round robin against prefix affinity on a small local sim fleet.

Starts 8 sim replicas behind the gateway for each policy in turn, replays the scaled
contract library with Locust for ``--duration`` seconds, and prints the engines' token hit
rate and the client-side time to first token; a plot and a Markdown report are saved.
About 2 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadtests.report import table
from loadtests.run import SCALED_CONTRACTS, ProgressLine, RunConfig
from loadtests.run import run as run_load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=45.0, help="seconds per policy")
    parser.add_argument("--replicas", type=int, default=RunConfig().replicas)
    parser.add_argument("--rate", type=float, default=RunConfig().rate, help="target requests/s")
    parser.add_argument("--out", type=Path, default=Path("kvgate-demo"),
                        help="folder for the plot, report and JSON")


def run(args: argparse.Namespace) -> int:
    cfg = RunConfig(policies=("round_robin", "prefix_affinity"), duration_s=args.duration,
                    replicas=args.replicas, rate=args.rate, workload=dict(SCALED_CONTRACTS))
    docs, hot = SCALED_CONTRACTS["num_docs"], SCALED_CONTRACTS["hot_docs"]
    print(f"kvgate demo: {cfg.replicas} simulated Llama-3-8B replicas, a library of {docs} "
          f"contracts ({hot} hot ones get 80% of the questions), {cfg.rate:g} questions/s, "
          f"{cfg.duration_s:g} s per policy.", file=sys.stderr)
    out = run_load(cfg, args.out, args.out / "results.json", ProgressLine())
    print(file=sys.stderr)
    policies = out["policies"]
    print(table(policies))
    rr, pa = policies["round_robin"], policies["prefix_affinity"]
    if rr["token_hit_rate"] > 0:
        print(f"\nprefix_affinity served {pa['token_hit_rate'] / rr['token_hit_rate']:.1f}x "
              f"more prompt tokens from cache and computed "
              f"{rr['prefill_tokens'] - pa['prefill_tokens']:,} fewer prefill tokens.")
    print(f"plot: {args.out / 'hit_rate_ttft.png'}  report: {args.out / 'report.md'}")
    return 0
