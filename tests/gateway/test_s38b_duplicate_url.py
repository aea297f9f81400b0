"""Two replicas at one url (one server, listed twice) are refused as two replicas at one KV
event endpoint are: at load, on the admin API's add and in discovery, naming both replicas
and the url. The url is compared as a server: scheme and host in any case, the port
written or the scheme's, with or without a trailing slash."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
import yaml

from gateway.config import load_config, parse_config
from gateway.discovery.config import ReplicaTemplate
from gateway.membership import reconcile
from gateway.state import build_state
from policies.config import ConfigError
from tests.support.admin_posts import REPLICA_URL, admin_app, post_replica


@pytest.mark.parametrize("first, second", [
    ("http://127.0.0.1:8101", "http://127.0.0.1:8101"),
    ("http://Engine-0:80/", "HTTP://engine-0"),
    ("https://10.0.0.1/vllm", "https://10.0.0.1:443/vllm/")])
def test_two_replicas_at_one_url_are_refused_at_load(tmp_path: Path, first: str,
                                                     second: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"replicas": [
        {"id": "a", "url": first}, {"id": "b", "url": second}]}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: replicas[1] (b) url {second!r} is also replicas[0] (a)'s url: one server "
        "listed as two replicas would be counted twice (its load and its cache each seen "
        "as two replicas', its requests split between them); list it once")


def test_other_ports_paths_and_schemes_are_other_servers() -> None:
    config = parse_config({"replicas": [
        {"id": "a", "url": "http://127.0.0.1:8101"}, {"id": "b", "url": "http://127.0.0.1:8102"},
        {"id": "c", "url": "http://127.0.0.1:8101/other"},
        {"id": "d", "url": "https://127.0.0.1:8101"},
        {"id": "e", "url": "http://127.0.0.1:8103", "data_parallel_size": 2}]})
    assert [r.id for r in config.fleet_replicas()] == ["a", "b", "c", "d", "e.dp0", "e.dp1"]
    with pytest.raises(ConfigError, match=r"replicas\[1\] \(f\) url 'http://127.0.0.1:8103' "
                                          r"is also replicas\[0\] \(e\)'s url"):
        parse_config({"replicas": [  # a replica of ranks named as itself, not a rank
            {"id": "e", "url": "http://127.0.0.1:8103", "data_parallel_size": 2},
            {"id": "f", "url": "http://127.0.0.1:8103"}]})


async def test_the_admin_api_refuses_a_replica_at_a_url_the_fleet_has() -> None:
    app = admin_app()
    got = await post_replica(app, orjson.dumps({"id": "b", "url": f"{REPLICA_URL}/"}))
    assert got.status_code == 400, got.text
    error = got.json()["error"]
    assert error["code"] == "invalid_replica"
    assert error["message"].startswith(
        f"replica b url '{REPLICA_URL}/' is also replica a's url: one server"), error


async def test_discovery_leaves_out_a_replica_at_a_url_the_fleet_has(
        caplog: pytest.LogCaptureFixture) -> None:
    template = ReplicaTemplate()
    gw = build_state(parse_config({"replicas": [{"id": "r0", "url": "http://10.0.0.1:8000"}]}))
    wanted = {"10.0.0.1:8000": template.replica("10.0.0.1:8000", "10.0.0.1", 8000),
              "10.0.0.2:8000": template.replica("10.0.0.2:8000", "10.0.0.2", 8000)}
    with caplog.at_level(logging.WARNING, logger="kvgate.membership"):
        changes = await reconcile(gw, "dns:a", wanted)
        assert changes.added == ("10.0.0.2:8000",)
        assert changes.skipped == ("10.0.0.1:8000",)
        # and one source's found replicas are another's url too
        other = await reconcile(gw, "dns:b", {
            "pod-2": template.replica("pod-2", "10.0.0.2", 8000),
            "pod-3": template.replica("pod-3", "10.0.0.3", 8000)})
        assert (other.added, other.skipped) == (("pod-3",), ("pod-2",))
    said = [r.getMessage() for r in caplog.records if "not added" in r.getMessage()]
    assert said == [
        "discovery dns:a: replica 10.0.0.1:8000 not added: replica 10.0.0.1:8000 url "
        "'http://10.0.0.1:8000' is also replica r0's url: one server listed as two replicas "
        "would be counted twice (its load and its cache each seen as two replicas', its "
        "requests split between them); list it once",
        "discovery dns:b: replica pod-2 not added: replica pod-2 url 'http://10.0.0.2:8000' "
        "is also replica 10.0.0.2:8000's url: one server listed as two replicas would be "
        "counted twice (its load and its cache each seen as two replicas', its requests "
        "split between them); list it once"]
    assert sorted(s.id for s in gw.fleet) == ["10.0.0.2:8000", "pod-3", "r0"]
    # once the holder leaves, the replica left out joins at the next publish
    await reconcile(gw, "dns:a", {})
    again = await reconcile(gw, "dns:b", {
        "pod-2": template.replica("pod-2", "10.0.0.2", 8000),
        "pod-3": template.replica("pod-3", "10.0.0.3", 8000)})
    assert again.added == ("pod-2",)
