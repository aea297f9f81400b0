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


def test_a_context_longer_than_the_kv_cache_is_cut_to_it_or_refused_when_asked_for(
        caplog: pytest.LogCaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    small = ["--kv-cache-gib", "0.05"]  # Llama-3-8B: 128 KiB a token, 409 tokens
    server = engine_cli.build_server(parser.parse_args(small))
    capacity = server.core.config.num_blocks * server.core.config.block_size
    assert server.max_model_len == capacity < 8192  # the profile's 8,192 cut to the cache
    assert "larger than the" in caplog.text
    with pytest.raises(ValueError, match="--max-model-len 4096 is larger than the"):
        engine_cli.build_server(parser.parse_args([*small, "--max-model-len", "4096"]))
    fits = engine_cli.build_server(parser.parse_args([*small, "--max-model-len", "300"]))
    assert fits.max_model_len == 300


@pytest.mark.parametrize("argv, said", [
    (["--kv-cache-gib", "1e12"], "--kv-cache-gib 1e+12 is 512,000,000,000,000 blocks, whose "
                                 "records alone need"),
    (["--kv-cache-gib", "1e-9"], "--kv-cache-gib 1e-09 holds no block of 16 tokens"),
])
def test_kvgate_engine_refuses_a_kv_cache_no_machine_holds_in_one_line(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_cli.main(argv) == 2  # before the server starts
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--kv-cache-gib", "inf"], ["--kv-cache-gib", "nan"],
                                  ["--kv-cache-gib", "-1"], ["--max-num-seqs", "0"],
                                  ["--max-num-batched-tokens", "-5"], ["--max-model-len", "0"]])
def test_kvgate_engine_refuses_sizes_of_nothing_at_parse_time(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(argv)
    assert exited.value.code == 2
