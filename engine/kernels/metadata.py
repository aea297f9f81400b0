"""Where one step's tokens sit in the paged KV cache, in the layout every kernel reads.

Tokens of all sequences are packed along one axis. For sequence ``i``::

    query rows:        [query_start_loc[i], query_start_loc[i + 1])   (q_len_i rows)
    context positions: [0, seq_lens[i]); the queries are the last q_len_i of them,
                       [seq_lens[i] - q_len_i, seq_lens[i]); earlier ones are already cached
    position p lives in block block_tables[i, p // block_size], offset p % block_size

``slot_mapping[t] = block * block_size + offset`` is where row ``t``'s new K/V is written;
``-1`` marks a padding row that is neither stored nor attended to.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, -1 padded
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_size: int
    max_query_len: int
    max_seq_len: int
    query_start_host: tuple[int, ...]
    seq_lens_host: tuple[int, ...]
    positions: torch.Tensor  # [num_tokens] int64: each query row's absolute position

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)


class BlockIdsOutOfRange(ValueError):
    """Sequence ``index`` names block ids outside ``[0, limit)``: the kernels would read or
    write past the cache."""

    def __init__(self, index: int, ids: list[int], limit: int) -> None:
        super().__init__(f"sequence {index}: block ids {ids} outside [0, {limit})")
        self.index, self.ids, self.limit = index, ids, limit


def build_metadata(
    seqs: Sequence[tuple[int, int, Sequence[int]]],
    block_size: int,
    device: torch.device | str = "cpu",
    num_blocks: int | None = None,
) -> AttentionMetadata:
    """``seqs``: ``(start, num_new_tokens, block_ids)`` per sequence; the new tokens occupy
    positions ``[start, start + num_new_tokens)``. ``num_blocks``: the cache's blocks, every
    block id is checked against (``BlockIdsOutOfRange``).

    Built with array operations, not per token or per block in Python: a step of 256
    decodes of 500 blocks each has 128,000 block-table entries."""
    if not seqs:
        raise ValueError("build_metadata needs at least one sequence")
    n = len(seqs)
    starts = np.fromiter((s[0] for s in seqs), np.int64, n)
    counts = np.fromiter((s[1] for s in seqs), np.int64, n)
    sizes = np.fromiter((len(s[2]) for s in seqs), np.int64, n)
    ends = starts + counts
    empty = np.flatnonzero(counts <= 0)
    if empty.size:
        raise ValueError(f"sequence with start={starts[empty[0]]} has no new tokens")
    short = np.flatnonzero(sizes * block_size < ends)
    if short.size:
        i = int(short[0])
        raise ValueError(f"{sizes[i]} blocks of {block_size} cannot hold {ends[i]} positions")
    total_blocks = int(sizes.sum())
    flat = np.fromiter(itertools.chain.from_iterable(s[2] for s in seqs), np.int64,
                       total_blocks)
    if num_blocks is not None:
        outside = np.flatnonzero((flat < 0) | (flat >= num_blocks))
        if outside.size:
            first = np.cumsum(sizes)
            i = int(np.searchsorted(first, outside[0], side="right"))
            lo = int(first[i] - sizes[i])
            ids = [int(b) for b in flat[lo:lo + sizes[i]] if not 0 <= b < num_blocks]
            raise BlockIdsOutOfRange(i, ids[:4], num_blocks)
    table_starts = np.cumsum(sizes) - sizes  # where each sequence's blocks sit in ``flat``
    max_blocks = int(sizes.max())
    table = np.full((n, max_blocks), -1, dtype=np.int32)
    rows = np.repeat(np.arange(n), sizes)
    table[rows, np.arange(total_blocks) - table_starts[rows]] = flat
    query_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=query_start[1:])
    owner = np.repeat(np.arange(n), counts)  # each query row's sequence
    positions = np.arange(int(query_start[-1])) - query_start[owner] + starts[owner]
    slots = flat[table_starts[owner] + positions // block_size] * block_size \
        + positions % block_size

    def put(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(array).to(device=device, dtype=dtype)

    return AttentionMetadata(
        slot_mapping=put(slots, torch.int64),
        block_tables=put(table, torch.int32),
        query_start_loc=put(query_start, torch.int32),
        seq_lens=put(ends, torch.int32),
        block_size=block_size,
        max_query_len=int(counts.max()),
        max_seq_len=int(ends.max()),
        query_start_host=tuple(query_start.tolist()),
        seq_lens_host=tuple(ends.tolist()),
        positions=put(positions, torch.int64),
    )
