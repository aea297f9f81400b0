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

from collections.abc import Sequence
from dataclasses import dataclass

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

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)


def build_metadata(
    seqs: Sequence[tuple[int, int, Sequence[int]]],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """``seqs``: ``(start, num_new_tokens, block_ids)`` per sequence; the new tokens occupy
    positions ``[start, start + num_new_tokens)``."""
    if not seqs:
        raise ValueError("build_metadata needs at least one sequence")
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    max_blocks = max(len(b) for _, _, b in seqs)
    table: list[list[int]] = []
    for start, count, block_ids in seqs:
        end = start + count
        if count <= 0:
            raise ValueError(f"sequence with start={start} has no new tokens")
        if len(block_ids) * block_size < end:
            raise ValueError(
                f"{len(block_ids)} blocks of {block_size} cannot hold {end} positions")
        slots.extend(block_ids[p // block_size] * block_size + p % block_size
                     for p in range(start, end))
        query_start.append(query_start[-1] + count)
        seq_lens.append(end)
        table.append(list(block_ids) + [-1] * (max_blocks - len(block_ids)))
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor(table, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_size=block_size,
        max_query_len=max(c for _, c, _ in seqs),
        max_seq_len=max(seq_lens),
        query_start_host=tuple(query_start),
        seq_lens_host=tuple(seq_lens),
    )
