"""The gateway's request builder hashes only the prompt pieces a policy reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway.fleet import Fleet
from gateway.request_parse import ParsedRequest, parse_body
from gateway.routing import Router
from kvwire.openai_schema import BadRequest
from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR
from policies.prompt_chunks import id_chunks, text_chunks
from policies.registry import build_policy
from tests.support.bos_tokenizer import bos_tokenizer

TEXT = "The parties agree that the term of this agreement is five years. " * 400  # 26 KB


def completion(text: str | None = None, ids: list[int] | None = None) -> ParsedRequest:
    return ParsedRequest("completions", {}, "m", True, text, ids, None, None, None)


def test_prefix_affinity_gets_the_pieces_its_key_reads_and_cost_gets_all() -> None:
    affinity = Router(build_policy({"name": "prefix_affinity"}), load_tokenizer(), Fleet([]), 1)
    cost = Router(build_policy({"name": "cost"}), load_tokenizer(), Fleet([]), 1)
    try:
        request = affinity.build(completion(TEXT))
        assert affinity.policy.chunks_needed == 64  # K = 1,024 tokens, 16 a piece
        assert list(request.chunks) == text_chunks(TEXT, 64)[:64]
        assert request.prompt_tokens > 5000  # the whole prompt's length, estimated
        ids = list(range(3000))
        assert list(affinity.build(completion(ids=ids)).chunks) == id_chunks(ids)[:64]
        assert list(cost.build(completion(TEXT)).chunks) == text_chunks(TEXT, 64)
    finally:
        affinity.close()
        cost.close()


def test_a_document_asked_again_reuses_its_pieces_and_a_salt_keeps_its_own() -> None:
    cost = Router(build_policy({"name": "cost"}), load_tokenizer(), Fleet([]), 1)
    try:
        asks = [(TEXT + " What is the term?", None), (TEXT + " And the fee?", None),
                (TEXT + " And the fee?", "tenant-b"), (TEXT + "!", "tenant-b")]
        for text, salt in asks:
            parsed = ParsedRequest("completions", {}, "m", True, text, None, None, salt, None)
            assert list(cost.build(parsed).chunks) == text_chunks(text, 64)
        memo = cost._chunk_memo
        assert memo is not None
        # the second ask reused the first's pieces; the salted ones only each other's
        assert memo.hits == 2 and len(memo) == 2
    finally:
        cost.close()


def test_a_policy_that_reads_whole_prompts_gets_a_long_prompt_without_spaces() -> None:
    # kv_events needs every token: the whole encoding has no cut to reuse in such a text
    tokenizer = load_tokenizer(None, memo_size=2048)  # the gateway's default memo
    router = Router(build_policy({"name": "kv_events"}), tokenizer, Fleet([]), 1)
    try:
        for text in ("合同条款" * 1200, "x" * 5000):
            request = router.build(completion(text))
            assert list(request.tokens) == tokenizer.encode(text)
    finally:
        router.close()


@pytest.mark.parametrize("policy", ["cost", "radix"])  # those render the chat
def test_a_chat_the_gateways_template_refuses_is_routed_in_the_built_in_layout(
        tmp_path: Path, policy: str) -> None:
    # the gateway's tokenizer may not be the replica's: its template's refusal is not the
    # answer, the replica judges the chat; a malformed chat is still a 400
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")}))
    tokenizer = load_tokenizer(tmp_path)
    router = Router(build_policy({"name": policy}), tokenizer, Fleet([]), 1)
    chat = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]
    try:
        refused = router.build(ParsedRequest("chat", {}, "m", True, None, None, chat, None,
                                             None))
        built_in = tokenizer.render_chat(chat, builtin_layout=True)
        assert built_in.startswith("<|im_start|>system\nbe nice")
        assert refused.chunks and list(refused.chunks) == text_chunks(built_in, 64)
        assert refused.prompt_tokens > 0
        ok = router.build(ParsedRequest("chat", {}, "m", True, None, None, chat[1:], None,
                                        None))
        assert ok.prompt_tokens > 0
        with pytest.raises(BadRequest, match=r"messages\[1\]\.role") as raised:
            router.build(ParsedRequest("chat", {}, "m", True, None, None,
                                       [chat[0], {"content": "hi"}], None, None))
        assert raised.value.status == 400
    finally:
        router.close()


def test_the_affinity_field_is_a_string_or_a_number() -> None:
    def body(value: object) -> bytes:
        return b'{"model": "m", "prompt": "x", "session": %s}' % value_json(value)

    def value_json(value: object) -> bytes:
        if value == "deep":  # deeper than str() can go, within what the gateway reads
            return b"[" * 990 + b'"x"' + b"]" * 990
        return json.dumps(value).encode()

    assert parse_body(body("chat-7"), "completions", "session").affinity_key == "chat-7"
    assert parse_body(body(42), "completions", "session").affinity_key == "42"
    assert parse_body(body(None), "completions", "session").affinity_key is None
    for bad in ({"a": 1}, "deep", True):
        with pytest.raises(BadRequest, match=r"'session' .* must be a string or a number"):
            parse_body(body(bad), "completions", "session")


def test_a_request_says_whether_its_model_is_an_adapter_as_the_replicas_list_it() -> None:
    from gateway.config import ReplicaConfig
    from gateway.fleet import ModelInfo

    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:9")])
    state = fleet.get("r0")
    assert state is not None
    state.model_info = {"m": ModelInfo("m", None, 4096), "m-lora": ModelInfo("/a", "m")}
    router = Router(build_policy({"name": "kv_events"}), load_tokenizer(), fleet, 1)
    try:
        base = completion("hello")
        lora = ParsedRequest("completions", {}, "m-lora", True, "hello", None, None, None, None)
        assert router.build(base).adapter is False  # "m": the base model
        assert router.build(lora).adapter is True
        assert router.build(lora).base_model == "m"
        unknown = ParsedRequest("completions", {}, "x", True, "hi", None, None, None, None)
        assert router.build(unknown).adapter is False  # no replica lists it
        assert router.build(base).base_model is None and router.build(unknown).base_model is None
    finally:
        router.close()


def test_a_chat_is_rendered_as_the_replica_renders_its_turn() -> None:
    tokenizer = load_tokenizer()
    router = Router(build_policy({"name": "kv_events"}), tokenizer, Fleet([]), 1)
    chat = [{"role": "user", "content": "Write a haiku"},
            {"role": "assistant", "content": "Autumn moon"}]
    try:
        for body, render in (
                ({}, {}),
                ({"add_generation_prompt": False}, {"add_generation_prompt": False}),
                ({"continue_final_message": True, "add_generation_prompt": False},
                 {"add_generation_prompt": False, "continue_final_message": True})):
            parsed = ParsedRequest("chat", body, "m", True, None, None, chat, None, None)
            want = tokenizer.encode(tokenizer.render_chat(chat, **render))
            assert list(router.build(parsed).tokens) == want, body
        # a final message that cannot be continued: the plain chat, the replica to judge
        user_last = ParsedRequest("chat", {"continue_final_message": True}, "m", True, None,
                                  None, chat[:1], None, None)
        assert list(router.build(user_last).tokens) \
            == tokenizer.encode(tokenizer.render_chat(chat[:1]))
    finally:
        router.close()


def test_a_text_prompt_is_routed_by_the_ids_the_engines_encode_it_to(tmp_path: Path) -> None:
    # vLLM and SGLang put a Llama's BOS before a completion's text: the KV blocks an
    # exact index matches hold it; a chat's rendered template writes its own
    directory, bos = bos_tokenizer(tmp_path)
    tokenizer = load_tokenizer(directory, memo_size=64)
    exact = Router(build_policy({"name": "kv_events"}), tokenizer, Fleet([]), 1)
    keyed = Router(build_policy({"name": "prefix_affinity", "chunk_chars": 0}), tokenizer,
                   Fleet([]), 1)
    try:
        whole = exact.build(completion(TEXT))
        assert list(whole.tokens) == [bos, *tokenizer.encode(TEXT)]
        first, again = keyed.build(completion(TEXT)), keyed.build(completion(TEXT))
        assert list(first.tokens) == list(again.tokens) == list(whole.tokens)[:1024]
        chat = parse_body(json.dumps({"model": "m", "messages": [
            {"role": "user", "content": TEXT}]}).encode(), "chat")
        ids = list(exact.build(chat).tokens)
        assert ids[0] == bos and ids.count(bos) == 1
    finally:
        exact.close()
        keyed.close()
