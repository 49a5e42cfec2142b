"""The pure parts of spreading a worker group over Ray nodes: local ranks, how placements read."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from verl.single_controller.ray_placement import local_ranks, ranks_text  # noqa: E402


def test_local_ranks_count_the_ranks_on_each_node_in_rank_order():
    nodes = {0: ("a", "10.0.0.1"), 1: ("a", "10.0.0.1"), 2: ("b", "10.0.0.2"), 3: ("a", "10.0.0.1")}
    local, sizes = local_ranks(nodes)
    assert local == {0: 0, 1: 1, 2: 0, 3: 2}
    assert sizes == {0: 3, 1: 3, 2: 1, 3: 3}


def test_one_node_gives_local_rank_equal_to_rank():
    local, sizes = local_ranks({r: ("n", "127.0.0.1") for r in range(4)})
    assert local == {0: 0, 1: 1, 2: 2, 3: 3} and set(sizes.values()) == {4}


@pytest.mark.parametrize(
    "ranks, text",
    [([3], "rank 3"), ([0, 1], "ranks 0,1"), ([0, 1, 2], "ranks 0-2"), ([0, 2, 5], "ranks 0,2,5")],
)
def test_ranks_read_as_a_range_when_contiguous(ranks, text):
    assert ranks_text(ranks) == text
