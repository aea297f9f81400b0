"""Two ``kvgate serve`` gateways in front of one replica, peered (``gateway.peers``), each
one process or two workers: a request through one raises the queue the other sees for its
replica before the first byte returns, and both let go of it once answered."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.held_streams import held_stream
from tests.support.metrics import per_worker, samples
from tests.support.peered_gateways import start_peered_pair
from tests.support.processes import Processes
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

def _metrics(url: str) -> dict[Any, float]:
    return samples(httpx.get(f"{url}/metrics", headers={"connection": "close"}).text)


def _replica(url: str, name: str) -> float | None:
    return _metrics(url).get((name, (("replica", "r0"),)))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_copy_sees_the_request_another_copy_holds_at_a_replica(
        spawn: Processes, serve: Callable[..., ThreadServer], tmp_path: Path,
        workers: int) -> None:
    behaviour = Behaviour("r0", chunks=2)
    replica = serve(fake_replica(behaviour))
    urls = start_peered_pair(spawn, tmp_path, {
        "policy": {"name": "cost"}, "replicas": [{"id": "r0", "url": replica.url}],
        "health": {"interval_s": 0.2},
        "shutdown": {"grace_s": 0}},  # no load balancer to tell: stop at once
        workers)

    with held_stream(behaviour, urls[0]) as chunks:
        # the replica holds its first byte: the copy that did not route it counts it too
        wait_until(lambda: _replica(urls[1], "kvgate_replica_in_flight") == 1
                   and (_replica(urls[1], "kvgate_replica_queued_tokens") or 0) > 200,
                   20, "the other copy to see the request held at r0")
        assert _replica(urls[1], "kvgate_replica_queued_tokens") == \
            _replica(urls[0], "kvgate_replica_queued_tokens")
        assert not chunks  # no byte had come back
    assert chunks == ["t0 ", "t1 "]
    wait_until(lambda: _replica(urls[1], "kvgate_replica_in_flight") == 0
               and _replica(urls[1], "kvgate_replica_queued_tokens") == 0,
               20, "the other copy to see it answered")
    # its SENT, FIRST_BYTE, DONE and ROUTED frames (heartbeats are not counted), summed
    # over the workers (each counts those its links in received) whichever answers
    frames = per_worker(urls[1], lambda s: s.get(("kvgate_peer_frames_received_total", ()),
                                                 0) >= 4,
                        "every worker to show the box's frames received", workers)
    assert len(frames) == workers
