"""Discovery sources are told apart by what makes them two: one service name in two
clusters (contexts, kubeconfig files) or on two ports is two sources, not one refused as
a duplicate."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import parse_config
from policies.config import ConfigError


def test_one_service_in_two_clusters_is_two_sources(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).write_text("apiVersion: v1\nkind: Config\n")
    service = {"type": "kubernetes", "namespace": "llm", "service": "vllm"}
    config = parse_config({"discovery": [
        {**service, "kubeconfig": str(tmp_path / "a")},
        {**service, "kubeconfig": str(tmp_path / "b")},
        {**service, "context": "east"}, {**service, "port_name": "http2"}]})
    assert len({source.label for source in config.discovery}) == 4


def test_one_name_on_two_ports_is_two_sources() -> None:
    config = parse_config({"discovery": [{"type": "dns", "name": "vllm.llm.svc", "port": p}
                                         for p in (8000, 8001)]})
    assert [s.label for s in config.discovery] == ["dns:vllm.llm.svc:8000",
                                                   "dns:vllm.llm.svc:8001"]


def test_the_same_source_twice_is_still_refused() -> None:
    service = {"type": "kubernetes", "namespace": "llm", "service": "vllm", "context": "east"}
    with pytest.raises(ConfigError, match="appears twice"):
        parse_config({"discovery": [service, service]})
