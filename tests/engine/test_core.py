import pytest

from engine.core import EngineCore
from engine.eviction import FrequencyEviction
from engine.executor import Batch, StepResult
from engine.request import SamplingParams
from kvwire.kv_event_format import AllBlocksCleared, BlockRemoved, BlockStored
from tests.support.engine_cores import add, make_core, run_all


def tokens(out: list) -> list[int]:
    return [t for o in out for t in o.new_token_ids]


def test_last_token_rule_caps_hits_one_short_of_the_prompt() -> None:
    core = make_core()
    prompt = list(range(8))  # exactly two full blocks of 4
    add(core, "a", prompt)
    run_all(core)
    add(core, "b", prompt)
    out = run_all(core)["b"][-1]
    assert out.num_cached_tokens == 4  # (8 - 1) // 4 blocks, never the whole prompt
    assert core.stats.prefix_cache_hits == 4


def test_fully_cached_prompt_computes_only_its_last_token() -> None:
    core = make_core()
    add(core, "a", list(range(12)), max_tokens=2)
    run_all(core)
    add(core, "b", list(range(9)))  # both full blocks cached; 1 token left to compute
    step = core.step(0.0)
    assert step.num_tokens == 1
    assert step.outputs[0].num_cached_tokens == 8
    assert step.outputs[0].finished
    core.check_integrity()


def test_prefix_of_a_cached_prompt_still_leaves_one_token() -> None:
    core = make_core()
    add(core, "a", list(range(16)))
    run_all(core)
    add(core, "b", list(range(8)))
    step = core.step(0.0)
    assert step.outputs[0].num_cached_tokens == 4
    assert step.num_tokens == 4


def test_two_same_prefix_requests_in_one_step() -> None:
    core = make_core()
    prompt = list(range(10))
    add(core, "a", prompt, max_tokens=2)
    add(core, "b", prompt, max_tokens=2)
    first = core.step(0.0)
    assert first.num_seqs == 2 and first.num_tokens == 20  # both miss: same step
    core.check_integrity()
    pool = core.kv.pool
    assert len(pool.cached) == 2  # the duplicate blocks are not registered twice
    out = run_all(core)
    assert tokens(out["a"])[1:] == tokens(out["b"])[1:]
    core.check_integrity()
    add(core, "c", prompt)
    assert run_all(core)["c"][0].num_cached_tokens == 8


def test_preemption_recomputes_and_keeps_outputs() -> None:
    alone = make_core(num_blocks=16)
    for rid in ("a", "b"):
        add(alone, rid, [rid == "a"] * 3 + list(range(5)), max_tokens=12, ignore_eos=True)
    expected = {k: tokens(v) for k, v in run_all(alone).items()}
    assert alone.stats.num_preemptions == 0

    core = make_core(num_blocks=6)  # each request needs up to 5 blocks of 4: both can't
    for rid in ("a", "b"):
        add(core, rid, [rid == "a"] * 3 + list(range(5)), max_tokens=12, ignore_eos=True)
    got = {k: tokens(v) for k, v in run_all(core).items()}
    assert core.stats.num_preemptions >= 1
    assert core.stats.recompute_queries > 0
    assert got == expected
    assert all(len(v) == 12 for v in got.values())
    assert core.kv.pool.num_free_blocks == 6


def test_chunked_prefill_and_waiting_prompt_tokens_gauge() -> None:
    core = make_core(max_num_batched_tokens=8)
    add(core, "a", list(range(20)))
    assert core.stats.prompt_tokens_waiting == 20
    seen = []
    for _ in range(3):
        step = core.step(0.0)
        seen.append((step.num_tokens, core.stats.prompt_tokens_waiting, len(step.outputs)))
        core.check_integrity()
    assert seen == [(8, 12, 0), (8, 4, 0), (4, 0, 1)]


def test_scripted_run_counts_exact_tokens() -> None:
    core = make_core()
    add(core, "a", list(range(12)), max_tokens=3)
    run_all(core)
    add(core, "b", list(range(17)), max_tokens=2)
    run_all(core)
    add(core, "c", list(range(12)), max_tokens=3, cache_salt="tenant")
    out = run_all(core)
    s = core.stats
    assert s.prompt_tokens == 12 + 17 + 12
    assert s.prefix_cache_queries == 41
    assert s.prefix_cache_hits == 12  # b reuses a's three blocks; salted c shares nothing
    assert s.generation_tokens == 3 + 2 + 3
    assert s.num_requests_finished == 3 and s.num_preemptions == 0
    assert out["c"][-1].num_cached_tokens == 0
    assert s.prompt_tokens_waiting == 0


def test_adapter_requests_do_not_share_blocks() -> None:
    core = make_core()
    add(core, "a", list(range(12)))
    run_all(core)
    add(core, "b", list(range(12)), adapter="lora-x")
    assert run_all(core)["b"][0].num_cached_tokens == 0


def test_eos_stops_unless_ignored() -> None:
    core = make_core(eos=1, vocab=(0, 2))
    add(core, "a", [5, 6, 7], max_tokens=50)
    out = run_all(core)["a"]
    assert out[-1].finish_reason == "stop" and tokens(out)[-1] == 1
    assert len(out) < 50
    add(core, "b", [5, 6, 7], max_tokens=20, ignore_eos=True)
    out = run_all(core)["b"]
    assert out[-1].finish_reason == "length" and len(tokens(out)) == 20


def test_max_num_seqs_and_fcfs() -> None:
    core = make_core(max_num_seqs=2)
    for rid in "abc":
        add(core, rid, [1, 2, 3], max_tokens=2)
    core.step(0.0)
    assert [r.request_id for r in core.scheduler.running] == ["a", "b"]
    assert [r.request_id for r in core.scheduler.waiting] == ["c"]


def test_abort_frees_blocks() -> None:
    core = make_core()
    add(core, "a", list(range(10)), max_tokens=5)
    core.step(0.0)
    assert core.abort_request("a")
    assert not core.abort_request("a")
    core.check_integrity()
    assert core.kv.pool.num_used_blocks == 0 and not core.has_unfinished()
    assert core.stats.num_requests_aborted == 1


def test_driver_clock_stamps_outputs() -> None:
    core = make_core()
    add(core, "a", [1, 2, 3], max_tokens=1, now=10.0)
    step = core.step(now=12.0)
    o = step.outputs[0]
    assert (o.arrival_time, o.first_scheduled_time) == (10.0, 12.0)
    assert o.first_token_time == o.finish_time == 12.0 + step.seconds
    assert step.seconds > 0


def test_emit_first_and_last_only() -> None:
    core = make_core(emit_every_token=False)
    add(core, "a", [1, 2, 3], max_tokens=5)
    out = run_all(core)["a"]
    assert [o.num_output_tokens for o in out] == [1, 5]


def test_validation_and_precomputed_hashes() -> None:
    core = make_core(num_blocks=4, max_model_len=64)
    with pytest.raises(ValueError, match="maximum context length"):
        core.validate(64, 1)
    with pytest.raises(ValueError, match="KV cache"):
        core.validate(10, 20)  # 30 tokens > 4 blocks of 4
    req = core.make_request("x", list(range(9)))
    same = core.make_request("y", list(range(9)), block_hashes=req.block_hashes)
    assert same.block_hashes == req.block_hashes
    with pytest.raises(ValueError, match="block_hashes has 1 entries"):
        core.make_request("z", list(range(9)), block_hashes=req.block_hashes[:1])
    add(core, "d", [1])
    with pytest.raises(ValueError, match="duplicate"):
        add(core, "d", [1])
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


class RecordingExecutor:
    block_size = 4
    eos_token_id = None

    def __init__(self) -> None:
        self.batches: list[Batch] = []

    def execute(self, batch: Batch) -> StepResult:
        self.batches.append(batch)
        return StepResult({s.request_id: 7 for s in batch.seqs if s.sample}, 0.01)


def test_batches_follow_the_executor_contract() -> None:
    from engine.core import EngineConfig

    ex = RecordingExecutor()
    core = EngineCore(ex, EngineConfig(model_id="m", num_blocks=8, block_size=4,
                                       max_num_batched_tokens=6))
    core.add_request(core.make_request("a", list(range(10)), SamplingParams(max_tokens=2)))
    while core.has_unfinished():
        core.step()
    seqs = [b.seqs[0] for b in ex.batches]
    assert [(s.start, len(s.token_ids), s.sample) for s in seqs] == [
        (0, 6, False), (6, 4, True), (10, 1, True)]
    assert list(seqs[2].token_ids) == [7]
    for s in seqs:
        assert len(s.block_ids) * 4 >= s.context_len


def replay_events(core: EngineCore, stored: set[int]) -> None:
    """Apply the pool's KV events since the last call to ``stored`` (the hashes a
    subscriber holds), checking that every stored block's parent is held when it comes."""
    for event in core.kv.pool.events:
        if isinstance(event, AllBlocksCleared):
            stored.clear()
        elif isinstance(event, BlockRemoved):
            stored.difference_update(event.block_hashes)
        elif isinstance(event, BlockStored):
            assert event.parent_block_hash is None or event.parent_block_hash in stored
            stored.update(event.block_hashes)
    core.kv.pool.events.clear()


def test_a_reset_while_a_request_runs_keeps_the_events_chained() -> None:
    # every stored block's parent is stored when the event says so, across a reset made
    # while a request is decoding (its later blocks chain on blocks the reset dropped)
    core = make_core(num_blocks=32, block_size=4)
    core.kv.pool.events = []
    add(core, "a", list(range(10)), max_tokens=20, ignore_eos=True)
    stored: set[int] = set()
    for step in range(30):
        if step == 3:
            core.reset_prefix_cache()
        if core.has_unfinished():
            core.step()
        replay_events(core, stored)
    assert not core.has_unfinished() and len(stored) == 7  # its 29 tokens, cached again


def test_a_duplicate_block_takes_over_its_hash_when_the_registered_one_is_evicted() -> None:
    # a and b share a prompt and are admitted in one step: b's prompt blocks duplicate a's.
    # a finishes at once and other prompts evict its blocks while b decodes on: b's blocks
    # take the hashes over, so b's later blocks chain on stored blocks and stay reachable
    core = make_core(num_blocks=15, block_size=4)
    core.kv.pool.events = []
    prompt = list(range(100, 112))  # 3 blocks
    add(core, "a", prompt, max_tokens=1, ignore_eos=True)
    add(core, "b", prompt, max_tokens=24, ignore_eos=True)
    b = core.requests["b"]
    stored: set[int] = set()
    for step in range(60):
        if step == 2:
            for i in range(3):
                add(core, f"o{i}", list(range(200 + 20 * i, 212 + 20 * i)), max_tokens=1)
        if core.has_unfinished():
            core.step()
        core.check_integrity()
        replay_events(core, stored)
    assert not core.has_unfinished() and core.kv.pool.num_evictions > 0
    # b's whole sequence (prompt and answer, 35 tokens computed: 8 blocks) is found again
    assert len(b.all_token_ids) == 36
    again = core.make_request("again", list(b.all_token_ids), SamplingParams(max_tokens=1))
    assert len(core.kv.pool.longest_cached_prefix(again.block_hashes, 99)) == 8


def test_a_stop_token_ends_a_request_only_after_min_tokens() -> None:
    core = make_core()
    add(core, "a", list(range(8)), max_tokens=6)
    third = tokens(run_all(core)["a"])[2]
    for min_tokens, produced in ((0, 3), (4, 6)):
        params = SamplingParams(max_tokens=6, stop_token_ids=(third,), min_tokens=min_tokens)
        core.add_request(core.make_request(f"m{min_tokens}", list(range(8)), params))
        out = run_all(core)[f"m{min_tokens}"]
        assert len(tokens(out)) == produced
        assert out[-1].finish_reason == ("stop" if min_tokens == 0 else "length")


@pytest.mark.parametrize("field, value", [
    ("min_tokens", 7), ("top_k", -2), ("top_p", 0.0), ("top_p", 1.5), ("min_p", 2.0),
    ("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("repetition_penalty", 0.0),
])
def test_sampling_params_out_of_range_are_named(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(max_tokens=6, **{field: value})


def test_frequency_eviction_counts_a_preempted_requests_blocks_once() -> None:
    """A request preempted, then hitting or recomputing its own blocks, has not reused
    them: counted twice, a one-off prompt would pass for a reused one (protected)."""
    core = make_core(num_blocks=6, eviction="frequency")  # both can't run at once
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    reqs = [core.make_request(rid, [rid == "a"] * 3 + list(range(5)), params)
            for rid in ("a", "b")]
    for req in reqs:
        core.add_request(req)
    run_all(core)
    assert [req.num_preemptions for req in reqs] == [0, 1]
    evictor = core.kv.pool.evictor
    assert isinstance(evictor, FrequencyEviction)
    for req in reqs:
        counts = [evictor.count(h) for h in req.block_hashes]
        assert counts == [1, 1, 1, 1, 0], (req.request_id, counts)  # the last: not computed
