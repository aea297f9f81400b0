"""A discovered replica whose data-parallel ranks cannot be made (a KV event port an object
names, offset past 65535 by the template's ranks) is left out alone: the rest of its
source's set still joins and leaves."""

from __future__ import annotations

import logging

import pytest

from gateway.config import ReplicaConfig, parse_config
from gateway.data_parallel import rank_id
from gateway.discovery.config import ReplicaTemplate
from gateway.membership import Changes, reconcile
from gateway.state import GatewayState, build_state

SOURCE = "kubernetes:llm/service=vllm"
TEMPLATE = ReplicaTemplate(data_parallel_size=2)


ADDRESSES = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3", "d": "10.0.0.4"}


def listed(**events_ports: int) -> dict[str, ReplicaConfig]:
    """The replicas a list of pods gives (``a=5557``: pod vllm-a, its KV event port named
    by the pod), each config made anew, as a relist makes them."""
    return {f"vllm-{pod}": TEMPLATE.replica(f"vllm-{pod}", ADDRESSES[pod], 8000,
                                            kv_events_port=port)
            for pod, port in events_ports.items()}


def ranks(*names: str) -> list[str]:
    return [rank_id(name, k) for name in names for k in range(2)]


def fleet(gw: GatewayState) -> list[str]:
    return sorted(s.id for s in gw.fleet)


async def test_a_replica_whose_ranks_cannot_be_made_leaves_the_rest_of_its_set_moving(
        caplog: pytest.LogCaptureFixture) -> None:
    # its ranks' endpoints raised ValueError inside the pass: no change of the source
    # joined or left (a new pod never joined, a deleted one never left) for as long as the
    # object stayed, the failure named only as an ExceptionGroup
    gw = build_state(parse_config({"replicas": []}))
    wanted = listed(a=5557, b=65535, c=5557)  # b's rank 1: port 65536
    with caplog.at_level(logging.WARNING, logger="kvgate.membership"):
        changes = await reconcile(gw, SOURCE, wanted)
    assert changes == Changes(tuple(ranks("vllm-a", "vllm-c")), (), ("vllm-b",))
    assert fleet(gw) == ranks("vllm-a", "vllm-c")
    refusals = [r.getMessage() for r in caplog.records if "vllm-b not added" in r.getMessage()]
    assert len(refusals) == 1 and "65536" in refusals[0], refusals

    # a relist: equal copies; the refused one is not tried (nor named) again
    caplog.clear()
    relisted = listed(a=5557, b=65535, c=5557)
    assert await reconcile(gw, SOURCE, relisted) == Changes((), (), ())
    assert not [r for r in caplog.records if "not added" in r.getMessage()]

    # one in the fleet names such a port now: its ranks leave; the refused one is fixed
    # and joins; another pod joins beside them
    moved = {**listed(a=65535, b=5557, d=5557), "vllm-c": relisted["vllm-c"]}
    changes = await reconcile(gw, SOURCE, moved)
    assert changes == Changes(tuple(ranks("vllm-b", "vllm-d")), tuple(ranks("vllm-a")),
                              ("vllm-a",))
    assert fleet(gw) == ranks("vllm-b", "vllm-c", "vllm-d")

    # and the refused one is gone from the set: nothing of it to remove, no error
    del moved["vllm-a"]
    assert await reconcile(gw, SOURCE, moved) == Changes((), (), ())
    assert fleet(gw) == ranks("vllm-b", "vllm-c", "vllm-d")
