"""End to end: the `verl` command as a user runs it, at small size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import verl

pytestmark = pytest.mark.slow


def run_verl(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "verl.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


def test_version():
    result = run_verl("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"verl {verl.__version__}"


def test_config_typo_names_key_and_suggestion():
    result = run_verl("run", "actor_rollout_ref.actor.lrr=1e-4")
    assert result.returncode == 2
    assert "actor_rollout_ref.actor.lrr" in result.stderr
    assert "actor_rollout_ref.actor.optim.lr" in result.stderr


def test_verl_run_default_recipe_small(tmp_path):
    """`verl run` from nothing: builds data, a tiny model, its SFT warm start, trains, prints before/after."""
    env = dict(os.environ, VERL_HOME=str(tmp_path / "home"))
    out = tmp_path / "run"
    result = run_verl(
        "run",
        "prepare.sft.total_training_steps=20",
        "prepare.tiny_model.hidden_size=32",
        "prepare.tiny_model.num_hidden_layers=1",
        "prepare.tiny_model.intermediate_size=64",
        "prepare.task_kwargs.max_operand=9",
        "trainer.total_training_steps=3",
        "trainer.test_freq=2",
        f"trainer.default_local_dir={out}",
        "--summary-json",
        str(tmp_path / "summary.json"),
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "held-out val-core/arithmetic/acc/mean@1: before RL" in result.stdout
    assert "after RL" in result.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert "val-core/arithmetic/acc/mean@1" in records[2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["val_after"]["val-core/arithmetic/acc/mean@1"] >= 0
    home = tmp_path / "home"
    assert (home / "data/arithmetic/train.parquet").exists()
    assert (home / "models/tiny-arith-sft/config.json").exists()
    assert not list(home.glob("models/*.tmp"))
