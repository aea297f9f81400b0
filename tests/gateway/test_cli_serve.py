"""``kvgate serve`` as an operator runs it: Ctrl-C stops it with a line, not a traceback;
SIGTERM stops it even when nothing reads its stderr any more."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.processes import REPO
from tests.support.servers import free_port
from tests.support.waiting import wait_http


def _serve(tmp_path: Path, grace_s: float, sigint_ignored: bool = False, **popen: Any
           ) -> tuple[subprocess.Popen[Any], int]:
    """``kvgate serve`` of a gateway in front of one replica, not checked or scraped; its
    process and port. ``sigint_ignored``: started as a shell script's background job is,
    with SIGINT ignored."""
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}],
        "health": {"interval_s": 60}, "scrape": {"enabled": False},
        "shutdown": {"grace_s": grace_s, "timeout_s": 1}}))
    command = [sys.executable, "-m", "kvgate", "serve", "--config", str(config)]
    if sigint_ignored:
        command = ["sh", "-c", 'trap "" INT; exec "$0" "$@"', *command]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, **popen), port


@pytest.mark.parametrize("sigint_ignored", [False, True])
def test_ctrl_c_stops_the_gateway_without_a_traceback(tmp_path: Path,
                                                      sigint_ignored: bool) -> None:
    # (started with SIGINT ignored, as a shell script's background job is, the gateway took
    # the signal all the same, and ended with 0 and no line)
    proc, port = _serve(tmp_path, 0, sigint_ignored,
                        env=dict(os.environ, PYTHONUNBUFFERED="1"), text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 30, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.rstrip().endswith("kvgate serve: stopped")


def test_sigterm_stops_the_gateway_when_what_read_its_stderr_has_gone(tmp_path: Path) -> None:
    # a log collector that died, a `| head`: the drain's line has nowhere to go
    proc, port = _serve(tmp_path, 0.1)
    try:
        assert proc.stderr is not None
        proc.stderr.readline()  # "gateway on ..."
        proc.stderr.close()
        wait_http(f"http://127.0.0.1:{port}/health", 30, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_is_refused_in_one_line_before_start(
        tmp_path: Path, workers: str, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from gateway import serve as serve_cli

    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}]}))
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    with socket.socket() as taken:  # another server holds the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = parser.parse_args(["--config", str(config), "--port", str(port),
                                  "--workers", workers])
        assert serve_cli.run(args) == 2
    err = capsys.readouterr().err
    assert err == f"kvgate serve: {config}: --port {port} on '127.0.0.1' is in use: stop " \
        "what holds it, or choose another port\n"


def test_the_start_line_names_an_ipv6_address_as_a_url() -> None:
    from gateway.serve import _url

    assert _url("::1", 8000) == "http://[::1]:8000"
    assert _url("127.0.0.1", 8000) == "http://127.0.0.1:8000"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_missing_tokenizer_is_named_with_its_config_file_before_any_worker_starts(
        tmp_path: Path, workers: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway import serve as serve_cli

    config = tmp_path / "gateway.yaml"
    missing = tmp_path / "no-such-tokenizer.json"
    config.write_text(yaml.safe_dump({"replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}],
                                      "port": free_port(), "tokenizer": str(missing)}))
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    assert serve_cli.run(parser.parse_args(["--config", str(config), "--workers", workers])) \
        == 2
    assert capsys.readouterr().err == \
        f"kvgate serve: {config}: tokenizer file not found: {missing}\n"


def test_kvgate_serve_counts_the_answers_its_http_server_writes_itself(
        tmp_path: Path) -> None:
    import socket
    import urllib.request

    proc, port = _serve(tmp_path, 0.1)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 30)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert sock.recv(12) == b"HTTP/1.1 400"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            lines = page.read().decode().splitlines()
        assert 'kvgate_requests_total{replica="none",route="none",status="400"} 1.0' in lines
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
