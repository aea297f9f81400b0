"""A replica's error whose ``error`` is the message itself (TGI's: ``{"error": "...",
"error_type": "..."}``) reaches the client with that message, whole or as a stream's
opening event, as vLLM's and SGLang's error objects do."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway

OOM = "Request failed during generation: Server error: CUDA out of memory"
TGI_ERROR = b'{"error":"%s","error_type":"generation"}' % OOM.encode()
ASK = {"model": "sim-model", "prompt": "hi", "max_tokens": 2}


def test_a_whole_tgi_error_names_its_message(serve: Serve) -> None:
    rec = Behaviour("rec", status=500, error_body=TGI_ERROR)
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    answer = httpx.post(f"{gw.url}/v1/completions", json=ASK, timeout=10)
    assert answer.status_code == 500
    assert OOM in answer.json()["error"]["message"], answer.text


def test_a_stream_opening_with_a_tgi_error_names_its_message(serve: Serve) -> None:
    rec = Behaviour("rec", chunks=0, done_event=b"data: " + TGI_ERROR + b"\n\n")
    gw = start_gateway(serve, [("r0", serve(fake_replica(rec)).url)],
                       scrape={"enabled": False})
    answer = httpx.post(f"{gw.url}/v1/completions", json={**ASK, "stream": True},
                        timeout=10)
    assert answer.status_code == 502
    assert OOM in answer.json()["error"]["message"], answer.text
