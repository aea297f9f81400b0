"""``kvgate.layout``: prefix fingerprints in token ids and the shared-prefix assertion, on
a ``render()`` like the one teams write (a fixed system prompt, then the user's message),
and docs/prompt-layouts.md's example run as a test module of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from kvgate.layout import (
    ADVICE,
    SharedPrefixError,
    assert_shared_prefix,
    common_prefix_tokens,
    prefix_fingerprint,
)
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR

LAYOUT_DOC = Path(__file__).resolve().parents[2] / "docs" / "prompt-layouts.md"
SYSTEM_PROMPT = ("You are the contracts assistant of the legal team. Answer only from the "
                 "clauses given, cite each clause by its number, and say so when the "
                 "clauses do not answer the question.\n")


def render(user_message: str, now: str | None = None) -> str:
    """A chat prompt: the system prompt (with the time in it, when ``now`` is given), then
    the user's message."""
    system = SYSTEM_PROMPT if now is None else f"Current time: {now}.\n{SYSTEM_PROMPT}"
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user_message}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def tok() -> PromptTokenizer:
    return load_tokenizer()


def stable_tokens(tok: PromptTokenizer) -> int:
    """Tokens of the part every request shares (through the user turn's header)."""
    return len(tok.encode(render("x").split("x<|im_end|>")[0]))


def test_two_user_messages_give_the_same_fingerprint(tok: PromptTokenizer) -> None:
    n = stable_tokens(tok)
    a, b = render("What is the notice period?"), render("Repairs: who pays?")
    assert prefix_fingerprint(a, tok, n) == prefix_fingerprint(b, tok, n)
    assert assert_shared_prefix(a, b, tok, n) == prefix_fingerprint(a, tok, n)
    # one token further, the messages differ and so do the fingerprints
    assert prefix_fingerprint(a, tok, n + 1) != prefix_fingerprint(b, tok, n + 1)


def test_a_timestamp_in_the_system_prompt_fails_pointing_at_it(tok: PromptTokenizer) -> None:
    a = render("What is the notice period?", now="2026-12-01 10:00:03")
    b = render("Who pays for repairs?", now="2026-12-01 10:05:41")
    with pytest.raises(SharedPrefixError) as failed:
        assert_shared_prefix(a, b, tok, stable_tokens(tok))
    message = str(failed.value)
    at = common_prefix_tokens(tok.encode(a), tok.encode(b))
    first_changed = a.index("10:00:03") + 4  # "10:0" is shared, then "0" against "5"
    assert len(tok.encode(a[:first_changed])) == at  # the count stops at the timestamp
    assert f"differ at token {at} of the first" in message
    shown = re.findall(r"\[\[(.*?)\]\]", message)
    assert shown == ["'0'", "'5'"]  # the first differing token, from each prompt
    assert "Current time: 2026-12-01 10:0" in message and "':03." in message
    assert ADVICE in message
    assert "end the stable part on a newline" in message
    assert "fingerprint token ids, not characters" in message


def test_a_prompt_shorter_than_n_tokens(tok: PromptTokenizer) -> None:
    short, long = render("hi"), render("hi") + "more words to make it longer"
    n = len(tok.encode(short)) + 3
    with pytest.raises(ValueError, match=f"fewer than n_tokens={n}"):
        prefix_fingerprint(short, tok, n)
    with pytest.raises(SharedPrefixError, match="prompt a has only"):
        assert_shared_prefix(short, long, tok, n)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_n_tokens_is_checked(bad: object, tok: PromptTokenizer) -> None:
    with pytest.raises(ValueError, match=f"n_tokens must be an integer >= 1, got {bad!r}"):
        prefix_fingerprint("text", tok, bad)  # type: ignore[arg-type]


def test_any_tokenizer_gives_the_same_fingerprint(tok: PromptTokenizer) -> None:
    """The project's tokenizer, the HF ``tokenizers`` one it wraps, a path, and None (the
    project's) count the same token ids."""
    prompt = render("What is the notice period?")
    hf = Tokenizer.from_file(str(ASSET_DIR / "tokenizer.json"))
    prints = {prefix_fingerprint(prompt, t, 20) for t in (tok, hf, ASSET_DIR, None)}
    assert len(prints) == 1
    with pytest.raises(TypeError, match="tokenizer must be"):
        prefix_fingerprint(prompt, 42, 20)


def test_fingerprints_are_of_token_ids_not_characters(tok: PromptTokenizer) -> None:
    """Equal first characters, different first tokens: a stable part that does not end on a
    newline merges with what follows it."""
    stable = "Answer from the clauses"
    a, b = stable + " given below.", stable + "given below."
    assert a[: len(stable)] == b[: len(stable)]
    n = len(tok.encode(stable))
    assert prefix_fingerprint(a, tok, n) != prefix_fingerprint(b, tok, n)
    with_newline = stable + "\n"
    m = len(tok.encode(with_newline))
    assert (prefix_fingerprint(with_newline + " given below.", tok, m)
            == prefix_fingerprint(with_newline + "given below.", tok, m))


def documented_example() -> str:
    text = LAYOUT_DOC.read_text()
    marker = text.index("<!-- prefix-check-example")
    return text[marker:].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_example_runs_and_catches_a_timestamp(tmp_path: Path) -> None:
    code = documented_example()
    (tmp_path / "test_example.py").write_text(code)
    # the same example with the time put at the top of the system prompt
    stamped = code.replace("def render(", 'STAMPS = iter(["2026-12-01 10:00:03", '
                           '"2026-12-01 10:05:41"])\n\n\ndef render(')
    stamped = stamped.replace("system\\n{SYSTEM}", "system\\nNow: {next(STAMPS)}\\n{SYSTEM}")
    assert stamped.count("STAMPS") == 2
    (tmp_path / "test_stamped.py").write_text(stamped)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert "1 failed, 1 passed" in out, out
    assert "test_stamped.py" in out and "differ at token" in out
