"""The outputs group of the hostile-user round (``benchmarks/misuse_round.py``): outputs that cannot be written (report, export) and report inputs that would draw wrongly.

Unwritable outputs (a ``chattr +i`` directory, a read-only bind mount made in a user namespace with
``unshare -rm``, ``/sys``, ``/proc``, a path through a file, a full 4 KB tmpfs) must be one line with exit 3
(the path given cannot be written; 5 when the file system is full), naming the path, and leave the place as it
was. A ``metrics.jsonl`` with booleans, text, nan, a 1.7e308, steps of 1e18, negative, fractional, repeated or
out of order must give a page whose figures leave those out (read from the inline SVGs' axis labels) and say so.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.misuse_cases import write
from benchmarks.misuse_round import RUN_DIR, Case, Cmd, Ctx, Fixtures, error, ok

RD = RUN_DIR  # ckpt_dir: the checkpoint fixture, for the export cases
RUN = "run"  # a hand-written run directory (metrics.jsonl only), for the report cases
STEPS = 30
LOCKED = "locked"
RO = "ro"
FULL = "full"

# ------------------------------------------------------------------------------------------------ setups


def _metrics(extra: Sequence[dict[str, Any]] = (), raw: str = "", score: Callable[[int], Any] | None = None):
    """A run directory ``run/`` whose metrics.jsonl holds 30 ordinary steps (a score of step/1000, so a value
    drawn at 1.0 shows in the axis labels), then ``extra`` lines and the ``raw`` text."""

    def setup(tmp: Path, fx: Fixtures) -> None:
        lines = [
            {
                "step": s,
                "critic/score/mean": (score or (lambda s: s / 1000))(s),
                "actor/entropy": 2.0 - s / 100,
            }
            for s in range(1, STEPS + 1)
        ]
        lines += list(extra)
        write(tmp / RUN / "metrics.jsonl", "".join(json.dumps(line) + "\n" for line in lines) + raw)

    return setup


def _lock(rel: str) -> None:
    """Make ``rel`` unwritable even for root: ``chattr +i`` where the file system has it, else mode 0555."""
    if subprocess.run(["chattr", "+i", rel], capture_output=True).returncode != 0:
        Path(rel).chmod(0o555)


def _locked(*files: tuple[str, str], base: Callable[[Path, Fixtures], None] | None = None):
    def setup(tmp: Path, fx: Fixtures) -> None:
        if base:
            base(tmp, fx)
        (tmp / LOCKED).mkdir(exist_ok=True)
        for rel, content in files:
            write(tmp / LOCKED / rel, content)
        _lock(str(tmp / LOCKED))

    return setup


def _unlock(rel: str):
    def teardown(tmp: Path) -> None:
        if (tmp / rel).exists():
            subprocess.run(["chattr", "-i", str(tmp / rel)], capture_output=True)
            (tmp / rel).chmod(0o755)

    return teardown


def _with_dirs(*rels: str, base: Callable[[Path, Fixtures], None] | None = None):
    def setup(tmp: Path, fx: Fixtures) -> None:
        if base:
            base(tmp, fx)
        for rel in rels:
            (tmp / rel).mkdir(parents=True, exist_ok=True)

    return setup


def _with_files(*files: tuple[str, str], base: Callable[[Path, Fixtures], None]):
    def setup(tmp: Path, fx: Fixtures) -> None:
        base(tmp, fx)
        for rel, content in files:
            write(tmp / rel, content)

    return setup


def _locked_run(tmp: Path, fx: Fixtures) -> None:
    """``run/`` with its metrics, then made immutable: the report's default output is in it."""
    _metrics()(tmp, fx)
    _lock(str(tmp / RUN))


def _copy_run(tmp: Path, fx: Fixtures) -> None:
    fx.copy_run(tmp / RD)


# ------------------------------------------------------------------------------------------------ commands


def _in_readonly_mount(*args: str) -> Cmd:
    """``verl ARGS`` where ``ro/`` is a read-only bind mount of itself (a private mount namespace of an
    unprivileged user namespace: nothing outside the command sees it)."""
    script = f'mount --bind {RO} {RO} && mount -o remount,bind,ro {RO} && exec "$@"'
    return Cmd(lambda ctx: ["unshare", "-rm", "sh", "-c", script, "sh", *ctx.fixtures.verl, *args])


def _on_full_disk(*args: str) -> Cmd:
    """``verl ARGS`` where ``full/`` is a 4 KB tmpfs already filled by one file."""
    script = (
        f"mount -t tmpfs -o size=4k tmpfs {FULL} && head -c 4096 /dev/zero > {FULL}/filler; "
        f'"$@"; code=$?; ls -A {FULL}; exit $code'
    )
    return Cmd(lambda ctx: ["unshare", "-rm", "sh", "-c", script, "sh", *ctx.fixtures.verl, *args])


# ------------------------------------------------------------------------------------------------ checks


def _left_empty(rel: str, keep: Sequence[str] = ()):
    """The directory ``rel`` holds nothing but ``keep`` (no temporary file, no half-written model)."""

    def check(ctx: Ctx) -> str | None:
        found = sorted(p.name for p in (ctx.tmp / rel).iterdir())
        return None if found == sorted(keep) else f"{rel}/ holds {found}, expected {sorted(keep)}"

    return check


def _only_filler(ctx: Ctx) -> str | None:
    """The tmpfs's listing (printed last by :func:`_on_full_disk`) is the filler alone."""
    lines = [ln.strip() for ln in ctx.result.stdout.splitlines() if ln.strip()]
    return None if lines[-1:] == ["filler"] else f"the full disk was left holding {lines[-3:]}"


def _figures(ctx: Ctx) -> list[str]:
    page = (ctx.tmp / RUN / "report.html").read_text(errors="replace")
    return re.findall(r"<svg.*?</svg>", page, re.S)


def _axis_labels(svg: str, axis: int) -> list[str]:
    """The text of axis ``axis`` (1: x, 2: y) of one inline SVG: its tick labels and offset ("1e18")."""
    start = svg.find(f'id="matplotlib.axis_{axis}"')
    if start < 0:
        return []
    end = svg.find(f'id="matplotlib.axis_{axis + 1}"', start)
    part = svg[start : end if end > 0 else len(svg)]
    return [t.replace("\u2212", "-") for t in re.findall(r"<text[^>]*>([^<]*)</text>", part)]


def _numbers(labels: list[str]) -> list[float]:
    out = []
    for label in labels:
        if not any(c.isdigit() for c in label):
            continue  # the axis's title ("step")
        try:
            out.append(float(label))
        except ValueError:
            out.append(float("inf"))  # an offset such as "1e18" or "×10^18" is not a plain tick
    return out


def _x_within(low: float, high: float, *said: str):
    """Every figure's x axis runs within ``low..high`` (a step of 1e18 would stretch it), and the page says
    each of ``said``."""

    def check(ctx: Ctx) -> str | None:
        figures = _figures(ctx)
        if not figures:
            return "the page has no figure"
        for svg in figures:
            ticks = _numbers(_axis_labels(svg, 1))
            if ticks and not all(low <= t <= high for t in ticks):
                return f"an x axis runs to {_axis_labels(svg, 1)}"
        return _says(*said)(ctx)

    return check


def _score_axis_below(limit: float, *said: str):
    """The score figure's y axis stays below ``limit`` (scores are 0.001..0.03: a true drawn as 1.0, or a
    1.7e308, would stretch it), and the page says each of ``said``."""

    def check(ctx: Ctx) -> str | None:
        figures = [svg for svg in _figures(ctx) if ">Score and reward<" in svg]
        if not figures:
            return "no score figure on the page"
        ticks = _numbers(_axis_labels(figures[0], 2))
        if not ticks or max(ticks) >= limit:
            return f"the score axis runs to {_axis_labels(figures[0], 2)}"
        return _says(*said)(ctx)

    return check


def _says(*said: str):
    def check(ctx: Ctx) -> str | None:
        page = (ctx.tmp / RUN / "report.html").read_text(errors="replace")
        missing = [s for s in said if s not in page]
        return f"the page does not say {missing}" if missing else None

    return check


# ------------------------------------------------------------------------------------------------ cases


def _out(id: str, what: str, cmd: Any, expect: Any, setup: Any, **kw: Any) -> Case:
    return Case(f"out-{id}", "outputs", what, cmd, expect, setup=setup, limit_s=kw.pop("limit_s", 90), **kw)


def _report_cases() -> list[Case]:
    report = ["verl", "report", RUN]
    return [
        _out(
            "report-immutable-dir",
            "verl report -o into an immutable (chattr +i) directory, and into a missing directory inside it",
            Cmd([*report, "-o", f"{LOCKED}/sub/report.html"]),
            error(3, [f"{LOCKED}/sub/report.html", "not permitted"], check=_left_empty(LOCKED)),
            _locked(base=_metrics()),
            teardown=_unlock(LOCKED),
        ),
        _out(
            "report-immutable-run-dir",
            "verl report RUN_DIR whose run directory is immutable (the default output is in it)",
            Cmd(report),
            error(3, [f"{RUN}/report.html"], check=_left_empty(RUN, ["metrics.jsonl"])),
            _locked_run,
            protect=[RUN],
            teardown=_unlock(RUN),
        ),
        _out(
            "report-readonly-mount",
            "verl report -o into a read-only bind mount (unshare -rm; mount -o remount,bind,ro)",
            _in_readonly_mount("report", RUN, "-o", f"{RO}/report.html"),
            error(3, [f"{RO}/report.html", "Read-only file system"], check=_left_empty(RO)),
            _with_dirs(RO, base=_metrics()),
        ),
        _out(
            "report-under-sys",
            "verl report -o /sys/verl-misuse/report.html",
            Cmd([*report, "-o", "/sys/verl-misuse/report.html"]),
            error(3, ["/sys/verl-misuse/report.html"]),
            _metrics(),
        ),
        _out(
            "report-under-proc",
            "verl report -o /proc/report.html",
            Cmd([*report, "-o", "/proc/report.html"]),
            error(3, ["/proc/report.html"]),
            _metrics(),
        ),
        _out(
            "report-onto-a-directory",
            "verl report -o an existing directory holding notes.txt",
            Cmd([*report, "-o", "notes"]),
            error(3, ["notes", "directory"]),
            _with_files(("notes/notes.txt", "mine\n"), base=_metrics()),
            protect=["notes"],
        ),
        _out(
            "report-through-a-file",
            "verl report -o run/metrics.jsonl/report.html (a path through a file)",
            Cmd([*report, "-o", f"{RUN}/metrics.jsonl/report.html"]),
            error(3, [f"{RUN}/metrics.jsonl", "not a directory"]),
            _metrics(),
            protect=[f"{RUN}/metrics.jsonl"],
        ),
        _out(
            "report-full-disk",
            "verl report -o onto a full file system (a 4 KB tmpfs, filled)",
            _on_full_disk("report", RUN, "-o", f"{FULL}/sub/report.html"),
            error(5, [f"{FULL}/sub/report.html", "No space left"], check=_only_filler),
            _with_dirs(FULL, base=_metrics()),
        ),
    ]


def _export_cases() -> list[Case]:
    export = ["verl", "export", RD]
    return [
        _out(
            "export-immutable-dir",
            "verl export into a new directory inside an immutable (chattr +i) directory",
            Cmd([*export, f"{LOCKED}/a/out"]),
            error(3, [f"{LOCKED}/a/out", "not permitted"], check=_left_empty(LOCKED)),
            _locked(base=_copy_run),
            teardown=_unlock(LOCKED),
        ),
        _out(
            "export-overwrite-immutable-dir",
            "verl export --overwrite into an immutable directory holding notes.txt",
            Cmd([*export, LOCKED, "--overwrite"]),
            error(3, [LOCKED, "not permitted"], check=_left_empty(LOCKED, ["notes.txt"])),
            _locked(("notes.txt", "mine\n"), base=_copy_run),
            protect=[LOCKED],
            teardown=_unlock(LOCKED),
        ),
        _out(
            "export-readonly-mount",
            "verl export into a new directory of a read-only bind mount",
            _in_readonly_mount("export", RD, f"{RO}/a/out"),
            error(3, [f"{RO}/a/out", "Read-only file system"], check=_left_empty(RO)),
            _with_dirs(RO, base=_copy_run),
        ),
        _out(
            "export-under-sys",
            "verl export into /sys/verl-misuse/out",
            Cmd([*export, "/sys/verl-misuse/out"]),
            error(3, ["/sys/verl-misuse/out"]),
            _copy_run,
        ),
        _out(
            "export-under-proc",
            "verl export into /proc/out",
            Cmd([*export, "/proc/out"]),
            error(3, ["/proc/out"]),
            _copy_run,
        ),
        _out(
            "export-through-a-file",
            "verl export into notes.txt/out (a path through a file)",
            Cmd([*export, "notes.txt/out"]),
            error(3, ["notes.txt", "not a directory"]),
            _with_files(("notes.txt", "mine\n"), base=_copy_run),
            protect=["notes.txt"],
        ),
        _out(
            "export-full-disk",
            "verl export onto a full file system (a 4 KB tmpfs, filled)",
            _on_full_disk("export", RD, f"{FULL}/out"),
            error(5, [f"{FULL}/out", "No space left"], check=_only_filler),
            _with_dirs(FULL, base=_copy_run),
        ),
    ]


def _metrics_cases() -> list[Case]:
    report = Cmd(["verl", "report", RUN])
    return [
        _out(
            "metrics-booleans",
            "metrics.jsonl whose score is true/false at some steps",
            report,
            ok(_score_axis_below(0.1, "true/false (booleans are not numbers)")),
            _metrics(score=lambda s: s % 10 == 0 if s % 5 == 0 else s / 1000),
        ),
        _out(
            "metrics-strings",
            'metrics.jsonl whose score is text ("high", "0.9") at some steps',
            report,
            ok(_score_axis_below(0.1, "text, null or another non-number")),
            _metrics(score=lambda s: ("high" if s % 2 else "0.9") if s % 5 == 0 else s / 1000),
        ),
        _out(
            "metrics-step-1e18",
            "metrics.jsonl with one line at step 1e18",
            report,
            ok(_x_within(-5, 2 * STEPS, "more steps than any run takes, not drawn: 1e+18")),
            _metrics([{"step": 1e18, "critic/score/mean": 0.9}]),
        ),
        _out(
            "metrics-far-step",
            "metrics.jsonl with one line at step 5000 after steps 1..30 (total_training_steps unknown)",
            report,
            ok(_x_within(-5, 2 * STEPS, "far beyond the run&#x27;s other steps")),
            _metrics([{"step": 5000, "critic/score/mean": 0.9}]),
        ),
        _out(
            "metrics-negative-fractional-steps",
            'metrics.jsonl with lines at steps -5, 2.5, "7" and none',
            report,
            ok(_x_within(0, 2 * STEPS, "is negative, not drawn: -5", "not a whole number, not drawn: 2.5")),
            _metrics(
                [
                    {"step": -5, "critic/score/mean": 0.9},
                    {"step": 2.5, "critic/score/mean": 0.9},
                    {"step": "7", "critic/score/mean": 0.9},
                    {"critic/score/mean": 0.9},
                ]
            ),
        ),
        _out(
            "metrics-repeated-out-of-order",
            "metrics.jsonl with steps 12, 3 and 7 logged again at the end (the later values win)",
            report,
            ok(_x_within(-5, 2 * STEPS, "logged twice")),
            _metrics([{"step": s, "critic/score/mean": 0.02} for s in (12, 3, 7)]),
        ),
        _out(
            "metrics-nan-inf",
            'metrics.jsonl with NaN, Infinity (JSON literals) and "nan" strings',
            report,
            ok(_score_axis_below(0.1, "non-finite value")),
            _metrics(
                [{"step": 31, "critic/score/mean": "nan"}],
                '{"step": 32, "critic/score/mean": NaN}\n{"step": 33, "critic/score/mean": Infinity}\n',
            ),
        ),
        _out(
            "metrics-huge-values",
            "metrics.jsonl with a score of 1.7e308 and of a 400-digit integer",
            report,
            ok(_score_axis_below(0.1, "beyond float32")),
            _metrics(
                [{"step": 31, "critic/score/mean": 1.7e308}],
                '{"step": 32, "critic/score/mean": ' + "9" * 400 + "}\n",
            ),
        ),
        _out(
            "metrics-unparsable-lines",
            "metrics.jsonl with a 5,000-digit number and 100,000 nested brackets",
            report,
            ok(_says("2 of metrics.jsonl skipped")),
            _metrics((), '{"step": 31, "critic/score/mean": ' + "9" * 5000 + "}\n" + "[" * 100_000 + "\n"),
        ),
    ]


def output_cases() -> list[Case]:
    return [*_report_cases(), *_export_cases(), *_metrics_cases()]
