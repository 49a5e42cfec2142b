"""Issue 42: `verl report` and `verl export` facing outputs that cannot be written, and a ``metrics.jsonl``
that would draw wrongly.

* An output the OS refuses (a read-only or immutable directory, ``/sys``, ``/proc``, a path through a file, a
  full disk) is one line with an exit code (3: the path given; 5: a failing file system), naming the path and
  the OS's reason, and leaves nothing behind: no temporary file, no directory made on the way.
* A value that is not a measurement (``true``, text, a number beyond float32) is not drawn, nor a line whose
  step is not a plausible step number (``1e18``, negative, ``2.5``); the page says what it left out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._html import PageChecker
from verl.cli import main
from verl.report import build_report, load_run, read_metrics
from verl.report import plots as report_plots

STEPS = 30
HOSTILE_STEP = 1e18


def _write_metrics(run: Path, extra: list[dict] | None = None, text: str = "") -> Path:
    """``run/metrics.jsonl``: 30 ordinary steps of a score and an entropy, then ``extra`` lines and ``text``."""
    run.mkdir(parents=True, exist_ok=True)
    lines = [
        {"step": s, "critic/score/mean": s / 100, "actor/entropy": 2.0 - s / 100} for s in range(1, STEPS + 1)
    ]
    lines += extra or []
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + text)
    return run


@pytest.fixture
def x_ranges(monkeypatch) -> list[tuple[float, float]]:
    """The x axis range of every figure the report draws, read from the matplotlib axes as they are saved."""
    ranges: list[tuple[float, float]] = []
    to_svg = report_plots.to_svg

    def recording(fig, salt):
        ranges.extend(ax.get_xlim() for ax in fig.axes)
        return to_svg(fig, salt)

    monkeypatch.setattr(report_plots, "to_svg", recording)
    return ranges


# ------------------------------------------------------------------------------------------------
# values and steps that would draw wrongly


def test_booleans_and_text_are_not_drawn_and_the_page_says_so(tmp_path):
    run = _write_metrics(
        tmp_path / "run",
        [
            {"step": 31, "critic/score/mean": True},
            {"step": 32, "critic/score/mean": False, "actor/entropy": "1.5"},
            {"step": 33, "critic/score/mean": 0.33, "flag": True},
        ],
    )
    log = read_metrics(run / "metrics.jsonl")
    score = dict(log.series["critic/score/mean"].items())
    assert 31 not in score and 32 not in score and score[33] == 0.33  # true was drawn as 1.0
    assert 32 not in dict(log.series["actor/entropy"].items())  # "1.5" is text, not a number
    assert log.series["critic/score/mean"].skipped == 2 and "flag" in log.text_keys
    assert log.skipped_values["true/false (booleans are not numbers)"] == 3
    page = build_report(run).read_text()
    checker = PageChecker()
    checker.feed(page)
    checker.close()
    assert checker.problems == [] and checker.stack == []  # the note is well-formed HTML
    assert 'id="data-problems"' in page and "3 values were true/false (booleans are not numbers)" in page
    assert "2 values that are not a measurement" in page  # under the score figure


def test_a_step_of_1e18_does_not_squash_the_x_axis(tmp_path, x_ranges):
    run = _write_metrics(tmp_path / "run", [{"step": HOSTILE_STEP, "critic/score/mean": 0.9}])
    log = load_run(run).metrics
    assert log.steps[-1] == STEPS and log.series["critic/score/mean"].steps[-1] == STEPS
    page = build_report(run).read_text()
    assert x_ranges and max(hi for _, hi in x_ranges) < 2 * STEPS, x_ranges  # was about 1e18
    assert "whose step is beyond 1e+09, more steps than any run takes, not drawn: 1e+18" in page


def test_steps_far_beyond_the_others_negative_or_fractional_are_left_out(tmp_path, x_ranges):
    extra = [
        {"step": 5000, "critic/score/mean": 0.9},  # far beyond steps 1..30 (median 16)
        {"step": -3, "critic/score/mean": 0.9},
        {"step": 2.5, "critic/score/mean": 0.9},
        {"step": "7", "critic/score/mean": 0.9},
        {"step": True, "critic/score/mean": 0.9},
        {"critic/score/mean": 0.9},
        {"step": 4, "critic/score/mean": 0.444},  # repeated and out of order: the later line wins
    ]
    run = _write_metrics(tmp_path / "run", extra)
    log = read_metrics(run / "metrics.jsonl")
    assert log.steps == list(range(1, STEPS + 1)) and log.repeated_steps == [4]
    assert dict(log.series["critic/score/mean"].items())[4] == 0.444
    assert list(log.dropped_steps.values()) == [[-3], [2.5], ["7", True], [None], [5000]]
    page = build_report(run).read_text()
    assert max(hi for _, hi in x_ranges) < 2 * STEPS
    for said in ("is negative, not drawn: -3", "not a whole number, not drawn: 2.5", "is missing, not drawn"):
        assert said in page
    assert "far beyond the run&#x27;s other steps (above 260), not drawn: 5000" in page


def test_the_runs_total_steps_make_a_late_step_plausible(tmp_path):
    run = _write_metrics(tmp_path / "run", [{"step": 5000, "critic/score/mean": 0.9}])
    (run / "config.yaml").write_text("trainer:\n  total_training_steps: 5000\n")
    assert load_run(run).metrics.steps[-1] == 5000 and not load_run(run).metrics.problems()


def test_huge_and_unparsable_numbers_neither_crash_nor_draw(tmp_path):
    """1.7e308 made matplotlib fail ("arange: cannot compute length"); a 400-digit integer overflowed float();
    a 5,000-digit one and a 100,000-deep nesting failed json.loads with other errors than JSONDecodeError."""
    extra = [
        {"step": 31, "critic/score/mean": 1.7e308},
        {"step": 32, "critic/score/mean": 10**400, "actor/entropy": float("nan")},
        {"step": 10**400, "critic/score/mean": 0.5},
    ]
    text = '{"step": 33, "critic/score/mean": ' + "9" * 5000 + "}\n" + "[" * 100_000 + "\n"
    run = _write_metrics(tmp_path / "run", extra, text)
    log = read_metrics(run / "metrics.jsonl")
    assert max(log.series["critic/score/mean"].values) < 1
    assert log.series["actor/entropy"].non_finite == 1 and log.skipped_lines == 2
    page = build_report(run).read_text()
    assert "2 values were beyond float32&#x27;s range" in page and "1 non-finite value (nan/inf)" in page


def test_an_ordinary_run_has_no_data_problems(tmp_path):
    run = _write_metrics(tmp_path / "run", [], '{"step": 31, "critic/sc')  # a running run's half line
    assert 'id="data-problems"' not in build_report(run).read_text()


# ------------------------------------------------------------------------------------------------
# outputs that cannot be written


def _one_line_error(capsys, code: int, rc: int, *names: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "INFO" not in line]
    assert rc == code, err
    assert "Traceback" not in err and len(lines) == 1, err
    assert all(name in lines[0] for name in names), lines[0]
    return lines[0]


def _immutable(path: Path) -> bool:
    """Make ``path`` read-only even for root: chattr +i where the file system has it, else mode 0555 (which
    only binds a user that is not root)."""
    if (
        shutil.which("chattr")
        and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    ):
        return True
    path.chmod(0o555)
    return os.geteuid() != 0


def _mutable(path: Path) -> None:
    if shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    path.chmod(0o755)


def _unshare_ro(target: Path, command: list[str]) -> subprocess.CompletedProcess | None:
    """Run ``command`` where ``target`` is a read-only bind mount of itself (a user namespace); None where
    unshare cannot."""
    script = f'mount --bind "{target}" "{target}" && mount -o remount,bind,ro "{target}" && exec "$@"'
    argv = ["unshare", "-rm", "sh", "-c", script, "sh", *command]
    if (
        not shutil.which("unshare")
        or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode
    ):
        return None
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.fixture
def tiny_run(tmp_path: Path) -> Path:
    return _write_metrics(tmp_path / "run")


@pytest.mark.parametrize(
    "where",
    ["/sys/verl-report/report.html", "/sys/report.html", "/proc/report.html", "{run}/metrics.jsonl/r.html"],
    ids=["under-sys", "in-sys", "in-proc", "through-a-file"],
)
def test_report_into_a_place_that_cannot_be_written_is_one_line(tiny_run, capsys, where):
    out = where.format(run=tiny_run)
    before = sorted(p.name for p in tiny_run.iterdir())
    rc = main(["report", str(tiny_run), "-o", out])
    line = _one_line_error(capsys, 3, rc, "report error: cannot write", out)
    if "metrics.jsonl" in out:
        assert "metrics.jsonl is a file, not a directory" in line
    assert sorted(p.name for p in tiny_run.iterdir()) == before  # no temporary file


def test_report_into_an_immutable_directory_leaves_nothing(tiny_run, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    if not _immutable(locked):
        _mutable(locked)
        pytest.skip("neither chattr +i nor a mode binds this user")
    try:
        for out in (locked / "report.html", locked / "a" / "b" / "report.html"):
            rc = main(["report", str(tiny_run), "-o", str(out)])
            _one_line_error(capsys, 3, rc, f"cannot write {out}")
        assert list(locked.iterdir()) == []
    finally:
        _mutable(locked)


def test_report_into_a_missing_directory_of_a_readonly_mount_is_one_line(tiny_run, tmp_path):
    mount = tmp_path / "mount"
    mount.mkdir()
    out = mount / "new" / "report.html"
    proc = _unshare_ro(mount, [sys.executable, "-m", "verl.cli", "report", str(tiny_run), "-o", str(out)])
    if proc is None:
        pytest.skip("no unshare -rm here")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot write {out}: Read-only file system" in proc.stderr
    assert list(mount.iterdir()) == []


def _in_own_mount_namespace(script: str) -> subprocess.CompletedProcess:
    """Run a shell script as root of a user and mount namespace of its own (where it may mount a tmpfs)."""
    if (
        not shutil.which("unshare")
        or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode
    ):
        pytest.skip("no unshare -rm here")
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)


def test_report_on_a_full_disk_is_a_storage_error_and_leaves_nothing(tiny_run, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    script = (
        f'mount -t tmpfs -o size=4k tmpfs "{full}" && head -c 4096 /dev/zero > "{full}/filler" ; '
        f'{sys.executable} -m verl.cli report "{tiny_run}" -o "{full}/sub/report.html"; echo "rc=$?"; ls -A "{full}"'
    )
    proc = _in_own_mount_namespace(script)
    assert "rc=5" in proc.stdout and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "storage error: cannot write" in proc.stderr and "No space left on device" in proc.stderr
    assert proc.stdout.split("rc=5")[1].split() == ["filler"]  # no sub/, no temporary file


# ------------------------------------------------------------------------------------------------
# verl export


@pytest.fixture
def checkpoint(tiny_model_dir, tmp_path) -> Path:
    """A minimal ``global_step_1`` of an actor, as a run writes it."""
    from safetensors.torch import save_model

    from verl.models import load_hf_model

    step = tmp_path / "ckpt" / "global_step_1"
    (step / "actor").mkdir(parents=True)
    save_model(load_hf_model(tiny_model_dir), str(step / "actor" / "model.safetensors"))
    ignore = shutil.ignore_patterns("*.safetensors")
    shutil.copytree(tiny_model_dir, step / "actor" / "huggingface", ignore=ignore)
    torch.save({"global_step": 1}, step / "trainer_state.pt")
    return step


@pytest.mark.parametrize(
    "where", ["/sys/verl-export/out", "/proc/out", "{ckpt}/trainer_state.pt/out"], ids=["sys", "proc", "file"]
)
def test_export_into_a_place_that_cannot_be_written_is_one_line(checkpoint, capsys, where):
    out = where.format(ckpt=checkpoint)
    rc = main(["export", str(checkpoint), out])
    _one_line_error(capsys, 3, rc, "input error: cannot write", out)
    assert not Path(out).exists()


def test_export_into_an_immutable_directory_leaves_it_and_its_files_as_they_were(
    checkpoint, tmp_path, capsys
):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "notes.txt").write_text("mine")
    if not _immutable(locked):
        _mutable(locked)
        pytest.skip("neither chattr +i nor a mode binds this user")
    try:
        rc = main(["export", str(checkpoint), str(locked / "a" / "out")])  # a new directory inside it
        _one_line_error(capsys, 3, rc, f"cannot write {locked / 'a' / 'out'}")
        rc = main(["export", str(checkpoint), str(locked), "--overwrite"])  # into it
        _one_line_error(capsys, 3, rc, f"cannot write {locked}")
        assert [p.name for p in locked.iterdir()] == ["notes.txt"]
        assert not list(tmp_path.glob(".locked.export-*"))  # the staging directory is gone
    finally:
        _mutable(locked)
    assert (locked / "notes.txt").read_text() == "mine"


def test_export_into_a_readonly_mount_is_one_line(checkpoint, tmp_path):
    mount = tmp_path / "mount"
    mount.mkdir()
    out = mount / "a" / "out"
    proc = _unshare_ro(mount, [sys.executable, "-m", "verl.cli", "export", str(checkpoint), str(out)])
    if proc is None:
        pytest.skip("no unshare -rm here")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot write {out}: Read-only file system" in proc.stderr
    assert list(mount.iterdir()) == []


def test_export_onto_a_full_disk_is_a_storage_error_and_leaves_nothing(checkpoint, tmp_path):
    """safetensors' writer reports a full disk as text ("No space left on device (os error 28)"), not as an
    OSError: it is still the one-line storage error (exit 5), and the staging directory is gone."""
    full = tmp_path / "full"
    full.mkdir()
    script = (
        f'mount -t tmpfs -o size=64k tmpfs "{full}" && '
        f'{sys.executable} -m verl.cli export "{checkpoint}" "{full}/a/out"; echo "rc=$?"; ls -A "{full}"'
    )
    proc = _in_own_mount_namespace(script)
    assert "rc=5" in proc.stdout and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert f"storage error: cannot write {full}/a/out: No space left on device" in proc.stderr
    assert proc.stdout.split("rc=5")[1].split() == []  # no a/, no staging directory
