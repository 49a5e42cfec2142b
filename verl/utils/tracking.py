"""Where metrics go: the console (a progress bar, or periodic lines off a terminal) and the sinks of
:mod:`verl.utils.trackers` (a JSONL file, TensorBoard, W&B, MLflow)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from verl.utils.trackers import (
    BUILT,
    CsvTracker,
    JsonlTracker,
    MlflowTracker,
    TensorboardTracker,
    WandbTracker,
    redact,
)

# The handful of numbers shown on the progress bar; everything goes to the other sinks.
CONSOLE_KEYS = {
    "critic/score/mean": "score",
    "actor/pg_loss": "pg_loss",
    "response_length/mean": "resp_len",
    "timing_s/step": "step_s",
}


def validation_postfix(metrics: dict[str, float]) -> dict[str, float]:
    """The validation number for the progress bar: ``val_acc`` (the first data source's
    ``val-core/<source>/acc/mean@n``) when the scorer reports an accuracy, else ``val_reward`` (its
    ``val-core/<source>/reward/mean@n``); nothing when the metrics hold no validation."""
    for name in ("acc", "reward"):
        for key, value in metrics.items():
            parts = key.rsplit("/", 2)  # a data source may hold "/" itself (openai/gsm8k)
            if len(parts) != 3:
                continue
            source, metric, stat = parts
            if source.startswith("val-core/") and metric == name and stat.startswith("mean@"):
                return {f"val_{name}": value}
    return {}


class ProgressLines:
    """The console sink off a terminal (CI, ``nohup``, Ray logs): a carriage-return progress bar would
    write thousands of updates into one line there, so it prints one summary line at the first training
    step, then at most every ``interval_s`` seconds, at every validation and at the last step."""

    def __init__(self, total: int, initial: int, desc: str, interval_s: float = 30.0) -> None:
        self.total, self.n, self.desc, self.interval_s = total, initial, desc, interval_s
        self.start_step, self.start = initial, time.monotonic()
        self.last_print: float | None = None

    def update(self, step: int, numbers: dict[str, float], validated: bool) -> None:
        now = time.monotonic()
        first = self.n == self.start_step and step > self.start_step  # the first training step
        if step == self.start_step:  # the validation before training: the rate counts from after it
            self.start = now
        self.n = step
        due = self.last_print is None or now - self.last_print >= self.interval_s
        if not (due or first or validated or step >= self.total):
            return
        self.last_print = now
        shown = "".join(f" {label}={value:.3g}" for label, value in numbers.items())
        rate = ""
        if step > self.start_step:  # not for the validation before the first step
            per_step = (now - self.start) / (step - self.start_step)
            rate = f" [{per_step:.2f} s/step, eta {_duration(per_step * max(0, self.total - step))}]"
        percent = 100 * step / max(1, self.total)
        print(
            f"{self.desc} step {step}/{self.total} ({percent:.0f}%){shown}{rate}", file=sys.stderr, flush=True
        )

    def write(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _SignalHold:
    """While active, SIGINT / SIGTERM only get noted; :meth:`release` puts the handlers back and delivers
    the noted signal to its handler. A second signal while one is held is delivered at once."""

    active: _SignalHold | None = None  # the hold in force (the main thread's); holds do not nest

    def __init__(self) -> None:
        handlers = {sig: signal.getsignal(sig) for sig in HELD_SIGNALS}
        # Not held: an ignored signal, and one whose handler Python did not install (it cannot restore it).
        self.handlers = {sig: h for sig, h in handlers.items() if h is not None and h != signal.SIG_IGN}
        self.noted: tuple[int, Any] | None = None
        self.released = False
        for sig in self.handlers:
            signal.signal(sig, self.note)
        _SignalHold.active = self

    def note(self, signum: int, frame: Any) -> None:
        if self.noted is None:
            self.noted = (signum, frame)
            return
        self.noted = None  # a second one: the user (or the supervisor) insists, so it goes through now
        self.restore()
        _deliver(signum, frame, self.handlers[signum])

    def restore(self) -> None:
        if not self.released:
            self.released = True
            for sig, handler in self.handlers.items():
                signal.signal(sig, handler)
            _SignalHold.active = None

    def release(self) -> None:
        self.restore()
        if self.noted is not None:
            (signum, frame), self.noted = self.noted, None
            _deliver(signum, frame, self.handlers[signum])


def _deliver(signum: int, frame: Any, handler: Any) -> None:
    """What the signal does with ``handler`` installed (it is installed again already)."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action: the process ends


def _raise_a_dropped_sigterm() -> None:
    """A SIGTERM whose exception some library caught and dropped (a bare ``except:``, a finalizer that was
    running when the handler ran) would let the run go on to its end: verl's handler marks that it ran
    (``received``), and a run that still logs steps after that gets it raised again here."""
    handler = signal.getsignal(signal.SIGTERM)
    if getattr(handler, "received", False) and threading.current_thread() is threading.main_thread():
        handler(signal.SIGTERM, None)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT / SIGTERM back until the block ends: one that arrives meanwhile is delivered right after
    it, to the handler installed before (verl's: ``Terminated`` / ``KeyboardInterrupt``); a second one
    while the first is held goes through at once, so a tracker that hangs can still be stopped.

    The handlers are swapped for one that only notes the signal. Blocking the signals with
    ``pthread_sigmask`` does not hold them: the mask is the main thread's, the kernel hands a
    process-directed signal to any other thread that does not block it (a tracker's, torch's, the step
    pool's), and CPython runs the Python handler in the main thread at its next bytecode whichever thread
    took the signal, so the exception came out in the middle of a tracker's call (inside MLflow's SQLite
    transaction it left the database locked: the run's end could not be written)."""
    if _SignalHold.active is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    hold = _SignalHold()
    try:
        yield
    finally:
        hold.release()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Tracking:
    """Fan metrics out to the configured loggers (``trainer.logger``): ``console`` (a progress bar on a
    terminal, periodic lines elsewhere), ``jsonl`` / ``file`` (``metrics.jsonl``), ``tensorboard``,
    ``wandb`` and ``mlflow`` (:mod:`verl.utils.trackers`). Use it as a context manager, or call
    :meth:`close` in a ``finally``: every sink is flushed and closed once, however the run ends."""

    def __init__(
        self,
        loggers: list[str],
        output_dir: str | Path,
        total_steps: int,
        project_name: str = "verl",
        experiment_name: str = "default",
        config: dict | None = None,
        initial_step: int = 0,
        desc: str = "train",
    ) -> None:
        unknown = set(loggers) - set(BUILT)
        if unknown:
            raise ValueError(f"unknown trainer.logger {sorted(unknown)}; choose {', '.join(BUILT)}")
        self.output_dir = Path(output_dir).expanduser()
        self.progress: tqdm | ProgressLines | None = None
        self.sinks: dict[str, Any] = {}
        self.closed = False
        config = redact(config) if config is not None else None  # no API key leaves the machine
        try:
            if "console" in loggers:
                if sys.stderr.isatty():
                    self.progress = tqdm(
                        total=total_steps,
                        initial=initial_step,
                        desc=desc,
                        file=sys.stderr,
                        dynamic_ncols=True,
                    )
                else:
                    self.progress = ProgressLines(total_steps, initial_step, desc)
            if "jsonl" in loggers or "file" in loggers:
                self.sinks["jsonl"] = JsonlTracker(self.output_dir)
            if "csv" in loggers:
                self.sinks["csv"] = CsvTracker(self.output_dir, resume_step=initial_step)
            if "tensorboard" in loggers:
                self.sinks["tensorboard"] = TensorboardTracker(self.output_dir)
            if "wandb" in loggers:
                self.sinks["wandb"] = WandbTracker(self.output_dir, project_name, experiment_name, config)
                if self.sinks["wandb"].inferred_offline:
                    self.write(
                        f"wandb: no credentials (WANDB_API_KEY) and no WANDB_MODE, so logging offline to "
                        f"{self.sinks['wandb'].dir}; `wandb sync` uploads it"
                    )
            if "mlflow" in loggers:
                self.sinks["mlflow"] = MlflowTracker(self.output_dir, project_name, experiment_name, config)
        except BaseException:
            self.close(failed=True)  # the sinks opened before the one that failed
            raise

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, tb: object) -> None:
        self.close(failed=kind is not None)

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / "metrics.jsonl"

    def log(self, metrics: dict[str, float], step: int) -> None:
        _raise_a_dropped_sigterm()
        with _signals_held():  # a step is in every sink or in none: a SIGTERM waits until all have it
            for sink in self.sinks.values():
                sink.log(metrics, step)
            if self.progress is not None:
                self._show_progress(metrics, step)

    def _show_progress(self, metrics: dict[str, float], step: int) -> None:
        numbers = {label: metrics[key] for key, label in CONSOLE_KEYS.items() if key in metrics}
        validation = validation_postfix(metrics)
        numbers.update(validation)
        if isinstance(self.progress, ProgressLines):
            self.progress.update(step, numbers, validated=bool(validation))
        elif self.progress is not None:
            shown = {label: f"{value:.3g}" for label, value in numbers.items()}
            self.progress.set_postfix(shown, refresh=False)
            self.progress.update(max(0, step - self.progress.n))

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """A table (the validation generations) to every sink that shows tables."""
        with _signals_held():  # as for the metrics: no tracker is stopped in the middle of writing one
            for sink in self.sinks.values():
                sink.log_table(name, columns, rows, step)

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        if self.progress is not None:
            self.progress.write(message)
        else:
            print(message, file=sys.stderr)

    def close(self, failed: bool = False) -> None:
        """Flush and close every sink, once; one that fails to close does not keep the others open."""
        if self.closed:
            return
        self.closed = True
        if self.progress is not None:
            self.progress.close()
        errors, interrupted = [], None
        for name, sink in self.sinks.items():
            try:
                sink.close(failed or interrupted is not None)
            except Exception as e:  # noqa: BLE001 - the other sinks still close; reported below
                errors.append(f"{name}: {e}")
            except BaseException as e:  # a second Ctrl-C / SIGTERM: close the rest, then let it through
                interrupted = interrupted or e
        if errors:
            print(f"could not close trackers: {'; '.join(errors)}", file=sys.stderr)
        if interrupted is not None:
            raise interrupted
