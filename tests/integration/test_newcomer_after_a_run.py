"""The README's "After a run" commands, read from the README and run as written right after a first ``verl run``
in the same directory (issue 41: ``verl doctor`` and the trackers run were refused there). Only the run's size is
added to the ``verl run`` commands (a tiny model and warm start, one step): the artifacts are built in a
temporary ``$VERL_HOME`` and ``outputs/`` lands in a temporary working directory."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from verl.utils.trackers import missing_packages

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

SMALL = [  # the size of the run only; the README's own arguments are kept as written
    "prepare.sft.total_training_steps=20",
    "prepare.tiny_model.hidden_size=32",
    "prepare.tiny_model.num_hidden_layers=1",
    "prepare.tiny_model.intermediate_size=64",
    "prepare.task_kwargs.max_operand=9",
    "data.val_max_samples=8",
    "trainer.total_training_steps=1",
]
FIRST_RUN = Path("outputs/verl/grpo-arithmetic")
"""where the README's first ``verl run`` writes (outputs/<project>/<experiment>)"""


def after_a_run_commands() -> list[list[str]]:
    """The commands of the README's "After a run" code block, one argv each (comments dropped)."""
    section = (ROOT / "README.md").read_text().split("\n## After a run", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's 'After a run' section has no bash block"
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines() if line.strip()]


def verl(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """``verl <argv>`` started in ``cwd``, as the console script runs it (:func:`finish` waits for it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "verl.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
    )


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    """Its exit code, stdout and stderr, once it has ended."""
    try:
        out, err = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return process.returncode, out, err


def check_install_line(argv: list[str]) -> None:
    """The README's install line for the trackers: with the constraints, and an extra that has them."""
    import tomllib

    assert argv[:6] == ["python", "-m", "pip", "install", "-c", "constraints-cpu.txt"], argv
    extra = re.fullmatch(r"\.\[([\w-]+)\]", argv[-1])
    assert argv[-2] == "-e" and extra, argv
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {Requirement(r).name for r in extras[extra.group(1)]}
    assert {"tensorboard", "wandb", "mlflow-skinny", "sqlalchemy", "alembic"} <= names


def test_the_readme_after_a_run_commands_work_after_the_first_run(tmp_path: Path) -> None:
    missing = [p for name in ("tensorboard", "wandb", "mlflow") for p in missing_packages(name)]
    if missing:
        pytest.skip(f"the tracking extra is not installed here (missing {missing})")
    env = {**os.environ, "VERL_HOME": str(tmp_path / "home"), "WANDB_MODE": "offline"}  # wandb never logs in
    for name in ("TENSORBOARD_DIR", "WANDB_DIR", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)  # each tracker writes into the run directory, as the README says
    code, _, err = finish(verl(["run", *SMALL], tmp_path, env))
    assert code == 0, err[-3000:]
    first_metrics = (tmp_path / FIRST_RUN / "metrics.jsonl").read_text()

    commands = after_a_run_commands()
    assert [argv[:2] for argv in commands] == [
        ["verl", "report"],
        ["verl", "doctor"],
        ["python", "-m"],
        ["verl", "run"],
    ]
    check_install_line(commands[2])
    (tmp_path / FIRST_RUN / "report.html").unlink()  # the run wrote one: `verl report` must write it again
    started = {}
    for argv in (commands[0], commands[1], commands[3] + SMALL):
        # each reads the first run or writes a directory of its own: run side by side to keep the test short
        started[argv[1]] = (argv, verl(argv[1:], tmp_path, env))
    done = {name: (argv, *finish(process)) for name, (argv, process) in started.items()}
    for argv, code, out, err in done.values():
        assert code == 0, (argv, out[-3000:], err[-3000:])

    doctor_out = done["doctor"][2]  # it saw the first run, and says so without failing
    assert f"{FIRST_RUN} already holds a run" in doctor_out
    assert "trainer.on_existing_run=move_aside" in doctor_out
    assert (tmp_path / FIRST_RUN / "report.html").is_file()
    assert (tmp_path / FIRST_RUN / "metrics.jsonl").read_text() == first_metrics  # the first run untouched
    trackers = tmp_path / "outputs/verl/grpo-trackers"
    steps = [json.loads(line)["step"] for line in (trackers / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]
    for made in ("tensorboard", "wandb", "mlflow.db"):  # each tracker wrote into the new run's directory
        assert (trackers / made).exists(), made
