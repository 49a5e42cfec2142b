"""SIGTERM in the middle of a run: every tracker's files still hold the last validation logged before it.

verl's users lose their final validation metrics when a job is stopped and the trackers are not flushed;
here the trainer closes every sink on the way out (``Tracking`` as a context manager).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _small_run import small_run

from tests._wandb_records import history

VAL_KEY = "val-core/arithmetic/acc/mean@1"


def validated_steps(metrics: Path) -> dict[int, float]:
    if not metrics.is_file():
        return {}
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.endswith("}")]
    return {line["step"]: line[VAL_KEY] for line in lines if VAL_KEY in line}


def test_sigterm_flushes_every_tracker(tiny_model_dir, arithmetic_files, tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TENSORBOARD_"))}
    env.update(PYTHONUNBUFFERED="1", HOME=str(tmp_path / "home"), WANDB_SILENT="true")
    args = [
        *small_run(tiny_model_dir, arithmetic_files),
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=400",
        "trainer.test_freq=1",
        "trainer.log_val_generations=2",
        "trainer.logger=[console,jsonl,tensorboard,wandb,mlflow]",
        f"trainer.default_local_dir={out}",
        "prepare.enable=false",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl.cli", "run", "--config", "grpo", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.time() + 180
    while time.time() < deadline and len(validated_steps(out / "metrics.jsonl")) < 3 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        # Known and open: about one SIGTERM in twenty is lost with every tracker on and the run goes on
        # (seen with jsonl + tensorboard + wandb + mlflow, never with wandb alone). That is not what this
        # test checks, so the signal is sent again; every assertion below still holds on the way out.
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "step 1/400" in stderr and "\r" not in stderr  # progress as lines off a terminal

    logged = validated_steps(out / "metrics.jsonl")
    last = max(logged)
    assert last >= 1  # at least one validation after a training step

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert max(e.step for e in events.Scalars(VAL_KEY)) == last  # the flush_secs buffer was written

    wandb_steps = [row["_step"] for row in history(out) if VAL_KEY in row]
    assert max(wandb_steps) == last

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("verl").experiment_id])
    assert run.info.status == "FAILED"  # ended by the signal, not finished
    steps = [m.step for m in client.get_metric_history(run.info.run_id, VAL_KEY.replace("@", "_at_"))]
    assert max(steps) == last

    dumped = sorted(int(p.stem) for p in (out / "validation").glob("*.jsonl"))
    assert set(logged) <= set(dumped)  # a validation file for every logged validation


def test_a_run_writes_generations_tables_and_its_report(
    tiny_model_dir, arithmetic_files, tmp_path, monkeypatch
):
    """verl run with the generation keys: rollouts and validations as verl's <step>.jsonl where asked, the
    samples as a TensorBoard table, and report.html (which reads the named validation directory)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from verl.cli import main

    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    out, rollouts, validation = tmp_path / "run", tmp_path / "rollouts", tmp_path / "val"
    args = [
        *small_run(tiny_model_dir, arithmetic_files),
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=2",
        "trainer.test_freq=1",
        "trainer.log_val_generations=3",
        "trainer.logger=[jsonl,tensorboard]",
        f"trainer.rollout_data_dir={rollouts}",
        f"trainer.validation_data_dir={validation}",
        f"trainer.default_local_dir={out}",
        "prepare.enable=false",
    ]
    assert main(["run", "--config", "grpo", *args]) == 0
    first = [json.loads(line) for line in (rollouts / "1.jsonl").read_text().splitlines()]
    assert len(first) == 16 and {"input", "output", "gts", "score", "step"} <= set(first[0])
    assert {r["step"] for r in first} == {1} and all(r["input"].endswith("assistant\n") for r in first)
    assert sorted(int(p.stem) for p in validation.glob("*.jsonl")) == [0, 1, 2]
    assert not (out / "validation").exists()  # the named directory instead of the run's own
    val = [json.loads(line) for line in (validation / "2.jsonl").read_text().splitlines()]
    assert len(val) == 8 and all(r["data_source"] == "arithmetic" for r in val)

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    tables = events.Tensors("val/generations/text_summary")
    assert [t.step for t in tables] == [0, 1, 2]
    assert tables[-1].tensor_proto.string_val[0].decode().count("\n| 2 |") == 3  # 3 rows of step 2

    page = (out / "report.html").read_text()
    assert 'name="generator" content="verl report"' in page
    assert val[0]["gts"] in page and "not recorded" not in page.split("Validation samples")[-1][:2000]
    assert (out / "config.yaml").read_text().startswith("# verl: the resolved config")
