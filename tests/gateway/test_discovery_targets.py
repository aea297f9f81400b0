"""What discovery sources make of what they find, how their config is checked, and how
membership applies a source's set to the fleet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ReplicaConfig, parse_config
from gateway.discovery.config import DNSSourceConfig, KubernetesSourceConfig, ReplicaTemplate
from gateway.discovery.targets import dns_targets, pod_targets, slice_targets
from gateway.fleet_events import FleetEvent, ReplicaAdded
from gateway.membership import reconcile
from gateway.state import build_state
from policies.base import ReplicaRemoved
from policies.config import ConfigError
from tests.support.fake_kube_api import endpoint, endpoint_slice

SERVICE = KubernetesSourceConfig(namespace="llm", service="vllm", port_name="http")


def slice_of(*endpoints: dict[str, Any], port: int = 8000, **extra: int) -> dict[str, Any]:
    return endpoint_slice("llm", "s", "vllm", port, list(endpoints), extra_ports=extra)


def test_only_ready_endpoints_count_with_the_apis_defaults() -> None:
    found = slice_targets(SERVICE, [slice_of(
        endpoint("10.0.0.1", "p1"),  # ready
        endpoint("10.0.0.2", "p2", ready=None),  # unset: ready
        endpoint("10.0.0.3", "p3", ready=False),  # starting
        endpoint("10.0.0.4", "p4", ready=False, serving=True, terminating=True),  # draining
    )])
    assert sorted(found) == ["p1", "p2"]
    assert found["p1"].url == "http://10.0.0.1:8000"


def test_ports_no_api_server_writes_are_left_out() -> None:
    # a serving port past 65535 makes no replica (it would stay unhealthy for good); a KV
    # event port past it is not followed
    assert slice_targets(SERVICE, [slice_of(endpoint("10.0.0.1", "p1"), port=70000)]) == {}
    (config,) = slice_targets(SERVICE, [slice_of(endpoint("10.0.0.1", "p1"),
                                                 **{"kv-events": 99999})]).values()
    assert config.url == "http://10.0.0.1:8000" and config.kv_events is None


def test_terminating_serving_endpoints_only_when_none_is_ready() -> None:
    found = slice_targets(SERVICE, [slice_of(
        endpoint("10.0.0.3", "p3", ready=False),
        endpoint("10.0.0.4", "p4", ready=False, serving=True, terminating=True),
        endpoint("10.0.0.5", "p5", ready=False, serving=False, terminating=True),
    )])
    assert sorted(found) == ["p4"]
    # serving unset defers to ready (the API's rule): a terminating endpoint that is not
    # ready and does not say it serves takes no traffic
    assert slice_targets(SERVICE, [slice_of(
        endpoint("10.0.0.6", "p6", ready=False, terminating=True))]) == {}
    assert sorted(slice_targets(SERVICE, [slice_of(
        endpoint("10.0.0.7", "p7", ready=None, terminating=True))])) == ["p7"]


def test_ports_kv_events_and_ids() -> None:
    template = ReplicaTemplate(api_key_env="HOME", kv_events_replay_port=5558)
    source = KubernetesSourceConfig(service="vllm", port_name="http", replica=template)
    s = slice_of(endpoint("fd00::5", "p1"), **{"kv-events": 5557})
    s["addressType"] = "IPv6"
    del s["endpoints"][0]["targetRef"]
    (config,) = slice_targets(source, [s]).values()
    assert config.id == "[fd00::5]:8000"
    assert config.url == "http://[fd00::5]:8000"
    assert config.kv_events == "tcp://[fd00::5]:5557"
    assert config.kv_events_replay == "tcp://[fd00::5]:5558"
    assert config.api_key_env == "HOME"
    # without a port_name: the one port that is not a KV event port; none to choose: none
    unnamed = KubernetesSourceConfig(service="vllm")
    assert list(slice_targets(unnamed, [slice_of(endpoint("10.0.0.1", "p1"),
                                                 **{"kv-events": 5557})])) == ["p1"]
    assert slice_targets(unnamed, [slice_of(endpoint("10.0.0.1", "p1"), metrics=9090)]) == {}
    # an explicit port wins; an endpoint listed in two slices counts once
    fixed = KubernetesSourceConfig(service="vllm", port=9000)
    found = slice_targets(fixed, [slice_of(endpoint("10.0.0.1", "p1")),
                                  slice_of(endpoint("10.0.0.1", "p1"))])
    assert [c.url for c in found.values()] == ["http://10.0.0.1:9000"]


def pod(name: str, ip: str | None = "10.0.0.9", ready: str = "True", phase: str = "Running",
        annotations: dict[str, str] | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8000},
                                               {"name": "kv-events", "containerPort": 5557},
                                               {"name": "kv-replay", "containerPort": 5558}]}]},
            "status": {"phase": phase, "podIP": ip,
                       "conditions": [{"type": "Ready", "status": ready}]}}


def test_pods_ready_running_with_an_ip() -> None:
    source = KubernetesSourceConfig(label_selector="app=vllm", port_name="http")
    found = pod_targets(source, [
        pod("ok"), pod("unready", ready="False"), pod("pending", phase="Pending"),
        pod("no-ip", ip=None), pod("deleting", deleting=True),
        pod("annotated", annotations={"kvgate.io/kv-events-port": "6000"}),
        pod("bad-annotation", annotations={"kvgate.io/kv-events-port": "x"}),
    ])
    assert sorted(found) == ["annotated", "bad-annotation", "ok"]
    assert found["ok"].kv_events == "tcp://10.0.0.9:5557"  # the named container port
    assert found["annotated"].kv_events == "tcp://10.0.0.9:6000"  # the annotation wins
    assert found["bad-annotation"].kv_events == "tcp://10.0.0.9:5557"
    # the replay port: a container port's name is at most 15 characters, so not the
    # Service's kv-events-replay
    assert found["ok"].kv_events_replay == "tcp://10.0.0.9:5558"


def test_dns_targets() -> None:
    source = DNSSourceConfig(name="vllm.llm.svc", port=8000,
                             replica=ReplicaTemplate(scheme="https", base_path="/v"))
    found = dns_targets(source, ["10.0.0.2", "fd00::1", "10.0.0.2"])
    assert {k: v.url for k, v in found.items()} == {
        "10.0.0.2:8000": "https://10.0.0.2:8000/v", "[fd00::1]:8000": "https://[fd00::1]:8000/v"}


@pytest.mark.parametrize(("source", "fragment"), [
    ({"type": "consul"}, "discovery[0].type: 'consul' is not one of 'dns', 'kubernetes'"),
    ({"type": "dns", "port": 80}, "discovery[0]: missing required key 'name'"),
    ({"type": "dns", "name": "a", "port": 0}, "port must be a port (1-65535), got 0"),
    ({"type": "dns", "name": "a", "port": 80, "interval_s": 0},
     "interval_s must be at least 0.01 s, got 0"),
    ({"type": "dns", "name": "a", "port": 80, "record_types": ["MX"]}, "'MX' is not one of"),
    ({"type": "kubernetes"}, "set exactly one of service and label_selector"),
    ({"type": "kubernetes", "service": "a", "label_selector": "b"}, "exactly one of"),
    ({"type": "kubernetes", "service": "a", "replica": {"base_path": "v"}},
     "discovery[0].replica: base_path 'v' must start with '/'"),
    ({"type": "kubernetes", "service": "a", "replica": {"weight": 0}}, "weight must be > 0"),
    ({"type": "kubernetes", "service": "a", "replica": {"api_key_env": "NOT_SET_ANYWHERE"}},
     "api_key_env 'NOT_SET_ANYWHERE' is not set"),
    ({"type": "kubernetes", "service": "a", "watch": True}, "unknown key 'watch'"),
    ({"type": "kubernetes", "label_selector": "app=e", "kv_events_replay_port_name":
      "kv-events-replay"}, "kv_events_replay_port_name 'kv-events-replay' is no container "
     "port's name: pods' port names are at most 15 characters"),
    ({"type": "kubernetes", "service": "a", "kubeconfig": "/nonexistent/kubeconfig"},
     "kubeconfig '/nonexistent/kubeconfig' names no file"),
    ({"type": "kubernetes", "service": "a", "namespace": ""},
     "namespace must not be empty (leave it out for the pod's own"),
    ("dns", "expected a mapping with a 'type' key"),
])
def test_bad_source_names_the_key_and_value(source: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"discovery": [source]})
    assert fragment in str(err.value)


def test_a_kubeconfig_is_read_as_kubeconfig_is(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """'~' is the home directory and a list of paths is merged, as the client library
    reads them (both were refused as 'not a file')."""
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("apiVersion: v1\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    for kubeconfig in ("~/.kube/config", f"/nonexistent/a{os.pathsep}~/.kube/config"):
        cfg = parse_config({"discovery": [{"type": "kubernetes", "service": "a",
                                           "kubeconfig": kubeconfig}]})
        assert cfg.discovery[0].kubeconfig == kubeconfig  # (the library expands it)
    # expanded and split, not waved through: none of them a file is still refused
    for kubeconfig in ("~/.kube/absent", f"/nonexistent/a{os.pathsep}~/.kube/absent"):
        with pytest.raises(ConfigError, match="names no file"):
            parse_config({"discovery": [{"type": "kubernetes", "service": "a",
                                         "kubeconfig": kubeconfig}]})


def test_the_same_source_twice_is_refused() -> None:
    dns = {"type": "dns", "name": "a", "port": 80}
    with pytest.raises(ConfigError, match=r"discovery\[1\] \(dns:a:80\) appears twice"):
        parse_config({"discovery": [dns, dns]})


async def test_reconcile_touches_only_its_own_source() -> None:
    gw = build_state(parse_config({"replicas": [{"id": "x", "url": "http://10.0.0.9:1"}]}))
    events: list[FleetEvent] = []
    gw.fleet.listen(events.append)

    def replica(rid: str, host: str) -> ReplicaConfig:
        return ReplicaConfig(id=rid, url=f"http://{host}:8000")

    changes = await reconcile(gw, "dns:a", {"x": replica("x", "10.0.0.1"),
                                            "y": replica("y", "10.0.0.2")})
    assert changes.added == ("y",) and changes.skipped == ("x",)
    assert {s.id: s.source for s in gw.fleet} == {"x": "static", "y": "dns:a"}
    # y moved: it leaves and joins again (the policy forgets what it held)
    await reconcile(gw, "dns:a", {"y": replica("y", "10.0.0.3")})
    state = gw.fleet.get("y")
    assert state is not None and state.config.url == "http://10.0.0.3:8000"
    # an empty set removes y, never the static x
    changes = await reconcile(gw, "dns:a", {})
    assert changes.removed == ("y",) and [s.id for s in gw.fleet] == ["x"]
    assert events == [ReplicaAdded("y"), ReplicaRemoved("y"), ReplicaAdded("y"),
                      ReplicaRemoved("y")]


def test_a_replica_missing_from_one_dns_answer_is_kept_until_missing_from_enough() -> None:
    from gateway.discovery.removal_grace import RemovalGrace

    def found(*rids: str) -> dict[str, ReplicaConfig]:
        return {rid: ReplicaConfig(rid, f"http://{rid}:8000") for rid in rids}

    grace = RemovalGrace(2)
    assert sorted(grace.apply(found("a", "b"))) == ["a", "b"]
    assert sorted(grace.apply(found("a"))) == ["a", "b"]  # b missing once: kept
    assert sorted(grace.apply(found("a", "b"))) == ["a", "b"]  # back: its count starts over
    assert sorted(grace.apply(found("a"))) == ["a", "b"]
    assert sorted(grace.apply(found("a"))) == ["a"]  # missing twice in a row: removed
    assert sorted(grace.apply(found("a"))) == ["a"]
    assert sorted(RemovalGrace(1).apply(found("a"))) == ["a"]
    with pytest.raises(ValueError, match="after must be >= 1"):
        RemovalGrace(0)
    with pytest.raises(ConfigError, match="remove_after"):
        parse_config({"discovery": [{"type": "dns", "name": "x", "port": 8000,
                                     "remove_after": 0}]})


async def test_a_source_cannot_grow_the_fleet_past_its_limit(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import gateway.fleet
    import gateway.membership

    for module in (gateway.fleet, gateway.membership):
        monkeypatch.setattr(module, "MAX_REPLICAS", 3)
    gw = build_state(parse_config({"replicas": [{"id": "x", "url": "http://10.0.0.9:1"}]}))
    wanted = {f"r{i}": ReplicaConfig(id=f"r{i}", url=f"http://10.0.1.{i}:8000")
              for i in range(5)}
    changes = await reconcile(gw, "dns:a", wanted)
    assert changes.added == ("r0", "r1") and changes.skipped == ("r2", "r3", "r4")
    assert len(gw.fleet) == 3
    assert "holds its limit of 3 replicas: r2, r3, r4 not added" in caplog.text
    with pytest.raises(ValueError, match="limit of 3 replicas"):
        gw.fleet.add(ReplicaConfig(id="z", url="http://10.0.0.8:1"))


async def test_a_source_past_the_workers_shared_slots_adds_what_fits_and_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    from gateway.shared_load import SharedLoad
    from tests.support.shared_blocks import new_load_block

    block = new_load_block(1, 2)  # room for the configured replica and one more
    try:
        shared = SharedLoad(block, 1, 0, 2)
        gw = build_state(parse_config({"replicas": [{"id": "x", "url": "http://10.0.0.9:1"}]}),
                         shared=shared)
        wanted = {f"r{i}": ReplicaConfig(id=f"r{i}", url=f"http://10.0.1.{i}:8000")
                  for i in range(3)}
        # no error escapes (a discovery source restarted over it, forever): what has no
        # slot is skipped and named
        changes = await reconcile(gw, "dns:a", wanted)
        assert changes.added == ("r0",) and changes.skipped == ("r1", "r2")
        assert "replica r1 not added" in caplog.text and "slots" in caplog.text
    finally:
        block.close()
        block.unlink()


def test_a_dual_stack_service_gives_each_pod_one_address_whatever_the_slice_order() -> None:
    # a dual-stack Service has an IPv4 and an IPv6 EndpointSlice for the same pods; the
    # API lists slices by name and a watch appends a recreated one, so the order changes
    # at every relist: the replica must not move between its two addresses (each move
    # removes it and adds it again, and the policy forgets what it holds)
    v4 = slice_of(endpoint("10.0.0.1", "p1"), endpoint("10.0.0.2", "p2"))
    v4["metadata"]["name"] = "vllm-zq7k2"
    v6 = slice_of(endpoint("fd00::1", "p1"), endpoint("fd00::2", "p2"))
    v6["metadata"]["name"] = "vllm-9cx4m"
    v6["addressType"] = "IPv6"
    first = slice_targets(SERVICE, [v4, v6])
    assert first == slice_targets(SERVICE, [v6, v4])
    assert {rid: c.url for rid, c in first.items()} == {
        "p1": "http://10.0.0.1:8000", "p2": "http://10.0.0.2:8000"}
    # a pod only the IPv6 slice lists ready yet is found there
    v4["endpoints"][1]["conditions"] = {"ready": False}
    assert slice_targets(SERVICE, [v6, v4])["p2"].url == "http://[fd00::2]:8000"
