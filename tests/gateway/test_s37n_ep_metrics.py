"""SGLang with MoE expert parallelism labels each scheduler's samples with its
``moe_ep_rank`` besides ``tp_rank`` and ``pp_rank``: with
``--enable-metrics-for-all-schedulers`` every rank of one data-parallel group reports
the group's requests and KV pool, so the group counts once whatever its ranks' labels."""

from __future__ import annotations

from gateway.replica_metrics import parse_metrics

_FIGURES = (("num_running_reqs", 3), ("num_queue_reqs", 5),
            ("max_total_num_tokens", 100000), ("token_usage", 0.4))


def _page(tp: int, ep: bool, dp: tuple[int, ...] = ()) -> str:
    lines = []
    for name, value in _FIGURES:
        lines.append(f"# TYPE sglang:{name} gauge")
        for group in dp or (None,):
            dp_label = "" if group is None else f',dp_rank="{group}"'
            for rank in range(tp):
                lines.append(
                    f'sglang:{name}{{model_name="m",engine_type="unified",tp_rank="{rank}",'
                    f'pp_rank="0",moe_ep_rank="{rank if ep else 0}"{dp_label}}} {value}')
    return "\n".join(lines) + "\n"


def test_an_expert_parallel_groups_ranks_are_read_once() -> None:
    for ep in (False, True):
        scraped = parse_metrics(_page(4, ep))
        assert (scraped.running, scraped.waiting, scraped.kv_capacity_tokens) \
            == (3, 5, 100_000), (ep, scraped)
        assert scraped.kv_usage == 0.4


def test_expert_parallel_data_parallel_groups_still_add_up() -> None:
    scraped = parse_metrics(_page(2, True, dp=(0, 1)))
    assert (scraped.running, scraped.waiting, scraped.kv_capacity_tokens) \
        == (6, 10, 200_000), scraped
