"""Token-budget micro-batches and length balancing across data-parallel ranks, with hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.balancing import balance_across_ranks, balanced_order, balanced_partition
from verl.protocol import DataProto
from verl.workers.engine.batching import micro_batches, restore_order, token_budget_groups


def test_first_fit_decreasing_groups():
    # Longest first: 8 -> A (room 2), 7 -> B (room 3), 5 -> C (room 5), 3 -> B (room 0), 2 -> A (room 0).
    assert token_budget_groups([5, 3, 8, 2, 7], 10) == [[0], [1, 4], [2, 3]]
    assert token_budget_groups([4, 4, 4], 12) == [[0, 1, 2]]
    assert token_budget_groups([], 10) == []


def test_a_row_longer_than_the_budget_is_an_error_naming_the_setting():
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu"):
        token_budget_groups([3, 11], 10)


def batch_of_lengths(lengths: list[int], width: int = 12) -> DataProto:
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, width - n :] = 1
    return DataProto.from_dict(
        tensors={"attention_mask": mask, "row": torch.arange(len(lengths))},
        non_tensors={"uid": np.array([f"u{i}" for i in range(len(lengths))], dtype=object)},
    )


def test_micro_batches_by_tokens_and_the_way_back():
    data = batch_of_lengths([5, 3, 8, 2, 7])
    micros, order = micro_batches(data, micro_batch_size=None, max_tokens=10)
    assert [m.batch["row"].tolist() for m in micros] == [[0], [1, 4], [2, 3]]
    assert all(int(m.batch["attention_mask"].sum()) <= 10 for m in micros)
    per_row = torch.cat([m.batch["row"] * 10 for m in micros])  # results in micro-batch order
    assert restore_order(per_row, order).tolist() == [0, 10, 20, 30, 40]
    # Without a budget: fixed row counts, nothing to restore.
    micros, order = micro_batches(data, micro_batch_size=2)
    assert [len(m) for m in micros] == [2, 2, 1] and order is None


def test_balanced_partition_keeps_row_counts_equal():
    assert balanced_partition([10, 1, 1, 10], 2) == [[0, 1], [2, 3]]
    # 9 takes group A; the 1s go to B until B is full (2 rows), the last one to A.
    assert balanced_partition([9, 1, 1, 1], 2) == [[0, 3], [1, 2]]
    with pytest.raises(ValueError):
        balanced_partition([1, 2, 3], 2)


def test_balance_across_ranks_reorders_rows_and_reports_tokens_per_rank():
    # Contiguous halves hold 10+9=19 and 2+1=3 tokens; balanced, each rank gets 11.
    data = batch_of_lengths([10, 9, 2, 1])
    assert balanced_order(data, 2).tolist() == [0, 3, 1, 2]
    metrics = balance_across_ranks(data, 2)
    assert data.batch["row"].tolist() == [0, 3, 1, 2]
    assert data.non_tensor_batch["uid"].tolist() == ["u0", "u3", "u1", "u2"]
    assert metrics == {
        "global_seqlen/min": 3.0,
        "global_seqlen/max": 19.0,
        "global_seqlen/minmax_diff": 16.0,
        "global_seqlen/balanced_min": 11.0,
        "global_seqlen/balanced_max": 11.0,
        "global_seqlen/mean": 11.0,
    }
    # Rows that do not split evenly are left alone (the dispatcher pads them).
    odd = batch_of_lengths([3, 2, 1])
    balance_across_ranks(odd, 2)
    assert odd.batch["row"].tolist() == [0, 1, 2]
