"""``kvgate demo`` stopped by a signal (Ctrl-C, SIGTERM, a hang-up): its handler only cancels, so a
process spawned as the signal came is stopped with the rest, never left running; the demo
says it stopped and exits with 130, without a traceback."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests import cli_demo


def demo_args(out: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_demo.add_arguments(parser)
    return parser.parse_args(["--out", str(out), "--duration", "1", "--replicas", "2"])


def role(proc: subprocess.Popen[bytes]) -> str:
    """What the demo started: an ``engine``, the gateway (``serve``) or ``locust``."""
    assert isinstance(proc.args, list)
    return next(str(a) for a in proc.args if a in ("engine", "serve", "locust"))


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every process the demo spawns, killed at the end if still running."""
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def recorded(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(real_popen(*args, **kwargs))  # type: ignore[call-overload]
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", recorded)
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_that_comes_while_an_engine_is_spawned_stops_that_engine_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals,
        spawned: list[subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]) -> None:
    recorded = subprocess.Popen

    def popen_then_signal(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        started = recorded(*args, **kwargs)  # type: ignore[call-overload]
        os.kill(os.getpid(), sig)  # its handler runs here, before Popen has returned
        return started  # type: ignore[no-any-return]

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    handler = signal.getsignal(sig)
    assert cli_demo.run(demo_args(tmp_path / "out")) == 130
    assert signal.getsignal(sig) is handler  # the demo's own handler is gone
    err = capsys.readouterr().err
    assert err.endswith("\nkvgate demo: stopped\n") and "Traceback" not in err
    assert [role(p) for p in spawned] == ["engine"]  # the first engine, r0
    assert spawned[0].poll() is not None  # stopped with the fleet, not left running


def test_a_signal_while_the_load_runs_stops_locust_and_the_fleet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        spawned: list[subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]) -> None:
    recorded = subprocess.Popen

    def signal_when_locust_starts(*args: object, **kwargs: object
                                  ) -> subprocess.Popen[bytes]:
        started = recorded(*args, **kwargs)  # type: ignore[call-overload]
        if role(started) == "locust":
            os.kill(os.getpid(), signal.SIGINT)
        return started  # type: ignore[no-any-return]

    monkeypatch.setattr(subprocess, "Popen", signal_when_locust_starts)
    assert cli_demo.run(demo_args(tmp_path / "out")) == 130
    err = capsys.readouterr().err
    assert err.endswith("\nkvgate demo: stopped\n") and "Traceback" not in err
    # the first policy's fleet, and its load
    assert [role(p) for p in spawned] == ["engine", "engine", "serve", "locust"]
    assert [p.poll() is not None for p in spawned] == [True] * 4
    assert not (tmp_path / "out" / "results.json").exists()
