"""Proxy overhead on loopback: a fast fake backend directly, then through the gateway.

    python -m loadtests.bench_proxy --json out.json [--seconds 5]

Runs, in one go and on the same load generator, 6,000-token completion requests against
(1) the backend directly, (2) the gateway with ``round_robin``, (3) the gateway with
``prefix_affinity``, at 1 and 32 concurrent connections, and (4) a minimal pass-through
proxy over httpx, aiohttp and the gateway's own client (``client_httpx``,
``client_aiohttp``, ``client_kvgate``: how the gateway's upstream client was chosen); then
times prefix_affinity's routing decision on the gateway's request builder in process, and
the CPU that tokenizing the first 1,024 tokens of a new document costs when calls come
back to back and 10 ms apart (``prefix_tokenize_cpu_ms``: what a token-keyed policy pays).
``cpu_ms_per_request`` is the gateway's CPU per request per policy at a fixed offered rate
(``gateway_cpu``); ``cpu_ms_per_request_floor`` is the same for minimal streaming
pass-throughs on the same server, which route, count and log nothing: over the gateway's
own client (the floor under the gateway) and over aiohttp's. Both are medians of
``--cpu-rounds`` rounds that alternate the order, policies then floors and then all in
reverse (``cpu_ms_per_request_by_round``: each round's; one run of a few seconds varies by
a fifth here).
Each server runs in its own process; compare the figures as ratios. The throughput
measurements run in ``--rounds`` rounds: each target's figures are its median round's, each
ratio the median of the ratios within a round (``c32_rps_by_round`` has every round's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from loadtests.gateway_cpu import SCENARIOS, cpu_ms_per_request, documents
from loadtests.json_out import print_json
from loadtests.policy_specs import policy_spec

BACKEND_REPLY = json.dumps({
    "id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 6000, "completion_tokens": 1, "total_tokens": 6001},
}).encode()
STREAM_CHUNKS = 10  # SSE events of a streamed answer, a token each, then usage and [DONE]


def _sse_token(finish_reason: str | None) -> bytes:
    return b"data: " + json.dumps({
        "id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "text": " ok", "finish_reason": finish_reason}]}).encode() \
        + b"\n\n"


# the last token's event tells the finish reason, as vLLM's does
_SSE_TOKEN, _SSE_LAST_TOKEN = _sse_token(None), _sse_token("length")
_SSE_END = b"data: " + json.dumps({
    "id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
    "choices": [], "usage": {"prompt_tokens": 6000, "completion_tokens": STREAM_CHUNKS,
                             "total_tokens": 6000 + STREAM_CHUNKS}}).encode() \
    + b"\n\ndata: [DONE]\n\n"


async def backend_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The fastest honest backend: reads the body, answers a fixed completion."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    more = True
    tail = b""  # the body's last bytes: a streamed request says so there (bodies() below)
    while more:
        message = await receive()
        tail = (tail + message.get("body", b""))[-32:]
        more = message.get("more_body", False)
    if b'"stream": true' in tail:
        await _stream(send)
        return
    if path == "/v1/models":
        body = b'{"object":"list","data":[{"id":"bench","object":"model"}]}'
    elif path in ("/health", "/metrics"):
        body = b""
    else:
        body = BACKEND_REPLY
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def _stream(send: Any) -> None:
    """A streamed answer: ``STREAM_CHUNKS`` token events a millisecond apart (so the
    gateway relays them as separate chunks, as it would an engine's), then usage."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for i in range(STREAM_CHUNKS):
        token = _SSE_LAST_TOKEN if i == STREAM_CHUNKS - 1 else _SSE_TOKEN
        await send({"type": "http.response.body", "body": token, "more_body": True})
        await asyncio.sleep(0.001)
    await send({"type": "http.response.body", "body": _SSE_END})


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def uvicorn_app(app: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """Serve the ASGI ``app`` ("module:attr") on a free loopback port in its own process,
    on the gateway's own server stack; returns the process and its base URL."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", app, "--port", str(port), "--loop", "uvloop",
         "--http", "httptools", "--log-level", "warning", "--no-access-log"], env=env)
    return proc, f"http://127.0.0.1:{port}"


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def _wait_post(url: str, body: bytes, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


async def _load(url: str, bodies: list[bytes], concurrency: int, seconds: float
                ) -> dict[str, float]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker(offset: int) -> None:
            i = offset
            while time.perf_counter() < stop_at:
                i += 1
                t0 = time.perf_counter()
                async with session.post(url, data=bodies[i % len(bodies)],
                                        headers={"content-type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url} answered {r.status}")
                latencies.append(time.perf_counter() - t0)

        warm_until = time.perf_counter() + 0.5
        n = 0
        while time.perf_counter() < warm_until:  # warm connections and caches
            n += 1
            async with session.post(url, data=bodies[n % len(bodies)]) as r:
                await r.read()
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        await asyncio.gather(*(worker(7 * c) for c in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {"rps": round(len(latencies) / elapsed, 1),
            "p50_ms": round(1000 * statistics.median(latencies), 3),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 3)}


def _throughput_rounds(targets: dict[str, str], bodies: list[bytes],
                       args: argparse.Namespace) -> list[dict[str, dict[str, Any]]]:
    """``args.rounds`` rounds of every target at 1 and 32 connections, in turn (each round
    in the other order from the last): this machine's speed drifts between measurements
    (the direct backend's c32 figure moved from 4,437 to 9,241 requests/s between two runs
    made one after the other), so a ratio is taken within a round."""
    rounds: list[dict[str, dict[str, Any]]] = []
    for k in range(args.rounds):
        names = list(targets) if k % 2 == 0 else list(reversed(targets))
        measured: dict[str, dict[str, Any]] = {}
        for name in names:
            measured[name] = {}
            for conc in (1, 32):
                measured[name][f"c{conc}"] = asyncio.run(
                    _load(f"{targets[name]}/v1/completions", bodies, conc, args.seconds))
                print(f"round {k}", name, conc, measured[name][f"c{conc}"], file=sys.stderr)
        rounds.append(measured)
    return rounds


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run of median requests/s (its figures kept together; the lower middle one of an
    even count)."""
    return sorted(runs, key=lambda run: run["rps"])[(len(runs) - 1) // 2]


def ratios_by_round(rps: dict[str, list[float]], names: tuple[str, ...]) -> dict[str, float]:
    """Per name, the median over rounds of its c32 requests/s over the direct backend's in
    the same round (``rps``: each target's figure per round, ``direct`` among them)."""
    direct = rps["direct"]
    return {name: round(statistics.median(
        mine / base for mine, base in zip(rps[name], direct, strict=True)), 3)
        for name in names}


def _route_decision_ms(prompts: list[str]) -> dict[str, float]:
    """Wall milliseconds of prefix_affinity's decision on the gateway's path: the request
    built by the gateway's own builder (from the prompt text), then ``choose``."""
    from gateway.fleet import Fleet
    from gateway.request_parse import ParsedRequest
    from gateway.routing import Router
    from kvwire.tokenizer import load_tokenizer
    from policies.base import ReplicaView
    from policies.registry import build_policy

    policy = build_policy({"name": "prefix_affinity", "prefix_tokens": 1024})
    router = Router(policy, load_tokenizer(), Fleet([]), 1)
    views = [ReplicaView(id=f"r{i}", queued_tokens=1000 * i) for i in range(8)]
    samples = []
    try:
        for i in range(400):
            text = prompts[i % len(prompts)]
            t0 = time.perf_counter()
            parsed = ParsedRequest("completions", {}, "bench", True, text, None, None, None,
                                   None)
            policy.choose(router.build(parsed), views)
            samples.append(time.perf_counter() - t0)
    finally:
        router.close()
    samples.sort()
    return {"p50": round(1000 * statistics.median(samples), 3),
            "p99": round(1000 * samples[int(0.99 * (len(samples) - 1))], 3)}


def _prefix_tokenize_ms(prompts: list[str]) -> dict[str, float]:
    """CPU milliseconds (median) to encode the first 1,024 tokens of a new document, calls
    back to back and 10 ms apart (as at 100 requests/s): on a shared machine the second is
    the slower, caches gone cold between calls, and it is what a gateway at that rate
    pays."""
    from kvwire.tokenizer import load_tokenizer

    tok = load_tokenizer()
    texts = documents(len(prompts) * 3, seed=17)
    tok.encode_prefix(texts[0], 1024)
    out = {}
    for name, gap_s in (("back_to_back", 0.0), ("spaced_10ms", 0.01)):
        samples = []
        for text in texts[: len(texts) // 2] if gap_s == 0 else texts[len(texts) // 2:]:
            t0 = time.process_time()
            tok.encode_prefix(text, 1024)
            samples.append(time.process_time() - t0)
            if gap_s:
                time.sleep(gap_s)
        out[name] = round(1000 * statistics.median(samples), 3)
    return out


def _start_gateway(tmp: str, policy: str, backend: str, workers: int, env: dict[str, str]
                   ) -> tuple[subprocess.Popen[bytes], str]:
    """A gateway for the ``policy_spec`` ``policy`` in front of ``backend``."""
    port = _free_port()
    cfg = Path(tmp) / f"{policy}-{workers}.yaml"
    cfg.write_text(yaml.safe_dump({"port": port, "policy": policy_spec(policy),
                                   "replicas": [{"id": "b0", "url": backend}]}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvgate", "--log-level", "WARNING", "serve", "--config",
         str(cfg), "--workers", str(workers)], env=env)
    _wait(f"http://127.0.0.1:{port}/ready", proc)
    return proc, f"http://127.0.0.1:{port}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def _cpu_table(tmp: str, policies: list[str], backend: str, workers: int,
               env: dict[str, str], prompts: list[str], args: argparse.Namespace
               ) -> dict[str, dict[str, float]]:
    """``cpu_ms_per_request`` per policy and scenario, one gateway at a time (alone on
    the machine but for the backend and the load)."""
    table: dict[str, dict[str, float]] = {}
    for policy in policies:
        proc, base = _start_gateway(tmp, policy, backend, workers, env)
        try:
            table[policy] = {scenario: cpu_ms_per_request(
                proc.pid, f"{base}/v1/completions", scenario, prompts, args.rate,
                args.cpu_seconds, workers) for scenario in SCENARIOS}
        finally:
            _stop(proc)
        print("cpu", workers, policy, table[policy], file=sys.stderr)
    return table


def _workers_table(tmp: str, backend: str, counts: tuple[int, int], env: dict[str, str],
                   prompts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """``cpu_ms_per_request`` of each of ``args.worker_policies`` with each worker count,
    measured in ``args.worker_rounds`` rounds that alternate the two (this machine's speed
    drifts by a fifth over minutes: one measurement after the other compares the drift);
    the median per scenario, and each round's figures under ``rounds``."""
    policies = args.worker_policies.split(",")
    rounds: list[dict[str, dict[str, dict[str, float]]]] = []
    for _ in range(args.worker_rounds):
        rounds.append({str(n): _cpu_table(tmp, policies, backend, n, env, prompts, args)
                       for n in counts})
    out: dict[str, Any] = {str(n): {policy: {
        scenario: round(statistics.median(r[str(n)][policy][scenario] for r in rounds), 3)
        for scenario in SCENARIOS} for policy in policies} for n in counts}
    out["rounds"] = rounds
    return out


def median_table(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per name and scenario, the median of the rounds' CPU figures (one run of a few
    seconds varies by a fifth on this machine: a median of alternating rounds tells a
    smaller change)."""
    if not rounds:
        raise ValueError("no rounds to take medians of")
    return {name: {scenario: round(statistics.median(r[name][scenario] for r in rounds), 3)
                   for scenario in scenarios} for name, scenarios in rounds[0].items()}


FLOORS = ("kvgate_client_stream_proxy", "aiohttp_stream_proxy")
FLOOR_APPS = dict(zip(FLOORS, ("kvgate_stream_app", "aiohttp_stream_app"), strict=True))


def _floor_cpu(backend: str, env: dict[str, str], prompts: list[str],
               args: argparse.Namespace, names: tuple[str, ...] = FLOORS
               ) -> dict[str, dict[str, float]]:
    """``cpu_ms_per_request`` of the minimal streaming pass-throughs ``names`` (in that
    order) on the gateway's own server: with its own client
    (``proxy_clients.kvgate_stream_app``, what relaying alone costs the gateway) and with
    aiohttp's (``aiohttp_stream_app``)."""
    out: dict[str, dict[str, float]] = {}
    for name in names:
        proc, base = uvicorn_app(f"loadtests.proxy_clients:{FLOOR_APPS[name]}",
                                 dict(env, BENCH_BACKEND=backend))
        try:
            _wait(f"{base}/health", proc)
            out[name] = {scenario: cpu_ms_per_request(proc.pid, f"{base}/v1/completions",
                                                      scenario, prompts, args.rate,
                                                      args.cpu_seconds)
                         for scenario in SCENARIOS}
        finally:
            _stop(proc)
        print("cpu floor", name, out[name], file=sys.stderr)
    return out


def run_cpu_rounds(policies: list[str], count: int,
                   measure: Callable[[str], dict[str, float]]
                   ) -> list[dict[str, dict[str, float]]]:
    """``count`` rounds of ``measure`` (a target's CPU figures per scenario) over the
    ``policies`` and the ``FLOORS``: the policies then the floors in even rounds, all in
    reverse order in odd rounds, so that a machine whose speed drifts over a round (about
    100 s) favours neither side of a gateway-to-floor ratio. Each round is keyed policies
    first, floors after, whichever order it ran in."""
    targets = [*policies, *FLOORS]
    rounds: list[dict[str, dict[str, float]]] = []
    for i in range(count):
        measured = {name: measure(name) for name in (targets if i % 2 == 0 else targets[::-1])}
        rounds.append({name: measured[name] for name in targets})
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the throughput measurements; ratios are taken within "
                        "a round, then their median")
    parser.add_argument("--workers", type=int, default=1,
                        help="gateway worker processes (kvgate serve --workers)")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="offered requests/s of the CPU-per-request runs")
    parser.add_argument("--cpu-rounds", type=int, default=3,
                        help="rounds of the CPU-per-request runs (policies and floors in "
                             "alternating order): the median per scenario, each round under "
                             "cpu_ms_per_request_by_round")
    parser.add_argument("--cpu-seconds", type=float, default=6.0,
                        help="length of each CPU-per-request run")
    parser.add_argument("--cpu-policies",
                        default="round_robin,prefix_affinity,prefix_affinity:chunk_chars=0,cost",
                        help="policies whose CPU per request is measured (comma-separated; "
                        "name:key=value sets a setting: prefix_affinity:chunk_chars=0 keys "
                        "on token ids, so the gateway tokenizes for it)")
    parser.add_argument("--compare-workers", type=int, default=0, metavar="N",
                        help="also measure --worker-policies' CPU per request with N workers "
                        "against --workers, in alternating rounds "
                        "(cpu_ms_per_request_by_workers)")
    parser.add_argument("--worker-policies", default="prefix_affinity",
                        help="the policies of the --compare-workers measurement "
                        "(comma-separated)")
    parser.add_argument("--worker-rounds", type=int, default=3,
                        help="rounds of the --compare-workers measurement")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.cpu_rounds < 1:
        parser.error(f"--cpu-rounds must be >= 1, got {args.cpu_rounds}")

    prompts = documents(64)
    # different documents, so routing sees distinct prefixes as in production
    bodies = [json.dumps({"model": "bench", "prompt": p, "max_tokens": 1}).encode()
              for p in prompts]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {"workers": args.workers}
    try:
        proc, direct = uvicorn_app("loadtests.bench_proxy:backend_app", env)
        procs.append(proc)
        _wait(f"{direct}/health", proc)
        targets = {"direct": direct}
        # the upstream client choice: the same minimal proxy over each client
        for client in ("httpx", "aiohttp", "kvgate"):
            proc, targets[f"client_{client}"] = uvicorn_app(
                f"loadtests.proxy_clients:{client}_app", dict(env, BENCH_BACKEND=direct))
            procs.append(proc)
        with tempfile.TemporaryDirectory() as tmp:
            for policy in ("round_robin", "prefix_affinity"):
                proc, targets[f"gateway_{policy}"] = _start_gateway(
                    tmp, policy, targets["direct"], args.workers, env)
                procs.append(proc)
            for client in ("httpx", "aiohttp", "kvgate"):
                _wait_post(f"{targets[f'client_{client}']}/v1/completions", bodies[0])
            rounds = _throughput_rounds(targets, bodies, args)
            for name in targets:
                results[name] = {conc: _median_run([r[name][conc] for r in rounds])
                                 for conc in ("c1", "c32")}
            results["c32_rps_by_round"] = {name: [r[name]["c32"]["rps"] for r in rounds]
                                           for name in targets}
            for proc in procs[4:]:  # the gateways: the CPU runs start their own
                _stop(proc)
            del procs[4:]
            policies = [p for p in args.cpu_policies.split(",") if p]

            def measure(name: str) -> dict[str, float]:
                if name in FLOOR_APPS:
                    return _floor_cpu(targets["direct"], env, prompts, args, (name,))[name]
                return _cpu_table(tmp, [name], targets["direct"], args.workers, env,
                                  prompts, args)[name]

            cpu_rounds = run_cpu_rounds(policies, args.cpu_rounds, measure)
            medians = median_table(cpu_rounds)
            results["cpu_ms_per_request"] = {p: medians[p] for p in policies}
            results["cpu_ms_per_request_floor"] = {f: medians[f] for f in FLOORS}
            results["cpu_ms_per_request_by_round"] = cpu_rounds
            if args.compare_workers:
                results["cpu_ms_per_request_by_workers"] = _workers_table(
                    tmp, targets["direct"], (args.workers, args.compare_workers), env,
                    prompts, args)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)
    results["cpu_offered_rate"] = args.rate
    results["route_decision_ms"] = _route_decision_ms(prompts)
    results["prefix_tokenize_cpu_ms"] = _prefix_tokenize_ms(prompts)
    results["ratios"] = ratios_by_round(
        results["c32_rps_by_round"], ("gateway_round_robin", "gateway_prefix_affinity",
                                          "client_httpx", "client_aiohttp", "client_kvgate"))
    print_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
