"""Every feature in every mode: the config of each of 288 combinations of rollout engine x training strategy x
trainer mode x LoRA x tool agent loop x algorithm is loaded and validated (no training), and every pair of
settings must be accepted together in some combination, except the pairs listed in ``REFUSED_PAIRS`` with the
reason the config gives. docs/architecture.md ("What combines with what") lists the same pairs.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from verl.config import ConfigError, load_config

ARR = "actor_rollout_ref"
DIMENSIONS: dict[str, dict[str, list[str]]] = {
    "engine": {name: [f"{ARR}.rollout.name={name}"] for name in ("fast", "hf", "vllm")},
    "strategy": {name: [f"{ARR}.actor.strategy={name}"] for name in ("dp", "fsdp2")},
    "mode": {
        mode: [f"trainer.v1.trainer_mode={mode}"] for mode in ("sync", "separate_async", "colocate_async")
    },
    "lora": {"no_lora": [], "lora": [f"{ARR}.model.lora_rank=8"]},
    "tools": {
        "no_tools": [],
        "tools": [
            f"{ARR}.rollout.multi_turn.enable=true",
            f"{ARR}.rollout.multi_turn.tool_config_path=calculator",
        ],
    },
    "algorithm": {
        "grpo": [],
        "dapo": ["algorithm.filter_groups.enable=true"],
        "gae": ["algorithm.adv_estimator=gae"],
        "remax": ["algorithm.adv_estimator=remax"],
    },
}
BASE = ["prepare.enable=false", f"{ARR}.model.path=unused"]

REFUSED_PAIRS: dict[frozenset[str], str] = {
    frozenset(pair): reason
    for pair, reason in [
        (("tools", "colocate_async"), "does not support agent loops / multi-turn yet"),
    ]
}
"""each pair of settings no combination accepts, with (part of) the reason the config gives for it"""


def _combinations() -> list[tuple[str, ...]]:
    return list(itertools.product(*(list(values) for values in DIMENSIONS.values())))


def _check(names: tuple[str, ...]) -> str | None:
    """None when the combination's config loads and validates, else the error."""
    overrides = [o for dim, name in zip(DIMENSIONS, names, strict=True) for o in DIMENSIONS[dim][name]]
    try:
        load_config("grpo", [*BASE, *overrides])
    except ConfigError as error:
        return str(error)
    return None


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[str, ...], str | None]:
    return {names: _check(names) for names in _combinations()}


def test_the_matrix_is_the_288_combinations(outcomes: dict[tuple[str, ...], Any]) -> None:
    assert len(outcomes) == 288
    pairs = {
        frozenset((a, b))
        for (da, va), (db, vb) in itertools.combinations(DIMENSIONS.items(), 2)
        for a in va
        for b in vb
    }
    assert len(pairs) == 105


def test_every_pair_of_settings_runs_together_in_some_combination(
    outcomes: dict[tuple[str, ...], Any],
) -> None:
    accepted = [names for names, error in outcomes.items() if error is None]
    never = []
    for (_, values_a), (_, values_b) in itertools.combinations(DIMENSIONS.items(), 2):
        for a, b in itertools.product(values_a, values_b):
            if not any(a in names and b in names for names in accepted):
                never.append(frozenset((a, b)))
    unexpected = [sorted(pair) for pair in never if pair not in REFUSED_PAIRS]
    assert not unexpected, f"pairs of settings no combination accepts: {unexpected}"
    lifted = [sorted(pair) for pair in REFUSED_PAIRS if pair not in never]
    assert not lifted, (
        f"pairs listed as refused that some combination now accepts (update the list): {lifted}"
    )


@pytest.mark.parametrize("pair", sorted(REFUSED_PAIRS, key=sorted), ids=lambda pair: "+".join(sorted(pair)))
def test_a_refused_pair_says_why(outcomes: dict[tuple[str, ...], Any], pair: frozenset[str]) -> None:
    errors = [error for names, error in outcomes.items() if pair <= set(names)]
    assert errors and all(error is not None for error in errors)
    assert any(REFUSED_PAIRS[pair] in error for error in errors), errors[0]
