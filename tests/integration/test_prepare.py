"""Prepared artifacts (task data, tiny model, SFT warm start): keyed by what determines them, built once
even by runs started together, never written at a path the user gave."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.config import ConfigError, load_config
from verl.errors import InputError
from verl.trainer.prepare import plan_inputs, prepare_inputs
from verl.utils.artifacts import ARTIFACT_FORMAT

pytestmark = pytest.mark.slow

# A model and warm start small enough to build in seconds.
SMALL = [
    "prepare.task_kwargs.max_operand=9",
    "prepare.tiny_model.hidden_size=32",
    "prepare.tiny_model.num_hidden_layers=1",
    "prepare.tiny_model.intermediate_size=64",
    "prepare.sft.total_training_steps=5",
]


def keys(*overrides: str, cache_dir: Path = Path("/nowhere")) -> dict[str, str]:
    plan = plan_inputs(load_config("grpo", [f"prepare.cache_dir={cache_dir}", *overrides]))
    return {a.kind: a.key for a in plan.artifacts()}


def test_each_setting_that_makes_an_artifact_is_in_its_key():
    base = keys()
    assert set(base) == {"arithmetic-data", "tiny-model", "tiny-model-sft"}
    assert keys() == base  # the same settings reuse the same artifacts
    changed = {
        "prepare.seed=2": {"tiny-model", "tiny-model-sft"},
        "prepare.sft.torch_threads=2": {"tiny-model-sft"},  # a warm start's floats depend on the thread count
        "prepare.sft.lr=1e-3": {"tiny-model-sft"},
        "prepare.tiny_model.hidden_size=64": {"tiny-model", "tiny-model-sft"},
        "prepare.task_kwargs.max_operand=50": {"arithmetic-data", "tiny-model-sft"},
        # The recipe pins the warm start (prepare.seed, prepare.sft.torch_threads): RL settings do not move it.
        "trainer.seed=2": set(),
        "trainer.torch_threads=2": set(),
    }
    for override, expected in changed.items():
        other = keys(override)
        assert {kind for kind in base if other[kind] != base[kind]} == expected, override
    # Without prepare.seed the run's seed makes the tiny model and its warm start.
    free = keys("prepare.seed=null")
    assert keys("prepare.seed=null", "trainer.seed=2")["tiny-model"] != free["tiny-model"]


def test_an_unknown_task_is_named_before_anything_is_built():
    with pytest.raises(ConfigError, match="prepare.task='nope': unknown task; known tasks: arithmetic"):
        keys("prepare.task=nope")


def test_paths_the_user_gives_are_used_as_they_are(tmp_path, tiny_model_dir):
    train = tmp_path / "mine.parquet"
    model = tmp_path / "my-model"
    only_model = keys(f"actor_rollout_ref.model.path={model}")
    assert set(only_model) == {"arithmetic-data"}  # no model built
    train.write_bytes(b"first version")
    with_data = keys(f"data.train_files={train}")
    assert set(with_data) == {"tiny-model", "tiny-model-sft"}  # the warm start trains on the user's file
    train.write_bytes(b"edited")
    assert keys(f"data.train_files={train}")["tiny-model-sft"] != with_data["tiny-model-sft"]
    config = prepare_inputs(load_config("grpo", ["prepare.enable=false", f"actor_rollout_ref.model.path={tiny_model_dir}",
                                               f"data.train_files={train}"]))  # fmt: skip
    assert config.actor_rollout_ref.model.path == str(tiny_model_dir)
    # A model path that does not exist is refused, and nothing is created there.
    with pytest.raises(
        InputError, match=r"actor_rollout_ref\.model\.path=.*my-model: the model directory does not exist"
    ):
        prepare_inputs(load_config("grpo", ["prepare.enable=false", f"actor_rollout_ref.model.path={model}",
                                          f"data.train_files={train}"]))  # fmt: skip
    assert not model.exists()


def test_three_first_runs_at_once_build_each_artifact_once(tmp_path):
    script = (
        "import sys; from verl.config import ConfigError, load_config; from verl.trainer.prepare import prepare_inputs\n"
        "cfg = prepare_inputs(load_config(None, sys.argv[1:]))\n"
        "print('MODEL', cfg.actor_rollout_ref.model.path)\n"
    )
    args = [f"prepare.cache_dir={tmp_path}", *SMALL]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )  # fmt: skip
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    models = {line.split()[1] for out in outputs for line in out.splitlines() if line.startswith("MODEL")}
    assert len(models) == 1
    builds = [line for out in outputs for line in out.splitlines() if line.startswith("[prepare] building")]
    assert len(builds) == 3, builds  # data, tiny model, warm start: once each, whoever got there first
    artifacts = tmp_path / "artifacts"
    built = sorted(p.name for p in artifacts.iterdir() if p.is_dir())
    assert len(built) == 3 and not [p for p in artifacts.iterdir() if p.name.startswith(".")]
    manifest = json.loads((Path(models.pop()) / "artifact.json").read_text())
    assert manifest["format"] == ARTIFACT_FORMAT and manifest["kind"] == "tiny-model-sft"
    assert manifest["sft"]["trainer"]["total_training_steps"] == 5
    # A later run with the same settings builds nothing.
    again = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "[prepare] building" not in again.stdout + again.stderr


def test_print_config_names_the_artifacts(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "verl.cli", "run", "--print-config", f"prepare.cache_dir={tmp_path}", *SMALL],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("# prepare:")]
    assert len(lines) == 3 and all("(to build)" in line for line in lines)
    assert f"path: {tmp_path}/artifacts/tiny-model-sft-" in result.stdout
    assert not (tmp_path / "artifacts").exists()  # printing builds nothing
