"""The timing probe sends half its documents by the victim first, as it says: a coin flip
per document left one side empty now and then (always with ``--probes 1``), and the AUC
then divided by zero once every probe had run."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from loadtests.timing_probe import main, probe
from tests.support.engine_servers import LiveEngine, serve_engine


def test_a_few_probes_always_give_an_auc() -> None:
    with contextlib.contextmanager(serve_engine)(LiveEngine, "m") as engine:
        # with a coin per document, seed 3 sent neither document by the victim first
        for seed in range(4):
            assert 0.0 <= probe(engine.url, "m", "a", "v", 2, 12, seed=seed) <= 1.0


def test_fewer_than_two_probes_are_refused_before_any_fleet_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVGATE_FLEET_DIR", str(tmp_path / "fleet"))
    with pytest.raises(SystemExit) as exit_:
        main(["--probes", "1", "--replicas", "1"])
    assert exit_.value.code == 2
    assert "argument --probes: must be at least 2" in capsys.readouterr().err
    assert not (tmp_path / "fleet").exists()
    with pytest.raises(ValueError, match=r"probes must be at least 2 .*, got 1"):
        probe("http://127.0.0.1:9", "m", "a", "v", 1, 12)
