"""``kvgate engine``'s arguments: values no engine can run with are refused at once."""

from __future__ import annotations

import argparse

import pytest

from engine import cli as engine_cli


def test_kvgate_engine_refuses_a_port_past_65535_and_a_block_of_no_tokens() -> None:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    for argv in (["--port", "99999"], ["--port", "0"], ["--block-size", "0"],
                 ["--kv-events-endpoint", "bogus"], ["--kv-events-replay-endpoint", "tcp:/x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
    assert parser.parse_args(["--log-level", "warning"]).log_level == "WARNING"
    assert parser.parse_args(["--kv-events-endpoint", "tcp://*:5557"]).kv_events_endpoint \
        == "tcp://*:5557"
