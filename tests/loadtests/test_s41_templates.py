"""The ``templates`` workload (prompt templates shared by their share of the requests, then
a tail of each request's own) and the ``system-prompt`` scenario built on it, where every
request shares one prefix: there ``cost``'s in-flight bound, and the shared prefix counted
as held on every replica, keep its first holders from taking the fleet's requests while the
other replicas stand idle."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from loadtests.simulate import main
from loadtests.workloads import TemplatesSpec, build_spec, generate


def test_requests_share_their_template_by_its_share() -> None:
    spec = TemplatesSpec(shares=(0.6, 0.3, 0.1), template_tokens=(100, 200),
                         tail_tokens=(5, 9), output_tokens=(2, 3), seed=3)
    requests = generate(spec, 3000)
    counts = Counter(r.label for r in requests)
    assert abs(counts["template0"] / 3000 - 0.6) < 0.03
    assert abs(counts["template2"] / 3000 - 0.1) < 0.02
    heads = {r.label: r.segments[0] for r in requests}
    for r in requests:
        head, tail = r.segments
        assert head == heads[r.label] and head.shared and 100 <= head.length <= 200
        assert not tail.shared and 5 <= tail.length <= 9 and 2 <= r.max_tokens <= 3
    assert len({r.segments[1].key for r in requests}) == 3000
    assert generate(spec, 3000) == requests  # the same spec, the same requests


@pytest.mark.parametrize(("params", "named"), [
    ({"shares": []}, "shares must be positive numbers"),
    ({"shares": [1.0, 0.0]}, "shares must be positive numbers"),
    ({"tail_tokens": [9, 5]}, r"tail_tokens must be \[lo, hi\]"),
])
def test_bad_templates_are_named(params: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        generate(build_spec("templates", **params), 10)


def _p95(tmp_path: Path, *extra: str) -> dict[str, float]:
    out = tmp_path / "r.json"
    assert main(["--scenario", "system-prompt", "--eviction", "lru", "--requests", "2500",
                 "--json", str(out), *extra]) == 0
    return {name: r["ttft_p95_s"] for name, r in json.loads(out.read_text())["policies"].items()}


def test_the_in_flight_bound_keeps_a_shared_prefix_from_piling_up(tmp_path: Path) -> None:
    bounded = _p95(tmp_path, "--policies", "round_robin,cost")
    # without the bound, and with the shared prefix's prefill charged to each request that
    # brings it to a replica (``common_head`` off): the first holders take the requests
    piled = _p95(tmp_path, "--policies", "cost", "--policy-set", "cost.balance_factor=null",
                 "--policy-set", "cost.common_head=false")["cost"]
    # the common head alone (counted as held everywhere) spreads them too, less well
    head_only = _p95(tmp_path, "--policies", "cost", "--policy-set",
                     "cost.balance_factor=null")["cost"]
    # (measured: 0.443 s bounded, 0.845 s piled, 0.558 s the head alone, round robin
    # 0.358 s)
    assert bounded["cost"] < 0.6 * piled, (bounded, piled)
    assert head_only < 0.75 * piled, (head_only, piled)
    assert bounded["cost"] < 2.5 * bounded["round_robin"]
