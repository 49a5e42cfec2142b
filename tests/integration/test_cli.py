"""End to end: the `verl` command as a user runs it, at small size."""

from __future__ import annotations

import json
import os
import re
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
    # the start-up line says what generates, in which dtype, where
    assert re.search(
        r"rollout \(actor_rollout\): fast \(verl's KV-cached sampler\), generating with the actor's module in "
        r"(float32|bfloat16) on cpu; rollout.mode=sync",
        result.stderr,
    ), result.stderr[:3000]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert "val-core/arithmetic/acc/mean@1" in records[2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["val_after"]["val-core/arithmetic/acc/mean@1"] >= 0
    artifacts = tmp_path / "home" / "artifacts"  # built under $VERL_HOME, keyed by their settings
    assert len(list(artifacts.glob("arithmetic-data-*/train.parquet"))) == 1
    assert len(list(artifacts.glob("tiny-model-sft-*/config.json"))) == 1
    assert not list(artifacts.glob(".*"))  # no half-built artifact left behind


def test_the_server_mode_says_it_serves_and_counts_what_it_answered(
    tmp_path, tiny_model_dir, arithmetic_files
):
    train, test = arithmetic_files
    out = tmp_path / "run"
    result = run_verl(
        "run",
        f"data.train_files={train}",
        f"data.val_files={test}",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "--config",
        "grpo",
        "prepare.enable=false",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.mode=async",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={out}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "; rollout.mode=async; served (max_num_seqs 256)" in result.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for record in records[1:]:  # each step's 4 prompts x 8 samples, answered by the server
        assert record["rollout/server_requests"] == 32 and record["rollout/server_engine_calls"] >= 1


CUSTOM_STEP = '''
from verl.trainer.step import rl_step


def counted_step(flow, plan, step, prompts, more):
    """The built-in step, plus a metric of its own computed in the driver."""
    result = rl_step(flow, plan, step, prompts, more)
    result.metrics.append(flow.driver(lambda batch: {"custom/rows": float(len(batch))}, batch=result.batch))
    return result


NOT_A_STEP = 3
'''


def test_custom_step_function_from_a_user_file(tmp_path, tiny_model_dir, arithmetic_files):
    """`verl run --step file.py:fn` runs the user's step function instead of rl_step."""
    (tmp_path / "my_step.py").write_text(CUSTOM_STEP)
    train, test = arithmetic_files
    common = [
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.train_batch_size=2",
        "data.max_response_length=4",
        "data.val_max_samples=4",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={tmp_path / 'out'}",
        "prepare.enable=false",
    ]
    result = run_verl("run", "--config", "grpo", "--step", "my_step.py:counted_step", *common, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["custom/rows"] for r in records] == [4.0, 4.0]  # 2 prompts x 2 samples, every step
    assert all("actor/pg_loss" in r for r in records)
    common[-2] = f"trainer.default_local_dir={tmp_path / 'other'}"  # 'out' holds the run above
    bad = run_verl("run", "--config", "grpo", "trainer.step=my_step.py:NOT_A_STEP", *common, cwd=tmp_path)
    assert bad.returncode == 2 and "trainer.step='my_step.py:NOT_A_STEP' must be a function" in bad.stderr
    missing = run_verl(
        "run", "--config", "grpo", "trainer.step=my_step.py:no_such_step", *common, cwd=tmp_path
    )
    assert missing.returncode == 2 and "has no step function 'no_such_step'" in missing.stderr
