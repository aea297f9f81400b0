"""``kvgate plan``: how much cache a fleet has for a workload, and which routing uses it.

Prints the capacity arithmetic (``plan_arithmetic``), then the token hit rate and the
prefill of hot requests per policy from a bounded offline simulation (``simulate``, LRU
engines, the gateway's own request path), and recommends a policy and a replica count::

    kvgate plan --profile llama3-8b-h100 --replicas 8 --idle-kv-gib 25 \
        --docs 2000 --doc-tokens 6000 --hot 250 --hot-share 0.8 [--rate R] [--json]

``--model DIR`` (a ``config.json``) replaces ``--profile``; ``--scenario NAME`` or
``--workload capture.jsonl`` replace the document numbers.

The simulation builds what it is asked to: a fleet of more than ``MAX_SIM_REPLICAS``
replicas or ``MAX_FLEET_BLOCKS`` KV blocks, a library of more than ``MAX_SIM_DOCS``
documents, or documents longer than the model's context are refused (a ``ValueError``
naming the flag and the most it takes) unless ``--sim-requests 0``, which sizes them by
the arithmetic alone.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import yaml

from engine.cost_model import ModelShape, Profile, load_profile
from engine.hf_shape import ModelSizing, sizing_from_dir
from engine.kv_sizing import GIB, window_blocks
from gateway.audit_cli import MAX_LINE_BYTES
from kvwire.arg_types import float_between, non_negative_int, positive_float, positive_int
from loadtests.plan_arithmetic import (
    MIB,
    ROUTING_WINS,
    Arithmetic,
    FleetSize,
    Library,
    arithmetic,
    request_blocks,
)
from loadtests.plan_report import render
from loadtests.plan_simulation import RUNNING_PROMPTS, PolicyFigures, fleet_spec, simulate_policies
from loadtests.plan_workload import PlanWorkload, from_capture, from_numbers, from_scenario
from loadtests.scenarios import SCENARIOS
from loadtests.sim_fleet import MAX_FLEET_BLOCKS
from loadtests.simulate import policy_names

DEFAULT_POLICIES = "round_robin,prefix_affinity,cost"
# a replica's idle KV: more than none, at most 4 TiB (past any server's memory today; the
# simulation keeps a record for every block of it)
IDLE_KV_GIB = float_between(0.0, 4096.0, " GiB", open_low=True)
HIT_RATE_TIE = 0.02  # token hit rates closer than this are a tie, decided by p95 TTFT
# what the simulation builds at most (each replica an engine, each document a weight of
# the generator's draw); --sim-requests 0 sizes any fleet and library by the arithmetic
MAX_SIM_REPLICAS = 1024
MAX_SIM_DOCS = 1_000_000
# a capture line longer than this is skipped, never held whole: one byte to 2^42 MiB
MAX_LINE_MB = float_between(1 / MIB, float(1 << 42), " MiB")
_NO_SIM = "--sim-requests 0 sizes it by the arithmetic alone"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--profile", default=None,
                       help="a model-on-GPU profile (engine/profiles), default llama3-8b-h100")
    model.add_argument("--model", default=None, metavar="DIR",
                       help="a model directory (or file) with a Hugging Face config.json")
    parser.add_argument("--gpu-profile", default="llama3-8b-h100",
                        help="with --model: the profile whose GPU the simulator uses")
    parser.add_argument("--replicas", type=positive_int, default=8)
    parser.add_argument("--idle-kv-gib", type=IDLE_KV_GIB, default=None,
                        help="KV per replica not pinned by running requests, up to 4096 "
                             "(default: the scenario's, else 25)")
    work = parser.add_mutually_exclusive_group()
    work.add_argument("--scenario", choices=sorted(SCENARIOS), default=None)
    work.add_argument("--workload", default=None, metavar="CAPTURE.jsonl",
                      help="a gateway capture: JSON lines with model and body")
    parser.add_argument("--max-line-mb", type=MAX_LINE_MB, default=MAX_LINE_BYTES / MIB,
                        help="with --workload: skip (and count) a line longer than this, "
                             "never holding it whole (default %(default)g)")
    # a library of numbers, when no --scenario or --workload names one (None: the default)
    parser.add_argument("--docs", type=positive_int, default=None, help="default 2000")
    parser.add_argument("--doc-tokens", type=positive_int, default=None, help="default 6000")
    parser.add_argument("--hot", type=positive_int, default=None,
                        help="documents in the hot set (default 250)")
    parser.add_argument("--hot-share", type=float_between(0.0, 1.0), default=0.8,
                        help="share of requests to the hot set (of a contracts scenario's "
                             "too; the hot set of a capture or another scenario is the "
                             "fewest documents that receive this share)")
    parser.add_argument("--rate", type=positive_float, default=None,
                        help="requests/s to the fleet (default: the workload's per-replica "
                             "rate x replicas)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer.json (or its directory) for a capture; default: the "
                             "--model directory's, else the gateway's built-in one")
    parser.add_argument("--policies", default=DEFAULT_POLICIES)
    parser.add_argument("--sim-requests", type=non_negative_int, default=2000,
                        help="requests simulated per policy; 0 skips the simulation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


_LIBRARY_FLAGS = (("--docs", "docs", 2000), ("--doc-tokens", "doc_tokens", 6000),
                  ("--hot", "hot", 250))


def _workload(args: argparse.Namespace) -> PlanWorkload:
    given = [flag for flag, name, _ in _LIBRARY_FLAGS if getattr(args, name) is not None]
    if given and (args.scenario or args.workload):
        source = f"--scenario {args.scenario}" if args.scenario else "--workload"
        raise ValueError(f"{', '.join(given)} describe a library of their own: {source} "
                         "brings its documents; give one or the other")
    if args.scenario:
        # the fleet's rate, which a workload timing its own arrivals (chat-apps) is drawn at
        rate = args.rate if args.rate is not None else \
            SCENARIOS[args.scenario].rate / 8 * args.replicas
        return from_scenario(args.scenario, args.hot_share, args.sim_requests, args.seed,
                             rate)
    if args.workload:
        from kvwire.tokenizer import load_tokenizer

        source = args.tokenizer
        if source is None and args.model and (Path(args.model) / "tokenizer.json").is_file():
            source = args.model
        return from_capture(args.workload, load_tokenizer(source), args.hot_share,
                            args.sim_requests, seed=args.seed,
                            max_line_bytes=max(1, int(args.max_line_mb * MIB)))
    docs, doc_tokens, hot = (default if getattr(args, name) is None else getattr(args, name)
                             for _, name, default in _LIBRARY_FLAGS)
    if args.sim_requests and docs > MAX_SIM_DOCS:  # the generator weighs each document
        raise ValueError(f"--docs {docs}: the simulation draws from at most "
                         f"{MAX_SIM_DOCS:,} documents; {_NO_SIM}")
    return from_numbers(docs, doc_tokens, hot, args.hot_share, args.sim_requests, args.seed)


def _check_simulation(args: argparse.Namespace, work: PlanWorkload, profile: str,
                      context: int, idle: float, bytes_per_request: int) -> None:
    """``ValueError`` naming the flag, before anything is built, where the simulation
    would be asked for more than it builds (see the module): documents with their
    questions longer than the model's context, or more KV blocks than
    ``MAX_FLEET_BLOCKS`` (``context``: the profile's model's, in tokens)."""
    request_tokens = work.library.doc_tokens + work.library.tail_tokens
    if not (args.scenario or args.workload) and request_tokens >= context:
        raise ValueError(f"--doc-tokens {work.library.doc_tokens:.0f}: a document with its "
                         f"question (~{request_tokens:,.0f} tokens) is longer than the "
                         f"model's context of {context:,} tokens, which the simulated "
                         f"engines refuse; {_NO_SIM}")
    spec = fleet_spec(work, profile, args.replicas, idle, bytes_per_request)
    per_replica, idle_blocks = spec.blocks(spec.kv_pool_gib), spec.blocks(idle)
    if args.replicas * per_replica <= MAX_FLEET_BLOCKS:
        return
    # [0, idle_blocks) the idle KV, [idle_blocks, per_replica) the running requests'
    most = [f"--replicas {MAX_FLEET_BLOCKS // per_replica:,}"] \
        if per_replica <= MAX_FLEET_BLOCKS else []
    idle_most = (MAX_FLEET_BLOCKS // args.replicas - (per_replica - idle_blocks)) * \
        spec.kv_bytes_per_token() * spec.block_size / GIB
    if idle_most > 0:  # rounded down to 4 digits: never past the most
        step = 10.0 ** (math.floor(math.log10(idle_most)) - 3)
        most.append(f"--idle-kv-gib {math.floor(idle_most / step) * step:.4g}")
    running = f"{RUNNING_PROMPTS} prompts" if work.scenario is None else "requests"
    raise ValueError(
        f"--replicas {args.replicas} x --idle-kv-gib {idle:g} (and room for {running} "
        f"running): {args.replicas * per_replica:,} KV blocks for the simulation to keep, "
        f"more than its {MAX_FLEET_BLOCKS:,}"
        + (f"; at most {' or '.join(most)} here" if most else "") + f"; {_NO_SIM}")


def _load_profile(name: str, flag: str) -> Profile:
    """``load_profile``, a file that is no text (``UnicodeDecodeError``) a ``ValueError``
    naming ``flag`` and the file."""
    try:
        return load_profile(name)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{flag} {name}: not a profile ({exc})") from None


def model_profile(model: str, gpu_profile: str, folder: Path) -> tuple[str, ModelSizing]:
    """The profile the simulator runs for ``--model``: the model's shape (a ``config.json``
    read by ``sizing_from_dir``) on ``gpu_profile``'s GPU, written to
    ``folder/model.yaml``; its path and the model's sizing (its weights' memory and what it
    assumed)."""
    sizing = sizing_from_dir(model)
    gpu = _load_profile(gpu_profile, "--gpu-profile").gpu
    path = folder / "model.yaml"
    path.write_text(yaml.safe_dump({"name": sizing.shape.name,
                                    "model": asdict(sizing.shape), "gpu": asdict(gpu)}))
    return str(path), sizing


def _profile_path(args: argparse.Namespace, work: PlanWorkload,
                  tmp: Path) -> tuple[str, ModelSizing | None]:
    """The profile the simulator runs: named, the scenario's, or ``--model``'s
    (``model_profile``, written to ``tmp``) with its sizing."""
    if args.model is None:
        return args.profile or (work.scenario.profile if work.scenario
                                else "llama3-8b-h100"), None
    return model_profile(args.model, args.gpu_profile, tmp)


def _notes(shape: ModelShape, library: Library, block_size: int, numbers: Arithmetic,
           every_layer: Arithmetic) -> list[str]:
    """What the figures assume for this model: its sliding-window layers' KV kept to their
    window (``numbers``), against every layer's in full (``every_layer``, what the
    simulation's engines keep)."""
    if not shape.sliding_window_layers or shape.sliding_window is None:
        return []
    blocks = request_blocks(library, block_size)
    kept = window_blocks(blocks, shape.sliding_window, block_size)
    return [f"{shape.sliding_window_layers} of {shape.num_layers} layers attend within a "
            f"sliding window of {shape.sliding_window:,} tokens: the figures keep "
            f"{kept:,} of a request's {blocks:,} blocks of {block_size} tokens in those "
            "layers (the window's, and one more where it starts within a block), as vLLM's "
            "hybrid KV cache manager does (a longer prefix whose last window is cached is "
            f"still reused): a document with its question takes "
            f"{numbers.bytes_per_request / MIB:,.0f} MiB. With "
            "--disable-hybrid-kv-cache-manager every layer keeps every block: "
            f"{every_layer.bytes_per_request / MIB:,.0f} MiB, "
            f"{every_layer.docs_per_replica:,} documents a replica. The simulation keeps "
            "every layer in full too: the policies' simulated hit rates and times to first "
            "token, hot_prefill_reduction_simulated (hot_prefill_reduction where simulated) "
            "and the policy recommended from them are figures of "
            f"{every_layer.docs_per_replica:,} documents a replica; docs_per_replica, "
            "replicas_for_hot_set, the verdict, hot_prefill_reduction_arithmetic and the "
            f"replica count recommended, of {numbers.docs_per_replica:,} (the window "
            "layers kept to their window)"]


def _skipped_note(work: PlanWorkload) -> list[str]:
    """What a capture's skipped lines were: how many, the first and why."""
    skipped = work.skipped
    if not skipped.count:
        return []
    return [f"{skipped.count:,} lines of the capture gave no prompt and were skipped; the "
            f"first, {skipped.first()}"]


def _has_windows(shape: ModelShape) -> bool:
    """Whether some of ``shape``'s layers attend within a sliding window."""
    return bool(shape.sliding_window_layers) and shape.sliding_window is not None


def _recommend(plan: dict[str, Any], figures: dict[str, PolicyFigures], replicas: int,
               simulated_docs: int | None = None) -> dict[str, Any]:
    """The policy (from ``figures``, else the arithmetic) and replica count (from the
    arithmetic, ``plan``'s) to run. ``simulated_docs``: the documents a replica held in
    the simulation where that is not the arithmetic's ``docs_per_replica`` (a model with
    sliding-window layers, which the simulation keeps in full); both are said."""
    if figures:
        # hit rates this close are the same within a short run's noise: then the tail
        top = max(f.token_hit_rate for f in figures.values())
        near = [n for n, f in figures.items() if f.token_hit_rate >= top - HIT_RATE_TIE]
        best = min(near, key=lambda n: figures[n].ttft_p95_s)
        held = "" if simulated_docs is None else \
            f" (simulated with every layer's KV in full: {simulated_docs} documents a replica)"
        why = (f"simulated token hit rate {figures[best].token_hit_rate:.2f} (best "
               f"{top:.2f}) and p95 time to first token {figures[best].ttft_p95_s:.2f} s, "
               f"the lowest of the policies within {HIT_RATE_TIE} of the best hit rate"
               f"{held}")
    else:
        best = "cost" if plan["verdict"] == ROUTING_WINS else "least_load"
        why = "from the arithmetic (no simulation)"
    need, docs = plan["replicas_for_hot_set"], plan["docs_per_replica"]
    each = f"{docs} documents each" if simulated_docs is None else \
        f"{docs} documents each, the window layers kept to their window"
    if need is None:
        count, fit = replicas, "no replica's idle KV holds one document: add KV first"
    elif need > replicas:
        count, fit = need, f"the hot set needs {need} replicas' idle KV ({each})"
    else:
        held = "" if simulated_docs is None else f" ({each})"
        count, fit = replicas, (f"{need} replicas' idle KV hold the hot set{held}; the "
                                "others carry load and the cold documents")
    return {"policy": best, "replicas": count, "why": f"{why}; {fit}"}


def _policy_names(names_csv: str) -> list[str]:
    """``--policies``' names, each built once: a ``ValueError`` naming a misspelt one
    before the workload is made or any policy simulated."""
    try:
        return policy_names(names_csv)[0]
    except ValueError as exc:  # policies' ConfigError is one
        raise ValueError(f"--policies {names_csv}: {exc}") from None


def build_plan(args: argparse.Namespace) -> dict[str, Any]:
    policies = _policy_names(args.policies)
    simulating = bool(policies) and args.sim_requests > 0
    if simulating and args.replicas > MAX_SIM_REPLICAS:  # each an engine of its own
        raise ValueError(f"--replicas {args.replicas}: the simulation builds at most "
                         f"{MAX_SIM_REPLICAS:,} replicas; {_NO_SIM}")
    work = _workload(args)
    scenario = work.scenario
    idle = args.idle_kv_gib if args.idle_kv_gib is not None else (
        scenario.idle_kv_gib if scenario else 25.0)
    rate = args.rate if args.rate is not None else work.rate_per_replica * args.replicas
    with tempfile.TemporaryDirectory(prefix="kvgate-plan-") as tmp:
        profile, sizing = _profile_path(args, work, Path(tmp))
        shape = _load_profile(profile, "--profile").model
        fleet = FleetSize(shape.kv_bytes_per_token, idle, args.replicas)
        every_layer = arithmetic(work.library, fleet)
        # sliding-window layers keep only their window's blocks (vLLM's hybrid KV cache
        # manager); the simulated engines keep every layer in full
        numbers = arithmetic(work.library, replace(
            fleet, kv_bytes_cached=shape.kv_bytes_cached)) \
            if _has_windows(shape) else every_layer
        simulating = simulating and bool(work.requests)
        if simulating:
            _check_simulation(args, work, profile, shape.max_model_len, idle,
                              every_layer.bytes_per_request)
        figures = simulate_policies(work, policies, profile, args.replicas, idle,
                                    every_layer.bytes_per_request, rate, args.seed) \
            if simulating else {}
    # as the checkpoint stores them (a profile's: its quantization, if any), the bytes the
    # simulator's steps read
    weights = shape.weights
    plan: dict[str, Any] = {
        "model": {"name": shape.name, "num_layers": shape.num_layers,
                  "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
                  "mla_latent_width": shape.mla_latent_width,
                  "params": shape.params, "active_params": shape.active,
                  "weight_bytes": weights.total_bytes,
                  "quantization": weights.method, "quantized_params": weights.quantized,
                  "bytes_per_quantized_param": weights.bytes_per_quantized,
                  "sliding_window": shape.sliding_window,
                  "sliding_window_layers": shape.sliding_window_layers,
                  "dtype_bytes": shape.dtype_bytes, "profile": args.model or profile},
        "fleet": {"replicas": args.replicas, "idle_kv_gib": idle, "arrival_rate": rate},
        "workload": {"source": work.source, "estimated": work.estimated,
                     "hot_docs_seen": work.hot_docs_seen,
                     "skipped_lines": work.skipped.count,
                     "first_skipped_line": work.skipped.first() or None,
                     **asdict(work.library)},
        **asdict(numbers),
        "policies": {name: f.summary() for name, f in figures.items()},
        "notes": [*_skipped_note(work),
                  *(sizing.notes if sizing else ()),
                  *_notes(shape, work.library, fleet.block_size, numbers, every_layer)],
    }
    plan["hot_prefill_reduction_arithmetic"] = numbers.hot_prefill_reduction
    rr, best = figures.get("round_robin"), None
    others = {n: f for n, f in figures.items() if n != "round_robin"}
    # no hot request after the warm-up (a hot share of 0): nothing measured, no ratio
    if rr is not None and others and rr.hot_requests:
        best = min(others, key=lambda n: others[n].hot_prefill_tokens)
        low = others[best].hot_prefill_tokens
        simulated = rr.hot_prefill_tokens / low if low else None  # JSON has no infinity
        plan["hot_prefill_reduction_simulated"] = simulated
        plan["hot_prefill_reduction"] = simulated
    else:
        plan["hot_prefill_reduction_simulated"] = None
        plan["hot_prefill_reduction"] = numbers.hot_prefill_reduction
    plan["hot_prefill_reduction_best_policy"] = best
    plan["recommendation"] = _recommend(
        plan, figures, args.replicas,
        every_layer.docs_per_replica if _has_windows(shape) else None)
    return plan


def run(args: argparse.Namespace) -> int:
    try:
        plan = build_plan(args)
    except (ValueError, OSError) as exc:
        print(f"kvgate plan: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan, indent=2) if args.json else render(plan))
    return 0
