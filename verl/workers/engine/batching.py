"""Micro-batches by token budget (balancing rows across data-parallel ranks is `verl.balancing`).

A fixed number of rows per micro-batch wastes work when sequence lengths vary: a micro-batch of long
rows may not fit in memory while one of short rows leaves the device idle. With a token budget
(verl's ``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``) rows are grouped so that each
micro-batch holds at most that many real tokens, and the results are put back in the rows' order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from verl.balancing import row_lengths
from verl.protocol import DataProto
from verl.workers.engine.distributed import all_reduce_max


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
    data: DataProto, micro_batch_size: int | None, max_tokens: int | None = None, count: int = 0
) -> tuple[list[DataProto], np.ndarray | None]:
    """Split ``data`` by a token budget (``max_tokens``) or a row count (``micro_batch_size``; None =
    all rows at once). Returns the micro-batches and, for a token budget, the row order they hold
    (``restore_order`` puts per-row results back).

    ``count``: at least that many micro-batches while rows allow (the largest one split in two until
    there are): FSDP ranks must all run the same number of forward passes (see `lockstep_micro_batches`).
    """
    rows = len(data)
    size = micro_batch_size or max(rows, 1)
    if max_tokens:
        groups = token_budget_groups(row_lengths(data), max_tokens)
    elif -(-rows // size) >= count:
        return (data.split(micro_batch_size) if micro_batch_size else [data]), None
    else:
        groups = [list(range(start, min(start + size, rows))) for start in range(0, rows, size)]
    groups = _split_largest(groups, count)
    order = np.concatenate([np.asarray(g, dtype=np.int64) for g in groups]) if groups else np.zeros(0, int)
    micros = [data.select_idxs(np.asarray(g, dtype=np.int64)) for g in groups]
    return micros, (order if max_tokens else None)


def _split_largest(groups: list[list[int]], count: int) -> list[list[int]]:
    """Halve the largest group until there are ``count`` groups (or every group is one row); a group's
    halves stay next to each other, so the rows' order is unchanged."""
    groups = list(groups)
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]), default=None)
        if largest is None or len(groups[largest]) < 2:
            break
        group = groups[largest]
        groups[largest : largest + 1] = [group[: len(group) // 2], group[len(group) // 2 :]]
    return groups


def lockstep_micro_batches(
    data: DataProto, micro_batch_size: int | None, max_tokens: int | None, lockstep: bool
) -> tuple[list[DataProto], np.ndarray | None, int]:
    """`micro_batches`, the same number on every rank when ``lockstep`` (FSDP with several ranks: each
    forward pass gathers every layer's parameters from all ranks, so a rank with one pass more would
    wait forever). Returns the micro-batches, their row order and how many of them are real: a rank with
    too few rows to split ends with copies of its first row, whose results the caller drops."""
    micros, order = micro_batches(data, micro_batch_size, max_tokens)
    if not lockstep:
        return micros, order, len(micros)
    if all_reduce_max(int(not len(data))):  # every rank raises, none waits for the others
        raise ValueError("an FSDP rank got no rows to compute: give every rank at least one sample")
    target = all_reduce_max(len(micros))
    if target > len(micros):
        micros, order = micro_batches(data, micro_batch_size, max_tokens, count=target)
    real = len(micros)
    if real < target:
        micros += [data.select_idxs(np.zeros(1, dtype=np.int64))] * (target - real)
    return micros, order, real


def restore_order(results: torch.Tensor, order: np.ndarray | None) -> torch.Tensor:
    """Rows computed in ``order`` (from `micro_batches`) back in the original order."""
    if order is None:
        return results
    out = torch.empty_like(results)
    out[torch.as_tensor(order, device=results.device)] = results
    return out
