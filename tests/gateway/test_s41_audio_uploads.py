"""vLLM's audio endpoints (``/v1/audio/transcriptions``, ``/v1/audio/translations``)
pass through the gateway as the official openai client uploads to them: the form reaches
the replica serving the form's ``model`` byte for byte, streamed answers relay as SSE, and
a body that is no form is refused 400 naming why, sent nowhere."""

from __future__ import annotations

import httpx
import openai

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until

_CLIP = bytes(range(256)) * 4096  # 1 MiB of "audio"


def _fleet(serve: Serve) -> tuple[str, Behaviour, Behaviour]:
    llm, asr = Behaviour("llm"), Behaviour("asr", model="whisper-large-v3")
    gw = start_gateway(serve, [("llm", serve(fake_replica(llm)).url),
                               ("asr", serve(fake_replica(asr)).url)])
    wait_until(lambda: len(httpx.get(f"{gw.url}/v1/models").json()["data"]) == 2, 10,
               "both models listed")
    return gw.url, llm, asr


def test_the_openai_client_uploads_through_the_gateway(serve: Serve) -> None:
    url, llm, asr = _fleet(serve)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    text = client.audio.transcriptions.create(model="whisper-large-v3",
                                              file=("clip.wav", _CLIP, "audio/wav"))
    assert text.text.startswith("asr heard"), text
    assert llm.received == [] and len(asr.received) == 1 and _CLIP in asr.received[0]
    assert asr.headers[0]["content-type"].startswith("multipart/form-data; boundary=")
    # (the client's translations call is deprecated: as vLLM's clients send it)
    translated = httpx.post(f"{url}/v1/audio/translations", timeout=10,
                            data={"model": "whisper-large-v3"},
                            files={"file": ("clip.wav", _CLIP, "audio/wav")})
    assert translated.json()["text"].startswith("asr heard") and asr.paths == [
        "/v1/audio/transcriptions", "/v1/audio/translations"]
    with client.audio.transcriptions.with_streaming_response.create(
            model="whisper-large-v3", file=("clip.wav", _CLIP, "audio/wav"),
            stream=True) as streamed:
        body = streamed.read()
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert b'"content": "world"' in body and body.endswith(b"data: [DONE]\n\n"), body


def test_the_form_is_forwarded_byte_for_byte(serve: Serve) -> None:
    url, _, asr = _fleet(serve)
    request = httpx.Request("POST", f"{url}/v1/audio/transcriptions?x=1",
                            data={"language": "en", "model": "whisper-large-v3"},
                            files={"file": ("clip.wav", _CLIP, "audio/wav")})
    sent = request.read()
    with httpx.Client(timeout=10) as client:
        r = client.send(request)
    assert r.status_code == 200, r.text
    assert asr.received == [sent] and asr.query_strings == ["x=1"]


def test_a_body_that_is_no_form_is_refused(serve: Serve) -> None:
    url, llm, asr = _fleet(serve)
    r = httpx.post(f"{url}/v1/audio/transcriptions", json={"model": "whisper-large-v3"},
                   timeout=10)
    assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/audio/transcriptions", timeout=10, content=b"--abc\r\n",
                   headers={"content-type": "multipart/form-data; boundary=abc"})
    assert r.status_code == 400 and "end of headers" in r.json()["error"]["message"], r.text
    assert llm.received == [] and asr.received == []
    # a form naming a model no replica serves: the fleet's 404, naming it
    r = httpx.post(f"{url}/v1/audio/transcriptions", timeout=10,
                   data={"model": "nope"}, files={"file": ("a.wav", b"x", "audio/wav")})
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"], r.text
    assert llm.received == [] and asr.received == []
