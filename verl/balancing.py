"""Rows of a batch balanced by length across data-parallel ranks (``trainer.balance_batch``).

The dispatcher gives each rank a contiguous share of a batch; reordering the rows first makes those
shares hold about the same number of tokens, so no rank waits for a longer one.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import torch

from verl.protocol import DataProto


def row_lengths(data: DataProto) -> torch.Tensor:
    """Real tokens (prompt + response) of each row."""
    return data.batch["attention_mask"].sum(-1)


def balanced_partition(lengths: Sequence[int] | torch.Tensor, parts: int) -> list[list[int]]:
    """``parts`` equal-sized groups of row indices whose total lengths are as even as a greedy gets.

    Longest processing time first, with a cap on the rows per group: each row, longest first, goes
    to the group with the fewest tokens that still has room. Equal row counts are needed because each
    data-parallel rank must hold the same number of mini-batches.
    """
    lengths = [int(n) for n in lengths]
    if len(lengths) % parts:
        raise ValueError(f"{len(lengths)} rows do not split into {parts} equal groups")
    cap = len(lengths) // parts
    groups: list[list[int]] = [[] for _ in range(parts)]
    heap = [(0, g) for g in range(parts)]  # (tokens, group)
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        full = []
        tokens, g = heapq.heappop(heap)
        while len(groups[g]) >= cap:
            full.append((tokens, g))
            tokens, g = heapq.heappop(heap)
        groups[g].append(row)
        heapq.heappush(heap, (tokens + lengths[row], g))
        for item in full:
            heapq.heappush(heap, item)
    return [sorted(g) for g in groups]


def balanced_order(data: DataProto, world_size: int) -> np.ndarray:
    """A row order after which ``data``'s ``world_size`` contiguous chunks (what each data-parallel rank
    receives) hold about the same number of tokens; the identity when the rows do not split evenly
    (the dispatcher pads such a batch, which balancing cannot help)."""
    if world_size <= 1 or len(data) % world_size:
        return np.arange(len(data))
    groups = balanced_partition(row_lengths(data), world_size)
    return np.concatenate([np.asarray(g, dtype=np.int64) for g in groups])


def balance_across_ranks(data: DataProto, world_size: int) -> dict[str, float]:
    """Reorder ``data`` in place by `balanced_order`; returns verl's ``global_seqlen/*`` metrics (tokens
    per rank before and after)."""
    lengths = row_lengths(data)
    before = [int(c.sum()) for c in lengths.chunk(world_size)]
    order = balanced_order(data, world_size)
    data.reorder(order)
    after = [int(c.sum()) for c in lengths[torch.as_tensor(order)].chunk(world_size)]
    metrics = {
        "global_seqlen/min": float(min(before)),
        "global_seqlen/max": float(max(before)),
        "global_seqlen/minmax_diff": float(max(before) - min(before)),
        "global_seqlen/balanced_min": float(min(after)),
        "global_seqlen/balanced_max": float(max(after)),
        "global_seqlen/mean": float(sum(after) / len(after)),
    }
    return metrics
