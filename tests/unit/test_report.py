"""``verl report``: reading a run directory, the page it writes, and the page in a real browser."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import struct
from pathlib import Path

import pytest

from tests._html import PageChecker
from verl.errors import UserError
from verl.report import ReportError, build_report, load_run, read_metrics
from verl.report.browser import find_browser, load_page, screenshot_report
from verl.report.cli import add_parser, cmd_report
from verl.report.page import GENERATOR_META, timing_breakdown
from verl.report.plots import thin

STEPS = 30
VAL_EVERY = 10
RESUMED_SCORE = 0.987654  # only the line written after the resume has it
UNIQUE = "zebra-quokka"  # in exactly one validation row
HOSTILE = '<script>alert("x")</script>'


def _training_line(step: int, score: float) -> dict:
    line = {
        "step": step,
        "critic/score/mean": score,
        "critic/rewards/mean": score - 0.01,
        "response_length/mean": 10.0 + step % 4,
        "response_length/max": 20.0,
        "response_length/min": 2.0,
        "actor/pg_loss": -0.01 * step,
        "actor/ppo_kl": 1e-4 * step,
        "actor/entropy": "nan" if step == 5 else 2.0 - step / STEPS,
        "actor/grad_norm": 1.0 + (step % 3),
        "actor/pg_clipfrac": 0.01,
        "actor/lr": 1e-4,
        "timing_s/step": 2.0,
        "timing_s/gen": 1.0,
        "timing_s/reward": 0.2,
        "timing_s/update_actor": 0.5,
        "perf/throughput": 1000.0 + step,
        "perf/time_per_step": 2.0,
        "perf/total_num_tokens": 5000,
        "perf/cpu_memory_used_gb": 1.5,
        "misc/<b>odd key</b>": float(step),
    }
    if step % VAL_EVERY == 0:
        line["val-core/arithmetic/acc/mean@1"] = step / 100
        line["val-core/openai/gsm8k/acc/mean@1"] = step / 200
        line["val-aux/arithmetic/reward/mean@1"] = step / 100
        line["timing_s/testing"] = 3.0
    return line


def _validation_rows(step: int, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        prompt = f"{HOSTILE} what is {i}+{step}?" + (f" {UNIQUE}" if (i, step) == (3, 10) else "")
        rows.append(
            {"input": prompt, "output": str(i + step), "gts": i + step, "score": float(i % 2), "step": step}
        )
    rows[0]["data_source"] = "arithmetic"
    return rows


def _write_run(run: Path) -> Path:
    """A finished run: 30 steps, validation every 10, steps 19-20 logged again after a resume, a "nan"
    entropy, a half-written last line; config, run info and two steps of validation generations."""
    (run / "validation").mkdir(parents=True)
    lines = [{"step": 0, "val-core/arithmetic/acc/mean@1": 0.05}]
    lines += [_training_line(step, 0.1 + step / 100) for step in range(1, 21)]
    lines += [_training_line(step, 0.2) for step in (19, 20)]  # resumed from the checkpoint of step 18
    lines[-1]["critic/score/mean"] = RESUMED_SCORE
    lines += [_training_line(step, 0.1 + step / 100) for step in range(21, STEPS + 1)]
    text = "\n".join(json.dumps(line) for line in lines) + '\n{"step": 31, "critic/sc'
    (run / "metrics.jsonl").write_text(text)
    (run / "config.yaml").write_text(
        f"trainer:\n  project_name: verl\n  experiment_name: demo\n  note: '</pre>{HOSTILE}'\n"
    )
    (run / "run.json").write_text(json.dumps({"run_id": "abc123", "started": "2025-01-01T00:00:00"}))
    for step, n in ((10, 250), (20, 5)):
        rows = _validation_rows(step, n)
        (run / "validation" / f"{step}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return _write_run(tmp_path / "run")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """The report of :func:`_write_run`'s run at its default path, built once for the tests that only read it."""
    run = _write_run(tmp_path_factory.mktemp("report") / "run")
    path = build_report(run)
    assert path == run / "report.html"
    return path.read_text()


@pytest.fixture
def tiny_run(tmp_path: Path) -> Path:
    """Two steps of one metric: for the tests of writing the file, where the content does not matter."""
    run = tmp_path / "tiny"
    run.mkdir()
    lines = [{"step": 1, "critic/score/mean": 0.5}, {"step": 2, "critic/score/mean": 0.6}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def _parse(page: str) -> PageChecker:
    parser = PageChecker()
    parser.feed(page)
    parser.close()
    assert parser.problems == [] and parser.stack == [], (parser.problems, parser.stack)
    return parser


def _sections(page: str) -> dict[str, str]:
    parts = re.split(r'<section id="([^"]+)">', page)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


# ------------------------------------------------------------------------------------------------
# reading the run directory


def test_a_repeated_step_keeps_the_later_line(run_dir):
    log = read_metrics(run_dir / "metrics.jsonl")
    score = dict(log.series["critic/score/mean"].items())
    assert score[20] == RESUMED_SCORE and score[19] == 0.2  # the resumed run's values
    assert score[18] == pytest.approx(0.28) and score[21] == pytest.approx(0.31)
    assert log.repeated_steps == [19, 20]
    assert log.steps == list(range(STEPS + 1))
    assert log.skipped_lines == 1  # the half-written last line
    assert log.series["critic/score/mean"].steps == tuple(range(1, STEPS + 1))


def test_nan_strings_are_numbers_and_validation_is_sparse(run_dir):
    log = read_metrics(run_dir / "metrics.jsonl")
    entropy = dict(log.series["actor/entropy"].items())
    assert math.isnan(entropy[5]) and entropy[6] == pytest.approx(2.0 - 6 / STEPS)
    assert log.series["actor/entropy"].non_finite == 1
    assert log.series["val-core/arithmetic/acc/mean@1"].steps == (0, 10, 20, 30)
    assert log.series["val-core/openai/gsm8k/acc/mean@1"].steps == (10, 20, 30)


def test_validation_files_are_read_capped(run_dir):
    data = load_run(run_dir, max_rows=7)
    assert [(v.step, v.total, len(v.rows)) for v in data.validation] == [(10, 250, 7), (20, 5, 5)]
    assert data.validation[0].mean_score == pytest.approx(0.5)  # over all 250 rows, not the 7 kept
    assert data.experiment == "verl/demo" and data.run_info["run_id"] == "abc123"


def test_timing_splits_regular_and_occasional_phases(run_dir):
    t = timing_breakdown(read_metrics(run_dir / "metrics.jsonl").series)
    assert list(t.regular) == ["gen", "update_actor", "reward", "other"]  # largest first, other last
    assert t.regular["other"][0] == pytest.approx(2.0 - 1.0 - 0.5 - 0.2)
    assert list(t.occasional) == ["testing"] and t.occasional["testing"].steps == (10, 20, 30)
    i = t.steps.index(10)  # testing is timed outside the step: "other" is the step less its regular phases
    assert t.regular["other"][i] == pytest.approx(2.0 - 1.0 - 0.5 - 0.2) and t.regular["gen"][i] == 1.0


def test_thinning_keeps_the_spike():
    steps = list(range(10_000))
    values = [0.0] * 10_000
    values[4321] = 99.0
    xs, ys = thin(steps, values, 300)
    assert len(xs) <= 300 and 99.0 in ys and xs[ys.index(99.0)] == 4321
    assert thin(steps[:10], values[:10], 300) == (steps[:10], values[:10])


# ------------------------------------------------------------------------------------------------
# the page


def test_report_holds_every_section_with_its_figures(page):
    _parse(page)
    assert GENERATOR_META in page[:500]
    sections = _sections(page)
    assert list(sections) == [
        "training",
        "validation",
        "timing",
        "perf",
        "samples",
        "all-metrics",
        "config",
        "run-info",
    ]
    # score+reward, response length, KL, entropy, grad norm, policy loss, clip fraction, lr (no value loss)
    assert sections["training"].count("<svg") == 8 and "Value loss (critic/vf_loss)" in sections["training"]
    assert sections["validation"].count("<svg") == 1  # acc mean@1 of both data sources
    assert "openai/gsm8k" in sections["validation"] and "arithmetic" in sections["validation"]
    assert sections["timing"].count("<svg") == 2  # the stack of regular phases, testing on its own
    assert sections["perf"].count("<svg") == 4  # throughput, time, tokens, host memory
    assert "Accelerator memory" in sections["perf"]  # named as not recorded
    assert sections["all-metrics"].count("<svg") == 2  # misc/<b>odd key</b> and val-aux/.../reward
    assert "1 non-finite value (nan/inf) not drawn" in sections["training"]  # the nan entropy
    # the headline: the first val-core accuracy, first and last value
    assert "val-core/arithmetic/acc/mean@1</code>: 5.0% at step 0" in page and "30.0%</strong>" in page
    assert "19, 20 (resumed" in page and "1 of metrics.jsonl skipped" in page
    assert "abc123" in sections["run-info"] and "experiment_name: demo" in sections["config"]


def test_text_from_the_run_is_escaped(page):
    parsed = _parse(page)
    assert len(parsed.scripts) == 1  # the page's own search script, nothing from the run
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; what is 3+10? zebra-quokka" in page
    assert "&lt;/pre&gt;&lt;script&gt;" in _sections(page)["config"]
    assert "misc/&lt;b&gt;odd key&lt;/b&gt;" in page and "<b>odd" not in page


def test_page_loads_nothing_from_the_network(run_dir):
    (run_dir / "trace.html").write_text("<html></html>")
    out = run_dir / "sub" / "page.html"
    page = build_report(run_dir, out).read_text()
    links = _parse(page).links
    assert links and all(link.startswith("#") or link == "../trace.html" for link in links), links
    assert "../trace.html" in links  # relative to where the page is
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<link" not in page and "@import" not in page and not re.search(r"url\((?!#)", page)


def test_validation_samples_are_capped_and_said_so(page):
    samples = _sections(page)["samples"]
    blocks = re.findall(r'<details class="samples-step" data-step="(\d+)"( open)?', samples)
    assert blocks == [("20", " open"), ("10", "")]  # the newest first, open
    assert samples.count('<tr class="sample">') == 200 + 5
    assert "first 200 of 250 rows" in samples and 'id="sample-search"' in samples


def test_a_running_run_with_no_steps_yet_still_gets_a_page(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    page = build_report(tmp_path).read_text()
    _parse(page)
    assert "none logged yet" in page and page.count("<svg") == 0
    for what in ("Training metrics", "config.yaml", "run.json", "Validation generations"):
        assert f"{what}" in page
    assert page.count(": not recorded.") >= 6


def test_refuses_to_overwrite_a_file_it_did_not_write(tiny_run, tmp_path):
    mine = tmp_path / "notes.html"
    mine.write_text("<html>my notes</html>")
    with pytest.raises(ReportError, match="refusing to overwrite"):
        build_report(tiny_run, mine)
    assert mine.read_text() == "<html>my notes</html>"
    (tiny_run / "report.html").write_text("hand-written")  # the default path is guarded the same way
    with pytest.raises(ReportError, match="not a report written by"):
        build_report(tiny_run)
    with pytest.raises(ReportError, match="is a directory"):
        build_report(tiny_run, tmp_path)
    out = tmp_path / "report.html"
    build_report(tiny_run, out)
    first = out.read_text()
    (tiny_run / "metrics.jsonl").write_text(json.dumps({"step": 1, "critic/score/mean": 0.5}) + "\n")
    assert build_report(tiny_run, out) == out and out.read_text() != first  # its own report: replaced


def test_write_is_atomic(tiny_run, monkeypatch):
    out = build_report(tiny_run)
    before = out.read_text()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    # one line, not a traceback
    with pytest.raises(ReportError, match="cannot write .*report.html: disk full"):
        build_report(tiny_run)
    assert out.read_text() == before
    assert sorted(p.name for p in tiny_run.iterdir()) == ["metrics.jsonl", "report.html"]  # no temp file left


def test_no_metrics_is_a_user_error_naming_the_path(tmp_path):
    with pytest.raises(ReportError) as caught:
        build_report(tmp_path)
    assert isinstance(caught.value, UserError) and caught.value.exit_code == 3
    assert str(tmp_path) in str(caught.value) and "metrics.jsonl" in str(caught.value)
    with pytest.raises(ReportError, match="no such run directory"):
        build_report(tmp_path / "absent")


def test_cli_subcommand(tiny_run, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="verl")
    add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "r.html"
    args = parser.parse_args(["report", str(tiny_run), "-o", str(out)])
    assert args.func is cmd_report and args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(out) and out.is_file()
    args = parser.parse_args(["report", str(tiny_run)])
    assert args.output is None and cmd_report(args) == 0
    assert capsys.readouterr().out.strip() == str(tiny_run / "report.html")


def test_many_metrics_and_steps_stay_a_few_megabytes(tmp_path):
    """60 extra keys x 1,200 steps: every figure is thinned, so the page grows by figures, not by steps."""
    keys = [f"group{g}/m{i}" for g in range(6) for i in range(10)]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for step in range(1, 1201):
            values = {k: math.sin(step / 40 + j) + (step % 7) / 10 for j, k in enumerate(keys)}
            f.write(json.dumps({"step": step, "critic/score/mean": step / 1200, **values}) + "\n")
    page = build_report(tmp_path).read_text()
    assert page.count("<svg") == 61
    assert len(page.encode()) < 61 * 14_000  # about 10 KB a figure: 200 keys would be about 2.5 MB


# ------------------------------------------------------------------------------------------------
# a real browser, where one is installed


@pytest.mark.skipif(find_browser() is None, reason="no chromium / chromium-browser / google-chrome on PATH")
def test_page_renders_searches_and_photographs_in_headless_chromium(run_dir, tmp_path):
    page = build_report(run_dir)
    loaded = load_page(page, fragment=f"search={UNIQUE}")
    assert 'data-ready="ok"' in loaded.dom, re.findall(r'data-ready="[^"]*"', loaded.dom)
    assert loaded.console == []  # the page logs nothing, and nothing it runs throws
    broken = tmp_path / "broken.html"  # ... which would show: the capture itself works
    broken.write_text("<html><body><script>null.x;</script></body></html>")
    assert any("TypeError" in line for line in load_page(broken).errors)
    assert 'data-matches="1"' in loaded.dom  # the search box kept one row of 205
    visible = re.findall(r'<tr class="sample">(.*?)</tr>', loaded.dom, flags=re.S)
    assert len(visible) == 1 and UNIQUE in visible[0]
    assert loaded.dom.count('<tr class="sample" hidden=""') == 204
    assert re.search(r'data-step="10" open=""', loaded.dom)  # the block holding the match was opened
    assert "1 of 205 rows match" in loaded.dom

    png = screenshot_report(run_dir, tmp_path / "shot.png", width=900, height=700)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (900, 700)
    assert len(data) > 20_000  # plots and text, not a blank page
