"""Embeddings end to end: the official OpenAI client -> the gateway process -> two engine
processes (sim executor) that serve ``/v1/embeddings``, passed through by model."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.cost_model import load_profile
from gateway.replica_metrics import parse_metrics
from kvwire import metric_names as m
from tests.support.fleets import start_fleet
from tests.support.processes import Processes

pytestmark = pytest.mark.slow

MODEL = "sim-llama"
DIM = load_profile("llama3-8b-h100").model.hidden_size  # the engines' default width
CLAUSE = ("The licensee may not sublicense the software without the licensor's written "
          "consent, which shall not be unreasonably withheld.")
NEAR = CLAUSE.replace("written", "prior written")
FAR = "Migrating geese cross the strait twice a year, resting on the salt marshes."


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_embeddings_pass_through_the_gateway(spawn: Processes, tmp_path: Path) -> None:
    fleet = start_fleet(spawn, tmp_path, {"name": "prefix_affinity"})
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)

    raw = client.embeddings.with_raw_response.create(model=MODEL,
                                                     input=[CLAUSE, NEAR, FAR, CLAUSE])
    assert raw.headers["x-kvgate-route"] == "passthrough"
    assert raw.headers["x-kvgate-replica"] in {"r0", "r1"}
    out = raw.parse()
    assert out.model == MODEL and [d.index for d in out.data] == [0, 1, 2, 3]
    vecs = [d.embedding for d in out.data]
    assert all(len(v) == DIM for v in vecs)
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-5)
               for v in vecs)
    assert vecs[0] == vecs[3]
    assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2]) + 0.3
    assert out.usage.prompt_tokens == out.usage.total_tokens > 30

    # equal texts give equal vectors whichever replica embeds them (ties go in turn)
    by_replica: dict[str, list[float]] = {}
    for _ in range(6):
        one = client.embeddings.with_raw_response.create(model=MODEL, input=CLAUSE)
        by_replica.setdefault(one.headers["x-kvgate-replica"], one.parse().data[0].embedding)
    assert set(by_replica) == {"r0", "r1"}
    assert by_replica["r0"] == by_replica["r1"] == vecs[0]

    short = client.embeddings.create(model=MODEL, input=[CLAUSE], dimensions=256)
    assert len(short.data[0].embedding) == 256

    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model="no-such-model", input=CLAUSE)
    err = info.value.body
    assert isinstance(err, dict) and err["code"] == "model_not_found"
    assert err["type"] == "invalid_request_error"

    with pytest.raises(openai.BadRequestError) as bad:
        client.embeddings.create(model=MODEL, input=[CLAUSE, ""])
    assert isinstance(bad.value.body, dict) and bad.value.body["param"] == "input"

    # each replica counted its share as finished requests whose prompts it computed
    stops = 0.0
    for url in fleet.urls:
        text = httpx.get(f"{url}/metrics").text
        assert (parse_metrics(text).query_tokens or 0) > 0
        stops += sum(s.value for fam in text_string_to_metric_families(text)
                     for s in fam.samples if s.name == f"{m.REQUEST_SUCCESS}_total"
                     and s.labels.get("finished_reason") == "stop")
    assert stops == 4 + 6 + 1
