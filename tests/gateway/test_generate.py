"""SGLang's native /generate through the gateway, in front of loopback replicas that
speak it: routed on its prompt, relayed whole, its meta_info counted as usage."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from gateway.capture import CaptureRecord, record_of
from gateway.generate_request import counts_of, generate_fields, stream_counts
from gateway.layout_audit import render
from gateway.proxy import UpstreamStream
from gateway.request_parse import parse_body
from kvwire.openai_schema import BadRequest
from kvwire.tokenizer import load_tokenizer
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import (
    AUTH,
    Gateway,
    Serve,
    start_gateway,
    two_replicas,
    wait_for_metric,
)


@pytest.fixture
def two(serve: Serve) -> tuple[Gateway, Behaviour, Behaviour]:
    return two_replicas(serve)


def _events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e]


def test_generate_relayed_and_counted(two: tuple[Gateway, Behaviour, Behaviour]) -> None:
    gw, a, b = two
    raw = b'{"text": "The capital of France is", "sampling_params": {"max_new_tokens": 3},' \
          b' "rid": "my-rid-1"}'
    r = httpx.post(f"{gw.url}/generate", content=raw,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["prompt_tokens"] == 10
    assert r.headers["x-request-id"] == "my-rid-1"  # SGLang's rid names the request
    assert a.received + b.received == [raw]  # the body as sent, to the replica's /generate
    assert a.paths + b.paths == ["/generate"]
    # a batch of texts: one answer per text, summed
    r = httpx.post(f"{gw.url}/generate", json={"text": ["one", "two"]})
    assert r.status_code == 200 and len(r.json()) == 2
    wait_for_metric(gw, 'kvgate_prompt_tokens_total{route="round_robin"}', 30.0)
    wait_for_metric(gw, 'kvgate_cached_prompt_tokens_total{route="round_robin"}', 12.0)


def test_a_batch_teaches_no_calibration(two: tuple[Gateway, Behaviour, Behaviour]) -> None:
    """A batch's usage is summed over its prompts while the gateway counted its first
    prompt alone: the token calibration learns only from single prompts."""
    gw, _, _ = two

    def ratio() -> float:
        listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()
        return listed["replicas"][0]["replica_tokens_per_gateway_token"]

    ids = list(range(1000, 1020))  # 20 tokens; the replicas count 10 for each prompt
    for _ in range(12):
        assert httpx.post(f"{gw.url}/generate", json={"input_ids": [ids] * 4}).status_code \
            == 200
    assert ratio() == 1.0  # unlearned (12 batches would have made it 2)
    for _ in range(12):
        assert httpx.post(f"{gw.url}/generate", json={"input_ids": ids}).status_code == 200
    assert ratio() == pytest.approx(10 / 20)


def test_generate_stream_with_long_cumulative_text(serve: Serve) -> None:
    """Each event carries the whole text so far (SGLang's default): the last one is
    longer than the bytes of a stream the gateway keeps, and its counts still read."""
    long = Behaviour("long", chunks=4, pad=5000)
    gw = start_gateway(serve, [("long", serve(fake_replica(long)).url)])
    with httpx.stream("POST", f"{gw.url}/generate",
                      json={"input_ids": [1, 2, 3], "stream": True}) as r:
        assert r.status_code == 200
        body = r.read()
    events = _events(body)
    assert events[-1] == b"data: [DONE]"
    assert len(events) == 5 and len(events[-2]) > 20_000
    wait_for_metric(gw, 'kvgate_prompt_tokens_total{route="round_robin"}', 10.0)
    wait_for_metric(gw, 'kvgate_cached_prompt_tokens_total{route="round_robin"}', 4.0)


def test_generate_stream_counts_past_long_log_probabilities(serve: Serve) -> None:
    """SGLang writes meta_info's prompt count before the log probabilities so far and the
    other counts after them: in an event longer than the tail kept, the counts are read
    from the head of its meta_info and the tail."""
    logprobs = Behaviour("logprobs", chunks=4, logprobs=200)
    gw = start_gateway(serve, [("logprobs", serve(fake_replica(logprobs)).url)])
    with httpx.stream("POST", f"{gw.url}/generate",
                      json={"text": "hello", "stream": True, "return_logprob": True}) as r:
        events = _events(r.read())
    assert len(events[-2]) > 12_000 and events[-1] == b"data: [DONE]"
    wait_for_metric(gw, 'kvgate_prompt_tokens_total{route="round_robin"}', 10.0)
    wait_for_metric(gw, 'kvgate_cached_prompt_tokens_total{route="round_robin"}', 4.0)


def test_generate_stream_without_done_is_shown_cut(serve: Serve) -> None:
    cut = Behaviour("cut", chunks=2, done=False)
    gw = start_gateway(serve, [("cut", serve(fake_replica(cut)).url)])
    with httpx.stream("POST", f"{gw.url}/generate",
                      json={"text": "hello", "stream": True}) as r:
        body = r.read()
    last = json.loads(_events(body)[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "upstream_broken"
    assert b"[DONE]" not in body


def test_generate_routed_by_its_prompt(serve: Serve) -> None:
    """prefix_affinity keys /generate on its prompt: the same input_ids (or text) go to
    one replica, whichever comes first."""
    behaviours = [Behaviour(f"r{i}") for i in range(4)]
    gw = start_gateway(serve, [(b.name, serve(fake_replica(b)).url) for b in behaviours],
                       policy={"name": "prefix_affinity"})
    for body in ({"input_ids": list(range(100, 400))}, {"text": "a long document " * 50}):
        chosen = {httpx.post(f"{gw.url}/generate", json=body).headers["x-kvgate-replica"]
                  for _ in range(6)}
        assert len(chosen) == 1, chosen
    firsts = {httpx.post(f"{gw.url}/generate", json={"input_ids": [i] * 300}).headers[
        "x-kvgate-replica"] for i in range(1, 13)}
    assert len(firsts) > 1  # different prompts spread


# the fields the gateway acts on: refused by it, naming the field
_BAD = [
    ({"text": "a", "model": 3}, "model"),
    ({"text": "a", "stream": "yes please"}, "stream"),
    ({"text": "a", "cache_salt": ""}, "cache_salt"),
]
# prompts it cannot read: forwarded for the replica to judge (as SGLang's router does)
_UNREAD = [{"sampling_params": {}}, {"text": "a", "input_ids": [1]}, {"text": ""},
           {"text": ["a", 3]}, {"input_ids": [1, -2]}, {"input_ids": []},
           {"input_ids": [[1], []]}, {"input_embeds": [[0.5, 1.5]]}]


def test_generate_bad_fields_named_unread_prompts_forwarded(
        two: tuple[Gateway, Behaviour, Behaviour]) -> None:
    gw, a, b = two
    for body, param in _BAD:
        r = httpx.post(f"{gw.url}/generate", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, body
    assert a.received + b.received == []
    r = httpx.post(f"{gw.url}/generate", json={"text": "a", "model": "other"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    for body in _UNREAD:
        assert httpx.post(f"{gw.url}/generate", json=body).status_code == 200, body
    def canonical(body: object) -> str:
        return json.dumps(body, sort_keys=True)

    assert sorted(canonical(json.loads(raw)) for raw in a.received + b.received) == \
        sorted(map(canonical, _UNREAD))


def test_generate_fields() -> None:
    batch = generate_fields({"input_ids": [[5, 6], [7]], "stream": True, "cache_salt": "t"})
    assert (batch.prompt_ids, batch.num_prompts, batch.stream, batch.cache_salt) == \
        ([5, 6], 2, True, "t")
    texts = generate_fields({"text": ["x y", "z"]})
    assert (texts.prompt_text, texts.num_prompts) == ("x y", 2)
    # an unread prompt stands in by a digest of its fields: the same one keys the same
    embeds = generate_fields({"input_embeds": [[0.5, 1.0], [2.0, 3.0]]})
    assert embeds.prompt_text == generate_fields(
        {"input_embeds": [[0.5, 1.0], [2.0, 3.0]], "rid": "other"}).prompt_text
    assert embeds.prompt_text != generate_fields({"input_embeds": [[0.5, 2.0]]}).prompt_text
    assert embeds.prompt_text is not None and embeds.prompt_text.startswith("<|part:")
    both = generate_fields({"text": "a", "input_ids": [1]})
    assert both.prompt_ids is None and both.prompt_text != "a"
    with pytest.raises(BadRequest, match="'stream'"):
        generate_fields({"text": "a", "stream": "yes please"})


def test_counts_read_from_meta_info() -> None:
    meta = {"prompt_tokens": 7, "completion_tokens": 2, "cached_tokens": 3}
    assert counts_of({"text": "x", "meta_info": meta}) == {
        "prompt_tokens": 7, "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 3}}
    assert counts_of([{"meta_info": meta}, {"meta_info": meta}])["prompt_tokens"] == 14
    assert counts_of([{"meta_info": meta}, {"text": "no counts"}]) is None
    assert counts_of({"text": "x"}) is None
    event = b'data: {"text": "' + b"y" * 100 + b'", "meta_info": ' + json.dumps(
        {**meta, "finish_reason": {"type": "stop", "matched": "}"}}).encode() + b"}\n\n"
    stream = event + b"data: [DONE]\n\n"
    tail = stream[stream.index(b"yyy"):]  # the event's start is cut off
    counts = stream_counts(tail)
    assert counts is not None and counts["prompt_tokens"] == 7
    assert stream_counts(b'data: {"meta_info": {"prompt_tok') is None
    # an event longer than the tail: the head of its meta_info, then the tail
    head = b'"meta_info": {"id": "r", "prompt_tokens": 12, "output_token_logprobs": [[-1'
    tail = b'5, 3, null]], "completion_tokens": 9, "cached_tokens": 5}}\n\ndata: [DONE]\n\n'
    assert stream_counts(tail, head) == {"prompt_tokens": 12, "completion_tokens": 9,
                                         "prompt_tokens_details": {"cached_tokens": 5}}
    assert stream_counts(tail, b"") is None  # no prompt count: no usage


def test_generate_captured_and_rendered() -> None:
    """A captured /generate request keeps its endpoint, and the layout audit reads its
    prompt from ``text`` or ``input_ids``."""
    tok = load_tokenizer()
    for body, prompt in (({"text": "hello there"}, "hello there"),
                         ({"input_ids": tok.encode("ids here")}, "ids here")):
        parsed = parse_body(json.dumps(body).encode(), "generate",
                            default_model=lambda: "m")
        line = record_of(parsed, None, 10, now=0.0).to_json()
        record = CaptureRecord.from_json(line)
        assert record.endpoint == "generate"
        assert render(record, tok, 1000)[0] == prompt


def test_meta_info_head_kept_across_reads() -> None:
    """The head of the last meta_info is kept when its key falls across two reads."""
    event = b'data: {"text": "ab", "meta_info": {"prompt_tokens": 3, "cached_tokens": 1}}'
    cut = event.index(b"meta_") + 2  # the key split between the reads
    kept = SimpleNamespace(_meta=b"")
    UpstreamStream._note_meta(kept, event[:cut], event[cut:])  # type: ignore[arg-type]
    assert kept._meta == event[event.index(b'"meta_info"'):]
    UpstreamStream._note_meta(kept, event, b'data: {"meta_info": {"prompt_tokens": 4}}')
    assert kept._meta == b'"meta_info": {"prompt_tokens": 4}}'
