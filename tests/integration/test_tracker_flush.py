"""SIGTERM in the middle of a run: every tracker's files still hold the last validation logged before it.

verl's users lose their final validation metrics when a job is stopped and the trackers are not flushed;
here the trainer closes every sink on the way out (``Tracking`` as a context manager). A SIGTERM in the
middle of the fan-out to the trackers waits until every one has the step (in a process with threads, where
the kernel hands it to any thread), and one whose exception a library dropped is raised again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _small_run import small_run

from tests._wandb_records import history
from verl.utils.tracking import Tracking

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
    # One SIGTERM, a few milliseconds after the jsonl line: in the fan-out to the other trackers, where it
    # is held until every one has the step. Not sent again: a second one would interrupt a tracker's close.
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


class Stop(BaseException):
    """What the test's SIGTERM handler raises (verl's raises ``Terminated``)."""


@pytest.fixture
def sigterm_raises_stop():
    def handler(signum, frame):
        raise Stop

    previous = signal.signal(signal.SIGTERM, handler)
    yield handler
    signal.signal(signal.SIGTERM, previous)


def taken_by_another_thread() -> None:
    """SIGTERM as the kernel delivers a ``kill`` to a process whose main thread blocks it: to another thread,
    one that does not (the C handler runs there; Python runs the Python handler in the main thread)."""

    def take() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    thread = threading.Thread(target=take)
    thread.start()
    thread.join()


def bytecode() -> None:
    """Time in Python code: where the main thread runs a signal's Python handler."""
    for _ in range(100):
        time.sleep(0.001)


class Sink:
    """Sends ``signals`` SIGTERMs in its first call, each followed by some Python code."""

    def __init__(self, name: str, seen: list[str], signals: int = 0) -> None:
        self.name, self.seen, self.signals = name, seen, signals

    def log(self, *args: object) -> None:
        self.seen.append(f"{self.name} started")
        signals, self.signals = self.signals, 0
        for _ in range(signals):
            taken_by_another_thread()
            bytecode()
        bytecode()
        self.seen.append(f"{self.name} logged")

    log_table = log

    def close(self, failed: bool = False) -> None:
        pass


@pytest.mark.parametrize("method", ["log", "log_table"])
def test_a_sigterm_in_the_fan_out_waits_until_every_sink_has_the_step(tmp_path, sigterm_raises_stop, method):
    seen: list[str] = []
    tracking = Tracking([], tmp_path, 1)
    tracking.sinks = {"a": Sink("a", seen, signals=1), "b": Sink("b", seen)}
    args = ({"x": 1.0}, 1) if method == "log" else ("t", ["c"], [[1]], 1)
    with pytest.raises(Stop):
        getattr(tracking, method)(*args)
    assert seen == ["a started", "a logged", "b started", "b logged"]  # then the signal, not in a sink
    assert signal.getsignal(signal.SIGTERM) is sigterm_raises_stop
    tracking.log({"x": 2.0}, 2)  # the next step: nothing left over
    assert seen[-1] == "b logged"


def test_a_second_sigterm_while_one_is_held_goes_through_at_once(tmp_path, sigterm_raises_stop):
    seen: list[str] = []
    tracking = Tracking([], tmp_path, 1)
    tracking.sinks = {"a": Sink("a", seen, signals=2), "b": Sink("b", seen)}
    with pytest.raises(Stop):
        tracking.log({"x": 1.0}, 1)
    assert seen == ["a started"]  # a tracker that hangs can still be stopped
    assert signal.getsignal(signal.SIGTERM) is sigterm_raises_stop
    tracking.log({"x": 2.0}, 2)  # the first one, dropped: it is not delivered later
    assert seen[-1] == "b logged"


def test_a_sigterm_a_library_dropped_is_raised_again_at_the_next_step(tmp_path, monkeypatch):
    from verl.cli_signals import Terminated, _on_sigterm

    monkeypatch.setattr(_on_sigterm, "received", False, raising=False)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        tracking = Tracking([], tmp_path, 2)
        try:  # a library's bare except: around the moment the handler ran
            signal.raise_signal(signal.SIGTERM)
        except Terminated:
            pass
        with pytest.raises(Terminated):
            tracking.log({"x": 1.0}, 1)
    finally:
        signal.signal(signal.SIGTERM, previous)
