"""Reading a run directory for the report: metrics, validation generations, config and run info.

Everything here is tolerant of a run that is still going or was written by an older verl: a missing file is
``None`` (the page says "not recorded"), an unreadable line is skipped and counted. Only a run directory with
no ``metrics.jsonl`` at all is an error, since there is then nothing to report.

It is tolerant of a damaged or hostile ``metrics.jsonl`` too, without drawing it wrongly: a value that is not a
measurement (``true``, text, a number beyond float32's range) is left out and counted, and a line whose step is
not a plausible step number (not a whole number, negative, or far beyond the run's other steps, such as
``1e18``, which would squash every curve into the left edge) is left out and listed, so the page can say what
it did not draw and why.
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

MAX_VALUE = 3.4e38
"""the largest magnitude drawn: float32's range, which no metric computed in float32 / bf16 exceeds; a larger
number is corrupt (and near float64's limit matplotlib cannot draw its axis at all)"""
NON_FINITE_SPELLINGS = frozenset({"nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity"})
"""the strings read as numbers: how the JSONL logger writes non-finite floats (``str(float("nan"))``)"""
MAX_STEP = 10**9
"""no run logs a billion steps: a larger step number is corrupt, whatever the other steps"""
STEP_SPREAD = 10
"""a step more than this many times the median step (plus :data:`STEP_SLACK`), and beyond the run's
``trainer.total_training_steps``, is far from every other step: drawn, it would squash the run into the
left edge of every figure"""
STEP_SLACK = 100
"""so that the first steps of a short run (median 3: up to step 130) are never far from each other"""
MISSING = "is missing"
"""why a line without a ``step`` is left out (the page shows no example of it)"""


class ReportError(InputError):
    """The run directory cannot be reported on, or the report would overwrite a file it did not write."""

    label = "report error"


@dataclass(frozen=True)
class Series:
    """One metric over the steps that logged it, in step order."""

    steps: tuple[int, ...]
    values: tuple[float, ...]
    skipped: int = field(default=0, compare=False)
    """values of this key left out: not numbers (``true``, text) or beyond :data:`MAX_VALUE`"""

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
    """lines that are not a JSON object (e.g. the half-written last line of a running run)"""
    text_keys: list[str] = field(default_factory=list)
    """keys whose values are not numbers, so not plotted"""
    skipped_values: dict[str, int] = field(default_factory=dict)
    """values left out, by why (:func:`value_problem`): booleans, text, numbers beyond :data:`MAX_VALUE`"""
    dropped_steps: dict[str, list[Any]] = field(default_factory=dict)
    """lines left out for their step, by why (:func:`step_problem`, :func:`step_limit`): the steps as they
    were written"""

    def problems(self) -> list[str]:
        """What was not drawn and why, one sentence each (empty when nothing was left out)."""
        lines = []  # unreadable lines are a fact of the header already (a running run's half-written line)
        for why, steps in self.dropped_steps.items():
            shown = ", ".join(_short(s) for s in steps[:5]) + (", ..." if len(steps) > 5 else "")
            line = f"{len(steps)} line{_s(len(steps))} whose step {why}, not drawn"
            lines.append(line if why == MISSING else f"{line}: {shown}")
        for why, n in self.skipped_values.items():
            lines.append(f"{n} value{_s(n)} {'was' if n == 1 else 'were'} {why}: not drawn")
        return lines


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _short(value: Any) -> str:
    """A value as written, cut to a few characters (a hostile step may be a 4,000-digit number)."""
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 24 else text[:20] + "..."


def as_number(value: Any) -> float | None:
    """A metric value as a float: numbers as they are, and the strings "nan" / "inf" / "-inf" (how the JSONL
    logger writes non-finite floats); anything else ``None``: ``true`` is not 1.0, nor text such as "1.5" a
    number (the logger writes numbers as numbers). An integer too large for a float is infinite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str) and value.strip().lower() in NON_FINITE_SPELLINGS:
        return float(value)
    return None


def value_problem(value: Any) -> tuple[float | None, str | None]:
    """A metric value as the number to draw, or ``None`` and why it is left out."""
    if isinstance(value, bool):
        return None, "true/false (booleans are not numbers)"
    number = as_number(value)
    if number is None:
        return None, "text, null or another non-number"
    too_large = (
        abs(value) > MAX_VALUE
        if isinstance(value, int)
        else math.isfinite(number) and abs(number) > MAX_VALUE
    )
    if too_large:  # an int beyond float64 is too large, not infinite: only the logger's "inf" is
        return None, f"beyond float32's range (|x| > {MAX_VALUE:.1e}, larger than any metric)"
    return number, None


def step_problem(record: dict[str, Any]) -> tuple[int | None, str | None]:
    """The line's step, or ``None`` and why it is not a step number."""
    if "step" not in record:
        return None, MISSING
    step = record["step"]
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        return None, "is not a number"
    if isinstance(step, float) and (not math.isfinite(step) or step != int(step)):
        return None, "is not a whole number"
    if step < 0:
        return None, "is negative"
    if step > MAX_STEP:
        return None, f"is beyond {MAX_STEP:.0e}, more steps than any run takes"
    return int(step), None


def step_limit(steps: list[int], total_steps: int | None = None) -> int:
    """The largest plausible step of a log with these (distinct) ``steps``: beyond both the run's
    ``total_training_steps`` and :data:`STEP_SPREAD` times the median step (plus :data:`STEP_SLACK`), a step
    is far from the others. The median, not the largest step: one hostile step cannot raise the limit."""
    ordered = sorted(steps)
    median = ordered[len(ordered) // 2] if ordered else 0
    return max(STEP_SPREAD * median + STEP_SLACK, total_steps or 0)


def _records(f: Any) -> Any:
    """Each non-blank line of ``f`` as parsed JSON, or ``None`` when it is not JSON (a half-written line, a
    number of more than 4,300 digits, nesting too deep to parse)."""
    for line in f:
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            yield None


class _Reader:
    """What :func:`read_metrics` gathers line by line: per step, the latest value of each key."""

    def __init__(self) -> None:
        self.by_step: dict[int, dict[str, float]] = {}
        self.seen_keys: dict[int, set[str]] = {}
        self.repeated: set[int] = set()
        self.text_keys: set[str] = set()
        self.skipped_lines = 0
        self.skipped_values: dict[str, int] = {}
        self.skipped_by_key: dict[str, int] = {}
        self.dropped_steps: dict[str, list[Any]] = {}

    def add(self, record: Any) -> None:
        if not isinstance(record, dict):
            self.skipped_lines += 1
            return
        step, why = step_problem(record)
        if step is None:
            self.dropped_steps.setdefault(str(why), []).append(record.get("step"))
            return
        row = self.by_step.setdefault(step, {})
        keys = {k for k in record if k != "step"}
        if keys & self.seen_keys.setdefault(step, set()):
            self.repeated.add(step)
        self.seen_keys[step] |= keys
        for key in keys:
            number, why = value_problem(record[key])
            if number is None:
                self.text_keys.add(key)
                self.skipped_values[str(why)] = self.skipped_values.get(str(why), 0) + 1
                self.skipped_by_key[key] = self.skipped_by_key.get(key, 0) + 1
                row.pop(key, None)
            else:
                row[key] = number

    def drop_far_steps(self, total_steps: int | None) -> None:
        """Leave out the steps beyond :func:`step_limit` (a corrupt ``1e18``), and say which."""
        limit = step_limit(list(self.by_step), total_steps)
        far = sorted(s for s in self.by_step if s > limit)
        if far:
            self.dropped_steps[f"is far beyond the run's other steps (above {limit})"] = far
        for step in far:
            del self.by_step[step]
            self.repeated.discard(step)

    def log(self) -> MetricsLog:
        steps = sorted(self.by_step)
        columns: dict[str, tuple[list[int], list[float]]] = {}
        for step in steps:
            for key, value in self.by_step[step].items():
                xs, ys = columns.setdefault(key, ([], []))
                xs.append(step)
                ys.append(value)
        series = {
            key: Series(tuple(xs), tuple(ys), self.skipped_by_key.get(key, 0))
            for key, (xs, ys) in sorted(columns.items())
        }
        return MetricsLog(
            series,
            steps,
            sorted(self.repeated),
            self.skipped_lines,
            sorted(self.text_keys - set(series)),
            dict(sorted(self.skipped_values.items())),
            self.dropped_steps,
        )


def read_metrics(path: str | os.PathLike[str], total_steps: int | None = None) -> MetricsLog:
    """Parse a ``metrics.jsonl``: per key, the value of each step; a step logged twice keeps the later
    line's values (key by key, so a validation line and a training line of one step both count). What is
    not a measurement, or not at a plausible step (``total_steps``: the run's ``total_training_steps``,
    when known), is left out and counted (:meth:`MetricsLog.problems`)."""
    reader = _Reader()
    with open(path, encoding="utf-8", errors="replace") as f:
        for record in _records(f):
            reader.add(record)
    reader.drop_far_steps(total_steps)
    return reader.log()


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
        for row in _records(f):
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


def _total_steps(config: Any) -> int | None:
    """The run's ``trainer.total_training_steps`` when its config set a whole number (else ``None``)."""
    trainer = config.get("trainer") if isinstance(config, dict) else None
    total = trainer.get("total_training_steps") if isinstance(trainer, dict) else None
    return total if isinstance(total, int) and not isinstance(total, bool) and 0 < total <= MAX_STEP else None


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
        metrics=read_metrics(metrics_path, _total_steps(config)),
        metrics_mtime=metrics_path.stat().st_mtime,
        config_text=config_text,
        config=config,
        run_info=run_info,
        run_info_error=run_info_error,
        validation=read_validation(run_dir, max_rows, _validation_folder(config)),
        trace=trace if trace.is_file() else None,
    )
