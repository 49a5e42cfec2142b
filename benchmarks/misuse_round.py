"""The hostile-user round: run well over a hundred misuses of the ``verl`` command as real subprocesses and
classify what each one did.

Each case (``benchmarks/misuse_cases*.py``) runs in its own fresh directory (the cwd of its commands, and
the home of its run directory ``ckpt_dir``), optionally after "prior" commands whose outcome is not graded
(a run that leaves checkpoints, a run that is Ctrl-C'd, a run left going in the background). The graded
command's exit code, output and the files it touched are then sorted into exactly one outcome:

==============  =========================================================================================
clear error     an error was expected: the right exit code, no traceback, the message names what it must
handled         success was expected, and the run succeeded and passed the case's check
traceback       "Traceback (most recent call last)" in the output (a user error shown as a crash)
unclear error   nonzero exit without a traceback, but the wrong exit code or a message missing a name
silent          exit 0 where an error was expected, a failed check, or a path that must not exist does
security        untrusted code (a tool call, a checkpoint) did what it must not: its check says so
hang            a command ran past the case's time limit (its process group is killed)
data loss       a protected file (hashed before the graded command) changed or disappeared
==============  =========================================================================================

``data loss`` and ``hang`` take precedence over everything else. The expectations follow the exit-code
contract of ``verl.errors`` (0 ok, 1 run failed, 2 config error, 3 input error, 4 run directory error,
130 interrupted), not the behaviour of whatever tree is measured.

    python benchmarks/misuse_round.py                 # the whole round, 2 cases at a time
    python benchmarks/misuse_round.py --only reward   # a group, an id, or a glob: --only 'ckpt-*,cli-1*'
    python benchmarks/misuse_round.py --list

A full round writes ``benchmarks/results/misuse_round.json`` and ``docs/misuse_round.md`` (a selection
writes only where ``--json`` / ``--md`` say). The exit status is 1 when any case is data loss, silent, hang
or traceback.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "misuse_round.json"
DEFAULT_MD = ROOT / "docs" / "misuse_round.md"
DEFAULT_BEFORE = ROOT / "benchmarks" / "results" / "misuse_round_before.json"

OUTCOMES = ("clear error", "handled", "traceback", "unclear error", "silent", "hang", "data loss", "security")
BAD_OUTCOMES = ("data loss", "security", "silent", "hang", "traceback")
SECURITY = "security: "
"""a check's answer that starts with this is a security outcome (untrusted code did what it must not)"""
GROUPS = (
    "cli",
    "config-values",
    "data",
    "model",
    "checkpoints",
    "export",
    "reward",
    "signals",
    "sft",
    "sandbox",
    "hostile-checkpoints",
    "hung-tools",
    "parser",
    "outputs",
    "chat-rows",
)
TRACEBACK = "Traceback (most recent call last)"

RUN_DIR = "ckpt_dir"
"""Every case's ``trainer.default_local_dir``, relative to the case directory."""
BASE = [
    "trainer.total_training_steps=2",
    "trainer.test_freq=2",  # validated once, after the last step (-1 would never validate)
    "trainer.val_before_train=false",
    "data.val_max_samples=64",
    f"trainer.default_local_dir={RUN_DIR}",
]
"""Overrides of a short ``verl run`` (about 10 s on the tiny default recipe)."""

ERROR_LABELS = (
    "config error:",
    "input error:",
    "run directory error:",
    "run failed:",
    "interrupted",
    "error:",
    "verl: error:",
)
"""Where the user-facing message starts in stderr (argparse's is ``verl run: error: ...``)."""

# ------------------------------------------------------------------------------------------------ the spec


@dataclass
class Signal:
    """Send ``signum`` to the command's process group (as a terminal's Ctrl-C does) ``after_s`` seconds after
    it started, or ``delay_s`` after a path matching the glob ``when`` (relative to the case dir) appears."""

    signum: int = signal.SIGINT
    after_s: float | None = None
    when: str | None = None
    delay_s: float = 0.0


@dataclass
class Cmd:
    """One command. ``argv`` starts with ``verl``; ``{tmp}``, ``{model}``, ``{train}``, ``{val}``,
    ``{cache}``, ``{host}``, ``{bg_pid}`` in its items are replaced. A callable gets the :class:`Ctx` (for
    argv built from what earlier commands left). ``background``: start it and go on once ``ready`` (a glob
    relative to the case dir) exists; it is killed when the case ends."""

    argv: Sequence[str] | Callable[[Ctx], Sequence[str]]
    env: dict[str, str] = field(default_factory=dict)
    signals: list[Signal] = field(default_factory=list)
    background: bool = False
    ready: str | None = None


@dataclass
class Expect:
    """``error(code, mentions)`` or ``ok(check)``; see the module docstring for how they are graded."""

    kind: str  # "error" | "ok"
    codes: tuple[int, ...] = ()
    mentions: tuple[Any, ...] = ()
    """substrings the error message must hold (case-insensitive); a tuple item is a set of alternatives"""
    check: Callable[[Ctx], str | None] | None = None
    """returns None when fine, else what is wrong"""

    def describe(self) -> str:
        if self.kind == "ok":
            return "ok" + (" + check" if self.check else "")
        codes = "/".join(str(c) for c in self.codes)
        names = ", ".join("|".join(m) if isinstance(m, tuple) else str(m) for m in self.mentions)
        return f"exit {codes}" + (f" [{names}]" if names else "") + (" + check" if self.check else "")


def error(codes: int | Sequence[int], mentions: Sequence[Any] = (), check: Callable | None = None) -> Expect:
    codes = (codes,) if isinstance(codes, int) else tuple(codes)
    return Expect("error", codes, tuple(mentions), check)


def ok(check: Callable | None = None) -> Expect:
    return Expect("ok", (0,), (), check)


@dataclass
class Case:
    id: str
    group: str
    what: str
    cmd: Cmd | Sequence[str]
    expect: Expect
    setup: Callable[[Path, Fixtures], None] | None = None
    prior: list[Cmd | Sequence[str]] = field(default_factory=list)
    after: list[Cmd | Sequence[str]] = field(default_factory=list)
    """commands run after the graded one (a rerun that must resume); their results go to the check"""
    protect: list[str] = field(default_factory=list)
    """paths (relative to the case dir) whose files must be byte-identical after the case"""
    snapshot: list[str] = field(default_factory=list)
    """paths hashed before the graded command for the check (``ctx.before``), without the protect rule"""
    no_create: list[str] = field(default_factory=list)
    """paths that must not exist after the case (the error must not make them up)"""
    limit_s: float = 90.0
    """time limit of each command of the case"""
    teardown: Callable[[Path], None] | None = None


@dataclass
class CmdResult:
    argv: list[str]
    rc: int | None
    seconds: float
    stdout: str
    stderr: str
    timed_out: bool = False
    signals_sent: list[str] = field(default_factory=list)
    pid: int | None = None

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr


@dataclass
class Ctx:
    """What a check, or a callable argv, sees."""

    tmp: Path
    fixtures: Fixtures
    prior: list[CmdResult] = field(default_factory=list)
    result: CmdResult | None = None
    after: list[CmdResult] = field(default_factory=list)
    before: dict[str, str] = field(default_factory=dict)
    """sha256 by path (relative to the case dir) of the protect and snapshot paths before the graded command"""
    bg_pid: int | None = None

    @property
    def run_dir(self) -> Path:
        return self.tmp / RUN_DIR


# ------------------------------------------------------------------------------------------------ fixtures


class Fixtures:
    """What cases share: the cached tiny model and data of the default recipe (found through
    ``verl run --print-config``), and one small run with checkpoints to copy (built on first use)."""

    def __init__(self, workdir: Path, verl: list[str]) -> None:
        self.workdir = workdir
        self.verl = verl
        self.host = socket.gethostname()
        self._lock = threading.Lock()
        self._checkpoint_run: Path | None = None
        self._prepared: set[str] = set()
        self.model, self.train, self.val, self.cache = self._find_inputs()

    def _find_inputs(self) -> tuple[str, str, str, str]:
        import yaml

        where = self.workdir / "_fixtures"
        where.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [*self.verl, "run", "--print-config"],
            cwd=where,
            env=base_env(None),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise SystemExit(f"`verl run --print-config` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        cfg = yaml.safe_load(proc.stdout)
        data, model = cfg["data"], cfg["actor_rollout_ref"]["model"]
        cache = os.path.expanduser(str(cfg.get("prepare", {}).get("cache_dir") or "~/.cache/verl"))
        return str(model["path"]), str(data["train_files"]), str(data["val_files"]), cache

    def checkpoint_run(self) -> Path:
        """A run directory after a 2-step run with save_freq=1 (global_step_1, global_step_2, metrics)."""
        with self._lock:
            if self._checkpoint_run is None:
                # Built as a case would build it (cwd, relative ckpt_dir), so a copy is the same as a prior
                # run in the case's own directory, down to the config saved in each checkpoint.
                run = self.workdir / "_fixtures" / RUN_DIR
                proc = subprocess.run(
                    [*self.verl, "run", *BASE, "trainer.save_freq=1"],
                    cwd=run.parent,
                    env=base_env(self.cache),
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if proc.returncode != 0 or not (run / "global_step_2").is_dir():
                    raise RuntimeError(f"could not build the checkpoint fixture:\n{proc.stderr[-3000:]}")
                self._checkpoint_run = run
            return self._checkpoint_run

    def prepare(self, recipe: str, overrides: Sequence[str] = ()) -> None:
        """Build the prepared inputs (warm start, data) of ``recipe`` with ``overrides`` in the shared cache,
        once, before a case's clock starts: a warm start takes minutes on a slow CPU, not what a case grades."""
        key = " ".join([recipe, *overrides])
        with self._lock:
            if key in self._prepared:
                return
            code = (
                "from verl.config import load_config\n"
                "from verl.trainer.prepare import prepare_inputs\n"
                f"prepare_inputs(load_config({recipe!r}, {list(overrides)!r}))\n"
            )
            proc = subprocess.run(
                [sys.executable, "-c", code],
                env=base_env(self.cache),
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"could not prepare the {recipe} recipe's inputs:\n{proc.stderr[-3000:]}")
            self._prepared.add(key)

    def copy_run(self, dest: Path) -> Path:
        """Copy the checkpoint fixture to ``dest`` (without a lock file a run may have left)."""
        shutil.copytree(self.checkpoint_run(), dest, ignore=shutil.ignore_patterns("*.lock", "*lock*"))
        return dest

    def ensure_model(self) -> str:
        """The cached model's path, built first if need be: the default recipe's first run builds it (the
        checkpoint fixture's run), and a case naming or copying it may start before any run has, e.g. on a
        fresh machine or after a change to what the cache key covers."""
        self.checkpoint_run()
        return self.model

    def copy_model(self, dest: Path, drop: Sequence[str] = ()) -> Path:
        shutil.copytree(self.ensure_model(), dest)
        for name in drop:
            (dest / name).unlink()
        return dest


# ------------------------------------------------------------------------------------------------ running


def base_env(cache: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VERL_DEBUG", None)
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TQDM_DISABLE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    if cache:
        env["VERL_HOME"] = cache  # the warm cache, also when a case moves HOME
    return env


def verl_command() -> list[str]:
    exe = shutil.which("verl")
    return [exe] if exe else [sys.executable, "-m", "verl.cli"]


def substitute(text: str, ctx: Ctx) -> str:
    fx = ctx.fixtures
    values = {
        "{tmp}": str(ctx.tmp),
        "{model}": fx.ensure_model() if "{model}" in text else fx.model,
        "{train}": fx.train,
        "{val}": fx.val,
        "{cache}": fx.cache,
        "{host}": fx.host,
        "{bg_pid}": str(ctx.bg_pid),
    }
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def as_cmd(cmd: Cmd | Sequence[str]) -> Cmd:
    return cmd if isinstance(cmd, Cmd) else Cmd(list(cmd))


def _argv(cmd: Cmd, ctx: Ctx) -> list[str]:
    argv = list(cmd.argv(ctx) if callable(cmd.argv) else cmd.argv)
    argv = [substitute(str(a), ctx) for a in argv]
    if argv and argv[0] == "verl":
        argv = ctx.fixtures.verl + argv[1:]
    return argv


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Runner:
    def __init__(self, fixtures: Fixtures, logdir: Path) -> None:
        self.fx = fixtures
        self.logdir = logdir

    def start(self, cmd: Cmd, ctx: Ctx, tag: str) -> tuple[subprocess.Popen, list[str], Path, Path]:
        argv = _argv(cmd, ctx)
        env = base_env(self.fx.cache)
        env.update({k: substitute(v, ctx) for k, v in cmd.env.items()})
        out, err = self.logdir / f"{tag}.out", self.logdir / f"{tag}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            proc = subprocess.Popen(
                argv,
                cwd=ctx.tmp,
                env=env,
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return proc, argv, out, err

    def run(self, cmd: Cmd, ctx: Ctx, tag: str, limit_s: float) -> CmdResult:
        proc, argv, out, err = self.start(cmd, ctx, tag)
        t0 = time.monotonic()
        pending = list(cmd.signals)
        seen: dict[int, float] = {}
        sent: list[str] = []
        timed_out = False
        while proc.poll() is None:
            now = time.monotonic() - t0
            if now > limit_s:
                timed_out = True
                _kill_group(proc)
                proc.wait()
                break
            for sig in list(pending):
                fire = sig.after_s is not None and now >= sig.after_s
                if sig.when is not None and not fire:
                    if id(sig) not in seen and any(ctx.tmp.glob(sig.when)):
                        seen[id(sig)] = now
                    fire = id(sig) in seen and now >= seen[id(sig)] + sig.delay_s
                if fire:
                    _kill_group(proc, sig.signum)
                    sent.append(f"{signal.Signals(sig.signum).name} at {now:.2f}s")
                    pending.remove(sig)
            time.sleep(0.004 if pending else 0.05)
        for sig in pending:
            sent.append(f"{signal.Signals(sig.signum).name} never sent (trigger not seen)")
        return CmdResult(
            argv=argv,
            rc=None if timed_out else proc.returncode,
            seconds=round(time.monotonic() - t0, 2),
            stdout=out.read_text(errors="replace"),
            stderr=err.read_text(errors="replace"),
            timed_out=timed_out,
            signals_sent=sent,
            pid=proc.pid,
        )

    def background(self, cmd: Cmd, ctx: Ctx, tag: str, limit_s: float) -> tuple[subprocess.Popen, str | None]:
        proc, _, _, err = self.start(cmd, ctx, tag)
        t0 = time.monotonic()
        while cmd.ready and not any(ctx.tmp.glob(cmd.ready)):
            if proc.poll() is not None:
                return proc, f"background command exited {proc.returncode} before {cmd.ready} appeared"
            if time.monotonic() - t0 > limit_s:
                return proc, f"{cmd.ready} did not appear within {limit_s:.0f}s"
            time.sleep(0.05)
        return proc, None


def _is_lock(path: Path) -> bool:
    return "lock" in path.name.lower()


def hash_paths(tmp: Path, paths: Sequence[str]) -> dict[str, str]:
    """sha256 of every file under ``paths`` (relative to ``tmp``), lock files excepted: a run directory's
    lock is verl's bookkeeping (who holds the directory), not the user's data."""
    out: dict[str, str] = {}
    for rel in paths:
        p = tmp / rel
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else []
        for f in files:
            if _is_lock(f) and f != p:
                continue
            out[str(f.relative_to(tmp))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def message_of(stderr: str) -> str:
    """The user-facing message: stderr from the first line that starts like an error message to the end,
    else its last non-empty line."""
    lines = [ln.strip() for ln in stderr.replace("\r", "\n").splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        low = line.lower()
        if low.startswith(ERROR_LABELS) or (low.startswith("verl ") and ": error:" in low):
            return "\n".join(lines[i:])
    return lines[-1] if lines else ""


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _missing_mentions(expect: Expect, message: str, ctx: Ctx) -> list[str]:
    low = message.lower()
    missing = []
    for m in expect.mentions:
        options = m if isinstance(m, tuple) else (m,)
        if not any(substitute(str(o), ctx).lower() in low for o in options):
            missing.append("|".join(substitute(str(o), ctx) for o in options))
    return missing


def classify(case: Case, ctx: Ctx, violations: dict[str, list[str]], notes: list[str]) -> tuple[str, str]:
    """(outcome, why) of a finished case."""
    res = ctx.result
    assert res is not None
    if violations["protect"]:
        return "data loss", "protected files changed or gone: " + ", ".join(violations["protect"][:6])
    timed = [r for r in [res, *ctx.after] if r.timed_out]
    if timed:
        return "hang", f"ran past {case.limit_s:.0f}s: " + " ".join(timed[0].argv[1:])[:200]
    graded = [res, *ctx.after]
    traced = any(TRACEBACK in r.output for r in graded)
    exp = case.expect
    if exp.kind == "error":
        if res.rc == 0:
            return "silent", "exit 0, an error was expected"
        if TRACEBACK in res.output:
            return "traceback", f"exit {res.rc} with a traceback"
        if violations["no_create"]:
            return "silent", "made up: " + ", ".join(violations["no_create"])
        if res.rc not in exp.codes:
            return "unclear error", f"exit {res.rc}, expected {'/'.join(map(str, exp.codes))}"
        missing = _missing_mentions(exp, message_of(res.stderr), ctx)
        if missing:
            return "unclear error", "message does not name: " + ", ".join(missing)
        if traced:
            return "traceback", "a later command printed a traceback"
        if exp.check:
            why = exp.check(ctx)
            if why:
                return ("security", why[len(SECURITY) :]) if why.startswith(SECURITY) else ("silent", why)
        return "clear error", f"exit {res.rc} as expected"
    if traced:
        return "traceback", f"exit {res.rc} with a traceback"
    if res.rc != 0:
        why = exp.check(ctx) if exp.check else None  # e.g. the process was killed by the code it ran
        if why and why.startswith(SECURITY):
            return "security", why[len(SECURITY) :]
        return "unclear error", f"exit {res.rc}, success expected"
    if violations["no_create"]:
        return "silent", "made up: " + ", ".join(violations["no_create"])
    if exp.check:
        why = exp.check(ctx)
        if why:
            return ("security", why[len(SECURITY) :]) if why.startswith(SECURITY) else ("silent", why)
    return "handled", "succeeded" + (" and the check passed" if exp.check else "")


def run_case(case: Case, fx: Fixtures, workdir: Path, keep: bool) -> dict[str, Any]:
    tmp = workdir / case.id
    logdir = workdir / "_logs" / case.id
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        return _run_case(case, fx, tmp, logdir)
    finally:
        if case.teardown:
            case.teardown(tmp)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(logdir, ignore_errors=True)


def _run_case(case: Case, fx: Fixtures, tmp: Path, logdir: Path) -> dict[str, Any]:
    runner = Runner(fx, logdir)
    ctx = Ctx(tmp=tmp, fixtures=fx)
    notes: list[str] = []
    background: list[subprocess.Popen] = []
    t0 = time.monotonic()
    try:
        if case.setup:
            case.setup(tmp, fx)
        for i, c in enumerate(case.prior):
            c = as_cmd(c)
            if c.background:
                proc, problem = runner.background(c, ctx, f"prior{i}", case.limit_s)
                background.append(proc)
                ctx.bg_pid = proc.pid
                if problem:
                    notes.append(problem)
            else:
                r = runner.run(c, ctx, f"prior{i}", case.limit_s)
                ctx.prior.append(r)
                if r.rc not in (0, 130) or r.timed_out:
                    notes.append(f"prior command {i} exited {r.rc}{' (timed out)' if r.timed_out else ''}")
        before = hash_paths(tmp, case.protect)
        ctx.before = {**before, **hash_paths(tmp, case.snapshot)}
        for rel in case.protect:
            if not (tmp / rel).exists():
                notes.append(f"protected path {rel} did not exist before the graded command")
        ctx.result = runner.run(as_cmd(case.cmd), ctx, "graded", case.limit_s)
        for i, c in enumerate(case.after):
            ctx.after.append(runner.run(as_cmd(c), ctx, f"after{i}", case.limit_s))
    finally:
        for proc in background:
            _kill_group(proc)
            proc.wait()
    after = hash_paths(tmp, case.protect)
    violations = {
        "protect": [p for p, h in before.items() if after.get(p) != h],
        "no_create": [p for p in case.no_create if (tmp / p).exists() or (tmp / p).is_symlink()],
    }
    outcome, why = classify(case, ctx, violations, notes)
    res = ctx.result
    return {
        "id": case.id,
        "group": case.group,
        "what": case.what,
        "expected": case.expect.describe(),
        "outcome": outcome,
        "why": why,
        "exit": res.rc,
        "message": message_of(res.stderr)[-600:],
        "last_stderr_line": last_line(res.stderr),
        "seconds": round(time.monotonic() - t0, 1),
        "notes": notes + [s for r in [res, *ctx.after] for s in r.signals_sent],
        "commands": [
            {
                "role": role,
                "argv": r.argv,
                "exit": r.rc,
                "seconds": r.seconds,
                "timed_out": r.timed_out,
                "stderr_tail": r.stderr[-1500:],
                "stdout_tail": r.stdout[-600:],
            }
            for role, rs in (("prior", ctx.prior), ("graded", [res]), ("after", ctx.after))
            for r in rs
        ],
        "violations": violations,
    }


def run_case_safely(case: Case, fx: Fixtures, workdir: Path, keep: bool) -> dict[str, Any]:
    """A broken case (its setup raised) is reported as such rather than ending the round."""
    try:
        return run_case(case, fx, workdir, keep)
    except Exception as exc:  # noqa: BLE001
        return {
            "id": case.id,
            "group": case.group,
            "what": case.what,
            "expected": case.expect.describe(),
            "outcome": "unclear error",
            "why": f"the harness failed on this case: {type(exc).__name__}: {exc}",
            "exit": None,
            "message": "",
            "last_stderr_line": "",
            "seconds": 0.0,
            "notes": ["harness error"],
            "commands": [],
            "violations": {},
        }


# ------------------------------------------------------------------------------------------------ reports


def summary_counts(results: list[dict[str, Any]]) -> Counter:
    return Counter(r["outcome"] for r in results)


def _cell(text: Any, width: int | None = None) -> str:
    s = " ".join(str(text).split())
    if width and len(s) > width:
        s = s[: width - 1] + "…"
    return s.replace("|", "\\|")


def markdown(
    results: list[dict[str, Any]], meta: dict[str, Any], before: dict[str, Any] | None = None
) -> str:
    """The report; with ``before`` (another round's JSON, e.g. on the tree before the fixes) a column of its
    outcomes next to this round's."""
    counts = summary_counts(results)
    then = {r["id"]: r["outcome"] for r in before["results"]} if before else {}
    then_counts = summary_counts(before["results"]) if before else Counter()
    lines = [
        "# Hostile-user round",
        "",
        f"`python benchmarks/misuse_round.py` ({len(results)} misuses of `verl` run as subprocesses; "
        "see benchmarks/README.md). "
        f"Tree: `{meta.get('commit', '?')}`{' + uncommitted changes' if meta.get('dirty') else ''}, "
        f"{meta.get('date', '')}, {meta.get('wall_s', 0):.0f} s at --jobs {meta.get('jobs', '?')}.",
    ]
    if before:
        bm = before["meta"]
        lines += [
            "",
            f"*before*: the same cases on `{bm.get('commit', '?')}` ({bm.get('date', '')}, "
            f"{bm.get('note', 'the tree before the fixes')}).",
        ]
    lines += [
        "",
        "| outcome | cases |" + (" before |" if before else ""),
        "|---|---|" + ("---|" if before else ""),
    ]
    lines += [
        f"| {o} | {counts.get(o, 0)} |" + (f" {then_counts.get(o, 0)} |" if before else "") for o in OUTCOMES
    ]
    lines += ["", "| group | " + " | ".join(OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 1) + "|"]
    for g in GROUPS:
        rows = [r for r in results if r["group"] == g]
        if rows:
            c = summary_counts(rows)
            lines.append(f"| {g} | " + " | ".join(str(c.get(o, 0) or "") for o in OUTCOMES) + " |")
    head = "| id | group | what was done | expected | outcome | last stderr line |"
    lines += [
        "",
        head + (" before |" if before else ""),
        "|---|---|---|---|---|---|" + ("---|" if before else ""),
    ]
    for r in results:
        outcome = r["outcome"] if r["outcome"] in ("clear error", "handled") else f"**{r['outcome']}**"
        if r["outcome"] not in ("clear error", "handled"):
            outcome += f" ({_cell(r['why'], 90)})"
        row = (
            f"| {r['id']} | {r['group']} | {_cell(r['what'])} | {_cell(r['expected'])} | {outcome} | "
            f"{_cell(r['last_stderr_line'], 120)} |"
        )
        if before:
            was = then.get(r["id"], "")
            row += f" {was if was in ('clear error', 'handled', '') else f'**{was}**'} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def git_meta() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout
        except Exception:  # noqa: BLE001
            return ""

    return {
        "commit": git("rev-parse", "--short", "HEAD").strip(),
        "dirty": bool(git("status", "--porcelain").strip()),
    }


# ------------------------------------------------------------------------------------------------ main


def load_cases() -> list[Case]:
    from benchmarks.misuse_cases import all_cases

    cases = all_cases()
    seen: set[str] = set()
    for c in cases:
        if c.id in seen:
            raise SystemExit(f"duplicate case id {c.id}")
        if c.group not in GROUPS:
            raise SystemExit(f"case {c.id}: unknown group {c.group}")
        seen.add(c.id)
    return cases


def select(cases: list[Case], only: str | None) -> list[Case]:
    if not only:
        return cases
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    return [c for c in cases if any(c.group == p or fnmatch.fnmatchcase(c.id, p) for p in patterns)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--only", default=None, help="comma list of case ids, groups or id globs")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--json", default=None, help=f"results file (full round default: {DEFAULT_JSON})")
    parser.add_argument("--md", default=None, help=f"markdown table (full round default: {DEFAULT_MD})")
    parser.add_argument("--workdir", default=None, help="where the case directories go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep every case directory and log")
    parser.add_argument(
        "--before",
        default=None,
        help=f"another round's JSON to compare with in the table (full round default: {DEFAULT_BEFORE}, if there)",
    )
    parser.add_argument(
        "--render",
        default=None,
        metavar="JSON",
        help="write --md from an earlier round's JSON, without running",
    )
    args = parser.parse_args(argv)
    before_path = args.before or (None if args.only or not DEFAULT_BEFORE.is_file() else str(DEFAULT_BEFORE))
    before = json.loads(Path(before_path).read_text()) if before_path else None
    if args.render:
        done = json.loads(Path(args.render).read_text())
        md = args.md or str(DEFAULT_MD)
        Path(md).write_text(markdown(done["results"], done["meta"], before))
        print(f"table: {md}")
        return 0

    cases = select(load_cases(), args.only)
    if args.list:
        for c in cases:
            print(f"{c.id:40s} {c.group:14s} {c.what}")
        print(
            f"{len(cases)} cases: "
            + ", ".join(f"{g} {n}" for g, n in Counter(c.group for c in cases).items())
        )
        return 0
    if not cases:
        print(f"no case matches --only {args.only}", file=sys.stderr)
        return 2
    json_path = args.json or (None if args.only else str(DEFAULT_JSON))
    md_path = args.md or (None if args.only else str(DEFAULT_MD))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="verl-misuse-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"{len(cases)} cases, {args.jobs} at a time; case directories under {workdir}", flush=True)
    t0 = time.monotonic()
    fx = Fixtures(workdir, verl_command())
    order = {c.id: i for i, c in enumerate(cases)}
    results: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run_case_safely, c, fx, workdir, args.keep): c for c in cases}
        for n, fut in enumerate(as_completed(futures), start=1):
            r = fut.result()
            results.append(r)
            print(
                f"[{n:3d}/{len(cases)}] {r['id']:40s} {r['outcome']:13s} {r['seconds']:6.1f}s  "
                f"{_cell(r['why'], 70)}",
                flush=True,
            )
    results.sort(key=lambda r: order[r["id"]])
    wall = time.monotonic() - t0
    meta = {
        **git_meta(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "wall_s": round(wall, 1),
        "jobs": args.jobs,
        "cases": len(results),
        "selection": args.only,
    }
    counts = summary_counts(results)
    print(f"\n{len(results)} cases in {wall:.0f}s")
    for o in OUTCOMES:
        print(f"  {o:14s} {counts.get(o, 0)}")
    bad = [r for r in results if r["outcome"] in BAD_OUTCOMES]
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(
            json.dumps({"meta": meta, "summary": dict(counts), "results": results}, indent=1) + "\n"
        )
        print(f"results: {json_path}")
    if md_path:
        Path(md_path).parent.mkdir(parents=True, exist_ok=True)
        Path(md_path).write_text(markdown(results, meta, before))
        print(f"table: {md_path}")
    if not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.misuse_round import main as _main

    sys.exit(_main())
