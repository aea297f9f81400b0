"""The token calibration keeps each replica's answers apart and combines the replicas'
ratios robustly: one replica telling ``usage.prompt_tokens`` 12x the truth no longer
moves every replica's figures 12-fold (with three replicas, it moves nothing; with two,
the square root of its lie), and a replica that leaves takes its answers with it."""

from __future__ import annotations

import math

import httpx
import pytest

from gateway.calibration import IDLE_ANSWERS, MAX_RATIO, TokenCalibration
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway

HONEST = 0.5  # the replicas' tokenizer counts half the gateway's tokens
LIE = 12.0  # ... and the liar tells 12x that


def answer_round_robin(cal: TokenCalibration, ratios: dict[str, float], rounds: int,
                       model: str | None = "m") -> None:
    for _ in range(rounds):
        for replica, ratio in ratios.items():
            cal.observe(model, round(1000 * ratio), 1000, replica)


def test_one_liar_among_three_replicas_moves_nothing() -> None:
    cal = TokenCalibration()
    answer_round_robin(cal, {"a": HONEST, "b": HONEST, "liar": HONEST * LIE}, 100)
    assert cal.ratio("m") == pytest.approx(HONEST)  # it was 12.07x / 3 + ...: 2.33
    assert cal.ratio() == pytest.approx(HONEST)  # and so the fallback of other models
    assert cal.replica_ratios("m")["liar"] == pytest.approx(HONEST * LIE)
    assert cal.snapshot() == {"m": pytest.approx(HONEST)}


def test_one_liar_among_three_moves_nothing_while_they_learn() -> None:
    # before any replica has min_samples answers the ratio is already the median
    cal = TokenCalibration()
    answer_round_robin(cal, {"a": HONEST, "b": HONEST, "liar": HONEST * LIE}, 3)
    assert cal.learned("m")
    assert cal.ratio("m") == pytest.approx(HONEST)


@pytest.mark.parametrize("lie", [LIE, MAX_RATIO / HONEST, 1 / 6])
def test_with_two_replicas_a_liar_moves_the_ratio_by_the_square_root_of_its_lie(
        lie: float) -> None:
    cal = TokenCalibration()
    told = min(MAX_RATIO, HONEST * lie)
    answer_round_robin(cal, {"a": HONEST, "liar": told}, 100)
    assert cal.ratio("m") == pytest.approx(math.sqrt(HONEST * told), rel=0.01)
    assert math.sqrt(HONEST / MAX_RATIO) <= cal.ratio("m") <= math.sqrt(HONEST * MAX_RATIO)


def test_a_newcomers_odd_first_answer_does_not_move_a_learned_replicas_ratio() -> None:
    cal = TokenCalibration()
    answer_round_robin(cal, {"a": HONEST}, 50)
    cal.observe("m", 1_500_000, 100_000, "new")  # 15x, on a huge prompt
    assert cal.ratio("m") == pytest.approx(HONEST)  # weighs 1 answer against 8


def test_a_replica_that_leaves_takes_its_answers_with_it() -> None:
    cal = TokenCalibration()
    answer_round_robin(cal, {"a": HONEST, "liar": HONEST * LIE}, 20)
    answer_round_robin(cal, {"liar": HONEST * LIE}, 20, model="only-the-liar")
    assert cal.ratio("m") != pytest.approx(HONEST, rel=0.5)
    cal.forget("liar")
    assert cal.ratio("m") == pytest.approx(HONEST)
    assert set(cal.replica_ratios("m")) == {"a"}
    assert len(cal) == 1  # the model only it answered is gone
    cal.forget("a")
    assert len(cal) == 0 and not cal.learned("m") and cal.ratio("m") == 1.0


def test_the_replicas_kept_per_model_are_bounded() -> None:
    cal = TokenCalibration(max_replicas=4)
    ratios = {f"r{i}": HONEST for i in range(10)}  # all answering: the first four kept
    answer_round_robin(cal, ratios, 20)
    assert set(cal.replica_ratios("m")) == {"r0", "r1", "r2", "r3"}
    # r0 stops answering: after long enough, a new replica takes its place
    rest = {"r1": HONEST, "r2": HONEST, "r3": HONEST}
    answer_round_robin(cal, rest, IDLE_ANSWERS * cal.max_replicas // len(rest) + 1)
    cal.observe("m", 500, 1000, "r9")
    assert set(cal.replica_ratios("m")) == {"r1", "r2", "r3", "r9"}


def test_the_fleet_teaches_per_replica_and_forgets_a_removed_one() -> None:
    fleet = Fleet([ReplicaConfig(rid, f"http://127.0.0.1:{9 + i}")
                   for i, rid in enumerate(("a", "b", "liar"))])
    for _ in range(20):
        for rid, ratio in (("a", HONEST), ("b", HONEST), ("liar", HONEST * LIE)):
            fleet.answered(rid, "m", 1000, round(1000 * ratio), 0)
    assert fleet.calibration.ratio("m") == pytest.approx(HONEST)
    fleet.remove("liar")
    assert set(fleet.calibration.replica_ratios("m")) == {"a", "b"}
    fleet.answered("liar", "m", 1000, 6000, 0)  # an answer after it left teaches nothing
    assert set(fleet.calibration.replica_ratios("m")) == {"a", "b"}


def test_a_lying_replica_behind_a_real_gateway_leaves_the_ratio_honest(
        serve: Serve) -> None:
    # every replica counts 10 tokens for any prompt; the liar tells 12x that
    honest = [serve(fake_replica(Behaviour(name))) for name in ("a", "b")]
    liar = serve(fake_replica(Behaviour("liar", usage={
        "prompt_tokens": 120, "completion_tokens": 3, "total_tokens": 123})))
    gw = start_gateway(serve, [("a", honest[0].url), ("b", honest[1].url),
                               ("liar", liar.url)])
    body = {"model": "sim-model", "prompt": "a question long enough to count tokens " * 4,
            "max_tokens": 3}
    for _ in range(3 * 8):  # round robin: every replica past its first answers
        r = httpx.post(f"{gw.url}/v1/completions", json=body)
        assert r.status_code == 200, r.text
    explained = httpx.post(f"{gw.admin}/admin/explain", json=body, headers=AUTH).json()
    truth = 10 / explained["prompt_tokens"]
    assert explained["replica_tokens_per_gateway_token"] == pytest.approx(truth)
    listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    assert [r["replica_tokens_per_gateway_token"] for r in listed] == [pytest.approx(truth)] * 3
    # each replica's own ratio is shown beside the fleet's: the liar's stands out
    own = {r["id"]: r["own_replica_tokens_per_gateway_token"] for r in listed}
    assert own["a"] == own["b"] == {"sim-model": pytest.approx(truth, rel=1e-3)}, own
    assert own["liar"] == {"sim-model": pytest.approx(12 * truth, rel=1e-3)}, own
