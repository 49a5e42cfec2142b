"""The prompt bookkeeping behind shared KV caches: distinct rows, and the prefix every prompt starts with."""

from __future__ import annotations

import torch

from verl.models.kv_cache import common_prefix, distinct_rows, leading_padding_columns


def test_distinct_rows_and_their_inverse():
    rows = torch.tensor([[1, 2], [3, 4], [1, 2], [3, 4], [5, 6]])
    representative, inverse = distinct_rows(rows)
    assert torch.equal(rows[representative][inverse], rows)
    assert len(representative) == 3


def test_leading_padding_columns():
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]])
    assert leading_padding_columns(mask) == 1


def left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def test_the_common_prefix_of_left_padded_prompts():
    # Three prompts start with 7 8 9 10; the second is one token shorter than the others.
    ids, mask = left_padded([[7, 8, 9, 10, 1, 2], [7, 8, 9, 10, 3], [7, 8, 9, 10, 5, 6]])
    prefix = common_prefix(ids, mask, min_saved=8)
    assert prefix.length == 4
    # Suffix columns from the first one holding a row's first token after the prefix: column 4 (rows 0, 2),
    # column 5 (row 1, which starts one column later).
    assert prefix.start == 4
    assert prefix.suffix_mask.tolist() == [[1, 1], [0, 1], [1, 1]]
    assert prefix.cache_mask().tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1]]
    assert prefix.columns == slice(0, 4)  # where the first row holds it
    assert common_prefix(ids[[1, 0, 2]], mask[[1, 0, 2]], min_saved=8).columns == slice(1, 5)
    # Kept short of the shortest prompt's last token: its output is that prompt's own.
    ids, mask = left_padded([[7, 8, 9], [7, 8, 9], [7, 8, 9, 4]])
    assert common_prefix(ids, mask, min_saved=1).length == 2


def test_no_prefix_is_shared_when_it_saves_too_little_or_the_rows_are_not_left_padded():
    ids, mask = left_padded([[7, 8, 9, 10, 1, 2], [7, 8, 9, 10, 3], [7, 8, 9, 10, 5, 6]])
    # 4 tokens x 2 other prompts = 8 token passes saved
    assert common_prefix(ids, mask, min_saved=9).length == 0
    assert common_prefix(ids[:1], mask[:1], min_saved=0).length == 0  # one prompt: nothing to share
    unshared = common_prefix(ids, mask, min_saved=9)
    assert unshared.start == 0 and torch.equal(unshared.suffix_mask, mask)
    right_padded = mask.flip(1)
    assert common_prefix(ids.flip(1), right_padded, min_saved=0).length == 0
    ids, mask = left_padded([[1, 8, 9], [2, 8, 9]])
    assert common_prefix(ids, mask, min_saved=0).length == 0  # they differ at the first token
