"""Admission is fair between tenants: while one tenant floods, another's request takes a
waiting slot (the flooder's newest waiter is refused 429 for it) and the next place freed
(it holds fewer places than the flooder), where it was refused 429 at once behind a queue
the flooder filled. A tenant alone still takes every place and every waiting slot, and
Retry-After counts the holds in progress when they are long."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable

import httpx
import pytest

from gateway.admin import create_admin_app
from gateway.admission import Admission, Slot
from gateway.app import create_app
from gateway.config import LimitsConfig, parse_config
from gateway.http_server import bounded_protocol
from gateway.state import GatewayState, build_state
from kvwire.openai_schema import TooManyRequests
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
KEYS = {"acme": "keyacmeacmeacmeacme0001", "beta": "keybetabetabetabeta0002"}


def _gateway(serve: Serve, replica_url: str) -> tuple[str, GatewayState]:
    config = parse_config({
        "replicas": [{"id": "r0", "url": replica_url}],
        "scrape": {"enabled": False},
        "limits": {"max_in_flight": 2, "max_pending": 3, "max_pending_s": 30},
        "auth": {"api_keys": [{"key": key, "tenant": tenant}
                              for tenant, key in KEYS.items()]},
    })
    state = build_state(config)
    server = serve(create_app(config, state), side=create_admin_app(state),
                   http=bounded_protocol(config, state.refused_by_server))
    return server.url, state


def _counts(state: GatewayState, tenant: str) -> tuple[int, int]:
    share = state.admission.shares.get(tenant)
    return (share.held, share.waiting) if share is not None else (0, 0)


def _waits(state: GatewayState, waiting: int) -> Callable[[], bool]:
    return lambda: state.admission.waiting == waiting


def test_a_light_tenant_is_served_while_another_floods(serve: Serve) -> None:
    replica = Behaviour("r0", hold=threading.Event())
    url, state = _gateway(serve, serve(fake_replica(replica)).url)
    answers: dict[str, httpx.Response] = {}

    def send(name: str, tenant: str) -> threading.Thread:
        def post() -> None:
            answers[name] = httpx.post(
                f"{url}/v1/completions", json={"model": "sim-model", "prompt": name},
                headers={"authorization": f"Bearer {KEYS[tenant]}"}, timeout=30)
        thread = threading.Thread(target=post)
        thread.start()
        return thread

    def prompts() -> list[str]:
        return [json.loads(body)["prompt"] for body in replica.received]

    first = replica.hold
    assert first is not None
    threads = [send("a1", "acme"), send("a2", "acme")]
    wait_until(lambda: len(replica.received) == 2, 10, "acme's two requests at the replica")
    for waiting, name in enumerate(("a3", "a4", "a5"), 1):  # every waiting slot
        threads.append(send(name, "acme"))
        wait_until(_waits(state, waiting), 10,
                   f"acme's request {name} waiting")
    try:
        threads.append(send("b1", "beta"))
        # beta takes acme's newest waiting slot: a5 is refused, not beta's request
        wait_until(lambda: "a5" in answers or "b1" in answers, 10, "a refusal")
        assert "b1" not in answers, answers["b1"].text
        assert answers["a5"].status_code == 429
        assert answers["a5"].json()["error"]["code"] == "gateway_overloaded"
        assert int(answers["a5"].headers["retry-after"]) >= 1
        assert _counts(state, "beta") == (0, 1) and _counts(state, "acme") == (2, 2)
        # two places free: beta's waiter (holding none) gets one before acme's older a4
        replica.hold = threading.Event()
        first.set()
        wait_until(lambda: len(replica.received) == 4, 10, "two waiters at the replica")
        assert sorted(prompts()[2:]) == ["a3", "b1"]
        assert _counts(state, "beta") == (1, 0) and _counts(state, "acme") == (1, 1)
    finally:
        first.set()
        assert replica.hold is not None
        replica.hold.set()
        for thread in threads:
            thread.join(30)
    assert {name: a.status_code for name, a in answers.items()} == {
        "a1": 200, "a2": 200, "a3": 200, "a4": 200, "a5": 429, "b1": 200}
    assert state.admission.shares == {} and state.admission.in_flight == 0


def _limits(**values: float) -> LimitsConfig:
    limits = LimitsConfig(**values)  # type: ignore[arg-type]
    limits.validate()
    return limits


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


@pytest.mark.parametrize("tenant", [None, "acme"])
async def test_a_tenant_alone_takes_every_place_and_waiting_slot(tenant: str | None) -> None:
    admission = Admission(_limits(max_in_flight=2, max_pending=2, max_pending_s=60))
    held = [admission.enter_now(tenant), admission.enter_now(tenant)]
    assert None not in held and admission.enter_now(tenant) is None
    waiters = [asyncio.create_task(admission.enter(tenant)) for _ in range(2)]
    await _until(lambda: admission.waiting == 2)
    with pytest.raises(TooManyRequests):
        admission.check_room(tenant)
    with pytest.raises(TooManyRequests):
        await admission.enter(tenant)
    for slot in held:
        assert slot is not None
        slot.release()
    slots: list[Slot] = [await waiter for waiter in waiters]
    assert admission.in_flight == 2 and admission.waiting == 0
    assert admission.shares[tenant].held == 2
    for slot in slots:
        slot.release()
    assert admission.in_flight == 0 and admission.shares == {}


async def test_retry_after_counts_the_long_holds_in_progress() -> None:
    now = [1000.0]
    admission = Admission(_limits(max_in_flight=2, max_pending=0), clock=lambda: now[0])
    held = [admission.enter_now("acme"), admission.enter_now("acme")]
    now[0] += 20.0  # both held 20 s, none ended yet
    with pytest.raises(TooManyRequests) as refused:
        await admission.enter("beta")
    assert int(refused.value.headers["Retry-After"]) >= 10
    for slot in held:
        assert slot is not None
        slot.release()
    assert admission.retry_after_s() >= 1 and admission.shares == {}
