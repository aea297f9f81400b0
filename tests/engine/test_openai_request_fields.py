"""Request fields of the OpenAI routes that change what the engine does, honoured as vLLM
honours them (sim executor): how a chat is rendered, prompt truncation, token ids in log
probabilities, usage on every streamed chunk, token strings from ``/tokenize`` and
batched completion prompts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from tokenizers import Tokenizer

from engine.generate_params import MAX_N, MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS
from kvwire.tokenizer_build import ASSET_DIR
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
STORY = [{"role": "user", "content": "tell a story"},
         {"role": "assistant", "content": "Once upon a"}]


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _tokens(live: LiveEngine, body: dict[str, Any]) -> list[int]:
    r = live.http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    tokens: list[int] = r.json()["tokens"]
    return tokens


def test_continue_final_message_leaves_the_assistant_turn_open(live: LiveEngine) -> None:
    tok = live.server.tokenizer
    open_turn = tok.encode("<|im_start|>user\ntell a story<|im_end|>\n"
                           "<|im_start|>assistant\nOnce upon a")
    asked = {"add_generation_prompt": False, "continue_final_message": True}
    assert _tokens(live, {"messages": STORY, **asked}) == open_turn
    out = live.client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=2,
                                              extra_body=asked)
    assert out.usage is not None and out.usage.prompt_tokens == len(open_turn)
    # without the header of a new assistant turn, and with it (the default)
    closed = tok.encode(tok.render_chat(STORY, add_generation_prompt=False))
    assert _tokens(live, {"messages": STORY, "add_generation_prompt": False}) == closed
    assert _tokens(live, {"messages": STORY}) == tok.encode(tok.render_chat(STORY))


@pytest.mark.parametrize(("body", "said"), [
    ({"messages": STORY, "continue_final_message": True}, "cannot both be true"),
    ({"messages": STORY[:1], "continue_final_message": True, "add_generation_prompt": False},
     "got role 'user'"),
])
def test_a_final_message_that_cannot_be_continued_is_refused(
        live: LiveEngine, body: dict[str, Any], said: str) -> None:
    for path, extra in (("/v1/chat/completions", {"model": MODEL}), ("/tokenize", {})):
        r = live.http.post(path, json={**body, **extra})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "continue_final_message" and said in error["message"]


def test_truncate_prompt_tokens_keeps_the_last_tokens(live: LiveEngine) -> None:
    ids = list(range(300, 320))
    cut = live.client.completions.create(model=MODEL, prompt=ids, max_tokens=4,
                                         extra_body={"truncate_prompt_tokens": 5})
    tail = live.client.completions.create(model=MODEL, prompt=ids[-5:], max_tokens=4)
    whole = live.client.completions.create(model=MODEL, prompt=ids, max_tokens=4)
    assert cut.usage is not None and cut.usage.prompt_tokens == 5
    # the sim draws its tokens from the prompt: the last five ids were the prompt
    assert cut.choices[0].text == tail.choices[0].text != whole.choices[0].text
    text = live.client.completions.create(model=MODEL, prompt="one two three four five",
                                          max_tokens=1, extra_body={"truncate_prompt_tokens": 2})
    assert text.usage is not None and text.usage.prompt_tokens == 2
    chat = live.client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=1,
                                               extra_body={"truncate_prompt_tokens": 3})
    assert chat.usage is not None and chat.usage.prompt_tokens == 3
    # -1: as many as the context holds (512 here), so the 600 ids become 512
    r = live.http.post("/v1/completions", json={
        "model": MODEL, "prompt": list(range(300, 900)), "max_tokens": 1,
        "truncate_prompt_tokens": -1})
    assert r.status_code == 400 and "(512 in the prompt" in r.json()["error"]["message"]
    kept = live.client.completions.create(model=MODEL, prompt=ids, max_tokens=1,
                                          extra_body={"truncate_prompt_tokens": -1})
    assert kept.usage is not None and kept.usage.prompt_tokens == 20


@pytest.mark.parametrize("value", [0, -2, 513, "all"])
def test_truncate_prompt_tokens_out_of_range_is_refused(live: LiveEngine, value: Any) -> None:
    r = live.http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                "truncate_prompt_tokens": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def _token_id(name: str) -> int:
    assert name.startswith("token_id:"), name
    return int(name.removeprefix("token_id:"))


def test_return_tokens_as_token_ids_names_each_token_by_its_id(live: LiveEngine) -> None:
    tok = live.server.tokenizer
    body: dict[str, Any] = {"model": MODEL, "prompt": "the colour of", "max_tokens": 5,
                            "seed": 5, "logprobs": 2}
    texts = live.http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    ids = live.http.post("/v1/completions", json={
        **body, "return_tokens_as_token_ids": True}).json()["choices"][0]["logprobs"]
    assert [tok.decode([_token_id(t)], False) for t in ids["tokens"]] == texts["tokens"]
    for by_id, by_text in zip(ids["top_logprobs"], texts["top_logprobs"], strict=True):
        assert {tok.decode([_token_id(t)], False) for t in by_id} == set(by_text)
    # as vLLM: the offsets advance by the length of each token's name
    names = ids["tokens"]
    assert ids["text_offset"] == [sum(len(t) for t in names[:i]) for i in range(len(names))]
    chat: dict[str, Any] = {"model": MODEL, "messages": STORY[:1], "max_tokens": 5, "seed": 5,
                            "logprobs": True, "top_logprobs": 2}
    plain = live.http.post("/v1/chat/completions", json=chat).json()
    named = live.http.post("/v1/chat/completions", json={
        **chat, "return_tokens_as_token_ids": True}).json()
    for entry, text in zip(named["choices"][0]["logprobs"]["content"],
                           plain["choices"][0]["logprobs"]["content"], strict=True):
        assert tok.decode([_token_id(entry["token"])], False) == text["token"]
        assert entry["bytes"] == text["bytes"]  # the entry's own bytes are its text's
        for top in entry["top_logprobs"]:
            _token_id(top["token"])
            assert top["bytes"] == list(top["token"].encode())  # as vLLM: the name's


def _stream(live: LiveEngine, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    return live.stream(path, {**body, "model": MODEL})


def test_continuous_usage_stats_puts_the_usage_so_far_on_every_chunk(
        live: LiveEngine) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = _stream(live, "/v1/completions", {"prompt": "count with me", "max_tokens": 4,
                                               "n": 2, "stream_options": options})
    prompt = chunks[-1]["usage"]["prompt_tokens"]
    seen: dict[int, list[int]] = {0: [], 1: []}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        usage = chunk["usage"]
        assert usage["prompt_tokens"] == prompt
        assert usage["total_tokens"] == prompt + usage["completion_tokens"]
        seen[choice["index"]].append(usage["completion_tokens"])
    for counts in seen.values():  # each choice's own count, as vLLM's
        assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 4
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    chat = _stream(live, "/v1/chat/completions", {"messages": STORY[:1], "max_tokens": 3,
                                                  "stream_options": options})
    assert chat[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chat[0]["usage"]["completion_tokens"] == 0  # the role chunk: nothing yet
    assert chat[-2]["usage"]["completion_tokens"] == 3
    # without it the usage is the last chunk's alone; without include_usage, nowhere
    plain = _stream(live, "/v1/completions", {"prompt": "count", "max_tokens": 2,
                                              "stream_options": {"include_usage": True}})
    assert all(c["usage"] is None for c in plain[:-1]) and plain[-1]["usage"] is not None
    bare = _stream(live, "/v1/completions", {"prompt": "count", "max_tokens": 2,
                                             "stream_options": {"continuous_usage_stats": True}})
    assert all("usage" not in c for c in bare)


def test_tokenize_returns_each_tokens_vocabulary_spelling_when_asked(
        live: LiveEngine) -> None:
    spelt = Tokenizer.from_file(str(ASSET_DIR / "tokenizer.json")).get_vocab()
    vocab = {i: t for t, i in spelt.items()}
    for body in ({"prompt": "the parties agree"}, {"messages": STORY}):
        answer = live.http.post("/tokenize", json={**body, "return_token_strs": True}).json()
        assert answer["token_strs"] == [vocab[i] for i in answer["tokens"]]
        assert any(s.startswith("\u0120") for s in answer["token_strs"])  # "Ġ", not " "
        plain = live.http.post("/tokenize", json=body).json()
        assert plain["tokens"] == answer["tokens"] and plain["token_strs"] is None


def _alone(live: LiveEngine, prompt: str | list[int], **kw: Any) -> dict[str, Any]:
    r = live.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, **kw})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def test_a_batch_of_prompts_answers_n_choices_for_each_in_vllms_order(
        live: LiveEngine) -> None:
    prompts = ["the colour of the sky", "a recipe for bread"]
    # greedy, the sim draws from the prompt alone: a choice's text tells which prompt it had
    singles = [_alone(live, text, max_tokens=3, temperature=0) for text in prompts]
    texts = [s["choices"][0]["text"] for s in singles]
    assert texts[0] != texts[1]
    out = live.client.completions.create(model=MODEL, prompt=prompts, max_tokens=3, n=2,
                                         temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert [c.text for c in out.choices] == [texts[0], texts[0], texts[1], texts[1]]
    assert out.usage is not None and out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens == sum(s["usage"]["prompt_tokens"] for s in singles)
    ids = live.client.completions.create(model=MODEL, prompt=[[300, 301], [302, 303, 304]],
                                         max_tokens=2)
    assert [c.text for c in ids.choices] == [
        _alone(live, [300, 301], max_tokens=2)["choices"][0]["text"],
        _alone(live, [302, 303, 304], max_tokens=2)["choices"][0]["text"]]
    assert ids.usage is not None and ids.usage.prompt_tokens == 5
    # seeded: each prompt's sequence i takes seed + i
    seeded = live.client.completions.create(model=MODEL, prompt=prompts, max_tokens=3, n=2,
                                            seed=7)
    for choice in seeded.choices:
        prompt, i = divmod(choice.index, 2)
        alone = _alone(live, prompts[prompt], max_tokens=3, seed=7 + i)
        assert choice.text == alone["choices"][0]["text"]


def test_a_streamed_batch_interleaves_every_choice_and_sums_the_usage(
        live: LiveEngine) -> None:
    body: dict[str, Any] = {"prompt": ["first prompt here", "and a second one"],
                            "max_tokens": 6, "n": 2}
    whole = _alone(live, **body)
    chunks = _stream(live, "/v1/completions", {**body,
                                               "stream_options": {"include_usage": True}})
    text = dict.fromkeys(range(4), "")
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        text[choice["index"]] += choice["text"]
    assert [text[i] for i in range(4)] == [c["text"] for c in whole["choices"]]
    order = [chunk["choices"][0]["index"] for chunk in chunks[:-1]]
    assert order.index(3) < len(order) - 1 - order[::-1].index(0), order  # as they come
    usage = chunks[-1]["usage"]  # (the second asking finds the prompts cached)
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"] == 24


def test_a_batchs_cached_tokens_are_every_prompts(live: LiveEngine) -> None:
    prompts = [" ".join(f"clause {i} binds the {word}." for i in range(30))
               for word in ("buyer", "seller")]
    counts = [_alone(live, text, max_tokens=1)["usage"]["prompt_tokens"] for text in prompts]
    out = _alone(live, prompts, max_tokens=1)
    assert out["usage"]["prompt_tokens"] == sum(counts)
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] \
        == sum((n - 1) // 4 * 4 for n in counts)  # whole blocks of 4, less the last token


@pytest.mark.parametrize(("prompt", "n", "status"), [
    (["x"] * MAX_N, 1, 200), (["x"] * (MAX_N + 1), 1, 400),
    (["x", "y"], MAX_N // 2, 200), (["x", "y"], MAX_N // 2 + 1, 400),
    ([[300], [300, 99999]], 1, 400)])
def test_a_batch_is_bounded_in_sequences_and_by_the_vocabulary(
        live: LiveEngine, prompt: list[Any], n: int, status: int) -> None:
    r = live.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "n": n,
                                                "max_tokens": 1})
    assert r.status_code == status, r.text
    if status == 200:
        assert len(r.json()["choices"]) == MAX_N
    else:
        assert r.json()["error"]["param"] == "prompt"


def test_a_batch_prompt_past_the_context_is_named_by_its_place(live: LiveEngine) -> None:
    r = live.http.post("/v1/completions", json={"model": MODEL, "max_tokens": 8,
                                                "prompt": [[300] * 4, [300] * 600]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert r.json()["error"]["message"].endswith("(prompt 1 of the batch)")
    alone = live.http.post("/v1/completions", json={"model": MODEL, "max_tokens": 8,
                                                    "prompt": [300] * 600})
    assert alone.status_code == 400 and "batch" not in alone.json()["error"]["message"]


def test_stop_strings_are_bounded_in_number_and_length(live: LiveEngine) -> None:
    base = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    ok = live.http.post("/v1/completions", json={
        **base, "stop": [f"q{i}" for i in range(MAX_STOP_STRINGS)]})
    assert ok.status_code == 200, ok.text
    for stop, what in (([f"q{i}" for i in range(MAX_STOP_STRINGS + 1)], "strings"),
                       (["x" * (MAX_STOP_CHARS + 1)], "characters")):
        r = live.http.post("/v1/completions", json={**base, "stop": stop})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
        assert what in r.json()["error"]["message"]
        r = live.http.post("/generate", json={"text": "hi", "sampling_params": {
            "max_new_tokens": 4, "stop": stop}})
        assert r.status_code == 400 and "stop" in r.text, r.text
    # and the stop token ids, each looked for in every sampled token
    many = list(range(MAX_STOP_TOKEN_IDS + 1))
    r = live.http.post("/v1/completions", json={**base, "stop_token_ids": many})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids", r.text
    r = live.http.post("/v1/completions", json={**base, "stop_token_ids": many[:-1]})
    assert r.status_code == 200, r.text


def _post_nested(live: LiveEngine, path: str, body: dict[str, Any], field: str) -> Any:
    """``body`` posted with ``field`` an array nested 1,000 levels deep (JSON allows 1,024;
    Python's own json module writes fewer)."""
    text = json.dumps({**body, field: "NESTED"}).replace('"NESTED"', "[" * 1000 + "1" + "]" * 1000)
    return live.http.post(path, content=text, headers={"content-type": "application/json"})


@pytest.mark.parametrize(("path", "field", "extra"), [
    ("/v1/completions", "logprobs", {}),
    ("/v1/chat/completions", "logprobs", {}),
    ("/v1/chat/completions", "top_logprobs", {"logprobs": True}),
    ("/v1/chat/completions", "tool_choice", {}),
    ("/v1/chat/completions", "response_format", {}),
    ("/v1/completions", "best_of", {}),
    ("/v1/completions", "temperature", {}),
])
def test_a_deeply_nested_value_is_a_400_naming_its_field(live: LiveEngine, path: str,
                                                        field: str, extra: dict) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, **extra}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    r = _post_nested(live, path, body, field)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"] and "array of 1" in r.json()["error"]["message"]


@pytest.mark.parametrize("field", ["rid", "sampling_params"])
def test_a_deeply_nested_value_on_generate_is_a_400(live: LiveEngine, field: str) -> None:
    r = _post_nested(live, "/generate", {"text": "hi"}, field)
    assert r.status_code == 400, r.text
