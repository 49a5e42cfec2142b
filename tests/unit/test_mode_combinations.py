"""Every feature in every mode: the config of each of 288 combinations of rollout engine x training strategy x
trainer mode x LoRA x tool agent loop x algorithm is loaded and validated (no training). Every one is accepted
(so every pair of settings runs together); docs/architecture.md ("What combines with what") says so, and how
the last refused pair (a streaming pool with the tool agent loop) was lifted. tests/integration/test_mode_pairs.py
trains every pair for real.
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


def test_every_combination_is_accepted(outcomes: dict[tuple[str, ...], Any]) -> None:
    refused = {"+".join(names): error for names, error in outcomes.items() if error is not None}
    assert not refused, f"{len(refused)} combinations refused, e.g. {next(iter(refused.items()))}"


def test_a_combination_that_is_refused_is_reported_with_its_reason() -> None:
    """The check above can fail: a setting no mode accepts comes back as a refusal with the config's reason."""
    assert _check(("fast", "dp", "sync", "no_lora", "no_tools", "grpo")) is None
    DIMENSIONS["mode"]["broken"] = [
        "trainer.v1.trainer_mode=colocate_async",
        "async_training.partial_rollout=false",
    ]
    try:
        error = _check(("fast", "dp", "broken", "no_lora", "no_tools", "grpo"))
    finally:
        del DIMENSIONS["mode"]["broken"]
    assert error is not None and "partial_rollout=false" in error
