"""``trainer.logger=[csv]``: ``metrics.csv``, a row per step and a column per metric."""

from __future__ import annotations

import csv

from verl.utils.trackers import CsvTracker
from verl.utils.tracking import Tracking


def read(path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_a_row_per_step_and_a_later_metric_widens_the_table(tmp_path):
    with Tracking(["csv"], tmp_path, 3) as tracking:
        tracking.log({"actor/pg_loss": 0.5, "timing_s/step": 1.25}, 1)
        tracking.log({"actor/pg_loss": float("nan"), "timing_s/step": 1.0}, 2)
        tracking.log({"actor/pg_loss": 0.25, "timing_s/step": 1.0, "val-core/acc": 0.75}, 3)
    columns, rows = read(tmp_path / "metrics.csv")
    assert columns == ["step", "actor/pg_loss", "timing_s/step", "val-core/acc"]
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert rows[0]["val-core/acc"] == "" and rows[2]["val-core/acc"] == "0.75"
    assert rows[1]["actor/pg_loss"] == "nan"


def test_a_resumed_run_sets_aside_the_steps_it_logs_again(tmp_path):
    first = CsvTracker(tmp_path)
    for step in (1, 2, 3):  # the killed run: its last checkpoint was at step 1
        first.log({"x": float(step)}, step)
    resumed = CsvTracker(tmp_path, resume_step=1)
    resumed.log({"x": 20.0}, 2)
    resumed.log({"x": 30.0, "y": 1.0}, 3)
    _, rows = read(tmp_path / "metrics.csv")
    assert [(r["step"], r["x"]) for r in rows] == [("1", "1.0"), ("2", "20.0"), ("3", "30.0")]
    (aside,) = tmp_path.glob("metrics.after_step_1.*.csv")
    _, old = read(aside)
    assert [(r["step"], r["x"]) for r in old] == [("2", "2.0"), ("3", "3.0")]  # nothing lost


def test_a_validation_only_pass_at_the_last_step_keeps_the_training_row(tmp_path):
    first = CsvTracker(tmp_path)
    for step in (1, 2):
        first.log({"x": float(step)}, step)
    again = CsvTracker(tmp_path, resume_step=2)  # trainer.val_only from the step-2 checkpoint
    again.log({"val-core/acc": 0.5}, 2)
    _, rows = read(tmp_path / "metrics.csv")
    assert [(r["step"], r["x"], r["val-core/acc"]) for r in rows] == [
        ("1", "1.0", ""),
        ("2", "2.0", ""),
        ("2", "", "0.5"),
    ]
    assert not list(tmp_path.glob("metrics.after_step_*"))
