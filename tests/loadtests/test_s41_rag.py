"""The ``rag`` workload (a system prompt, retrieved chunks in retrieval's order, a
question) and, on its scenario, ``cost`` leaving no replica idle: an idle replica that
held hot entries from early spills was charged their eviction on every admission, though
no hot key was placed there, and took 52 of 3,000 requests (seed 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.simulate import main
from loadtests.workloads import RagSpec, build_spec, generate


def test_requests_are_a_system_prompt_chunks_and_a_question() -> None:
    spec = RagSpec(chunks=50, chunk_tokens=(10, 20), per_request=(2, 4), seed=1)
    requests = generate(spec, 500)
    lengths: dict[str, int] = {}
    for r in requests:
        system, *chunks, question = r.segments
        assert system.key == "system" and system.length == 600 and system.shared
        assert 2 <= len(chunks) <= 4 and len({c.key for c in chunks}) == len(chunks)
        for c in chunks:
            assert c.shared and 10 <= c.length <= 20 and lengths.setdefault(c.key, c.length) \
                == c.length
        assert not question.shared and r.affinity_key == chunks[0].key
    first = [r.segments[1].key for r in requests]
    assert first.count("chunk0") > first.count("chunk40") * 5  # Zipf: the head is popular
    assert generate(spec, 500) == requests


@pytest.mark.parametrize(("params", "named"), [
    ({"chunks": 3, "per_request": [2, 5]}, "asks more than the 3 chunks"),
    ({"zipf_s": 0}, "zipf_s must be a positive number"),
])
def test_bad_rag_settings_are_named(params: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        generate(build_spec("rag", **params), 10)


def test_no_replica_stands_idle(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["--scenario", "rag", "--eviction", "lru", "--requests", "3000", "--seed", "5",
                 "--policies", "cost", "--json", str(out)]) == 0
    routed = json.loads(out.read_text())["policies"]["cost"]["replica_requests"]
    assert min(routed) > 0.5 * sum(routed) / len(routed), routed
