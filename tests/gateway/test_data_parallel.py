"""Replicas of several data-parallel ranks behind one API server (vLLM's
``--data-parallel-size``, SGLang's ``--dp-size``): one fleet member per rank, each request
pinned to its rank by ``X-Data-Parallel-Rank``, each rank's load read by its metric label
and its KV events from its own endpoint."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import pytest
import zmq
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.config import HealthConfig, ReplicaConfig, ScrapeConfig, parse_config
from gateway.discovery.config import DNSSourceConfig, ReplicaTemplate
from gateway.discovery.targets import dns_targets
from gateway.fleet import Fleet
from gateway.http_server import bounded_protocol
from gateway.kv_event_subscriber import KVEventSubscriber
from gateway.membership import reconcile
from gateway.monitor import Monitor
from gateway.networks import Networks
from gateway.replica_metrics import parse_metrics, parse_rank_metrics
from gateway.state import build_state
from gateway.tenancy import Partition, Tenancy, TenancyConfig
from policies.config import ConfigError
from policies.kv_index import KVIndex
from tests.support import foreign_vllm as vllm
from tests.support.gateway_harness import ADMIN_TOKEN, AUTH, Gateway, Serve, start_gateway
from tests.support.servers import free_port
from tests.support.waiting import wait_until, wait_until_async

# vLLM's API server with two engines: each sample labelled with its engine (rank)
DP_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 30.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.9
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.1
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
# TYPE kvgate:num_prompt_tokens_waiting gauge
kvgate:num_prompt_tokens_waiting{engine="0"} 50000.0
kvgate:num_prompt_tokens_waiting{engine="1"} 0.0
"""


def test_a_replica_of_n_ranks_is_n_members_with_their_own_event_endpoints() -> None:
    config = parse_config({"replicas": [
        {"id": "big", "url": "http://127.0.0.1:8000", "data_parallel_size": 3,
         "kv_events": "tcp://127.0.0.1:5557", "kv_events_replay": "tcp://127.0.0.1:5600"},
        {"id": "ipc", "url": "http://127.0.0.1:8001", "data_parallel_size": 2,
         "kv_events": "ipc:///tmp/kv"},
        {"id": "one", "url": "http://127.0.0.1:8002"}]})
    members = config.fleet_replicas()
    assert [r.id for r in members] == ["big.dp0", "big.dp1", "big.dp2", "ipc.dp0", "ipc.dp1",
                                       "one"]
    assert [r.kv_events for r in members[:3]] == [
        "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5559"]
    assert [r.kv_events_replay for r in members[:3]] == [
        "tcp://127.0.0.1:5600", "tcp://127.0.0.1:5601", "tcp://127.0.0.1:5602"]
    assert [r.kv_events for r in members[3:5]] == ["ipc:///tmp/kv", "ipc:///tmp/kv_dp1"]
    assert [r.data_parallel_rank for r in members] == [0, 1, 2, 0, 1, None]
    assert {r.url for r in members[:3]} == {"http://127.0.0.1:8000"}
    # a member's config is its own: expanding it again changes nothing
    assert members[1].ranks() == [members[1]]


@pytest.mark.parametrize(("replica", "named"), [
    ({"data_parallel_size": 0}, "data_parallel_size"),
    ({"data_parallel_size": 1000}, "data_parallel_size"),
    ({"id": "a.dp1"}, r"'a\.dp1'"),  # a rank's id, on a replica of none
    ({"data_parallel_size": 4, "kv_events": "tcp://127.0.0.1:65534"}, "65536"),
])
def test_bad_data_parallel_settings_are_refused_naming_them(replica: dict[str, object],
                                                            named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_config({"replicas": [{"id": "a", "url": "http://127.0.0.1:8000", **replica}]})


def test_two_replicas_whose_ranks_would_share_an_id_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"replicas\[1\]\.id 'a' appears twice"):
        parse_config({"replicas": [
            {"id": "a", "url": "http://127.0.0.1:8000", "data_parallel_size": 2},
            {"id": "a", "url": "http://127.0.0.1:8001", "data_parallel_size": 2}]})


@pytest.mark.parametrize(("second", "named"), [
    ({"id": "a"}, r"replicas\[1\]\.id 'a' appears twice"),  # one DELETE, two replicas
    ({"id": "b.dp1", "data_parallel_size": 2, "data_parallel_rank": 1},
     r"replicas\[1\]\.data_parallel_rank is set by the gateway"),
])
def test_a_replica_beside_one_of_ranks_is_refused_where_they_would_mix(
        second: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_config({"replicas": [
            {"id": "a", "url": "http://127.0.0.1:8000", "data_parallel_size": 2},
            {"url": "http://127.0.0.1:8001", **second}]})


def test_a_rank_reads_its_own_samples_of_the_replicas_metrics() -> None:
    busy, idle = parse_rank_metrics(DP_METRICS, 2).snapshots
    assert (busy.running, busy.waiting, busy.queued_tokens) == (8, 30, 50000)
    assert (idle.running, idle.waiting, idle.queued_tokens) == (1, 0, 0)
    assert busy.kv_usage == pytest.approx(0.9)
    assert idle.kv_capacity_tokens == 16000
    whole = parse_metrics(DP_METRICS)  # the replica as one: the sum of its engines
    assert (whole.running, whole.queued_tokens, whole.kv_capacity_tokens) == (9, 50000, 32000)


def test_metrics_that_name_no_rank_are_shared_evenly_by_the_ranks() -> None:
    text = DP_METRICS.replace('engine="1",', "").replace('engine="0",', "")
    text = "\n".join(line for line in text.splitlines() if 'engine="' not in line)
    rank = parse_rank_metrics(text, 2).snapshots[1]
    whole = parse_metrics(text)
    assert rank.running == whole.running // 2
    assert rank.kv_capacity_tokens == whole.kv_capacity_tokens // 2  # type: ignore[operator]
    assert rank.kv_usage == whole.kv_usage


def test_a_partition_naming_a_replica_holds_all_its_ranks() -> None:
    tenancy = Tenancy(TenancyConfig(partitions=[Partition(["t"], ["big"])]), Networks([]))
    own, others = tenancy.allowed("t"), tenancy.allowed("u")
    assert own is not None and others is not None
    assert own("big.dp0") and own("big.dp7") and not own("small")
    assert not others("big.dp3") and others("small")


def _dp_front(seen: list[str | None], scrapes: list[int] | None = None) -> Starlette:
    """vLLM's API server in front of two engines: requests go to the rank their
    ``X-Data-Parallel-Rank`` names; /metrics labels each engine's samples."""
    async def complete(request: Request) -> Response:
        await request.body()
        seen.append(request.headers.get("x-data-parallel-rank"))

        async def events():  # type: ignore[no-untyped-def]
            yield b'data: {"choices":[{"index":0,"text":"ok","finish_reason":null}]}\n\n'
            yield b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}],' \
                  b'"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}\n\n'
            yield b"data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def metrics(request: Request) -> Response:
        if scrapes is not None:
            scrapes.append(1)
        return Response(DP_METRICS.encode(), media_type="text/plain")

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                             Route("/health", health), Route("/v1/models", models),
                             Route("/metrics", metrics)])


def test_requests_go_to_the_idle_rank_pinned_by_its_header(serve: Serve) -> None:
    seen: list[str | None] = []
    front = serve(_dp_front(seen))
    config = parse_config({
        "replicas": [{"id": "dp", "url": front.url, "data_parallel_size": 2}],
        "policy": {"name": "least_load"}, "scrape": {"interval_s": 0.2},
        "admin": {"token": ADMIN_TOKEN, "allow_networks": ["127.0.0.0/8"]}})
    state = build_state(config)
    pair = serve(create_app(config, state), side=create_admin_app(state),
                 http=bounded_protocol(config))
    gw = Gateway(pair.url, pair.port, pair.side_url)
    ranks = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()
    assert sorted(r["id"] for r in ranks["replicas"]) == ["dp.dp0", "dp.dp1"]
    wait_until(lambda: any(r["id"] == "dp.dp0" and r.get("queued_tokens")
                           for r in httpx.get(f"{gw.admin}/admin/replicas",
                                              headers=AUTH).json()["replicas"]),
               10, "rank 0's queue scraped")
    for _ in range(4):
        # a client's own rank header is replaced by the chosen rank's
        r = httpx.post(f"{gw.url}/v1/completions", headers={"X-Data-Parallel-Rank": "0"},
                       json={"model": "m", "prompt": "hello", "stream": True})
        assert r.status_code == 200
        assert r.headers["x-kvgate-replica"] == "dp.dp1"
    assert seen == ["1"] * 4


def test_ranks_join_and_leave_through_the_admin_api_together(serve: Serve) -> None:
    seen: list[str | None] = []
    front = serve(_dp_front(seen))
    gw = start_gateway(serve, [])
    added = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH, json={
        "id": "dp", "url": front.url, "data_parallel_size": 3})
    assert added.status_code == 201, added.text
    assert [r["id"] for r in added.json()["ranks"]] == ["dp.dp0", "dp.dp1", "dp.dp2"]
    again = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH, json={
        "id": "dp", "url": front.url, "data_parallel_size": 3})
    assert again.status_code == 400 and "dp.dp0" in again.text
    # a lone rank, added as one: the gateway sets a rank on its ranks' configs only
    lone = httpx.post(f"{gw.admin}/admin/replicas", headers=AUTH, json={
        "id": "x.dp1", "url": front.url, "data_parallel_size": 2, "data_parallel_rank": 1})
    assert lone.status_code == 400 and lone.json()["error"]["param"] == "data_parallel_rank"
    removed = httpx.delete(f"{gw.admin}/admin/replicas/dp", headers=AUTH)
    assert removed.json() == {"removed": "dp", "ranks": ["dp.dp0", "dp.dp1", "dp.dp2"]}
    assert httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"] == []


async def test_each_ranks_kv_events_come_from_its_own_endpoint() -> None:
    ctx = zmq.Context()
    pubs: list[zmq.Socket[bytes]] = []
    while len(pubs) < 2:  # two ports in a row: rank 0's, then rank 1's
        base = free_port()
        for pub in pubs:
            pub.close()
        pubs = []
        for rank in range(2):
            pub = ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 0)
            try:
                pub.bind(f"tcp://127.0.0.1:{base + rank}")
            except zmq.ZMQError:
                pub.close()
                break
            pubs.append(pub)
    config = ReplicaConfig("dp", "http://127.0.0.1:1", kv_events=f"tcp://127.0.0.1:{base}",
                           data_parallel_size=2)
    fleet = Fleet(config.ranks())
    index = KVIndex(16)
    sub = KVEventSubscriber(fleet, index, reconcile_s=0.05)
    await sub.start()
    chain, other = list(range(32)), list(range(200, 216))
    try:
        on_one = vllm.kv_message(0, [vllm.block_stored([11, 12], None, chain)], rank=1)
        await wait_until_async(
            lambda: index.match([*chain, 1], ["dp.dp0", "dp.dp1"]) == {"dp.dp0": 0,
                                                                        "dp.dp1": 2}, 10,
            "rank 1's blocks under rank 1", retry=lambda: pubs[1].send_multipart(on_one))
        on_zero = vllm.kv_message(0, [vllm.block_stored([21], None, other)])
        await wait_until_async(
            lambda: index.match([*other, 1], ["dp.dp0", "dp.dp1"]) == {"dp.dp0": 1,
                                                                        "dp.dp1": 0}, 10,
            "rank 0's block under rank 0", retry=lambda: pubs[0].send_multipart(on_zero))
        assert index.match([*chain, 1], ["dp.dp0", "dp.dp1"]) == {"dp.dp0": 0, "dp.dp1": 2}
    finally:
        await sub.stop()
        for pub in pubs:
            pub.close()
        ctx.term()


async def test_a_discovered_replica_of_n_ranks_joins_and_leaves_as_n_members() -> None:
    template = ReplicaTemplate(kv_events_port=5557, data_parallel_size=2)
    source = DNSSourceConfig(name="vllm.llm.svc", port=8000, replica=template)
    gw = build_state(parse_config({"replicas": []}))
    wanted = dns_targets(source, ["10.0.0.1"])
    changes = await reconcile(gw, "dns:a", wanted)
    assert changes.added == ("10.0.0.1:8000.dp0", "10.0.0.1:8000.dp1")
    assert [s.config.kv_events for s in gw.fleet] == ["tcp://10.0.0.1:5557",
                                                      "tcp://10.0.0.1:5558"]
    assert [s.pinned for s in gw.fleet] == [{"x-data-parallel-rank": "0"},
                                            {"x-data-parallel-rank": "1"}]
    # found again unchanged: nothing moves; gone: both ranks leave
    assert (await reconcile(gw, "dns:a", dns_targets(source, ["10.0.0.1"]))).added == ()
    changes = await reconcile(gw, "dns:a", {})
    assert changes.removed == ("10.0.0.1:8000.dp0", "10.0.0.1:8000.dp1")


async def test_the_ranks_of_a_replica_share_one_read_of_its_metrics_page(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    scrapes: list[int] = []
    front = serve(_dp_front([], scrapes))
    config = ReplicaConfig("dp", front.url, data_parallel_size=4)
    fleet = Fleet([*config.ranks(), ReplicaConfig("solo", front.url)])
    async with aiohttp.ClientSession() as session:
        monitor = Monitor(fleet, session, HealthConfig(timeout_s=5.0),
                          ScrapeConfig(timeout_s=5.0))
        await monitor.scrape_round()
        await monitor.scrape_round()
    assert len(scrapes) == 4  # the four ranks' page once a round, the other replica's once
    # a server of two engines configured as four: told once
    told = [r.getMessage() for r in caplog.records if "data_parallel_size" in r.getMessage()]
    assert told == ["replica dp: data_parallel_size is 4, but its /metrics name ranks 0, 1: "
                    "set data_parallel_size to its server's --data-parallel-size (--dp-size)"]
    queued = {s.id: s.scraped.queued_tokens for s in fleet if s.scraped is not None}
    # ranks 2 and 3 have no samples on this page (a server of two engines)
    assert queued == {"dp.dp0": 50000, "dp.dp1": 0, "dp.dp2": None, "dp.dp3": None,
                      "solo": 50000}


async def test_a_page_that_names_no_rank_is_no_wrong_size(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    async def metrics(request: Request) -> Response:
        return Response(b"vllm:num_requests_running{model_name=\"m\"} 2.0\n",
                        media_type="text/plain")

    front = serve(Starlette(routes=[Route("/metrics", metrics)]))
    fleet = Fleet(ReplicaConfig("dp", front.url, data_parallel_size=2).ranks())
    caplog.set_level(logging.INFO, logger="kvgate.monitor")
    async with aiohttp.ClientSession() as session:
        await Monitor(fleet, session, HealthConfig(timeout_s=5.0),
                      ScrapeConfig(timeout_s=5.0)).scrape_round()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "replica dp" in r.getMessage()]
    assert said == [(logging.INFO, "replica dp: its /metrics name no data-parallel rank; "
                                   "each of its 2 ranks is given an even share of its counts")]


def test_a_failing_servers_other_ranks_are_tried_after_other_replicas(serve: Serve) -> None:
    async def failing(request: Request) -> Response:
        return JSONResponse({"error": {"message": "engine dead"}}, status_code=500)

    async def ok(request: Request) -> Response:
        return JSONResponse({"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                       "total_tokens": 2}})

    def server(complete: Callable[[Request], Awaitable[Response]]) -> Starlette:
        async def health(request: Request) -> Response:
            return PlainTextResponse("ok")

        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

        return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                                 Route("/health", health), Route("/v1/models", models)])

    broken, fine = serve(server(failing)), serve(server(ok))
    config = parse_config({
        "replicas": [{"id": "dp", "url": broken.url, "data_parallel_size": 2},
                     {"id": "b", "url": fine.url}],
        "policy": {"name": "round_robin"}, "max_attempts": 2,
        "admin": {"token": ADMIN_TOKEN, "allow_networks": ["127.0.0.0/8"]}})
    state = build_state(config)
    gw = serve(create_app(config, state), http=bounded_protocol(config))
    # round robin's turns start at each member in turn, the ranks' included: two ranks of
    # the failing server are never a request's two tries
    for _ in range(3):
        r = httpx.post(f"{gw.url}/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 200, r.text
        assert r.headers["x-kvgate-replica"] == "b"


async def test_a_server_of_ranks_is_probed_once_a_round_for_all_of_them(serve: Serve) -> None:
    asked: list[str] = []
    status = [200]

    async def health(request: Request) -> Response:
        asked.append("/health")
        return PlainTextResponse("ok", status_code=status[0])

    async def models(request: Request) -> Response:
        asked.append("/v1/models")
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    front = serve(Starlette(routes=[Route("/health", health), Route("/v1/models", models)]))
    alone = serve(Starlette(routes=[Route("/health", health), Route("/v1/models", models)]))
    fleet = Fleet([*ReplicaConfig("dp", front.url, data_parallel_size=4).ranks(),
                   ReplicaConfig("one", alone.url)])
    async with aiohttp.ClientSession() as session:
        monitor = Monitor(fleet, session, HealthConfig(timeout_s=5.0, failures_to_eject=1),
                          ScrapeConfig(timeout_s=5.0))
        await monitor.health_round()
        assert sorted(asked) == ["/health", "/health", "/v1/models", "/v1/models"]
        assert all(s.healthy and list(s.model_info) == ["m"] for s in fleet)
        asked.clear()
        status[0] = 503
        await monitor.health_round()
    assert asked == ["/health", "/health"]
    assert not any(s.healthy for s in fleet)


async def test_a_replicas_ranks_join_together_or_not_at_all_near_the_fleets_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.membership

    monkeypatch.setattr(gateway.membership, "MAX_REPLICAS", 5)
    template = ReplicaTemplate(data_parallel_size=2)
    source = DNSSourceConfig(name="vllm.llm.svc", port=8000, replica=template)
    gw = build_state(parse_config({"replicas": []}))
    # 3 servers of 2 ranks, room for 5 members: the third server's ranks wait, both
    changes = await reconcile(gw, "dns:a", dns_targets(source, ["10.0.0.1", "10.0.0.2",
                                                                "10.0.0.3"]))
    assert len(changes.added) == 4
    assert changes.skipped == ("10.0.0.3:8000.dp0", "10.0.0.3:8000.dp1")
    assert sorted(s.id for s in gw.fleet) == [
        "10.0.0.1:8000.dp0", "10.0.0.1:8000.dp1", "10.0.0.2:8000.dp0", "10.0.0.2:8000.dp1"]
