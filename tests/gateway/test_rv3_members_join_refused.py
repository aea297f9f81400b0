"""A discovered replica the fleet refuses for a reason of its own (its API key file gone,
no slot left in the workers' accounting) is logged for that reason, not as the fleet's
limit of replicas, and joins at a later publish once the reason is gone."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.config import ReplicaConfig, parse_config
from gateway.discovery.config import ReplicaTemplate
from gateway.membership import Changes, reconcile
from gateway.state import GatewayState, build_state

SOURCE = "dns:vllm.llm.svc:8000"


async def _one_joined(tmp_path: Path) -> tuple[Path, dict[str, ReplicaConfig], GatewayState]:
    """A key file, two discovered replicas reading it, and a gateway only the first of
    them joined."""
    key = tmp_path / "vllm-key"
    key.write_text("sk-replica\n")
    template = ReplicaTemplate(api_key_file=str(key))
    wanted = {f"10.0.0.{i}:8000": template.replica(f"10.0.0.{i}:8000", f"10.0.0.{i}", 8000)
              for i in (1, 2)}
    gw = build_state(parse_config({"replicas": []}))
    await reconcile(gw, SOURCE, {"10.0.0.1:8000": wanted["10.0.0.1:8000"]})
    return key, wanted, gw


async def test_a_replica_refused_for_its_key_file_is_not_logged_as_the_fleet_limit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the refusal was also counted as past the limit: "the fleet holds its limit of 4096
    # replicas: 10.0.0.2:8000 not added", with one replica in the fleet
    key, wanted, gw = await _one_joined(tmp_path)
    key.unlink()  # the Secret is being replaced
    with caplog.at_level(logging.WARNING, logger="kvgate.membership"):
        changes = await reconcile(gw, SOURCE, wanted)
    assert changes == Changes((), (), ("10.0.0.2:8000",))
    said = [r.getMessage() for r in caplog.records]
    assert any("10.0.0.2:8000 not added: api_key_file" in line for line in said), said
    assert not [line for line in said if "limit" in line], said

    key.write_text("sk-replica\n")  # back: the same set joins whole at the next publish
    assert await reconcile(gw, SOURCE, wanted) == Changes(("10.0.0.2:8000",), (), ())
    assert sorted(s.id for s in gw.fleet) == sorted(wanted)


# A replica's API key is checked as a bearer token each time it is read, not only when the
# config was loaded: a key file that changed since (a replaced Secret, a replica found later
# by discovery) with a line break in its key joined the fleet, and every request routed to
# it then failed in the gateway (the upstream client refuses a header holding a line break).
async def test_a_key_file_rewritten_with_a_line_break_keeps_its_replica_out(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key, wanted, gw = await _one_joined(tmp_path)
    key.write_text("sk-replica\r\nx-injected: 1\n")
    with caplog.at_level(logging.WARNING, logger="kvgate.membership"):
        changes = await reconcile(gw, SOURCE, wanted)
    assert changes == Changes((), (), ("10.0.0.2:8000",))
    said = [r.getMessage() for r in caplog.records]
    assert any("10.0.0.2:8000 not added" in line and "api_key holds a control character"
               in line for line in said), said
    assert "sk-replica" not in " ".join(said)  # the key is never logged
    assert [s.id for s in gw.fleet] == ["10.0.0.1:8000"]
