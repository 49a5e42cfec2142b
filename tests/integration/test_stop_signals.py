"""A run stops when asked, whatever user code is doing: a reward function that never returns does not keep
Ctrl-C or SIGTERM from ending the run promptly with 130 / 143, the last whole checkpoint intact and the run
directory free for the rerun that resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _small_run import small_run

from verl.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: the bound on the time to stop is wall-clock

HANGS_AFTER_FIRST_STEP = """
import os, time
calls = 0

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global calls
    calls += 1
    if calls > {per_step} and os.environ.get("HANG") == "1":
        time.sleep(10**6)
    return float(solution_str.strip() == ground_truth)
"""


def _args(model_dir, files, out: Path, reward: Path, steps: int) -> list[str]:
    return [
        *small_run(model_dir, files),
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={out}",
        "prepare.enable=false",
        f"custom_reward_function.path={reward}",
        "reward_model.timeout_s=null",  # no per-call limit: only the signal can end the hung call
    ]


@pytest.mark.parametrize(
    ("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_hung_reward_function_does_not_keep_a_signal_from_ending_the_run(
    sig, code, said, tiny_model_dir, arithmetic_files, tmp_path
):
    out, reward = tmp_path / "run", tmp_path / "reward.py"
    args = _args(tiny_model_dir, arithmetic_files, out, reward, steps=3)
    batch = next(int(a.split("=")[1]) for a in args if a.startswith("data.train_batch_size="))
    reward.write_text(HANGS_AFTER_FIRST_STEP.format(per_step=batch * 4))
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl.cli", "run", "--config", "grpo", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "HANG": "1"},
    )
    marker = out / "latest_checkpointed_iteration.txt"
    deadline = time.time() + 180
    while time.time() < deadline and not marker.exists():
        time.sleep(0.1)
    assert marker.read_text().strip() == "1"
    time.sleep(3)  # step 2 is now scoring, in the call that never returns
    sent = time.monotonic()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    stopped_s = time.monotonic() - sent
    assert proc.returncode == code, stderr[-2000:]
    assert said in stderr and "Traceback" not in stderr
    assert stopped_s < 30, stopped_s
    # the checkpoint of step 1 is whole: the rerun (the reward no longer hangs) resumes from it and finishes
    assert (
        main(["run", "--config", "grpo", *_args(tiny_model_dir, arithmetic_files, out, reward, steps=2)]) == 0
    )
    assert marker.read_text().strip() == "2"
