"""The admin API's ``/admin/top`` names who holds the gateway's places and waiting slots:
per tenant (None: requests of no tenant) its requests in flight and waiting, the busiest
first, capped with the rest summed; with ``serve --workers N`` every worker's added up.
``/metrics``, open on the client port, still names no tenant, and ``kvgate top`` shows
the busiest in one line."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console

from gateway.admin import create_admin_app
from gateway.admission import SHOWN_TENANTS, Admission, TenantCount
from gateway.app import create_app
from gateway.config import LimitsConfig, parse_config
from gateway.http_server import bounded_protocol
from gateway.shared_load import TenantBoard
from gateway.state import build_state
from gateway.top import frame
from gateway.top_window import TopWindow
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.processes import Processes
from tests.support.servers import ThreadServer, free_port
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
KEYS = {"acme-corp": "keyacmeacmeacmeacme0001", "globex-bank": "keybetabetabetabeta0002",
        None: "keyanonanonanonanon0003"}
ADMIN = "admin-token-for-tests-0123"


def _send(url: str, name: str, key: str, answers: dict[str, int],
          workers: set[str] | None = None) -> threading.Thread:
    def post() -> None:
        got = httpx.post(
            f"{url}/v1/completions", json={"model": "sim-model", "prompt": name},
            headers={"authorization": f"Bearer {key}", "connection": "close"}, timeout=30)
        answers[name] = got.status_code
        if workers is not None:
            workers.add(got.headers.get("x-kvgate-worker", ""))
    thread = threading.Thread(target=post)
    thread.start()
    return thread


def _admission(admin_url: str) -> dict[str, Any]:
    got = httpx.get(f"{admin_url}/admin/top", headers={"authorization": f"Bearer {ADMIN}"})
    assert got.status_code == 200, got.text
    admission: dict[str, Any] = got.json()["admission"]
    return admission


def _tenants(*rows: tuple[str | None, int, int]) -> list[dict[str, Any]]:
    return [{"tenant": t, "in_flight": f, "waiting": w} for t, f, w in rows]


NO_MORE = {"tenants": 0, "in_flight": 0, "waiting": 0}


def test_admin_top_names_the_tenants_holding_and_waiting_for_places(serve: Serve) -> None:
    replica = Behaviour("r0", hold=threading.Event())
    config = parse_config({
        "replicas": [{"id": "r0", "url": serve(fake_replica(replica)).url}],
        "scrape": {"enabled": False},
        "limits": {"max_in_flight": 3, "max_pending": 4, "max_pending_s": 30},
        "auth": {"api_keys": [{"key": key, "tenant": tenant} for tenant, key in KEYS.items()]},
        "admin": {"token": ADMIN},
    })
    state = build_state(config)
    server = serve(create_app(config, state), side=create_admin_app(state),
                   http=bounded_protocol(config, state.refused_by_server))
    assert _admission(server.side_url) == {"in_flight": 0, "waiting": 0, "tenants": [],
                                           "tenants_more": NO_MORE}
    answers: dict[str, int] = {}
    hold = replica.hold
    assert hold is not None
    threads: list[threading.Thread] = []
    try:
        # places: acme twice, an untenanted key once; then acme and globex wait
        for name, tenant in (("a1", "acme-corp"), ("a2", "acme-corp"), ("n1", None)):
            threads.append(_send(server.url, name, KEYS[tenant], answers))
        wait_until(lambda: len(replica.received) == 3, 10, "three requests at the replica")
        for waiting, (name, tenant) in enumerate((("a3", "acme-corp"), ("g1", "globex-bank"),
                                                  ("g2", "globex-bank")), 1):
            threads.append(_send(server.url, name, KEYS[tenant], answers))
            wait_until(lambda w=waiting: state.admission.waiting == w, 10, f"{name} waiting")
        refused = httpx.get(f"{server.side_url}/admin/top")  # the admin token is needed
        assert refused.status_code == 401
        wrong = httpx.get(f"{server.side_url}/admin/top",
                          headers={"authorization": "Bearer not-the-admin-token-000"})
        assert wrong.status_code == 401
        assert "acme" not in refused.text + wrong.text
        assert _admission(server.side_url) == {
            "in_flight": 3, "waiting": 3,
            "tenants": _tenants(("acme-corp", 2, 1), ("globex-bank", 0, 2), (None, 1, 0)),
            "tenants_more": NO_MORE}
        page = httpx.get(f"{server.url}/metrics").text
        assert "acme" not in page and "globex" not in page and 'tenant="' not in page
    finally:
        hold.set()
        for thread in threads:
            thread.join(30)
    assert sorted(answers.values()) == [200] * 6
    assert _admission(server.side_url)["tenants"] == []


def test_admin_top_names_the_busiest_tenants_and_sums_the_rest(serve: Serve) -> None:
    config = parse_config({"replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}],
                           "scrape": {"enabled": False}, "admin": {"token": ADMIN},
                           "limits": {"max_in_flight": 2000}})
    state = build_state(config)
    server = serve(create_app(config, state), side=create_admin_app(state))
    slots = []
    for i in range(SHOWN_TENANTS + 7):  # t00 holds 1 place, t01 2, ...: the last busiest
        for _ in range(i + 1):
            slot = state.admission.enter_now(f"t{i:02d}")
            assert slot is not None
            slots.append(slot)
    got = _admission(server.side_url)
    shown = got["tenants"]
    assert len(shown) == SHOWN_TENANTS
    assert [t["tenant"] for t in shown] == [f"t{i:02d}" for i in range(56, 6, -1)]
    assert shown[0] == {"tenant": "t56", "in_flight": 57, "waiting": 0}
    assert got["tenants_more"] == {"tenants": 7, "in_flight": 1 + 2 + 3 + 4 + 5 + 6 + 7,
                                   "waiting": 0}
    assert got["in_flight"] == sum(t["in_flight"] for t in shown) + 28
    for slot in slots:
        slot.release()


def test_a_worker_publishes_its_tenants_for_worker_0() -> None:
    block = shared_memory.SharedMemory(create=True, size=TenantBoard.size(2))
    try:
        leader = TenantBoard(block, 2, 0)
        follower = TenantBoard(shared_memory.SharedMemory(block.name), 2, 1)
        assert leader.read(1) == ([], 0, 0, 0)  # before its first heartbeat
        admission = Admission(LimitsConfig(max_in_flight=10_000))
        slots = [admission.enter_now("acme"), admission.enter_now("acme"),
                 admission.enter_now(None)]
        follower.publish(admission.tenant_counts())
        assert leader.read(1) == ([TenantCount("acme", 2, 0), TenantCount(None, 1, 0)],
                                  0, 0, 0)
        # tenants past what a region holds (long names): the least busy summed
        for i in range(200):
            slots.append(admission.enter_now(f"{i:03d}" + "x" * 1000))
        follower.publish(admission.tenant_counts())
        published = leader.read(1)
        assert published is not None
        assert published.shown[0] == TenantCount("acme", 2, 0)
        assert 0 < published.more_tenants < 200
        assert published.more_in_flight == published.more_tenants
        assert len(published.shown) + published.more_tenants == 202
        for slot in slots:
            assert slot is not None
            slot.release()
        follower.publish(admission.tenant_counts())
        assert leader.read(1) == ([], 0, 0, 0)
        follower.close()
        leader.close()
    finally:
        block.unlink()


def test_admin_top_adds_up_the_workers_tenants(spawn: Processes, tmp_path: Path) -> None:
    replica_behaviour = Behaviour("r0", hold=threading.Event())
    replica = ThreadServer(fake_replica(replica_behaviour)).start()
    port, admin_port = free_port(), free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "replicas": [{"id": "r0", "url": replica.url}],
        "scrape": {"enabled": False},
        "admin": {"token": ADMIN, "host": "127.0.0.1", "port": admin_port},
        "auth": {"api_keys": [{"key": key, "tenant": tenant} for tenant, key in KEYS.items()]},
        "shutdown": {"grace_s": 0, "timeout_s": 1}}))
    url, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    hold = replica_behaviour.hold
    assert hold is not None
    answers: dict[str, int] = {}
    threads: list[threading.Thread] = []
    workers: set[str] = set()
    answered_by: set[str] = set()

    def both_serve() -> bool:
        try:
            got = httpx.get(f"{url}/metrics", headers={"connection": "close"}, timeout=2)
            workers.add(got.headers.get("x-kvgate-worker", ""))
        except httpx.TransportError:  # not listening yet
            pass
        return {"0", "1"} <= workers

    try:
        spawn("serve", "--config", str(config), "--workers", "2")
        wait_until(both_serve, 60, "both workers to answer")
        # 24 connections: the kernel spreads them over both workers
        sent = [("acme-corp", 14), ("globex-bank", 6), (None, 4)]
        for tenant, count in sent:
            for i in range(count):
                threads.append(_send(url, f"{tenant}-{i}", KEYS[tenant], answers,
                                     answered_by))
        wait_until(lambda: len(replica_behaviour.received) == 24, 20, "24 held requests")
        expected = _tenants(("acme-corp", 14, 0), ("globex-bank", 6, 0), (None, 4, 0))
        wait_until(lambda: _admission(admin).get("tenants") == expected, 10,
                   "the workers' tenants added up")
        assert _admission(admin)["tenants_more"] == NO_MORE
    finally:
        hold.set()
        for thread in threads:
            thread.join(30)
        replica.stop()
    assert sorted(answers.values()) == [200] * 24
    assert answered_by == {"0", "1"}  # each worker held some (all on one: 1 in 8 million)


def _screen(admission: dict[str, Any]) -> str:
    snapshot = {"replicas": [{"id": "r0", "healthy": True}], "admission": admission}
    window = TopWindow(10)
    window.add(0.0, snapshot)
    out = io.StringIO()
    Console(file=out, width=300, color_system=None).print(
        frame(snapshot, window, "http://127.0.0.1:8001"))
    return " ".join(out.getvalue().split())


def test_top_shows_the_busiest_tenants_in_one_line() -> None:
    rows = [(f"tenant{i}", 10 - i, i % 2) for i in range(7)] + [(None, 1, 1)]
    screen = _screen({"in_flight": 50, "waiting": 5, "tenants": _tenants(*rows),
                      "tenants_more": {"tenants": 40, "in_flight": 3, "waiting": 0}})
    assert ("tenants (in flight+waiting): tenant0 10+0, tenant1 9+1, tenant2 8+0, "
            "tenant3 7+1, tenant4 6+0; 43 more 13+2") in screen
    assert "(no tenant) 3+4" in _screen({"in_flight": 3, "waiting": 4, "tenants": _tenants(
        (None, 3, 4)), "tenants_more": NO_MORE})
    # no tenant with requests, or a gateway that does not say: no line
    assert "tenants" not in _screen({"in_flight": 0, "waiting": 0, "tenants": [],
                                     "tenants_more": NO_MORE})
    assert "tenants" not in _screen({"in_flight": 0, "waiting": 0})
    # a name that is markup or a control sequence is shown as text
    assert "[red]x[/] 1+0" in _screen({"tenants": _tenants(("[red]x[/]", 1, 0))})
