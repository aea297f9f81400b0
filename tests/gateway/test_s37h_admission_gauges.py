"""The gateway's own admission is on /metrics and in /admin/top: the requests holding a
place and those waiting for one, all tenants together, back to 0 once the answers held at
the replica are let go. /metrics is open on the client port: it names no tenant."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable

import httpx
from rich.console import Console

from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.config import parse_config
from gateway.http_server import bounded_protocol
from gateway.state import build_state
from gateway.top import frame
from gateway.top_window import TopWindow
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.metrics import Samples, samples
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
KEYS = {"acme-corp": "keyacmeacmeacmeacme0001", "globex-bank": "keybetabetabetabeta0002",
        None: "keyanonanonanonanon0003"}
ADMIN = "admin-token-for-tests-0123"


def _admission(page: Samples) -> dict[str, float | None]:
    return {name: page.get((name, ())) for name in
            ("kvgate_admission_in_flight", "kvgate_admission_waiting")}


def _names_no_tenant(text: str) -> bool:
    """Whether a /metrics page names none of the configured tenants, in a label or
    anywhere else."""
    return not any(tenant in text for tenant in KEYS if tenant) and 'tenant="' not in text


def test_admission_gauges_follow_held_and_waiting_requests(serve: Serve) -> None:
    replica = Behaviour("r0", hold=threading.Event())
    config = parse_config({
        "replicas": [{"id": "r0", "url": serve(fake_replica(replica)).url}],
        "scrape": {"enabled": False},
        "limits": {"max_in_flight": 2, "max_pending": 3, "max_pending_s": 30},
        "auth": {"api_keys": [{"key": key, "tenant": tenant} for tenant, key in KEYS.items()]},
        "admin": {"token": ADMIN},
    })
    state = build_state(config)
    server = serve(create_app(config, state), side=create_admin_app(state),
                   http=bounded_protocol(config, state.refused_by_server))
    answers: dict[str, int] = {}

    def send(name: str, key: str) -> threading.Thread:
        def post() -> None:
            answers[name] = httpx.post(
                f"{server.url}/v1/completions", json={"model": "sim-model", "prompt": name},
                headers={"authorization": f"Bearer {key}"}, timeout=30).status_code
        thread = threading.Thread(target=post)
        thread.start()
        return thread

    pages: list[str] = []

    def page() -> Samples:
        pages.append(httpx.get(f"{server.url}/metrics").text)
        return samples(pages[-1])

    def top() -> dict[str, object]:  # the totals (per tenant: test_s38t_admission_tenants_top)
        admission = httpx.get(f"{server.side_url}/admin/top",
                              headers={"authorization": f"Bearer {ADMIN}"}).json()["admission"]
        return {key: admission[key] for key in ("in_flight", "waiting")}

    idle = page()
    assert _admission(idle) == {"kvgate_admission_in_flight": 0,
                                "kvgate_admission_waiting": 0}
    hold = replica.hold
    assert hold is not None
    # two places held at the replica (acme's and an untenanted key's), then two waiting
    threads = [send("a1", KEYS["acme-corp"]), send("n1", KEYS[None])]
    try:
        wait_until(lambda: len(replica.received) == 2, 10, "two requests at the replica")
        threads.append(send("a2", KEYS["acme-corp"]))
        wait_until(lambda: state.admission.waiting == 1, 10, "acme's request waiting")
        threads.append(send("b1", KEYS["globex-bank"]))
        wait_until(lambda: state.admission.waiting == 2, 10, "globex-bank's request waiting")
        unknown = httpx.post(f"{server.url}/v1/completions",
                             json={"model": "sim-model", "prompt": "x"},
                             headers={"authorization": "Bearer nokeynokeynokeynokey00"})
        assert unknown.status_code == 401
        busy = page()
        assert _admission(busy) == {"kvgate_admission_in_flight": 2,
                                    "kvgate_admission_waiting": 2}
        assert top() == {"in_flight": 2, "waiting": 2}
    finally:
        hold.set()
        for thread in threads:
            thread.join(30)
    assert answers == {"a1": 200, "n1": 200, "a2": 200, "b1": 200}
    drained = page()
    assert _admission(drained) == {"kvgate_admission_in_flight": 0,
                                   "kvgate_admission_waiting": 0}
    assert len(pages) == 3
    assert all(_names_no_tenant(text) for text in pages)  # idle, busy and drained
    assert top() == {"in_flight": 0, "waiting": 0}


def _screen(snapshot: dict[str, object]) -> str:
    window = TopWindow(10)
    window.add(0.0, snapshot)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(
        frame(snapshot, window, "http://127.0.0.1:8001"))
    return " ".join(out.getvalue().split())


def test_top_shows_the_gateways_places_under_its_table() -> None:
    replicas = [{"id": "r0", "healthy": True}]
    assert "gateway: 1,024 in flight, 3 waiting for a place" in _screen(
        {"replicas": replicas, "admission": {"in_flight": 1024, "waiting": 3}})
    # a gateway of another version: its figure unknown, or none at all
    assert "gateway: ? in flight, 0 waiting" in _screen(
        {"replicas": replicas, "admission": {"in_flight": None, "waiting": 0}})
    assert "gateway:" not in _screen({"replicas": replicas})
