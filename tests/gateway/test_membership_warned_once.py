"""A discovered replica that cannot join (its id held by another source) is warned of
once while it stays so, not at every publish (a DNS source's every few seconds)."""

from __future__ import annotations

import logging

import pytest

from gateway.config import parse_config
from gateway.discovery.config import ReplicaTemplate
from gateway.membership import reconcile
from gateway.state import build_state


async def test_an_id_held_by_another_source_is_warned_of_once_while_it_stays(
        caplog: pytest.LogCaptureFixture) -> None:
    template = ReplicaTemplate()
    replica = template.replica("10.0.0.1:8000", "10.0.0.1", 8000)
    gw = build_state(parse_config({"replicas": []}))
    await reconcile(gw, "dns:a", {"10.0.0.1:8000": replica})

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if "already in the fleet" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="kvgate.membership"):
        for _ in range(3):
            changes = await reconcile(gw, "dns:b", {"10.0.0.1:8000": replica})
            assert changes.skipped == ("10.0.0.1:8000",)
        assert len(warnings()) == 1, warnings()
        await reconcile(gw, "dns:a", {})  # it leaves a: b's copy joins
        assert (await reconcile(gw, "dns:b", {"10.0.0.1:8000": replica})).added \
            == ("10.0.0.1:8000",)
        await reconcile(gw, "dns:b", {})
        await reconcile(gw, "dns:a", {"10.0.0.1:8000": replica})
        await reconcile(gw, "dns:b", {"10.0.0.1:8000": replica})  # held again: said again
        assert len(warnings()) == 2, warnings()
