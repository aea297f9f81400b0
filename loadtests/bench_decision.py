"""Benchmark of one routing decision on the gateway's path: build the request from the
prompt text (tokenize or chunk-hash it, as the policy asks) and choose a replica.

    python -m loadtests.bench_decision --json out.json

Each prompt is a fresh document (no tokenizer memo hit) of ``--words`` words (~6,000
project-tokenizer tokens at 3,100 words) plus a question; the policy sees 8 replicas and
has routed ``--warmup`` earlier prompts. Figures per policy: wall-clock p50/p99 of
``Router.build`` + ``choose`` in milliseconds, and CPU milliseconds per decision (this
process's CPU time over the decisions), also as cores per 100 decisions per second. Radix
is measured twice: hashing text chunks (its default) and tokenizing the whole prompt
(``chunk_chars: 0``). Compare the figures of one run with each other. ``--chat N`` also
measures N turns of the ``chat-apps`` workload (system prompt, tools and history rendered
by the gateway's chat template first), the figures under ``"chat"``, and again on the
gateway's own path (``Router.route_request`` on an event loop, which renders a small chat
inline and sends a larger one, or one to encode, to the tokenizer pool) under
``"chat_gateway_path"``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

import orjson

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.request_parse import ParsedRequest
from gateway.routing import Router
from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import sample_text
from loadtests.json_out import print_json
from loadtests.workloads import build_spec, generate
from policies.base import Routed
from policies.registry import build_policy, load_preset

VARIANTS: dict[str, dict[str, Any]] = {
    "prefix_affinity": {},
    "cost": {},
    "radix": {},
    "radix_tokens": {"name": "radix", "chunk_chars": 0},
}


def measure(variant: str, bodies: list[ParsedRequest], warmup: int,
            gateway_path: bool = False) -> dict[str, float]:
    """Route ``bodies[:warmup]``, then time the decisions on the rest: ``Router.build``
    on this thread, or with ``gateway_path`` the gateway's ``Router.route_request`` on an
    event loop (the tokenizer pool where it sends work there, the CPU of its threads
    counted)."""
    params = VARIANTS[variant]
    policy = build_policy({**load_preset(params.get("name", variant)), **params})
    fleet = Fleet([ReplicaConfig(f"r{i}", f"http://127.0.0.1:{9000 + i}") for i in range(8)])
    router = Router(policy, load_tokenizer(None, memo_size=2048), fleet, 1)
    timed = bodies[warmup:]

    async def run() -> tuple[list[float], float]:
        for i, body in enumerate(bodies[:warmup]):
            req = router.build(body, now=float(i))
            views = fleet.views()
            policy.observe(Routed(req, policy.choose(req, views).chosen, views))
        wall: list[float] = []
        cpu0 = time.process_time()
        for i, body in enumerate(timed):
            t0 = time.perf_counter()
            req = await router.route_request(body, None) if gateway_path \
                else router.build(body, now=float(warmup + i))
            views = fleet.views()
            chosen = policy.choose(req, views).chosen
            wall.append(time.perf_counter() - t0)
            policy.observe(Routed(req, chosen, views))
        return wall, 1000 * (time.process_time() - cpu0) / len(timed)
    try:
        wall, cpu_ms = asyncio.run(run())
    finally:
        router.close()
    wall.sort()
    return {"p50_ms": round(1000 * statistics.median(wall), 3),
            "p99_ms": round(1000 * wall[int(0.99 * (len(wall) - 1))], 3),
            "cpu_ms_per_decision": round(cpu_ms, 3),
            "cores_per_100_rps": round(cpu_ms / 10, 4)}


def document_bodies(words: int, n: int, seed: int) -> list[ParsedRequest]:
    """``n`` completions, each a fresh document of ``words`` words plus a question."""
    rng = random.Random(seed + words)
    return [ParsedRequest("completions", {}, "m", True,
                          f"{sample_text(rng, words)}\n\nQuestion: {sample_text(rng, 40)}",
                          None, None, None, None) for _ in range(n)]


def chat_bodies(n: int) -> list[ParsedRequest]:
    """The first ``n`` turns of the chat-apps workload, as messages and tools, each with
    the size of the body a client would send them in."""
    out = []
    for r in generate(build_spec("chat-apps"), n):
        messages, tools = r.messages(), r.tools()
        size = len(orjson.dumps({"model": "m", "messages": messages, "tools": tools}))
        out.append(ParsedRequest("chat", {}, "m", True, None, None, messages, None, None,
                                 tools, size))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--words", type=int, nargs="+", default=[3100, 1500],
                    help="document sizes in words (3,100 words: ~6,000 tokens)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chat", type=int, default=300, metavar="N",
                    help="chat-apps turns to measure (0: none)")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"samples": args.samples, "warmup": args.warmup}
    for words in args.words:
        docs = document_bodies(words, args.warmup + args.samples, args.seed)
        figures = {v: measure(v, docs, args.warmup) for v in args.variants}
        out[f"{words}_words"] = figures
        for v, f in figures.items():
            print(f"{words:5d} words {v:16s} {f}", flush=True)
    if args.chat > 0:
        chats = chat_bodies(args.warmup + args.chat)
        out["chat"] = {v: measure(v, chats, args.warmup) for v in args.variants}
        for v, f in out["chat"].items():
            print(f" chat turns {v:16s} {f}", flush=True)
        out["chat_gateway_path"] = {v: measure(v, chats, args.warmup, gateway_path=True)
                                    for v in args.variants}
        for v, f in out["chat_gateway_path"].items():
            print(f" chat turns {v:16s} {f} (gateway path)", flush=True)
    print_json(out, args.json)
    return out


if __name__ == "__main__":
    main()
