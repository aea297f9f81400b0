"""Engine core benchmark: scheduler + KV cache CPU overhead per step, and how many
simulated requests per second one process drives, with the sim executor.

    python -m loadtests.bench_engine --json out/bench_engine.json

Overhead per step = CPU time of ``EngineCore.step`` minus the time inside the executor,
compared with the step's modeled duration (llama3-8b on H100 by default). Prompts are
6,000 tokens. The throughput part replays a contract-library-like stream (shared
documents whose block hashes are memoized, as the offline simulator does, plus a short
question) in virtual time.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from array import array
from pathlib import Path
from typing import Any

from engine.core import EngineConfig, EngineCore
from engine.cost_model import CostModel, load_profile
from engine.executor import Batch, StepResult
from engine.request import SamplingParams
from engine.sim_executor import SimExecutor
from kvwire.block_hashing import block_hashes
from loadtests.json_out import print_json

PROMPT_TOKENS = 6000
BLOCK = 16


class TimedExecutor:
    """Wraps an executor and accumulates the CPU time spent inside it."""

    def __init__(self, inner: SimExecutor) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.eos_token_id = inner.eos_token_id
        self.cpu = 0.0

    def execute(self, batch: Batch) -> StepResult:
        t0 = time.process_time()
        out = self.inner.execute(batch)
        self.cpu += time.process_time() - t0
        return out


def _tokens(rng: random.Random, n: int) -> list[int]:
    """``n`` pseudo-random ids in [259, 4096)."""
    return [259 + x % 3837 for x in array("H", rng.randbytes(2 * n))]


def _core(profile: str, num_blocks: int, max_seqs: int, eviction: str = "lru",
          emit_every_token: bool = True) -> tuple[EngineCore, TimedExecutor]:
    p = load_profile(profile)
    ex = TimedExecutor(SimExecutor(CostModel.from_profile(p), block_size=BLOCK,
                                   token_range=(259, 4096)))
    cfg = EngineConfig(model_id="bench", num_blocks=num_blocks, block_size=BLOCK,
                       eviction=eviction, max_num_seqs=max_seqs,
                       max_num_batched_tokens=8192, max_model_len=8192,
                       emit_every_token=emit_every_token)
    return EngineCore(ex, cfg), ex


def bench_batch(profile: str, batch: int, decode_steps: int, rng: random.Random) -> dict[str, Any]:
    """``batch`` requests of 6,000-token prompts: prefill them, then decode steadily."""
    # Long enough that every request is still decoding once the last prefill is done.
    max_tokens = -(-batch * PROMPT_TOKENS // 8192) + decode_steps + 2
    num_blocks = batch * ((PROMPT_TOKENS + max_tokens) // BLOCK + 2)
    core, ex = _core(profile, num_blocks, batch)
    for i in range(batch):
        prompt = _tokens(rng, PROMPT_TOKENS)
        core.add_request(core.make_request(f"r{i}", prompt, SamplingParams(
            max_tokens=max_tokens, ignore_eos=True)))
    phases: dict[str, list[float]] = {"prefill": [0, 0.0, 0.0], "decode": [0, 0.0, 0.0]}
    while core.has_unfinished():
        phase = "decode" if core.stats.prompt_tokens_waiting == 0 else "prefill"
        ex.cpu = 0.0
        t0 = time.process_time()
        out = core.step(0.0)
        cpu = time.process_time() - t0 - ex.cpu
        if phase == "decode" and out.num_seqs != batch:
            break  # the tail where requests finish: not steady state
        acc = phases[phase]
        acc[0] += 1
        acc[1] += cpu
        acc[2] += out.seconds
    result: dict[str, Any] = {"batch": batch, "prompt_tokens": PROMPT_TOKENS}
    for name, (steps, cpu, modeled) in phases.items():
        if steps:
            result[name] = {
                "steps": int(steps),
                "overhead_ms_per_step": round(cpu / steps * 1e3, 4),
                "modeled_ms_per_step": round(modeled / steps * 1e3, 3),
                "overhead_pct_of_modeled": round(100 * cpu / modeled, 3),
            }
    return result


def bench_throughput(profile: str, num_requests: int, eviction: str, rng: random.Random,
                     rate: float, max_tokens: int) -> dict[str, Any]:
    """Contract-library-like stream in virtual time: 2,000 documents of 6,000 tokens,
    80% of questions on the 250 hottest, memoized document hashes."""
    n_docs, hot = 2000, 250
    doc_cache: dict[int, tuple[list[int], list[bytes]]] = {}
    # 25 GiB of KV for llama3-8b: 12,800 blocks of 16 tokens.
    core, _ = _core(profile, 12800, 256, eviction, emit_every_token=False)
    prep = prep_cpu = 0.0
    arrivals = []
    t = 0.0
    for i in range(num_requests):
        t += rng.expovariate(rate)
        d = rng.randrange(hot) if rng.random() < 0.8 else rng.randrange(hot, n_docs)
        arrivals.append((t, i, d, _tokens(rng, rng.randint(60, 100))))
    wall0 = time.perf_counter()
    cpu0 = time.process_time()
    now = 0.0
    k = 0
    ttfts = []
    while k < len(arrivals) or core.has_unfinished():
        while k < len(arrivals) and arrivals[k][0] <= now:
            at, i, d, question = arrivals[k]
            if d not in doc_cache:
                p0, c0 = time.perf_counter(), time.process_time()
                toks = _tokens(random.Random(d), PROMPT_TOKENS)
                doc_cache[d] = (toks, block_hashes(toks, BLOCK, model_id="bench"))
                prep += time.perf_counter() - p0
                prep_cpu += time.process_time() - c0
            toks, hashes = doc_cache[d]
            tail = block_hashes(question, BLOCK, model_id="bench", parent=hashes[-1])
            req = core.make_request(f"q{i}", toks + question, SamplingParams(
                max_tokens=max_tokens, ignore_eos=True), block_hashes=hashes + tail)
            core.add_request(req, now=at)
            k += 1
        if not core.has_unfinished():
            now = arrivals[k][0]
            continue
        out = core.step(now)
        now += out.seconds
        for o in out.outputs:
            if o.num_output_tokens == 1 and o.first_token_time is not None:
                ttfts.append(o.first_token_time - o.arrival_time)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    s = core.stats
    ttfts.sort()
    return {
        "requests": num_requests,
        "eviction": eviction,
        "arrival_rate_per_s": rate,
        "max_tokens": max_tokens,
        "wall_s": round(wall, 3),
        "doc_generate_and_hash_s": round(prep, 3),
        "requests_per_s": round(num_requests / wall, 1),
        "requests_per_s_excluding_doc_prep": round(num_requests / (wall - prep), 1),
        "cpu_s": round(cpu, 3),
        "requests_per_cpu_s": round(num_requests / cpu, 1),
        "doc_generate_and_hash_cpu_s": round(prep_cpu, 3),
        "requests_per_cpu_s_excluding_doc_prep": round(num_requests / (cpu - prep_cpu), 1),
        "virtual_s": round(now, 2),
        "steps": s.num_steps,
        "token_hit_rate": round(s.prefix_cache_hits / max(1, s.prefix_cache_queries), 4),
        "preemptions": s.num_preemptions,
        "ttft_p50_s": round(ttfts[len(ttfts) // 2], 4) if ttfts else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--batches", default="1,32,256")
    parser.add_argument("--decode-steps", type=int, default=50)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rate", type=float, default=8.0,
                        help="virtual arrivals per second in the throughput run")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    batches = [bench_batch(args.profile, int(b), args.decode_steps, rng)
               for b in args.batches.split(",")]
    throughput = [bench_throughput(args.profile, args.requests, ev, rng, args.rate,
                                   args.max_tokens) for ev in ("lru", "frequency")]
    b32 = next((b for b in batches if b["batch"] == 32), None)
    target = None
    if b32 is not None and "decode" in b32:
        target = {"overhead_pct_at_batch_32": b32["decode"]["overhead_pct_of_modeled"],
                  "limit_pct": 5.0,
                  "met": b32["decode"]["overhead_pct_of_modeled"] <= 5.0
                  and b32.get("prefill", {}).get("overhead_pct_of_modeled", 0) <= 5.0}
    report = {"profile": args.profile, "python": sys.version.split()[0],
              "per_step": batches, "throughput": throughput, "target": target}
    print_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
