"""The attention metadata built with array operations equals the layout written out token by
token, and a block id outside the cache is refused naming its sequence."""

from __future__ import annotations

import random

import pytest
import torch

from engine.kernels.metadata import BlockIdsOutOfRange, build_metadata

BLOCK = 4


def _by_token(seqs: list[tuple[int, int, list[int]]]) -> dict[str, list]:
    """The layout the metadata module's docstring describes, written out one by one."""
    slots, positions, starts, lens, table = [], [], [0], [], []
    width = max(len(b) for _, _, b in seqs)
    for start, count, blocks in seqs:
        for p in range(start, start + count):
            positions.append(p)
            slots.append(blocks[p // BLOCK] * BLOCK + p % BLOCK)
        starts.append(starts[-1] + count)
        lens.append(start + count)
        table.append(blocks + [-1] * (width - len(blocks)))
    return {"slot_mapping": slots, "positions": positions, "query_start_loc": starts,
            "seq_lens": lens, "block_tables": table}


@pytest.mark.parametrize("seed", range(4))
def test_array_built_metadata_equals_the_layout_written_out(seed: int) -> None:
    rng = random.Random(seed)
    free = list(range(400))
    rng.shuffle(free)
    seqs = []
    for _ in range(rng.randint(1, 12)):
        start = rng.choice([0, rng.randint(0, 60)])  # a cold prefill, or cached context
        count = rng.choice([1, rng.randint(1, 30)])  # a decode, or a prompt chunk
        need = -(-(start + count) // BLOCK) + rng.randint(0, 2)  # some hold spare blocks
        seqs.append((start, count, [free.pop() for _ in range(need)]))
    meta = build_metadata(seqs, BLOCK, num_blocks=400)
    want = _by_token(seqs)
    assert meta.positions is not None
    got = {name: getattr(meta, name).tolist() for name in want}
    assert got == want
    assert (meta.slot_mapping.dtype, meta.block_tables.dtype, meta.positions.dtype) == \
        (torch.int64, torch.int32, torch.int64)
    assert meta.query_start_host == tuple(want["query_start_loc"])
    assert meta.seq_lens_host == tuple(want["seq_lens"])
    assert meta.max_query_len == max(c for _, c, _ in seqs)
    assert meta.max_seq_len == max(want["seq_lens"])


def test_block_ids_outside_the_cache_name_their_sequence() -> None:
    seqs = [(0, 3, [0]), (4, 1, [1, 9, 12]), (0, 1, [-1])]
    with pytest.raises(BlockIdsOutOfRange, match=r"sequence 1: block ids \[9, 12\] outside "
                                                 r"\[0, 8\)") as caught:
        build_metadata(seqs, BLOCK, num_blocks=8)
    assert caught.value.index == 1
    build_metadata(seqs[:2], BLOCK)  # unchecked without num_blocks


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="start=5 has no new tokens"):
        build_metadata([(0, 2, [0]), (5, 0, [1, 2])], BLOCK)
    with pytest.raises(ValueError, match="2 blocks of 4 cannot hold 9 positions"):
        build_metadata([(6, 3, [0, 1])], BLOCK)
    with pytest.raises(ValueError, match="at least one sequence"):
        build_metadata([], BLOCK)
