"""A preempted request queued again has its cached prompt taken off the waiting-tokens
gauge, as a request queued anew does: its freed blocks stay cached and it hits them."""

from __future__ import annotations

from tests.support.engine_cores import add, make_core


def test_a_preempted_request_counts_only_the_prompt_it_has_to_prefill_again() -> None:
    core = make_core(num_blocks=6, block_size=4)
    add(core, "a", list(range(10, 18)), max_tokens=16, ignore_eos=True)
    add(core, "b", list(range(30, 38)), max_tokens=16, ignore_eos=True)
    seen = False
    while core.has_unfinished():
        core.step()
        core.check_integrity()
        b = core.requests.get("b")
        if b is not None and b.block_table == [] and b.num_preemptions and not seen:
            seen = True
            cached = len(core.kv.lookup(b)) * core.block_size
            assert cached == 8  # its whole prompt is still in the cache
            # b is the only request waiting: nothing of its prompt is left to prefill
            assert core.stats.prompt_tokens_waiting == 8 - cached == 0
    assert seen and core.stats.num_preemptions >= 1
    assert core.stats.prompt_tokens_waiting == 0


def test_the_credit_is_what_the_step_left_cached_of_the_prompt() -> None:
    # memory pressure: requests preempt one another and take the blocks their victims
    # freed; a victim is credited what the step's allocations left of its prompt
    core = make_core(num_blocks=7, block_size=4)
    for k in range(4):  # prompts of distinct tokens: no request adds to another's hits
        add(core, f"r{k}", list(range(20 * k, 20 * k + 6 + k)), max_tokens=12, ignore_eos=True)
    checked = 0
    while core.has_unfinished():
        before = {rid: req.num_preemptions for rid, req in core.requests.items()}
        core.step()
        core.check_integrity()
        for req in core.scheduler.waiting:
            if req.num_preemptions > before[req.request_id]:  # preempted in this step
                hits = len(core.kv.lookup(req)) * core.block_size
                assert req.waiting_credit == min(hits, req.num_prompt_tokens)
                checked += 1
    assert checked >= 2
    assert core.stats.prompt_tokens_waiting == 0
