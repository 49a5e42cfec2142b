"""What `verl` prints when a run fails in a worker: one line naming the role, rank, node and cause, exit 1."""

from __future__ import annotations

import pytest

import verl.cli
from verl.single_controller.channels import StepError
from verl.single_controller.errors import WorkerError

LOST = WorkerError(
    "actor_rollout",
    1,
    "save_checkpoint",
    "the worker's process is gone",
    kind="died",
    pid=4321,
    node="5f9bf7d9 at 10.0.0.2",
)


def _step_error() -> StepError:
    error = StepError("step 'update_actor' failed: " + str(LOST), "actor_rollout", "update_actor")
    error.__cause__ = LOST
    return error


@pytest.mark.parametrize("raised", [LOST, _step_error()], ids=["outside-a-step", "in-a-step"])
def test_a_worker_failure_is_one_line_and_exit_1(raised, monkeypatch, capsys):
    """A node lost during a checkpoint save (a worker call outside the DAG's steps) reads like one lost in a
    step: "run failed: " and the worker's description, not a traceback."""

    def run(args):
        raise raised

    monkeypatch.setattr(verl.cli, "cmd_run", run)
    monkeypatch.delenv("VERL_DEBUG", raising=False)
    assert verl.cli.main(["run"]) == 1
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("run failed: ")]
    assert "role 'actor_rollout' rank 1 (pid 4321, node 5f9bf7d9 at 10.0.0.2)" in line, err
    assert "save_checkpoint" in line and "Traceback" not in err
