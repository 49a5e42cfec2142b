"""Run directories are owned: one writer, one run's files, retention of the run's own checkpoints, and a
resume that keeps the run's meaning (verl.trainer.run_dir, verl.trainer.resume_check). Checkpoints here
are directories with the files the rules look at; the real save / resume is in tests/integration."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl.config import load_config
from verl.errors import InputError, RunDirError
from verl.trainer.resume_check import config_changes
from verl.trainer.run_dir import LOCK_FILE, RunDirectory, check_run_directory, plan_run
from verl.utils.checkpoint import LATEST, prune_checkpoints, write_checkpoint_info


def _config(root: Path, *overrides: str):
    return load_config(None, [f"trainer.default_local_dir={root}", *overrides])


def fake_run(root: Path, steps: list[int], run_id: str = "run-a", config=None, metrics: bool = True) -> None:
    """A run's files as a finished run leaves them: checkpoints, the latest marker, metrics."""
    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        ckpt = root / f"global_step_{step}"
        (ckpt / "actor").mkdir(parents=True)
        (ckpt / "trainer_state.pt").write_bytes(f"state {step}".encode())
        (ckpt / "actor" / "model.safetensors").write_bytes(os.urandom(64))
        if config is not None:
            (ckpt / "config.yaml").write_text(OmegaConf.to_yaml(config))
        write_checkpoint_info(ckpt, run_id, step)
    if steps:
        (root / LATEST).write_text(f"{max(steps)}\n")
    if metrics:
        (root / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in steps))


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


# ---------------------------------------------------------------- a fresh run into a used directory


def test_a_fresh_run_into_another_runs_directory_is_refused_and_changes_nothing(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2, 3])
    before = digest(root)
    for mode in ("disable", "auto"):
        if mode == "auto":
            (root / LATEST).unlink()  # nothing to resume, but checkpoints and metrics are there
            before = digest(root)
        config = _config(root, f"trainer.resume_mode={mode}", "trainer.max_actor_ckpt_to_keep=1")
        with pytest.raises(RunDirError, match="holds another run") as err:
            RunDirectory(root).claim(config)
        assert "on_existing_run=move_aside" in str(err.value)
        assert digest(root) == before


def test_metrics_alone_count_as_another_run(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [], metrics=False)
    (root / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="metrics.jsonl"):
        plan_run(_config(root, "trainer.resume_mode=disable"))


def test_move_aside_moves_the_earlier_run_whole_and_deletes_nothing(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2])
    (root / "notes.txt").write_text("mine")  # not a run file: stays where it is
    before = digest(root)
    config = _config(root, "trainer.resume_mode=disable", "trainer.on_existing_run=move_aside")
    run_dir = RunDirectory(root)
    plan = run_dir.claim(config)
    run_dir.release()
    assert plan.resume_from is None
    (moved,) = tmp_path.glob("run.moved-*")
    after = digest(moved)
    after["notes.txt"] = digest(root)["notes.txt"]
    assert {k: v for k, v in after.items()} == before
    assert sorted(p.name for p in root.iterdir()) == sorted([LOCK_FILE, "notes.txt", "run.json"])


def test_auto_resumes_the_latest_checkpoint_and_keeps_the_run_id(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2], run_id="abc")
    plan = plan_run(_config(root))
    assert plan.resume_from == root / "global_step_2"
    assert plan.run_id == "abc"


def test_an_empty_or_missing_directory_starts_a_new_run(tmp_path):
    assert plan_run(_config(tmp_path / "new")).resume_from is None
    (tmp_path / "empty").mkdir()
    assert plan_run(_config(tmp_path / "empty", "trainer.resume_mode=disable")).resume_from is None


def test_resuming_an_early_step_in_place_would_overwrite_later_ones(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2, 3])
    with pytest.raises(RunDirError, match="overwrite its later checkpoints"):
        plan_run(_config(root, f"trainer.resume_mode={root / 'global_step_1'}"))
    # From another directory it is a new run that starts from that checkpoint.
    plan = plan_run(_config(tmp_path / "fork", f"trainer.resume_mode={root / 'global_step_1'}"))
    assert plan.resume_from == root / "global_step_1" and plan.run_id != "run-a"


def test_bad_resume_points_are_clear_errors(tmp_path):
    root = tmp_path / "run"
    with pytest.raises(InputError, match="not a checkpoint"):
        plan_run(_config(root, f"trainer.resume_mode={tmp_path / 'nowhere'}"))
    fake_run(root, [1])
    (root / LATEST).write_text("seven\n")
    with pytest.raises(RunDirError, match="cannot resume.*should hold a step number"):
        plan_run(_config(root))
    (root / LATEST).write_text("9\n")
    with pytest.raises(RunDirError, match="points at step 9"):
        plan_run(_config(root))


def test_a_file_as_the_run_directory_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        plan_run(_config(tmp_path / "file"))


# ---------------------------------------------------------------- one writer


def test_a_second_writer_is_refused_with_the_holders_pid_and_host(tmp_path):
    root = tmp_path / "run"
    first = RunDirectory(root)
    first.claim(_config(root))
    try:
        with pytest.raises(RunDirError, match=f"in use by another run \\(pid {os.getpid()} on host"):
            RunDirectory(root).claim(_config(root))
        with pytest.raises(RunDirError, match="in use"):
            check_run_directory(_config(root))
    finally:
        first.release()
    second = RunDirectory(root)  # released: the next run may have it
    second.claim(_config(root))
    second.release()


def test_claim_removes_only_unfinished_checkpoints(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1])
    (root / "global_step_2.tmp" / "actor").mkdir(parents=True)
    run_dir = RunDirectory(root)
    run_dir.claim(_config(root))
    run_dir.release()
    assert not (root / "global_step_2.tmp").exists() and (root / "global_step_1").is_dir()


# ---------------------------------------------------------------- retention


def test_retention_deletes_only_older_checkpoints_of_the_current_run(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2], run_id="other")  # e.g. a legacy or foreign checkpoint pair
    fake_run(root, [3, 4, 5, 9], run_id="mine", metrics=False)
    removed = prune_checkpoints(root, 2, "mine", current=5)
    assert sorted(p.name for p in removed) == ["global_step_3"]
    left = sorted(p.name for p in root.glob("global_step_*"))
    assert left == ["global_step_1", "global_step_2", "global_step_4", "global_step_5", "global_step_9"]
    assert prune_checkpoints(root, None, "mine", current=5) == []


# ---------------------------------------------------------------- resume keeps the run's meaning


def test_resume_refuses_changes_to_what_the_run_learns(tmp_path):
    root = tmp_path / "run"
    saved = _config(root, "trainer.save_freq=1")
    fake_run(root, [1, 2], config=saved)
    for change, key in [
        ("actor_rollout_ref.actor.optim.lr=0.5", "actor_rollout_ref.actor.optim.lr: 0.0001 -> 0.5"),
        ("algorithm.adv_estimator=rloo", "algorithm.adv_estimator: 'grpo' -> 'rloo'"),
        ("actor_rollout_ref.model.path=/elsewhere", "actor_rollout_ref.model.path"),
        ("data.train_batch_size=32", "data.train_batch_size: 16 -> 32"),
    ]:
        with pytest.raises(RunDirError, match="with a different run") as err:
            plan_run(_config(root, "trainer.save_freq=1", change))
        assert key in str(err.value)


def test_resume_applies_and_reports_changes_to_how_the_run_goes(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2], config=_config(root))
    plan = plan_run(
        _config(root, "trainer.total_training_steps=50", "trainer.save_freq=5", "trainer.logger=[jsonl]")
    )
    assert plan.resume_from == root / "global_step_2"
    assert any(c.startswith("trainer.total_training_steps: 1200 -> 50") for c in plan.config_changes)
    assert any(c.startswith("trainer.save_freq") for c in plan.config_changes)


def test_config_changes_splits_refused_from_applied(tmp_path):
    saved = OmegaConf.to_container(_config(tmp_path, "trainer.save_freq=1"), resolve=True)
    new = _config(
        tmp_path, "trainer.save_freq=2", "trainer.seed=2", "+custom_reward_function.reward_kwargs.scale=2"
    )
    refused, applied = config_changes(saved, new)
    assert refused == [  # a new entry in a free-form mapping is a change too
        "custom_reward_function.reward_kwargs: {} -> '(absent)'",
        "custom_reward_function.reward_kwargs.scale: '(absent)' -> 2",
        "trainer.seed: 1 -> 2",
    ]
    assert applied == ["trainer.save_freq: 1 -> 2"]
    # a key this version added since the checkpoint was written is not a change
    del saved["trainer"]["on_existing_run"]
    assert config_changes(saved, _config(tmp_path, "trainer.save_freq=1")) == ([], [])


def test_on_existing_run_is_one_of_its_choices(tmp_path):
    from verl.config import ConfigError

    with pytest.raises(ConfigError, match="trainer.on_existing_run must be one of refuse, move_aside"):
        _config(tmp_path, "trainer.on_existing_run=delete")


# ---------------------------------------------------------------- found in review


def test_auto_resumes_a_whole_checkpoint_newer_than_the_marker(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1, 2, 3])
    (root / LATEST).write_text("2\n")  # killed after renaming step 3 into place, before moving the marker
    assert plan_run(_config(root)).resume_from == root / "global_step_3"


def test_unreadable_run_files_are_errors_or_ignored_never_tracebacks(tmp_path):
    from verl.trainer.checkpointing import drop_metrics_after

    root = tmp_path / "run"
    fake_run(root, [1, 2], config=_config(root))
    (root / "global_step_1" / "checkpoint.json").write_text("[1, 2")  # cut short: not known to be ours
    assert prune_checkpoints(root, 1, "run-a", current=2) == []
    (root / "global_step_2" / "config.yaml").write_text("trainer: [unclosed\n")
    write_checkpoint_info(root / "global_step_2", "run-a", 2)  # hand-edited, its record made to match
    with pytest.raises(InputError, match="config.yaml cannot be read"):
        plan_run(_config(root))
    metrics = root / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "x": 1.2')  # the kill cut the last line
    aside = drop_metrics_after(metrics, 2)
    assert metrics.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert aside.read_text() == '{"step": 3, "x": 1.2\n'


def test_move_aside_takes_the_metrics_an_earlier_resume_set_aside(tmp_path):
    root = tmp_path / "run"
    fake_run(root, [1])
    (root / "metrics.after_step_1.20260101-000000.jsonl").write_text('{"step": 2}\n')
    plan = plan_run(_config(root, "trainer.resume_mode=disable", "trainer.on_existing_run=move_aside"))
    assert root / "metrics.after_step_1.20260101-000000.jsonl" in plan.move_aside


def test_sft_refuses_an_output_directory_holding_its_inputs(tiny_model_dir, arithmetic_files):
    from verl.config import SFTConfig
    from verl.trainer.sft_trainer import run_sft

    train, _ = arithmetic_files
    out = tiny_model_dir.parent  # holds the model: moving it aside would move the model away
    config = load_config(
        None,
        [f"model.path={tiny_model_dir}", f"data.train_files={train}", f"trainer.default_local_dir={out}"],
        schema=SFTConfig,
    )
    with pytest.raises(RunDirError, match="holds this run's inputs"):
        run_sft(config)
    assert not (out / LOCK_FILE).exists()  # refused before anything was written there


def test_where_samples_are_dumped_may_change_on_a_resume(tmp_path):
    saved = OmegaConf.to_container(_config(tmp_path), resolve=True)
    new = _config(
        tmp_path,
        f"trainer.rollout_data_dir={tmp_path / 'r'}",
        f"trainer.validation_data_dir={tmp_path / 'v'}",
    )
    refused, applied = config_changes(saved, new)
    assert refused == [] and [c.split(":")[0] for c in applied] == [
        "trainer.rollout_data_dir",
        "trainer.validation_data_dir",
    ]
