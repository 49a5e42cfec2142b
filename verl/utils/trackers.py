"""One class per metric sink (``trainer.logger``): JSONL, CSV, TensorBoard, Weights & Biases, MLflow.

Each sink writes inside the run directory unless the user's own environment variable names another place
(``TENSORBOARD_DIR``, ``WANDB_DIR``, ``MLFLOW_TRACKING_URI``, as in verl), so a run never writes into
another run's files. Every sink has ``log(metrics, step)``, ``log_table(name, columns, rows, step)`` (the
validation generations of ``trainer.log_val_generations``) and ``close(failed)``, which flushes: the
trainer closes every sink on a normal exit, on an exception and on SIGTERM / Ctrl-C.
"""

from __future__ import annotations

import csv
import json
import math
import netrc
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

BUILT = ("console", "jsonl", "file", "csv", "tensorboard", "wandb", "mlflow")
"""``trainer.logger`` values built here; ``file`` is verl's name for the JSONL file"""
NOT_BUILT = ("swanlab", "trackio", "clearml", "vemlp_wandb", "rl_insight")
"""verl's trackers that are not built here (their metrics still go to metrics.jsonl)"""
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""the Python package each optional sink imports"""
ALSO_NEEDED = {"mlflow": ("sqlalchemy", "alembic")}
"""packages a sink needs besides its own (mlflow-skinny's SQLite store needs SQLAlchemy and Alembic)"""


SECRET_KEY = re.compile(r"(?:^|[_.-])(?:api_?key|token|secret|password|passwd|credentials?)$", re.IGNORECASE)
"""config keys whose values are never sent to a tracker or shown in a report"""
REDACTED = "***"


def redact(node: Any) -> Any:
    """A copy of a nested config with the values of secret-looking keys (``SECRET_KEY``) replaced."""
    if isinstance(node, dict):
        return {k: REDACTED if SECRET_KEY.search(str(k)) and v else redact(v) for k, v in node.items()}
    if isinstance(node, list):
        return [redact(v) for v in node]
    return node


def redact_yaml(text: str) -> str:
    """The same for a YAML text, line by line: ``  api_key: abc`` becomes ``  api_key: '***'``."""
    key_value = re.compile(r"^(\s*-?\s*)([\w.-]+)(:)\s*(\S.*)$")

    def line_redacted(line: str) -> str:
        m = key_value.match(line)
        if m is None or not SECRET_KEY.search(m.group(2)) or m.group(4) in ("null", "~", "''", '""'):
            return line
        return f"{m.group(1)}{m.group(2)}: '{REDACTED}'"

    return "\n".join(line_redacted(line) for line in text.split("\n"))


def missing_packages(logger: str) -> list[str]:
    """The packages the ``trainer.logger`` entry needs that are not installed (a directory of that name,
    such as the ``./wandb`` that wandb writes, is a namespace package, not the tracker)."""
    import importlib.util

    def installed(name: str) -> bool:
        spec = importlib.util.find_spec(name)
        return spec is not None and spec.origin is not None

    needed = ([PACKAGES[logger]] if logger in PACKAGES else []) + list(ALSO_NEEDED.get(logger, ()))
    return [name for name in needed if not installed(name)]


def jsonable(value: Any) -> Any:
    """JSON has no NaN / inf: they are written as strings ("nan", "inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonlTracker:
    """``metrics.jsonl``: one JSON object per step, flushed at every line (a SIGKILL loses nothing logged)."""

    def __init__(self, output_dir: Path) -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        self.path = output_dir / "metrics.jsonl"
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def log(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step, **{k: jsonable(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """Tables live in their own files (``validation/<step>.jsonl``), not in the metrics lines."""

    def close(self, failed: bool = False) -> None:
        self.file.close()


class CsvTracker:
    """``metrics.csv``: a row per step, a column per metric (``step`` first), for a spreadsheet or pandas.

    A step appends its row and flushes. A metric first seen at a later step (validation's) widens the table:
    the file is rewritten with the new column, empty in the earlier rows. A run resumed from step N logs again
    the steps the interrupted one logged after N: the rows after N move to ``metrics.after_step_<N>.<time>.csv``
    when the tracker opens (as ``metrics.jsonl``'s do), so no step is there twice and none is lost.
    """

    def __init__(self, output_dir: Path, resume_step: int = 0) -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        self.path = output_dir / "metrics.csv"
        self.columns: list[str] = ["step"]
        self.rows: list[dict[str, Any]] = []
        if self.path.is_file():  # a resumed run's
            with open(self.path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                self.columns = list(reader.fieldnames or self.columns)
                self.rows = list(reader)
            later = [row for row in self.rows if _row_step(row) > resume_step]
            if later:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                self._write(later, self.path.with_name(f"metrics.after_step_{resume_step}.{stamp}.csv"))
                self.rows = [row for row in self.rows if _row_step(row) <= resume_step]
                self._write(self.rows, self.path)

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, **{k: jsonable(v) for k, v in metrics.items()}}
        new = [key for key in row if key not in self.columns]
        self.columns += new
        self.rows.append(row)
        if new or not self.path.is_file():
            self._write(self.rows, self.path)
        else:
            with open(self.path, "a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, self.columns).writerow(row)

    def _write(self, rows: list[dict[str, Any]], path: Path) -> None:
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, path)

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """Tables live in their own files (``validation/<step>.jsonl``), not in the metrics rows."""

    def close(self, failed: bool = False) -> None:
        """Every row is on disk when ``log`` returns."""


def _row_step(row: dict[str, Any]) -> float:
    try:
        return float(row["step"])
    except (KeyError, TypeError, ValueError):  # a row cut short by a kill: set aside with the later ones
        return math.inf


class TensorboardTracker:
    """Scalars and the generations table (as markdown text) in ``<run>/tensorboard`` or ``$TENSORBOARD_DIR``."""

    def __init__(self, output_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(os.environ.get("TENSORBOARD_DIR") or output_dir / "tensorboard")
        self.writer = SummaryWriter(str(self.dir), flush_secs=10)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        def cell(value: Any) -> str:
            return str(value).replace("|", "\\|").replace("\n", "<br>")

        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        self.writer.add_text(name, "\n".join(lines), step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()  # flushes the pending events


def wandb_mode() -> str | None:
    """``WANDB_MODE`` when set; otherwise online only with credentials (``WANDB_API_KEY`` or a netrc entry
    for the server, ``WANDB_BASE_URL`` or api.wandb.ai): without them wandb would stop the run to ask for a
    login, so it logs offline (``wandb sync`` uploads)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return None
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        entry = netrc.netrc().authenticators(host)
    except (OSError, netrc.NetrcParseError):
        entry = None
    return None if entry else OFFLINE_WITHOUT_LOGIN


OFFLINE_WITHOUT_LOGIN = "offline"


class WandbTracker:
    """A wandb run named ``project_name`` / ``experiment_name`` with the resolved config, files under
    ``<run>/wandb`` (or ``$WANDB_DIR``)."""

    def __init__(self, output_dir: Path, project: str, experiment: str, config: dict | None) -> None:
        import wandb

        self.wandb = wandb
        self.mode = wandb_mode()
        self.inferred_offline = self.mode == OFFLINE_WITHOUT_LOGIN and not os.environ.get("WANDB_MODE")
        directory = Path(os.environ.get("WANDB_DIR") or output_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=experiment,
            config=config,
            dir=str(directory),
            mode=self.mode,
            entity=os.environ.get("WANDB_ENTITY"),
        )
        self.dir = Path(self.run.dir).parent

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        self.run.log({name: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)
        # finish() returns before wandb's service process has written the run's last records to disk;
        # teardown waits for it, so the files are complete when the trainer returns (and on SIGTERM).
        self.wandb.teardown()


def mlflow_key(key: str) -> str:
    """MLflow takes only letters, digits, ``_ - . : /`` and spaces in a metric name: ``@`` becomes ``_at_``
    (``mean@1``, as verl), any other character ``_`` (a reward field ``format(strict)`` must not stop a run)."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))


class MlflowTracker:
    """An MLflow run (experiment = ``project_name``, run name = ``experiment_name``) with the config as
    params. The store is ``$MLFLOW_TRACKING_URI`` when set, else a SQLite file in the run directory (verl's
    default is a shared ``/tmp/mlruns.db``; a run's own file cannot mix with another run's)."""

    def __init__(self, output_dir: Path, project: str, experiment: str, config: dict | None) -> None:
        import mlflow

        self.mlflow = mlflow
        output_dir.mkdir(parents=True, exist_ok=True)
        self.uri = (
            os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"
        )
        self.client = mlflow.MlflowClient(self.uri)
        found = self.client.get_experiment_by_name(project)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            artifacts = None if os.environ.get("MLFLOW_TRACKING_URI") else (output_dir / "mlflow-artifacts")
            experiment_id = self.client.create_experiment(
                project, artifact_location=None if artifacts is None else artifacts.resolve().as_uri()
            )
        self.run_id = self.client.create_run(experiment_id, run_name=experiment).info.run_id
        params = [mlflow.entities.Param(k, str(v)[:500]) for k, v in leaves(config or {}).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        table = {"columns": columns, "data": [[jsonable(v) for v in row] for row in rows]}
        self.client.log_text(self.run_id, json.dumps(table, indent=1), f"{name}/step_{step}.json")

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config's leaf values as ``{"a.b.c": value}`` (MLflow params are flat)."""
    if isinstance(node, dict):
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(leaves(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node}
