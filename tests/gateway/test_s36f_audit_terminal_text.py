"""``kvgate audit``'s text report shows what the capture log holds (a client's prompt,
model and tenant) as printable text, never as codes the reader's terminal obeys; and a
``--max-requests`` or ``--min-tokens-lost`` no run can use is refused naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.cli import main

ESC = "\x1b]0;PWNED\x07\x1b[2J\x1b[31m"
DOC = "The quick brown fox jumps over the lazy dog. " * 40


def _log(tmp_path: Path) -> Path:
    """Requests whose prompts part at a date near their start, with codes planted in
    the prompt, the model and the tenant."""
    log = tmp_path / "capture.jsonl"
    log.write_text("".join(json.dumps({
        "ts": 1000 + i, "model": "m" + ESC, "tenant": "t" + ESC, "endpoint": "completions",
        "body": {"model": "m", "prompt": f"Now: 2024-01-{i + 1:02d}T10:{i:02d} {ESC}\n"
                 + DOC + f" Q{i}?"}}) + "\n" for i in range(12)))
    return log


def test_the_text_report_writes_codes_from_the_log_as_escapes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(tmp_path)
    assert main(["audit", str(log)]) == 0
    out = capsys.readouterr().out
    assert "timestamp" in out  # a finding, with the log's text in it
    assert "\x1b" not in out and "\x07" not in out
    planted = "\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31m"
    assert f"model m{planted}, tenant t{planted}" in out
    assert f"{planted}\\nThe quick brown fox" in out
    assert main(["audit", "--json", str(log)]) == 0  # JSON carries them as JSON does
    finding = json.loads(capsys.readouterr().out)["findings"][0]
    assert finding["model"] == "m" + ESC and finding["tenant"] == "t" + ESC


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--max-requests", "100000000000000000000", "must be at most"),
    ("--max-requests", "1e20", "must be an integer, got '1e20'"),
    ("--max-requests", "0", "must be >= 1, got 0"),
    ("--min-tokens-lost", "-3", "must be >= 1, got -3")])
def test_a_count_no_run_can_use_is_refused_naming_the_flag(
        flag: str, value: str, says: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-requests 1e20`` (as an integer) failed with "Python int too large to
    convert to C ssize_t", naming no flag."""
    with pytest.raises(SystemExit) as exited:
        main(["audit", str(_log(tmp_path)), flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {says}" in err and "Traceback" not in err
