"""Who owns a run directory (``trainer.default_local_dir``), and what a new run may do with one that has files.

A run directory belongs to one run at a time and to one run's history:

- **One writer.** The run holds an exclusive lock on ``<dir>/.verl-run.lock`` (``fcntl.flock``: the OS
  drops it when the process dies, so a crash never leaves a stale lock). A second run into the same
  directory is refused with the holder's pid and host.
- **One run's files.** A run that does not resume (``trainer.resume_mode=disable``, or ``auto`` with no
  checkpoint) into a directory holding another run's checkpoints or metrics is refused, unless
  ``trainer.on_existing_run=move_aside``: the old files are then moved to a sibling directory
  ``<dir>.moved-<time>``; nothing is deleted. Resuming from an explicit checkpoint inside the
  directory is refused when later checkpoints of the same directory would be overwritten.
- **Its own checkpoints only.** Every checkpoint records the id of the run that wrote it
  (``checkpoint.json``); retention (``max_actor_ckpt_to_keep``) deletes only older checkpoints of the
  current run. A resumed run keeps the id of the run it continues.
- **The same meaning on resume.** The checkpoint's ``config.yaml`` is compared with the new config
  (:mod:`verl.trainer.resume_check`): a change that alters the run is refused, one that only alters how
  it is run or logged is applied and reported.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from verl.errors import InputError, RunDirError, describe_error
from verl.trainer.resume_check import check_resume_config
from verl.utils.checkpoint import (
    LATEST,
    PREFIX,
    TMP_SUFFIX,
    atomic_write_bytes,
    checkpoint_damage,
    checkpoint_steps,
    latest_checkpoint,
    latest_checkpoint_or_none,
    load_trainer_state,
    misnamed,
    read_checkpoint_info,
    read_run_id,
    step_dir,
)

logger = logging.getLogger(__name__)

LOCK_FILE = ".verl-run.lock"
RUN_FILE = "run.json"
"""The run id, when and where the run started; written when a run starts in an empty directory."""
CONFIG_FILE = "config.yaml"
CONFIG_MARK = "# verl: the resolved config of the run in this directory\n"
"""the first line of the run's ``config.yaml``: a file without it is the user's and is never replaced"""
VALIDATION_DIR = "validation"
"""the run's validation generations, ``<step>.jsonl`` (when trainer.validation_data_dir names no other)"""
RUN_FILES = (
    "metrics.jsonl",
    "metrics.csv",
    LATEST,
    "tensorboard",
    VALIDATION_DIR,
    "wandb",
    "mlflow.db",
    "mlflow-artifacts",
)
"""What a run leaves in its directory besides its checkpoints that is worth refusing a new run over
(``run.json``, ``config.yaml``, ``trace.html`` and ``report.html`` alone are not: without these, there
is nothing of the run to lose)."""
MOVED_ALONG = (RUN_FILE, "trace.html", CONFIG_FILE, "report.html")
DAMAGED_SUFFIX = ".damaged"
"""a checkpoint a resume passed over because its files are not as saved: ``global_step_<N>.damaged``"""


@dataclass
class RunPlan:
    """What a run will do with its directory, decided before anything is written."""

    root: Path
    resume_from: Path | None = None
    """the checkpoint to resume from (None: a fresh run)"""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    """the id written into every checkpoint; a resumed run keeps the one it continues"""
    move_aside: list[Path] = field(default_factory=list)
    """an earlier run's files, to move to a sibling directory before the run starts"""
    config_changes: list[str] = field(default_factory=list)
    """keys a resumed run changes that it may change (``key: saved -> new``), for the log"""
    damaged: dict[Path, str] = field(default_factory=dict)
    """checkpoints newer than ``resume_from`` that are damaged (why), to move aside before the run starts"""


def earlier_run_files(root: Path) -> list[Path]:
    """An earlier run's checkpoints (complete or not) and files in ``root``."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in sorted(root.iterdir())
        if p.name.startswith((PREFIX, "metrics.after_step_")) or p.name in RUN_FILES
    ]
    # An empty metrics file (a run stopped before its first step) is not worth refusing over, but is kept.
    return [p for p in found if not (p.name == "metrics.jsonl" and p.stat().st_size == 0)]


def _describe(files: list[Path]) -> str:
    steps = sorted(
        int(p.name[len(PREFIX) :]) for p in files if p.is_dir() and p.name[len(PREFIX) :].isdigit()
    )
    parts = [f"checkpoints of steps {', '.join(map(str, steps))}"] if steps else []
    parts += [p.name for p in files if not p.name.startswith(PREFIX)]
    return ", ".join(parts) or ", ".join(p.name for p in files)


def plan_run(config: Any) -> RunPlan:
    """Decide whether the run of ``config`` resumes, starts fresh, or is refused; changes nothing on disk."""
    plan = _plan_directory(
        Path(config.trainer.default_local_dir).expanduser(),
        str(config.trainer.resume_mode),
        str(config.trainer.on_existing_run),
    )
    if plan.resume_from is not None:
        saved = saved_config(plan.resume_from)
        if saved is not None:
            plan.config_changes = check_resume_config(saved, config, str(plan.resume_from))
    trainer = config.trainer
    for key in ("validation_data_dir", "rollout_data_dir"):
        if key in trainer:  # the RL trainer's keys
            check_dump_dir(f"trainer.{key}", trainer[key], resuming=plan.resume_from is not None)
    return plan


def check_dump_dir(key: str, directory: str | None, resuming: bool) -> None:
    """A directory the user named for generation files must not hold another run's files: a new run into a
    non-empty one is refused (a resumed run writes its own steps again). It lies outside the run directory,
    so trainer.on_existing_run=move_aside does not move it."""
    if directory is None or resuming:
        return
    path = Path(directory).expanduser()
    if path.is_dir() and any(path.glob("*.jsonl")):
        raise RunDirError(
            f"{key}={directory} already holds generation files (*.jsonl) of another run; give an empty or "
            "new directory"
        )


def _plan_directory(root: Path, resume_mode: str, on_existing_run: str) -> RunPlan:
    if root.exists() and not root.is_dir():
        raise RunDirError(f"trainer.default_local_dir={root} is a file, not a directory; give a directory")
    plan = RunPlan(root)
    earlier = earlier_run_files(root)
    where = f"trainer.default_local_dir={root}"
    if resume_mode == "auto":
        try:
            plan.resume_from = latest_checkpoint(root)
        except (ValueError, FileNotFoundError) as e:
            raise RunDirError(
                f"{where}: cannot resume ({e}); to start over and keep these files, set "
                "trainer.on_existing_run=move_aside trainer.resume_mode=disable"
            ) from None
        if plan.resume_from is not None:
            # A save renamed into place just before a crash, the marker not moved yet: the newest is whole.
            marked = _step_of(plan.resume_from)
            newer = [
                s
                for s in checkpoint_steps(root)
                if s > marked and (step_dir(root, s) / "trainer_state.pt").is_file()
            ]
            if newer:
                plan.resume_from = step_dir(root, newer[-1])
                logger.warning(
                    "resuming from %s, newer than the latest marker (step %d)", plan.resume_from, marked
                )
            plan.resume_from, plan.damaged = _newest_whole(root, _step_of(plan.resume_from))
    elif resume_mode != "disable":
        path = Path(resume_mode).expanduser()
        if not (path / "trainer_state.pt").is_file():
            raise InputError(
                f"trainer.resume_mode={resume_mode}: not a checkpoint (no trainer_state.pt); expected "
                f"auto, disable or a global_step_<N> directory, e.g. {root / (PREFIX + '100')}"
            )
        damaged = checkpoint_damage(path)
        if damaged is not None:
            raise InputError(
                f"trainer.resume_mode={resume_mode}: the checkpoint is damaged, {damaged}; nothing was loaded. "
                "Resume from an earlier checkpoint (trainer.resume_mode=auto passes over damaged ones)"
            )
        plan.resume_from = path
        if path.resolve().parent == root.resolve():
            resumed = _step_of(path)
            later = [s for s in checkpoint_steps(root) if s > resumed]
            if later:
                raise RunDirError(
                    f"trainer.resume_mode={path}: resuming step {resumed} in {root} would overwrite its "
                    f"later checkpoints (steps {', '.join(map(str, later))}); resume into another "
                    "trainer.default_local_dir (resume_mode may point at a checkpoint anywhere)"
                )
            earlier = []  # the directory's own history, which the run continues
    if plan.resume_from is not None:
        check_checkpoint_identity(plan.resume_from, root)
        # The run it continues keeps its id; a checkpoint from elsewhere starts a new run from it.
        same_dir = plan.resume_from.resolve().parent == root.resolve()
        plan.run_id = (read_run_id(plan.resume_from) if same_dir else None) or plan.run_id
        if same_dir:
            return plan
    if not earlier:
        return plan
    if on_existing_run == "move_aside":
        plan.move_aside = earlier + [p for p in (root / name for name in MOVED_ALONG) if p.exists()]
        return plan
    hint = (
        "to continue it, set trainer.resume_mode=auto; "
        if resume_mode != "auto" and latest_checkpoint_or_none(root)
        else ""
    )
    raise RunDirError(
        f"{where} holds another run ({_describe(earlier)}); {hint}to start a new run there, set "
        "trainer.on_existing_run=move_aside (moves those files to a sibling directory, deletes nothing), "
        "or use another trainer.default_local_dir / trainer.experiment_name"
    )


def check_checkpoint_identity(checkpoint: Path, root: Path) -> None:
    """Refuse to resume a checkpoint that is not what its place says: a ``global_step_<N>`` directory
    recording another step (directories renamed into each other: the run would train steps again and then
    meet its own later checkpoint), or one in the run directory written by another run than the one
    ``run.json`` names (copied in: its metrics and history are not this directory's). Reads only JSON."""
    info = read_checkpoint_info(checkpoint)
    wrong_step = misnamed(checkpoint, info.get("step"))
    if wrong_step is not None:
        raise InputError(wrong_step)
    if checkpoint.resolve().parent != root.resolve():
        return  # resumed from elsewhere: it starts a new run here
    ours, theirs = _run_id_of(root), info.get("run_id")
    if ours and theirs and ours != theirs:
        raise RunDirError(
            f"checkpoint {checkpoint} was written by run {theirs}, not by run {ours} of "
            f"trainer.default_local_dir={root} ({RUN_FILE}): copied in from another run? Move it out, or resume "
            "it into a new directory (trainer.resume_mode=<its path> with another trainer.default_local_dir)"
        )


def _run_id_of(root: Path) -> str | None:
    """The id of the run that owns ``root``, from its ``run.json`` (None: none, or unreadable)."""
    try:
        info = json.loads((root / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    run_id = info.get("run_id") if isinstance(info, dict) else None
    return run_id if isinstance(run_id, str) else None


def _newest_whole(root: Path, newest: int) -> tuple[Path, dict[Path, str]]:
    """The newest checkpoint of ``root`` up to step ``newest`` whose files are as saved, and every
    checkpoint newer than it with what is wrong with it (a resume passes over a damaged checkpoint rather
    than load it; one that reaches its step again needs its name, so it is moved aside)."""
    damaged: dict[Path, str] = {}
    for step in reversed(checkpoint_steps(root)):
        path = step_dir(root, step)
        if step > newest:
            why = "newer than the newest complete checkpoint: never finished"
        else:
            why = checkpoint_damage(path)
        if why is None:
            return path, damaged
        damaged[path] = why
    reasons = "; ".join(f"{path.name}: {why}" for path, why in damaged.items())
    raise RunDirError(
        f"trainer.default_local_dir={root}: no checkpoint there is whole ({reasons}); nothing was loaded. To "
        "start over and keep these files, set trainer.on_existing_run=move_aside trainer.resume_mode=disable"
    )


def _free_name(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``... the first that does not exist."""
    n, free = 1, path
    while free.exists():
        n += 1
        free = path.with_name(f"{path.name}-{n}")
    return free


def _step_of(checkpoint: Path) -> int:
    """The step a checkpoint holds: from its name, else from its trainer_state.pt."""
    name = checkpoint.name[len(PREFIX) :] if checkpoint.name.startswith(PREFIX) else ""
    if name.isdigit():
        return int(name)
    return int(load_trainer_state(checkpoint)["global_step"])


class RunDirectory:
    """The run directory, locked for this process from :meth:`claim` to :meth:`release`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self._lock: IO[str] | None = None

    def claim(self, config: Any) -> RunPlan:
        """Lock the directory, decide what the run does with it (:func:`plan_run`) and prepare it: move an
        earlier run aside, remove checkpoints a crash left half-written, record a new run's id."""
        self._lock_dir("trainer.default_local_dir")
        try:
            plan = plan_run(config)
            if plan.move_aside:
                moved = self._move_aside(plan.move_aside)
                logger.warning("moved the earlier run's files in %s to %s", self.root, moved)
            for path, why in plan.damaged.items():
                aside = _free_name(path.with_name(f"{path.name}{DAMAGED_SUFFIX}"))
                os.replace(path, aside)
                logger.warning(
                    "checkpoint %s is damaged (%s): moved aside to %s, resuming from %s",
                    path, why, aside.name, plan.resume_from,
                )  # fmt: skip
            if plan.damaged:  # the marker pointed at one of them
                atomic_write_bytes(self.root / LATEST, f"{_step_of(plan.resume_from)}\n".encode())
            for path in sorted(self.root.glob(f"{PREFIX}*{TMP_SUFFIX}")):
                # Only this process writes here (the lock), so a .tmp checkpoint is a crashed save.
                logger.warning("removing a checkpoint an interrupted save left unfinished: %s", path)
                shutil.rmtree(path, ignore_errors=True)
            if plan.resume_from is None or not (self.root / RUN_FILE).is_file():
                info = {"run_id": plan.run_id, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
                info.update(host=socket.gethostname(), pid=os.getpid())
                atomic_write_bytes(self.root / RUN_FILE, (json.dumps(info, indent=2) + "\n").encode())
        except BaseException:
            self.release()
            raise
        return plan

    def claim_empty(self, on_existing_run: str, key: str = "trainer.default_local_dir") -> None:
        """Lock the directory for an output that starts from nothing (``verl sft``'s model): one that holds
        files is refused, or with ``move_aside`` its files are moved to a sibling directory first."""
        self._lock_dir(key)
        try:
            present = sorted(p for p in self.root.iterdir() if p.name != LOCK_FILE)
            if present and on_existing_run != "move_aside":
                names = ", ".join(p.name for p in present[:5]) + (", ..." if len(present) > 5 else "")
                raise RunDirError(
                    f"{key}={self.root} is not empty ({names}); give a new directory, or set "
                    "trainer.on_existing_run=move_aside (moves those files to a sibling directory, deletes nothing)"
                )
            if present:
                logger.warning("moved the earlier files in %s to %s", self.root, self._move_aside(present))
        except BaseException:
            self.release()
            raise

    def _lock_dir(self, key: str) -> None:
        """Create the directory if needed and take its lock; a file in the way or a place that cannot be
        written is a RunDirError naming ``key``."""
        if self.root.exists() and not self.root.is_dir():
            raise RunDirError(f"{key}={self.root} is a file, not a directory; give a directory")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._acquire()
        except OSError as e:  # no permission, a read-only file system, ...
            raise RunDirError(
                f"{key}={self.root}: cannot write there ({e.strerror or e}); give a writable directory"
            ) from None

    def _acquire(self) -> None:
        lock = open(self.root / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise RunDirError(
                f"trainer.default_local_dir={self.root} is in use by another run ({holder}); wait for it "
                "to finish, or give this run another trainer.default_local_dir / trainer.experiment_name"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on host {socket.gethostname()}, since {time.strftime('%H:%M:%S')}\n")
        lock.flush()
        self._lock = lock

    def _move_aside(self, paths: list[Path]) -> Path:
        target = _free_name(self.root.with_name(f"{self.root.name}.moved-{time.strftime('%Y%m%d-%H%M%S')}"))
        try:
            target.mkdir(parents=True)
            for path in paths:
                os.replace(path, target / path.name)
        except OSError as e:  # a read-only parent, a mount point (another file system): nothing was deleted
            raise RunDirError(
                f"cannot move the earlier files of {self.root} aside to {target} ({e.strerror or e}); move them "
                "yourself or use another directory"
            ) from None
        return target

    def release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def write_run_config(root: Path, text: str) -> Path | None:
    """The resolved config as ``<run>/config.yaml`` (read by ``verl report``), marked as this code's; a
    ``config.yaml`` there without the mark is the user's and is left alone (returns None)."""
    path = root / CONFIG_FILE
    if path.is_file():
        with open(path, encoding="utf-8", errors="replace") as f:
            if f.readline() != CONFIG_MARK:
                logger.warning(
                    "%s is not a config this code wrote; the run's config is not saved there", path
                )
                return None
    atomic_write_bytes(path, (CONFIG_MARK + text).encode())
    return path


def check_run_directory(config: Any) -> None:
    """Fail early (before data and models are built) when the run directory would be refused: locked by a
    running run, holding another run, or a resume that changes the run. ``config`` has the paths its
    prepared inputs will have (:func:`verl.trainer.prepare.resolve_inputs`)."""
    root = Path(config.trainer.default_local_dir).expanduser()
    if root.is_dir() and (root / LOCK_FILE).is_file():
        probe = RunDirectory(root)
        probe._lock_dir("trainer.default_local_dir")
        probe.release()
    plan_run(config)


def saved_config(checkpoint: Path) -> dict[str, Any] | None:
    """The config a checkpoint was written with (``config.yaml``), or None for one without it."""
    from omegaconf import OmegaConf

    path = checkpoint / "config.yaml"
    if not path.is_file():
        return None
    try:
        saved = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as e:  # a hand-edited file that no longer parses
        raise InputError(f"{path} cannot be read ({describe_error(e)})") from None
    if not isinstance(saved, dict):
        raise InputError(f"{path} should hold the run's config (a mapping), found a {type(saved).__name__}")
    return saved
