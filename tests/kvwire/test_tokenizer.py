"""The project tokenizer, prefix tokenization and chat rendering."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from kvwire.chat_messages import ChatFormatError
from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR, build, digest, sample_text
from tests.support.bos_tokenizer import bos_tokenizer


def test_build_is_deterministic_and_matches_the_shipped_copy(tmp_path: Path) -> None:
    assert digest(build(tmp_path)) == digest(ASSET_DIR / "tokenizer.json")


@pytest.mark.parametrize("seed", range(6))
def test_prefix_encoding_is_a_prefix_of_the_full_encoding(seed: int) -> None:
    tok = load_tokenizer()
    rng = random.Random(seed)
    text = sample_text(rng, rng.randint(5, 3000))
    if seed % 2:  # odd spacing and markup must not break the prefix property
        text = text.replace(". ", ".\n\n  ").replace(", ", " ,  ")
    full = tok.encode(text)
    for k in (1, 17, 256, 1024, 5000):
        enc = tok.encode_prefix(text, k)
        assert enc.ids == full[:k]
        if k >= len(full):
            assert enc.complete
        if not enc.complete:
            assert len(enc.ids) == k <= enc.total_estimate
        if enc.complete:
            assert enc.total_estimate == len(full)
    assert tok.encode_prefix(text, None).ids == full


def test_token_counts_are_realistic() -> None:
    tok = load_tokenizer()
    text = sample_text(random.Random(1), 1000)
    assert 1.2 < len(tok.encode(text)) / 1000 < 2.5
    assert tok.decode(tok.encode(text)) == text


def test_fixed_chat_layout_and_errors() -> None:
    tok = load_tokenizer()
    text = tok.render_chat([{"role": "system", "content": "be brief"},
                            {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert text == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok.encode(text)
    assert ids.count(tok.encode("<|im_start|>")[0]) == 3
    with pytest.raises(ChatFormatError, match=r"messages\[1\].role"):
        tok.render_chat([{"role": "user", "content": "a"}, {"content": "b"}])
    with pytest.raises(ChatFormatError, match=r"messages\[0\].content\[0\]"):
        tok.render_chat([{"role": "user", "content": [{"type": "image_url"}]}])


def _history(tool: str) -> list[dict[str, object]]:
    return [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": tool, "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]


def test_a_historys_tool_calls_are_rendered(tmp_path: Path) -> None:
    # two histories that differ only in the call made are two prompts, in the built-in
    # layout and to a model's template alike (which gets the calls as given)
    tok = load_tokenizer()
    weather, delete = tok.render_chat(_history("get_weather")), tok.render_chat(
        _history("delete_all_files"))
    assert '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}' \
        "\n</tool_call>" in weather
    assert tok.encode(weather) != tok.encode(delete)
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}"
                "{% for c in m.tool_calls or [] %}<call {{ c.function.name }}>{% endfor %}"
                "{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}{% endfor %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    assert load_tokenizer(tmp_path).render_chat(_history("get_weather"), False) == (
        "[user] weather in Paris?[assistant] <call get_weather>[tool] 18C (call_1)")
    for bad, param in ((5, r"messages\[1\]\.tool_calls"),
                       ([{"function": {"name": 5}}], r"messages\[1\]\.tool_calls\[0\]")):
        with pytest.raises(ChatFormatError, match=param):
            tok.render_chat([{"role": "user", "content": "x"},
                             {"role": "assistant", "content": "", "tool_calls": bad}])


def test_model_chat_template_is_used(tmp_path: Path) -> None:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "eos_token": "<|im_end|>"}))
    tok = load_tokenizer(tmp_path)
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "[user] hi\n[assistant]"
    assert tok.eos_token_id == tok.encode("<|im_end|>")[0]


def test_missing_tokenizer_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_tokenizer(tmp_path)


def test_prefix_memo_gives_the_same_answers() -> None:
    plain, memo = load_tokenizer(), load_tokenizer(memo_size=4)
    rng = random.Random(11)
    doc = sample_text(rng, 2000)
    texts = [doc + " question " + sample_text(rng, 30) for _ in range(3)]
    texts += [sample_text(rng, 2000) for _ in range(6)] + texts  # evicts, then repeats
    texts += ["short text", "word " * 3]
    for text in texts:
        for k in (64, 512):
            got, want = memo.encode_prefix(text, k), plain.encode_prefix(text, k)
            assert list(got.ids) == list(want.ids)
            assert got.complete == want.complete
            if want.complete:
                assert got.total_estimate == want.total_estimate == len(plain.encode(text))
            else:  # extrapolated from how far each read (which its history sets)
                assert got.total_estimate == pytest.approx(want.total_estimate, rel=0.05)
    assert 0 < len(memo._memo or {}) <= 4


def test_prefix_reads_little_past_the_tokens_asked_for_whatever_the_text() -> None:
    """The characters read for a prefix follow the characters per token of the prompts
    seen lately, not a fixed guess: after five prompts of a kind, a prefix of 1,024
    tokens reads at most a quarter more text than those tokens take, for English-like
    text and for digits alike; and the answer is always the full encoding's head."""
    tok = load_tokenizer()
    rng = random.Random(4)
    kinds = {"words": [sample_text(rng, 3000) for _ in range(8)],
             "digits": [" ".join(f"{rng.randrange(10**6)}," for _ in range(4000))
                        for _ in range(8)]}
    reads: list[int] = []
    real_encode = tok.encode
    tok.encode = lambda text: reads.append(len(text)) or real_encode(text)  # type: ignore
    for name, texts in kinds.items():
        for i, text in enumerate(texts):
            reads.clear()
            enc = tok.encode_prefix(text, 1024)
            full = real_encode(text)
            assert list(enc.ids) == full[:1024], name
            need = 1024 * len(text) / len(full)  # the characters 1,024 tokens take
            if i >= 5:  # learned
                assert sum(reads) <= 1.25 * need + 64, (name, reads, need)


def test_the_read_length_comes_back_down_after_sparse_prompts() -> None:
    """After prompts of many characters per token, shorter ordinary prompts (read whole,
    since they fit the longer reads) bring the read length back down."""
    rng = random.Random(6)
    tok = load_tokenizer()
    for _ in range(4):  # about 10 characters per token
        tok.encode_prefix(" ".join(["agreement"] * 3000), 1024)
    for _ in range(4):  # about 1,200 words: shorter than a read at 10 characters a token
        tok.encode_prefix(sample_text(rng, 1200), 1024)
    text = sample_text(rng, 3000)
    reads: list[int] = []
    real_encode = tok.encode
    tok.encode = lambda t: reads.append(len(t)) or real_encode(t)  # type: ignore
    tok.encode_prefix(text, 1024)
    need = 1024 * len(text) / len(real_encode(text))
    assert sum(reads) <= 1.25 * need + 64, (reads, need)


def test_prefix_memo_checks_text_read_past_the_first_budget() -> None:
    """A first budget without a space makes the encoder read further; a text sharing only
    the first budget must not be served the remembered answer."""
    plain, memo = load_tokenizer(), load_tokenizer(memo_size=8)
    run = "parties" * 300  # 2,100 characters without a space
    a = run + " alpha beta gamma " + sample_text(random.Random(2), 200)
    b = run + "zz delta epsilon " + sample_text(random.Random(3), 200)
    for text in (a, b, a, b):
        got, want = memo.encode_prefix(text, 64), plain.encode_prefix(text, 64)
        assert list(got.ids) == list(want.ids)
        assert got.total_estimate == want.total_estimate
    # both share one memo key: it holds b's answer now, checked against b's longer text
    hit = memo.remembered_prefix(b, 64)
    assert hit is not None and list(hit.ids) == list(plain.encode_prefix(b, 64).ids)
    assert memo.remembered_prefix(a, 64) is None


def test_a_template_that_refuses_the_messages_is_a_chat_format_error(tmp_path: Path) -> None:
    # as Mistral's and Gemma's templates do: raise_exception(...) on a system role, or on
    # roles out of turn
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                "{{ raise_exception('System role not supported') }}{% endif %}"
                "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tok = load_tokenizer(tmp_path)
    assert tok.render_chat([{"role": "user", "content": "hi"}]).startswith("[user] hi")
    with pytest.raises(ChatFormatError, match="System role not supported"):
        tok.render_chat([{"role": "system", "content": "be nice"},
                         {"role": "user", "content": "hi"}])
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(ASSET_DIR / "tokenizer.json", broken / "tokenizer.json")
    (broken / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ messages[0]['content'] + 1 }}"}))  # fails as it renders
    with pytest.raises(ChatFormatError, match="chat template"):
        load_tokenizer(broken).render_chat([{"role": "user", "content": "hi"}])


def test_a_text_part_must_hold_a_string() -> None:
    tok = load_tokenizer()
    deep: object = "x"
    for _ in range(990):  # deeper than repr() can go
        deep = [deep]
    for text in ({"a": 1}, deep, 7):
        with pytest.raises(ChatFormatError, match=r"messages\[0\].content\[0\].text must be"):
            tok.render_chat([{"role": "user", "content": [{"type": "text", "text": text}]}])


def test_a_remembered_prefix_is_not_served_to_a_text_going_on_otherwise_at_its_cut() -> None:
    """A prefix is read up to a space after a word (its cut) and remembered by the text
    before it: a later text with the same characters there but a word going on where the
    space was (``... stout`` + ``ing``) encodes its last token before the cut otherwise, and
    was served the remembered ids."""
    plain, memo = load_tokenizer(), load_tokenizer(memo_size=512)
    text = sample_text(random.Random(33), 400)
    for n in range(20, 64):  # (the reads learn as they go: n = 56 ends its read at n tokens)
        memo.encode_prefix(text, n)
        cut = next(held[2] for key, held in memo._memo._entries.items()  # type: ignore
                   if key[1] == n)
        going_on = text[:cut] + "ing" + text[cut:]
        assert list(memo.encode_prefix(going_on, n).ids) == plain.encode(going_on)[:n], n


def test_a_text_prompt_is_wrapped_in_the_special_tokens_the_tokenizer_adds(
        tmp_path: Path) -> None:
    # vLLM and SGLang encode a completion's text with them (a Llama's BOS), a chat without
    directory, bos = bos_tokenizer(tmp_path)
    tok = load_tokenizer(directory)
    assert tok.text_prefix_ids == (bos,) and tok.text_suffix_ids == ()
    ids = tok.encode("the term is five years")
    assert tok.prompt_ids(ids) == [bos, *ids] and bos not in ids
    chat = tok.encode(tok.render_chat([{"role": "user", "content": "hi"}]))
    assert chat.count(bos) == 1 and chat[0] == bos  # the template's own, once
    plain = load_tokenizer()
    assert plain.text_prefix_ids == () and plain.prompt_ids(ids) == ids
