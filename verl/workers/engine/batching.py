"""Micro-batches by token budget, and rows balanced by length across data-parallel ranks.

A fixed number of rows per micro-batch wastes work when sequence lengths vary: a micro-batch of long
rows may not fit in memory while one of short rows leaves the device idle. With a token budget
(verl's ``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``) rows are grouped so that each
micro-batch holds at most that many real tokens, and the results are put back in the rows' order.
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


def token_budget_groups(lengths: Sequence[int] | torch.Tensor, max_tokens: int) -> list[list[int]]:
    """Row indices grouped so that each group's lengths add up to at most ``max_tokens``.

    First-fit decreasing: rows longest first, each into the first group with room, a new group when
    none has. It uses at most 11/9 of the fewest groups possible (plus one). Indices within a group
    are ascending; groups are ordered by their first row.
    """
    lengths = [int(n) for n in lengths]
    if lengths and max(lengths) > max_tokens:
        raise ValueError(
            f"a row has {max(lengths)} tokens, more than the micro-batch token budget {max_tokens}: raise "
            "ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu to at least "
            "max_prompt_length + max_response_length"
        )
    groups: list[list[int]] = []
    room: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for g, free in enumerate(room):
            if lengths[row] <= free:
                groups[g].append(row)
                room[g] -= lengths[row]
                break
        else:
            groups.append([row])
            room.append(max_tokens - lengths[row])
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def micro_batches(
    data: DataProto, micro_batch_size: int | None, max_tokens: int | None = None
) -> tuple[list[DataProto], np.ndarray | None]:
    """Split ``data`` by a token budget (``max_tokens``) or a row count (``micro_batch_size``; None =
    all rows at once). Returns the micro-batches and, for a token budget, the row order they hold
    (``restore_order`` puts per-row results back)."""
    if max_tokens:
        groups = token_budget_groups(row_lengths(data), max_tokens)
        order = (
            np.concatenate([np.asarray(g, dtype=np.int64) for g in groups]) if groups else np.zeros(0, int)
        )
        return [data.select_idxs(np.asarray(g, dtype=np.int64)) for g in groups], order
    return (data.split(micro_batch_size) if micro_batch_size else [data]), None


def restore_order(results: torch.Tensor, order: np.ndarray | None) -> torch.Tensor:
    """Rows computed in ``order`` (from `micro_batches`) back in the original order."""
    if order is None:
        return results
    out = torch.empty_like(results)
    out[torch.as_tensor(order, device=results.device)] = results
    return out


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


# meta_info key under which a balanced batch carries its global_seqlen/* metrics.
GLOBAL_SEQLEN = "global_seqlen"


def balanced_order(data: DataProto, world_size: int) -> np.ndarray:
    """A row order after which ``data``'s ``world_size`` contiguous chunks (what each data-parallel rank
    receives) hold about the same number of tokens; the identity when the rows do not split evenly
    (the dispatcher pads such a batch, which balancing cannot help)."""
    if world_size <= 1 or len(data) % world_size:
        return np.arange(len(data))
    groups = balanced_partition(row_lengths(data), world_size)
    return np.concatenate([np.asarray(g, dtype=np.int64) for g in groups])


def balance_across_ranks(data: DataProto, world_size: int) -> np.ndarray:
    """Reorder ``data`` in place by `balanced_order` (returned, to reorder what is aligned with it) and
    keep verl's ``global_seqlen/*`` metrics (tokens per rank before and after) in
    ``data.meta_info["global_seqlen"]``."""
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
    data.meta_info[GLOBAL_SEQLEN] = metrics
    return order
