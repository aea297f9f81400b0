"""A stored response that a gateway copy holds as one tenant's stays that tenant's when a
peer copy or another worker of the box, which never learned it, tells it answered for
another tenant (a replica that names a response after the request's id, as vLLM does,
answered there under it): the told record is kept only as the copy's own answers are
(``tenancy.record_home``), and a peer's refused one goes on to no worker."""

from __future__ import annotations

from gateway.config import GatewayConfig, parse_config
from gateway.peer_wire import Answered
from gateway.responses_request import ResponseHome
from gateway.state import GatewayState, build_state
from gateway.worker_routes import WorkerRoutes, route_pair
from policies.cost import Cost
from tests.support.peer_copies import REPLICAS, SECRET, PeerCopy
from tests.support.waiting import wait_until_async


def _config() -> GatewayConfig:
    return parse_config({
        "replicas": [{"id": r.id, "url": r.url} for r in REPLICAS],
        "policy": {"name": "round_robin"},
        "peers": {"listen": "127.0.0.1:0", "addresses": [], "secret": SECRET}})


def _held_by_a(gw: GatewayState) -> None:
    """``resp_a`` answered here for tenant ``a``, by replica ``r0``."""
    gw.response_homes.put("resp_a", ResponseHome("r0", "a"))


async def test_a_peer_cannot_pass_another_tenants_record_over_a_stored_response() -> None:
    gw = build_state(_config())
    assert gw.peers is not None
    _held_by_a(gw)
    await gw.peers.start()
    assert gw.peers.address is not None
    teller = PeerCopy([f"127.0.0.1:{gw.peers.address[1]}"])
    await teller.peers.start()
    try:
        await wait_until_async(lambda: teller.peers.counts.links_up == 1, 5.0, "the link")
        teller.peers.answered("resp_a", "r1", "b")  # b's answer under a's response's id
        teller.peers.answered("resp_b", "r1", "b")  # a response of its own
        teller.peers.answered("resp_a", "r2", None)  # no tenant is not tenant a
        await wait_until_async(lambda: gw.peers is not None
                               and gw.peers.counts.frames_received == 3, 5.0, "the frames")
        assert gw.response_homes.get("resp_a", None) == ResponseHome("r0", "a")
        assert gw.response_homes.get("resp_b", None) == ResponseHome("r1", "b")
        # its own tenant's record of it is kept (the replica answered it again)
        teller.peers.answered("resp_a", "r3", "a")
        await wait_until_async(lambda: gw.response_homes.get("resp_a", None)
                               == ResponseHome("r3", "a"), 5.0, "a's own record")
    finally:
        await teller.peers.stop()
        await gw.peers.stop()


async def test_a_worker_keeps_its_record_against_the_others_and_passes_no_takeover_on(
        ) -> None:
    # one worker of a peered box, wired as ``gateway.workers.worker_main`` wires it; the
    # box's other worker a bare end that records what it is told
    gw = build_state(_config())
    assert gw.peers is not None and gw.peers.on_answered is not None
    inbox, to_this = route_pair()
    other_inbox, to_other = route_pair()
    heard: list[Answered] = []
    gw.worker_routes = WorkerRoutes(inbox, [to_other], gw.policy, gw.fleet, gw.keep_told)
    other = WorkerRoutes(other_inbox, [to_this], Cost(), on_answered=heard.append)
    gw.worker_routes.start()
    other.start()
    try:
        _held_by_a(gw)
        other.answered("resp_a", "r1", "b")  # the other worker never learned it was a's
        gw.worker_routes.catch_up()
        assert gw.worker_routes.answers_received == 1
        assert gw.response_homes.get("resp_a", None) == ResponseHome("r0", "a")
        # a peer's record of it is refused here, and told to no other worker
        gw.peers.on_answered(Answered("resp_a", "r2", "b"))
        gw.peers.on_answered(Answered("resp_b", "r2", "b"))
        other.catch_up()
        assert gw.response_homes.get("resp_a", None) == ResponseHome("r0", "a")
        assert heard == [Answered("resp_b", "r2", "b")]
        # another worker's record of a response new here is kept
        other.answered("resp_c", "r3", "b")
        gw.worker_routes.catch_up()
        assert gw.response_homes.get("resp_c", None) == ResponseHome("r3", "b")
    finally:
        gw.worker_routes.stop()
        other.stop()
