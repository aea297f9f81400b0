"""Load runs on a local fleet: for each policy a fresh fleet, a headless Locust run, and
the engines' own counters scraped before and after.

Usage::

    python -m loadtests.run --scenario contracts --policies round_robin,prefix_affinity \
        --duration 120 --json out.json --report DIR

The default library is the contract library scaled down so two CPU cores can drive it:
400 documents of ~1,500 tokens, 80 hot ones (120k tokens), 8 replicas of a slow GPU
profile (``profiles/llama3-8b-l4.yaml``) with 3 GiB of KV each (24.5k tokens; at most 8
running requests pin ~13k, leaving ~10-14 documents' worth idle): the hot set exceeds one
replica's cache (~6x) and fits the fleet's. At 20 requests/s round robin is busy (~80% of
its prefill capacity). The offline simulator with the same settings predicts the outcome::

    round_robin      token hit 0.13   TTFT p95 1.47 s
    prefix_affinity  token hit 0.54   TTFT p95 0.65 s   (eviction frequency)

``--engine-tokenizer DIR`` gives the replicas a tokenizer of their own (one built with
``python -m kvwire.tokenizer_build --out DIR --vocab-size 16000`` counts about two thirds
of the gateway's tokens), as a fleet the gateway did not set up has. Documents are then
sized in the replicas' tokens (words per token measured on that tokenizer), so the fleet
keeps its shape and only the gateway's count differs: what its token calibration is for.

``--kv-events`` has the engines publish KV events that the gateway subscribes to (for the
policies with an exact index: ``kv_events``, ``cost``); ``--gateways N`` starts N gateway
copies and sends each request to one of them at random, as a Kubernetes Service does.

A policy named ``sglang:cache_aware`` or ``vllm:kv_aware`` (or another policy of SGLang's
or vLLM's router) puts that router in front of the same fleet instead of a gateway, for a
side-by-side run with the same requests (``loadtests.third_party``: run it without
network, under ``unshare -rn``).
The engines' counters give its hit rate, and each engine names itself in its answers
(``kvgate engine --served-by``), which these routers pass on: the replica counts, the tail
by replica and the hot misses' causes are reported for them too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from engine.eviction import EVICTION_POLICIES
from kvwire.arg_types import positive_float, positive_int
from loadtests import engine_counters, third_party
from loadtests.fleet_flags import add_fleet_flags
from loadtests.hot_misses import hot_misses
from loadtests.label_stats import label_token_hit_rates, ttft_tail
from loadtests.local_fleet import (
    ENGINE_BLOCK_SIZE,
    FleetCancelled,
    LocalFleet,
    LocalFleetSpec,
    cancel_on_signals,
)
from loadtests.policy_specs import policy_spec
from loadtests.replica_prompts import replica_tokens_per_word
from loadtests.workloads import build_spec

HERE = Path(__file__).parent
LOCUSTFILE = HERE / "locustfile.py"
L4_PROFILE = str(HERE / "profiles" / "llama3-8b-l4.yaml")
USER_CLASSES = {"contracts": "ContractsUser", "chat": "ChatUser", "tools": "ToolsUser",
                "chat-apps": "ChatAppsUser"}
SCALED_CONTRACTS: dict[str, Any] = {"num_docs": 400, "hot_docs": 80, "doc_tokens": 1500,
                                    "output_tokens": [8, 16]}

Progress = Callable[[str, float, float], None]  # (policy, elapsed s, duration s)


@dataclass(frozen=True, slots=True)
class RunConfig:
    scenario: str = "contracts"
    policies: tuple[str, ...] = ("round_robin", "prefix_affinity")
    duration_s: float = 120.0
    replicas: int = 8
    users: int = 64
    rate: float = 20.0
    profile: str = L4_PROFILE
    kv_cache_gib: float = 3.0
    max_num_seqs: int = 8
    eviction: str = "frequency"
    workload: dict[str, Any] = field(default_factory=lambda: dict(SCALED_CONTRACTS))
    seed: int = 0
    affinity_header: bool = False
    engine_tokenizer: str | None = None  # the replicas' own tokenizer (dir or .json)
    kv_events: bool = False  # the engines publish KV events, the gateway subscribes
    gateways: int = 1  # gateway copies; each request goes to one at random
    peers: bool = False  # ... telling each other what they route (gateway.peers)
    slowdown: tuple[float, ...] = ()  # each engine's device that much slower, r0 first
    # the engines' usage tells their cached tokens (else as vLLM's by default: it does not)
    cached_report: bool = True
    # third-party routers' programs by router name (third_party.KINDS), for router:<policy>
    router_programs: dict[str, str] = field(default_factory=dict)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    a = np.asarray(values)
    return {f"p{q}": float(np.percentile(a, q)) for q in (50, 95, 99)}


STREAM_REQUESTS = 200_000  # the workload stream the Locust clients draw from
# after the run's time, how long Locust lets requests in flight finish before it stops
# their clients (those still unanswered then are ``unfinished``)
STOP_TIMEOUT_S = 30


def locust_run_time(duration_s: float) -> str:
    """Locust's ``-t`` for a run of ``duration_s``: whole seconds (``parse_timespan`` takes
    no fractions), to the nearest one. Under 1 s is refused: ``-t 0s`` means no limit."""
    if not 1 <= duration_s < math.inf:  # NaN too
        raise ValueError(f"duration must be a finite number of seconds >= 1 (Locust runs "
                         f"whole seconds, and -t 0s runs without end), got {duration_s!r}")
    return f"{math.floor(duration_s + 0.5)}s"


def duration_seconds(text: str) -> float:
    """argparse type of a run's ``--duration``: seconds, at least 1, rounded to the whole
    second Locust will run (``locust_run_time``)."""
    try:
        value = float(text)
        run_time = locust_run_time(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds >= 1 (Locust runs whole seconds, and 0 would run "
            f"without end), got {text}") from None
    return float(run_time[:-1])  # what Locust will run, as the report says


def _ttft(sample: dict[str, Any]) -> float:
    """A request's time to first token, from when it was due: its own, or for one
    unanswered when the run stopped without a first token (or never sent: every client
    was busy), how long it had waited by then (a lower bound); for one that failed (its
    answer never came whole, whatever came first), how long it had waited when the run
    stopped, as if still unanswered: a router that fails a request fast is not timed as
    one that answered it fast."""
    ttft = sample.get("ttft_s")
    failed = not (sample.get("ok") or sample.get("unfinished") or sample.get("unsent"))
    return float(sample["waited_s"] if failed or ttft is None else ttft)


def _hot_misses(cfg: RunConfig, ok: list[dict[str, Any]]) -> dict[str, dict[str, int]] | None:
    """The contracts scenario's hot misses by cause (``hot_misses``), as the simulator
    reports them, from the answered requests' replicas and cached tokens. A document's
    shared tokens are counted as the engines count them: its chat rendered and tokenized by
    their tokenizer, as the clients sent it."""
    from kvwire.tokenizer import load_tokenizer
    from loadtests.replica_prompts import RenderedPrompts
    from loadtests.workloads import SegmentContent, generate

    known = [s for s in ok if s.get("replica") and s.get("cached_tokens") is not None]
    if cfg.scenario != "contracts" or not known:
        return None
    spec = build_spec("contracts", **{**cfg.workload, "seed": cfg.seed})
    # the stream the clients drew from: which document a request asks for depends on the
    # stream's length, not only on its index
    content = SegmentContent(spec.seed, replica_tokens_per_word(cfg.engine_tokenizer))
    requests = generate(spec, STREAM_REQUESTS, content)
    engines = RenderedPrompts(load_tokenizer(cfg.engine_tokenizer))
    return hot_misses([requests[s["index"]] for s in known],
                      {s["index"]: s["replica"] for s in known},
                      {s["index"]: s["cached_tokens"] for s in known}, ENGINE_BLOCK_SIZE,
                      engines)


def _locust(cfg: RunConfig, urls: tuple[str, ...], workdir: Path, progress: Progress | None,
            policy: str, model: str | None = None) -> Path:
    url = urls[0]
    samples = workdir / f"{policy}.samples.json"
    env = dict(os.environ)
    env.update({
        "KVGATE_WORKLOAD": json.dumps({"params": {**cfg.workload, "seed": cfg.seed},
                                       "requests": STREAM_REQUESTS}),
        "KVGATE_RATE": str(cfg.rate),
        "KVGATE_USERS": str(cfg.users),
        "KVGATE_SAMPLES": str(samples),
        "KVGATE_AFFINITY": "1" if cfg.affinity_header else "0",
        "KVGATE_TOKENS_PER_WORD": str(replica_tokens_per_word(cfg.engine_tokenizer)),
        "KVGATE_HOSTS": json.dumps(list(urls)) if len(urls) > 1 else "",
    })
    if model:
        env["KVGATE_MODEL"] = model
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE),
            USER_CLASSES[cfg.scenario], "--headless", "-u", str(cfg.users),
            "-r", str(cfg.users), "-t", locust_run_time(cfg.duration_s), "--host", url,
            "--stop-timeout", str(STOP_TIMEOUT_S), "--only-summary", "--loglevel", "WARNING",
            "--csv", str(workdir / policy)]
    log = workdir / f"{policy}.locust.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)
        try:
            watch_locust(proc, progress, policy, started, cfg.duration_s)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:  # a Locust that ignores SIGTERM
                    proc.kill()
                    proc.wait()
    if not samples.exists():
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"locust wrote no samples (exit {proc.returncode}):\n{tail}")
    return samples


def watch_locust(proc: subprocess.Popen[bytes], progress: Progress | None, policy: str,
                 started: float, duration_s: float, every_s: float = 0.5) -> None:
    """Reports ``progress`` every ``every_s`` while Locust runs, and once more when it has
    ended: a Ctrl-C at the terminal stops Locust too, often before the next report, and
    that last report is what stops the run (``StoppableProgress``) instead of its cut
    results being written as a whole run's."""
    while True:
        ended = proc.poll() is not None
        if progress:
            progress(policy, time.monotonic() - started, duration_s)
        if ended:
            return
        time.sleep(every_s)


def _kv_event_messages(gateway_url: str) -> int:
    """KV event messages the gateway's index applied (0 when its policy keeps none)."""
    with urllib.request.urlopen(f"{gateway_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "kvgate_kv_event_messages":
            return int(sum(s.value for s in family.samples))
    return 0


def _engine_args(cfg: RunConfig, other: third_party.ThirdPartyRouter | None
                 ) -> tuple[str, ...]:
    """What every engine is started with: its own tokenizer, if given; for a third-party
    router fed by KV events, the form of the events it reads."""
    args: tuple[str, ...] = ("--tokenizer", cfg.engine_tokenizer) if cfg.engine_tokenizer \
        else ()
    if not cfg.cached_report:
        args += ("--no-prompt-tokens-details",)
    if other is not None and other.needs_kv_events:
        args += ("--kv-events-encoding", other.kind.kv_event_encoding)
    return args


def _program(cfg: RunConfig, router: str) -> str:
    """The program of a third-party router: as configured, else found."""
    return third_party.require_program(router, cfg.router_programs.get(router))


def _share(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


def run_policy(cfg: RunConfig, policy: str, workdir: Path,
               progress: Progress | None = None) -> dict[str, Any]:
    """One policy (or a third-party router, ``loadtests.third_party``): fresh fleet, counters
    before, Locust run, counters after."""
    other = third_party.parse(policy)
    spec = LocalFleetSpec(replicas=cfg.replicas,
                          policy={"name": policy} if other else policy_spec(policy),
                          profile=cfg.profile, kv_cache_gib=cfg.kv_cache_gib,
                          max_num_seqs=cfg.max_num_seqs, eviction=cfg.eviction,
                          engine_args=_engine_args(cfg, other),
                          kv_events=cfg.kv_events or bool(other and other.needs_kv_events),
                          gateways=0 if other else cfg.gateways,
                          peers=cfg.peers, slowdown=cfg.slowdown)
    with LocalFleet(spec, workdir / f"fleet-{policy}") as fleet, contextlib.ExitStack() as stack:
        urls, model = tuple(fleet.gateway_urls), None
        if other:
            workers = [third_party.Worker(r["url"], r.get("kv_events"),
                                          r.get("kv_events_replay")) for r in fleet.replicas]
            model = third_party.served_model(fleet.engine_urls[0])
            urls = (stack.enter_context(third_party.running(
                other, _program(cfg, other.router), workers, model, workdir)),)
        before = [engine_counters.scrape(u) for u in fleet.engine_urls]
        samples_path = _locust(cfg, urls, workdir, progress, policy, model)
        after = [engine_counters.scrape(u) for u in fleet.engine_urls]
        kv_messages = [_kv_event_messages(u) for u in fleet.gateway_urls] \
            if cfg.kv_events else []
    counters = engine_counters.deltas(before, after)
    samples = json.loads(samples_path.read_text())
    ok = [s for s in samples if s.get("ok")]
    # sent, but still unanswered when the clients stopped (a router that queued them)
    unfinished = sum(1 for s in samples if s.get("unfinished"))
    # due before the run's end, but never sent: every client was waiting on an answer
    unsent = sum(1 for s in samples if s.get("unsent"))
    # time to first token (from when the request was due) of every request: left out,
    # the unanswered and unsent ones would make a router that queues requests look fast,
    # and the failed ones one that fails them. One unanswered at the end counts with its
    # first token's time, or without one (or never sent) with how long it had waited by
    # then: a lower bound; a failed one with how long it had waited when the run stopped,
    # as one never answered (``ttft_censored``: how many are such lower bounds)
    timed = samples
    censored = sum(1 for s in timed if s.get("ttft_s") is None or not (
        s.get("ok") or s.get("unfinished") or s.get("unsent")))
    ttft = [_ttft(s) for s in timed]
    e2e = [s["e2e_s"] for s in ok]
    replicas = Counter(s.get("replica") for s in ok)
    gateways = Counter(s.get("gateway", 0) for s in ok)
    hot_ttft = [_ttft(s) for s in timed if s.get("label") == "hot"]
    tt, ee, hh = _percentiles(ttft), _percentiles(e2e), _percentiles(hot_ttft)
    return {
        # None where the engines counted no lookup (nothing reached them): not measured
        "token_hit_rate": counters.token_hit_rate,
        "prefill_tokens": counters.prefill_tokens,
        "prompt_tokens": int(counters.total("queries")),
        # what the clients were told (usage): matches the engines unless requests aborted
        "client_prompt_tokens": sum(s.get("prompt_tokens") or 0 for s in ok),
        "client_cached_tokens": sum(s.get("cached_tokens") or 0 for s in ok),
        "requests_ok": len(ok),
        "requests_failed": len(samples) - len(ok) - unfinished - unsent,
        "requests_unfinished": unfinished,
        "requests_unsent": unsent,
        # how late the clients sent requests after their due times (the unsent ones: how
        # late they were at the end): above 0 where every client was waiting on an answer
        # (the offered load then falls short of --rate)
        "send_late_s": _percentiles([s.get("late_s", 0.0) for s in samples]),
        # why they failed: each reason the clients saw (at most 200 characters) and how often
        "failures": dict(Counter(s.get("error") or "unknown" for s in samples
                                 if not (s.get("ok") or s.get("unfinished")
                                         or s.get("unsent"))).most_common(10)),
        "ttft_p50_s": tt["p50"], "ttft_p95_s": tt["p95"], "ttft_p99_s": tt["p99"],
        # of the TTFT values, how many are lower bounds (unanswered with no first token
        # yet, never sent, or failed)
        "ttft_censored": censored,
        "hot_ttft_p95_s": hh["p95"],
        "e2e_p50_s": ee["p50"], "e2e_p95_s": ee["p95"],
        # which replica answered each request (the gateway's header, or the engine's own);
        # where some answer says neither, the engines' counts of finished requests
        "replica_requests": [replicas.get(f"r{i}", 0) for i in range(cfg.replicas)]
        if None not in replicas else [int(r["requests"]) for r in counters.per_replica],
        "gateway_requests": [gateways.get(i, 0) for i in range(cfg.gateways)],
        # per gateway copy: KV event messages its policy's index applied
        "kv_event_messages": kv_messages,
        "replica_prefill_tokens": [int(r["queries"] - r["hits"])
                                   for r in counters.per_replica],
        "routes": dict(Counter(s.get("route") for s in ok)),
        "hot_misses": _hot_misses(cfg, ok),
        # as the simulator's: token hit rate per label (from what each client was told),
        # and the requests at or above the p95 time to first token by label and replica
        "label_token_hit_rates": label_token_hit_rates(
            (s.get("label") or "", s["prompt_tokens"], s.get("cached_tokens") or 0)
            for s in ok if s.get("prompt_tokens")),
        "ttft_tail": ttft_tail([(s.get("label") or "", s.get("replica"), _ttft(s))
                                for s in timed],
                               [f"r{i}" for i in range(cfg.replicas)]),
        "preemptions": int(counters.total("preemptions")),
        # replicas whose counters went back (restarted during the run): they count from
        # their restart
        "replicas_restarted": [f"r{i}" for i in counters.restarted],
        # how much later than their cost model the engine steps ended, as a share of the
        # modeled time: a host too busy for its fleet (every first token that much later)
        "engine_lateness": _share(counters.total("step_late_s"),
                                  counters.total("step_modeled_s")),
        "replica_engine_lateness": [_share(r["step_late_s"], r["step_modeled_s"])
                                    for r in counters.per_replica],
        "ttft_s": ttft,
    }


def check_policies(policies: tuple[str, ...]) -> None:
    """``ValueError`` naming the first entry of ``--policies`` that no run can take: a name
    that is neither a kvgate policy (with settings, ``cost:slow_replica_ratio=null``:
    ``policy_spec``) nor a third-party router's (``router:policy``), settings the policy
    refuses, one named twice (each run's results and files are kept under its name), or
    none at all."""
    from policies.registry import POLICY_NAMES, build_policy

    if not policies:
        raise ValueError("no policy to run: --policies names none")
    seen: set[str] = set()
    for name in policies:
        if name in seen:
            raise ValueError(f"policy {name!r} is named twice in --policies")
        seen.add(name)
        if third_party.parse(name) is not None:
            continue
        spec = policy_spec(name)
        if spec["name"] not in POLICY_NAMES:
            raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)}, "
                             f"or a router's {'|'.join(third_party.KINDS)}:<policy>)")
        build_policy(spec, where=f"--policies {name!r}")  # its settings, checked


def check_config(cfg: RunConfig) -> None:
    """``ValueError`` (or ``ThirdPartyError``) for a setting no run can take, before any
    fleet starts."""
    if cfg.scenario not in USER_CLASSES:
        raise ValueError(f"unknown scenario {cfg.scenario!r} (known: {', '.join(USER_CLASSES)})")
    locust_run_time(cfg.duration_s)  # a duration Locust cannot run: before any fleet starts
    check_policies(cfg.policies)  # a bad name up front, not after the runs before it
    # (a rate of 0 or below had the clients send back to back, reported as its target)
    for key in ("rate", "users", "gateways", "kv_cache_gib", "max_num_seqs"):
        value = getattr(cfg, key)
        if not 0 < value < math.inf:  # NaN too
            raise ValueError(f"{key} must be a positive number, got {value!r}")
    if cfg.peers and cfg.gateways < 2:  # one copy has no peer: nothing would be told
        raise ValueError(f"--peers needs --gateways 2 or more (gateway copies to tell each "
                         f"other what they route), got --gateways {cfg.gateways}")
    LocalFleetSpec(replicas=cfg.replicas, slowdown=cfg.slowdown).validate()
    # the workload the clients will build: a misspelt or impossible --set is named now, not
    # by Locust's traceback once the first policy's fleet has started
    build_spec(cfg.scenario, **{**cfg.workload, "seed": cfg.seed})
    others = [o for o in map(third_party.parse, cfg.policies) if o]
    if others:
        third_party.require_isolation()
        for other in others:
            _program(cfg, other.router)


def run(cfg: RunConfig, report_dir: Path | None = None, json_path: Path | None = None,
        progress: Progress | None = None) -> dict[str, Any]:
    """Every policy in turn; writes the JSON and the Markdown report when asked. A policy
    whose run fails (its fleet or router did not start, Locust wrote nothing) is named in
    ``failed`` with why, and the policies after it still run: one router that does not
    start no longer costs the results of the others. A signal stops the whole run."""
    check_config(cfg)
    results: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-run-") as tmp:
        workdir = Path(tmp)
        for policy in cfg.policies:
            try:
                results[policy] = run_policy(cfg, policy, workdir, progress)
            except (FleetCancelled, Stopped):
                raise
            except Exception as exc:
                if isinstance(progress, StoppableProgress) and progress.stopping:
                    raise  # what the signal broke (Locust, stopped, wrote nothing)
                failed[policy] = f"{type(exc).__name__}: {exc}"[-_FAILURE_CHARS:]
                print(f"\n{policy}: failed, going on with the next policy: "
                      f"{failed[policy]}", file=sys.stderr)
    out = {"scenario": cfg.scenario, "config": asdict(cfg),
           "policies": {k: {kk: vv for kk, vv in v.items() if kk != "ttft_s"}
                        for k, v in results.items()},
           "failed": failed}
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(out, indent=2))
    if report_dir:
        from loadtests.report import write_report

        write_report(report_dir, cfg, results, failed)
    return out


_FAILURE_CHARS = 4000  # of a failed policy's error (a router's output may be long): its end


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = RunConfig()
    parser.add_argument("--scenario", default=d.scenario, choices=sorted(USER_CLASSES))
    parser.add_argument("--policies", default=",".join(d.policies))
    parser.add_argument("--duration", type=duration_seconds, default=d.duration_s,
                        help="seconds per policy (at least 1; Locust runs the nearest whole "
                        "second)")
    parser.add_argument("--replicas", type=positive_int, default=d.replicas)
    parser.add_argument("--users", type=positive_int, default=d.users)
    parser.add_argument("--rate", type=positive_float, default=d.rate, help="target requests/s")
    parser.add_argument("--profile", default=d.profile)
    parser.add_argument("--kv-cache-gib", type=positive_float, default=d.kv_cache_gib)
    add_fleet_flags(parser, "the engines")
    parser.add_argument("--max-num-seqs", type=positive_int, default=d.max_num_seqs)
    parser.add_argument("--eviction", choices=EVICTION_POLICIES, default=d.eviction)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--affinity-header", action="store_true",
                        help="send each request's document id as the affinity key")
    parser.add_argument("--engine-tokenizer", default=None, metavar="DIR",
                        help="the replicas' own tokenizer (default: the gateway's)")
    parser.add_argument("--kv-events", action="store_true",
                        help="the engines publish KV events and the gateway subscribes")
    parser.add_argument("--gateways", type=positive_int, default=d.gateways,
                        help="gateway copies; each request goes to one at random")
    parser.add_argument("--peers", action="store_true",
                        help="the gateway copies tell each other what they route")
    for kind in third_party.KINDS.values():
        parser.add_argument(f"--{kind.program}", dest=f"{kind.name}_program", default=None,
                            metavar="PATH",
                            help=f"the {kind.program} program, for policies named "
                            f"{kind.name}:<policy> (default: ${kind.env}, else PATH); run "
                            "only without network (loadtests.third_party)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="workload parameter over the scaled defaults")
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    parser.add_argument("--report", dest="report_dir", type=Path, default=None)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    from loadtests.simulate import _parse_params

    workload = dict(SCALED_CONTRACTS) if args.scenario == "contracts" else {}
    if args.scenario == "chat-apps":  # it times its own turns: at --rate requests/s
        workload["rate"] = args.rate
    workload.update(_parse_params(args.set))
    return RunConfig(scenario=args.scenario,
                     policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
                     duration_s=args.duration, replicas=args.replicas, users=args.users,
                     rate=args.rate, profile=args.profile, kv_cache_gib=args.kv_cache_gib,
                     max_num_seqs=args.max_num_seqs,
                     eviction=args.eviction, workload=workload, seed=args.seed,
                     affinity_header=args.affinity_header,
                     engine_tokenizer=args.engine_tokenizer, kv_events=args.kv_events,
                     gateways=args.gateways, peers=args.peers, slowdown=args.slowdown,
                     cached_report=args.cached_report,
                     router_programs={
                         name: path for name in third_party.KINDS
                         if (path := getattr(args, f"{name}_program")) is not None})


class ProgressLine:
    """A one-line progress display on stderr, redrawn when the shown second changes."""

    def __init__(self) -> None:
        self._last: tuple[str, int] | None = None

    def __call__(self, policy: str, elapsed: float, duration: float) -> None:
        second = int(min(elapsed, duration))
        if (policy, second) == self._last:
            return
        if self._last is not None and self._last[0] != policy:
            print(file=sys.stderr)
        self._last = (policy, second)
        width = 30
        done = int(width * second / duration) if duration else width
        bar = "#" * done + "." * (width - done)
        tail = "  (draining)" if elapsed >= duration else ""
        print(f"\r{policy:>16} [{bar}] {second:4d}/{duration:.0f} s{tail}", end="",
              file=sys.stderr, flush=True)


class Stopped(Exception):
    """A signal came while the load ran (``StoppableProgress``); raised between the run's
    steps, so that the run stops its Locust clients and its fleet on the way out."""


class StoppableProgress:
    """``progress``, which also stops the load run at its next report once ``cancelled`` is
    set (the run reports twice a second while Locust runs)."""

    def __init__(self, cancelled: threading.Event, progress: Progress | None = None) -> None:
        self._cancelled = cancelled
        self._progress = progress

    @property
    def stopping(self) -> bool:
        """A signal came: the run is being stopped."""
        return self._cancelled.is_set()

    def __call__(self, policy: str, elapsed: float, duration: float) -> None:
        if self._cancelled.is_set():
            raise Stopped
        if self._progress is not None:
            self._progress(policy, elapsed, duration)


def run_stoppably(start: Callable[[StoppableProgress], dict[str, Any]]
                  ) -> dict[str, Any] | None:
    """``start``'s results (it runs a load, reporting progress on a line), or None when a
    signal (Ctrl-C, SIGTERM, the terminal closing) stopped it: the run, its Locust clients
    and its fleet stop on the way out."""
    with cancel_on_signals() as cancelled:
        try:
            out = start(StoppableProgress(cancelled, ProgressLine()))
        except (FleetCancelled, Stopped):
            pass  # what the run started has stopped on the way out
        except RuntimeError:  # Locust, stopped by the same signal, wrote no samples
            if not cancelled.is_set():
                raise
    return None if cancelled.is_set() else out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.run",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:  # a setting no run can take: said before any fleet starts, not a traceback
        cfg = config_from_args(args)
        check_config(cfg)
    except (third_party.ThirdPartyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        out = run_stoppably(lambda progress: run(cfg, args.report_dir, args.json_path,
                                                 progress))
    except third_party.ThirdPartyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if out is None:
        print("\nstopped", file=sys.stderr)
        return 130
    print(file=sys.stderr)
    from loadtests.report import table

    if out["policies"]:
        print(table(out["policies"]))
    for policy, why in out["failed"].items():
        print(f"error: {policy} failed: {why}", file=sys.stderr)
    return 1 if out["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
