"""Reading a run directory for the report: metrics, validation generations, config and run info.

Everything here is tolerant of a run that is still going or was written by an older verl: a missing file is
``None`` (the page says "not recorded"), an unreadable line is skipped and counted. Only a run directory with
no ``metrics.jsonl`` at all is an error, since there is then nothing to report.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl.errors import InputError
from verl.trainer.run_dir import CONFIG_FILE, RUN_FILE, VALIDATION_DIR
from verl.utils.trackers import redact_yaml

METRICS_FILE = "metrics.jsonl"
TRACE_FILE = "trace.html"


class ReportError(InputError):
    """The run directory cannot be reported on, or the report would overwrite a file it did not write."""

    label = "report error"


@dataclass(frozen=True)
class Series:
    """One metric over the steps that logged it, in step order."""

    steps: tuple[int, ...]
    values: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.steps)

    def items(self) -> list[tuple[int, float]]:
        """The (step, value) pairs."""
        return list(zip(self.steps, self.values, strict=True))

    def finite(self) -> list[tuple[int, float]]:
        """The (step, value) pairs with a finite value."""
        return [(s, v) for s, v in self.items() if math.isfinite(v)]

    @property
    def non_finite(self) -> int:
        """How many values are nan or infinite (logged as the strings "nan" / "inf")."""
        return sum(not math.isfinite(v) for v in self.values)


@dataclass
class MetricsLog:
    """The parsed ``metrics.jsonl``: one :class:`Series` per numeric key."""

    series: dict[str, Series]
    steps: list[int]
    """every step that has a line, ascending"""
    repeated_steps: list[int] = field(default_factory=list)
    """steps logged more than once (a resumed run redoes them): the later line's values are kept"""
    skipped_lines: int = 0
    """lines that are not a JSON object with an integer ``step`` (e.g. the half-written last line of a
    running run)"""
    text_keys: list[str] = field(default_factory=list)
    """keys whose values are not numbers, so not plotted"""


def as_number(value: Any) -> float | None:
    """A metric value as a float: numbers as they are, strings such as "nan" / "inf" / "1.5" parsed (the
    JSONL logger writes non-finite floats as strings), anything else ``None``."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _step_of(record: Any) -> int | None:
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
        return None
    return int(step) if step == int(step) else None


def read_metrics(path: str | os.PathLike[str]) -> MetricsLog:
    """Parse a ``metrics.jsonl``: per key, the value of each step; a step logged twice keeps the later
    line's values (key by key, so a validation line and a training line of one step both count)."""
    by_step: dict[int, dict[str, float]] = {}
    seen_keys: dict[int, set[str]] = {}
    repeated: set[int] = set()
    text_keys: set[str] = set()
    skipped = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            step = _step_of(record)
            if step is None:
                skipped += 1
                continue
            row = by_step.setdefault(step, {})
            keys = {k for k in record if k != "step"}
            if keys & seen_keys.setdefault(step, set()):
                repeated.add(step)
            seen_keys[step] |= keys
            for key in keys:
                number = as_number(record[key])
                if number is None:
                    text_keys.add(key)
                    row.pop(key, None)
                else:
                    row[key] = number
    steps = sorted(by_step)
    columns: dict[str, tuple[list[int], list[float]]] = {}
    for step in steps:
        for key, value in by_step[step].items():
            xs, ys = columns.setdefault(key, ([], []))
            xs.append(step)
            ys.append(value)
    series = {key: Series(tuple(xs), tuple(ys)) for key, (xs, ys) in sorted(columns.items())}
    return MetricsLog(series, steps, sorted(repeated), skipped, sorted(text_keys - set(series)))


@dataclass
class ValidationStep:
    """The validation generations of one evaluation step (``validation/<step>.jsonl``)."""

    step: int
    path: Path
    rows: list[dict[str, Any]]
    """the first rows of the file (at most the cap given to :func:`read_validation`)"""
    total: int
    """rows in the file"""
    mean_score: float | None
    """mean ``score`` over all rows of the file that have a numeric one"""
    skipped_lines: int = 0


def read_validation_step(path: Path, step: int, max_rows: int) -> ValidationStep:
    """One ``validation/<step>.jsonl``: the first ``max_rows`` objects, the row count and the mean score."""
    rows: list[dict[str, Any]] = []
    total = skipped = 0
    score_sum, scored = 0.0, 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if not isinstance(row, dict):
                skipped += 1
                continue
            total += 1
            score = as_number(row.get("score"))
            if score is not None and math.isfinite(score):
                score_sum, scored = score_sum + score, scored + 1
            if len(rows) < max_rows:
                rows.append(row)
    return ValidationStep(step, path, rows, total, score_sum / scored if scored else None, skipped)


def read_validation(run_dir: Path, max_rows: int = 200, folder: Path | None = None) -> list[ValidationStep]:
    """Every ``<step>.jsonl`` of the run's validation folder (``validation/``, or ``folder``: the run's
    ``trainer.validation_data_dir``), by step; files not named by a step are ignored."""
    folder = folder or run_dir / VALIDATION_DIR
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob("*.jsonl"):
        if path.stem.isdigit() and path.is_file():
            found.append(read_validation_step(path, int(path.stem), max_rows))
    return sorted(found, key=lambda v: v.step)


@dataclass
class RunData:
    """All a report shows, read from one run directory."""

    run_dir: Path
    metrics: MetricsLog
    metrics_mtime: float
    """when ``metrics.jsonl`` was last written (seconds since the epoch): when the last step ended"""
    config_text: str | None = None
    config: dict[str, Any] | None = None
    """``config.yaml`` parsed, when it parses to a mapping"""
    run_info: dict[str, Any] | None = None
    run_info_error: str | None = None
    validation: list[ValidationStep] = field(default_factory=list)
    trace: Path | None = None

    @property
    def experiment(self) -> str:
        """``project/experiment`` from the config (or run.json), else the directory's name."""
        for source in (self.config, self.run_info):
            trainer = (source or {}).get("trainer", source) or {}
            if isinstance(trainer, dict) and trainer.get("experiment_name"):
                project = trainer.get("project_name")
                name = str(trainer["experiment_name"])
                return f"{project}/{name}" if project else name
        return self.run_dir.name


def _read_config(path: Path) -> tuple[str | None, dict[str, Any] | None]:
    if not path.is_file():
        return None, None
    text = redact_yaml(path.read_text(encoding="utf-8", errors="replace"))  # a page is shared: no secrets
    try:
        import yaml

        parsed = yaml.safe_load(text)
    except Exception:  # a config the page cannot parse is still shown as text
        parsed = None
    return text, parsed if isinstance(parsed, dict) else None


def _read_run_info(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    if not path.is_file():
        return None, None
    try:
        info = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        return None, f"{path.name} is not valid JSON: {e}"
    return (info, None) if isinstance(info, dict) else ({"value": info}, None)


def _validation_folder(config: Any) -> Path | None:
    """The run's ``trainer.validation_data_dir`` when its config set one (else ``<run>/validation``)."""
    trainer = config.get("trainer") if isinstance(config, dict) else None
    folder = trainer.get("validation_data_dir") if isinstance(trainer, dict) else None
    return Path(folder).expanduser() if isinstance(folder, str) and folder else None


def load_run(run_dir: str | os.PathLike[str], max_rows: int = 200) -> RunData:
    """Read a run directory; raises :class:`ReportError` when it has no ``metrics.jsonl``."""
    run_dir = Path(run_dir).expanduser()
    metrics_path = run_dir / METRICS_FILE
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory (expected a directory holding {METRICS_FILE})")
    if not metrics_path.is_file():
        raise ReportError(
            f"{run_dir}: no {METRICS_FILE} here; a run directory (trainer.default_local_dir) holds one "
            "JSON line of metrics per step when trainer.logger includes jsonl"
        )
    config_text, config = _read_config(run_dir / CONFIG_FILE)
    run_info, run_info_error = _read_run_info(run_dir / RUN_FILE)
    trace = run_dir / TRACE_FILE
    return RunData(
        run_dir=run_dir,
        metrics=read_metrics(metrics_path),
        metrics_mtime=metrics_path.stat().st_mtime,
        config_text=config_text,
        config=config,
        run_info=run_info,
        run_info_error=run_info_error,
        validation=read_validation(run_dir, max_rows, _validation_folder(config)),
        trace=trace if trace.is_file() else None,
    )
