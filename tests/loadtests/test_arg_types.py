"""Counts and rates on the load tools' command lines: a value no run can use is refused
when the line is parsed, naming the flag."""

from __future__ import annotations

import argparse

import pytest

from kvwire.arg_types import non_negative_int, positive_float, positive_int
from loadtests import cli_demo, plan


@pytest.mark.parametrize("text", ["0", "-1"])
def test_a_count_below_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be >= 1, got {text}"):
        positive_int(text)
    assert positive_int("3") == 3
    assert non_negative_int("0") == 0  # kvgate plan --sim-requests 0: no simulation
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 0, got -1"):
        non_negative_int("-1")


@pytest.mark.parametrize("text", ["0", "-2.5", "nan", "inf"])
def test_a_rate_that_is_no_positive_number_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="must be a positive number"):
        positive_float(text)
    assert positive_float("0.5") == 0.5


@pytest.mark.parametrize(("module", "argv"), [
    (cli_demo, ["--rate", "0"]), (cli_demo, ["--duration", "-1"]),
    (cli_demo, ["--replicas", "0"]), (plan, ["--rate", "nan"]),
    (plan, ["--sim-requests", "-1"])])
def test_the_demo_and_plan_refuse_them(module: object, argv: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kvgate")
    module.add_arguments(parser)  # type: ignore[attr-defined]
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    assert f"argument {argv[0]}" in capsys.readouterr().err
