"""The report page: sections of HTML around the figures of :mod:`verl.report.plots`, written atomically.

Every piece of text from the run (metric keys, prompts, responses, config) goes through ``html.escape``;
the page loads nothing: the figures are inline SVG, the style and the search script are inline too.

The pieces: :mod:`verl.report.markup` (escaping, formatting, figure and section wrappers),
:mod:`verl.report.curves` (the figures of named metrics), :mod:`verl.report.timing` (the timing section) and
:mod:`verl.report.samples` (the validation samples); this module adds the header, the config and run info, and
writes the page.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from urllib.parse import quote

from verl.report.curves import (
    PERF_PLOTS,
    TRAINING_PLOTS,
    PlotSpec,
    _all_metrics_section,
    _spec_section,
    _validation_section,
    spec_lines,
)
from verl.report.data import METRICS_FILE, ReportError, RunData, Series, load_run
from verl.report.markup import Figures, _duration, _local_time, _missing, _section, _step_list, esc, fmt
from verl.report.output import missing_dirs, remove_created, unwritable
from verl.report.samples import MAX_CELL_CHARS, SAMPLE_BUDGET_CHARS, SAMPLE_FIELDS, _samples_section
from verl.report.timing import TIMING_PREFIX, TIMING_TOTAL, TimingBreakdown, _timing_section, timing_breakdown
from verl.utils.checkpoint import atomic_write_bytes

__all__ = [
    "DEFAULT_NAME",
    "GENERATOR",
    "GENERATOR_META",
    "MAX_CELL_CHARS",
    "MAX_ROWS_PER_STEP",
    "NAV",
    "PERF_PLOTS",
    "SAMPLE_BUDGET_CHARS",
    "SAMPLE_FIELDS",
    "TIMING_PREFIX",
    "TIMING_TOTAL",
    "TRAINING_PLOTS",
    "Figures",
    "PlotSpec",
    "TimingBreakdown",
    "build_report",
    "esc",
    "fmt",
    "headline_metric",
    "is_report",
    "render_report",
    "spec_lines",
    "timing_breakdown",
    "write_page",
]

GENERATOR = "verl report"
GENERATOR_META = f'<meta name="generator" content="{GENERATOR}">'
"""the mark of a page this module wrote: only such a file is ever overwritten"""
DEFAULT_NAME = "report.html"
MAX_ROWS_PER_STEP = 200


def headline_metric(series: dict[str, Series]) -> str | None:
    """The metric the header leads with: the first validation accuracy (``val-core/<source>/acc/mean@n``),
    else the first validation mean reward, else the training score."""
    for name in ("acc", "reward"):
        for key in series:
            parts = key.rsplit("/", 2)
            if len(parts) == 3 and parts[0].startswith("val-core/") and parts[1] == name:
                if parts[2].startswith("mean@") and series[key].finite():
                    return key
    return "critic/score/mean" if series.get("critic/score/mean", Series((), ())).finite() else None


def _headline(series: dict[str, Series]) -> str:
    key = headline_metric(series)
    if key is None:
        return '<p class="headline missing">No validation or score metric recorded yet.</p>'
    points = series[key].finite()
    percent = "/acc/" in key
    (s0, v0), (s1, v1) = points[0], points[-1]
    if len(points) == 1:
        change = f"<strong>{fmt(v0, percent)}</strong> at step {s0}"
    else:
        delta = (v1 - v0) * 100 if percent else v1 - v0
        direction = "up" if delta > 0 else "down" if delta < 0 else ""
        unit = " points" if percent else ""
        change = (
            f"{fmt(v0, percent)} at step {s0} &rarr; <strong>{fmt(v1, percent)}</strong> at step {s1} "
            f'<span class="{direction}">({delta:+.1f}{unit})</span>'
            if percent
            else f"{fmt(v0)} at step {s0} &rarr; <strong>{fmt(v1)}</strong> at step {s1} "
            f'<span class="{direction}">({delta:+.4g})</span>'
        )
    return f'<p class="headline"><code>{esc(key)}</code>: {change}</p>'


def _facts(data: RunData, built: float) -> str:
    log = data.metrics
    facts: list[tuple[str, str]] = []
    if log.steps:
        facts.append(("steps", f"{len(log.steps)} logged, {log.steps[0]} &ndash; {log.steps[-1]}"))
    else:
        facts.append(("steps", "none logged yet"))
    ago = max(0.0, built - data.metrics_mtime)
    facts.append(
        ("last step logged", f"{_local_time(data.metrics_mtime)} ({_duration(ago)} before this report)")
    )
    step_time = data.metrics.series.get(TIMING_TOTAL)
    if step_time is not None and step_time.finite():
        last = step_time.finite()[-1]
        facts.append(("last step took", f"{fmt(last[1])} s (step {last[0]})"))
    if log.repeated_steps:
        facts.append(
            ("logged twice", f"{_step_list(log.repeated_steps)} (resumed; the later values are shown)")
        )
    if log.skipped_lines:
        facts.append(("unreadable lines", f"{log.skipped_lines} of metrics.jsonl skipped"))
    facts.append(("report built", _local_time(built)))
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in facts)
    return f'<dl class="facts">{rows}</dl>'


def _data_problems(data: RunData) -> str:
    """What of ``metrics.jsonl`` the figures leave out and why (booleans, text, a step such as ``1e18``),
    so a curve that looks thin is never a mystery; empty when everything was drawn."""
    problems = data.metrics.problems()
    if not problems:
        return ""
    items = "".join(f"<li>{esc(p)}</li>" for p in problems)
    return (
        f'<div class="problems" id="data-problems"><strong>Data problems in {METRICS_FILE}</strong> '
        f"(left out of every figure):<ul>{items}</ul></div>"
    )


NAV = (
    ("training", "Training"),
    ("validation", "Validation"),
    ("timing", "Timing"),
    ("perf", "Throughput &amp; memory"),
    ("samples", "Samples"),
    ("all-metrics", "All metrics"),
    ("config", "Config"),
    ("run-info", "Run info"),
)


def _header(data: RunData, output: Path, built: float) -> str:
    links = "".join(f'<a href="#{anchor}">{label}</a>' for anchor, label in NAV)
    if data.trace is not None:
        links += f'<a href="{esc(_relative_href(data.trace, output))}">DAG trace</a>'
    return (
        f"<header>\n<h1>{esc(data.experiment)}</h1>\n"
        f'<div class="path">{esc(data.run_dir.resolve())}</div>\n'
        f"{_headline(data.metrics.series)}\n{_facts(data, built)}\n{_data_problems(data)}\n"
        f"<nav>{links}</nav>\n</header>"
    )


def _relative_href(target: Path, output: Path) -> str:
    rel = os.path.relpath(target.resolve(), output.resolve().parent)
    return quote(Path(rel).as_posix())


# ------------------------------------------------------------------------------------------------
# config and run info


def _config_section(data: RunData) -> str:
    if data.config_text is None:
        return _missing("config.yaml")
    lines = data.config_text.count("\n") + 1
    return (
        f'<details><summary>config.yaml<span class="count">{lines} lines</span></summary>'
        f"<pre>{esc(data.config_text)}</pre></details>"
    )


def _run_info_section(data: RunData, output: Path) -> str:
    parts = []
    if data.run_info_error:
        parts.append(f'<p class="missing">{esc(data.run_info_error)}</p>')
    if data.run_info is not None:
        rows = "".join(
            f"<tr><th>{esc(k)}</th><td>{esc(v if isinstance(v, str) else json.dumps(v, default=str))}</td></tr>"
            for k, v in data.run_info.items()
        )
        parts.append(f"<table>{rows}</table>")
    elif not data.run_info_error:
        parts.append(_missing("run.json"))
    if data.trace is not None:
        href = esc(_relative_href(data.trace, output))
        parts.append(f'<p>DAG trace of the steps: <a href="{href}">trace.html</a></p>')
    if data.metrics.text_keys:
        keys = ", ".join(f"<code>{esc(k)}</code>" for k in data.metrics.text_keys)
        parts.append(f'<p class="note">Logged with non-numeric values (not drawn): {keys}</p>')
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------
# the page


def _asset(name: str) -> str:
    return resources.files("verl.report").joinpath("assets", name).read_text(encoding="utf-8").strip()


def render_report(data: RunData, output: Path, built: float | None = None) -> str:
    """The whole page for ``data``, as it will be written to ``output`` (links are relative to it)."""
    built = time.time() if built is None else built
    series = data.metrics.series
    figures = Figures()
    sections: list[tuple[str, str, Callable[[], tuple[str, set[str]]]]] = [
        ("training", "Training", lambda: _spec_section(TRAINING_PLOTS, series, figures, "Training metrics")),
        ("validation", "Validation", lambda: _validation_section(series, figures)),
        ("timing", "Timing", lambda: _timing_section(series, figures)),
        ("perf", "Throughput & memory", lambda: _spec_section(PERF_PLOTS, series, figures, "perf/ metrics")),
    ]
    body, used = [_header(data, output, built)], set()
    for anchor, title, make in sections:
        html_part, keys = make()
        used |= keys
        body.append(_section(anchor, title, html_part))
    body.append(_section("samples", "Validation samples", _samples_section(data.validation)))
    body.append(_section("all-metrics", "All metrics", _all_metrics_section(series, used, figures)))
    body.append(_section("config", "Config", _config_section(data)))
    body.append(_section("run-info", "Run info", _run_info_section(data, output)))
    main = "\n".join(body)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en">\n<head>\n<meta charset="utf-8">\n{GENERATOR_META}\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(data.experiment)} &middot; verl report</title>\n"
        f"<style>\n{_asset('style.css')}\n</style>\n</head>\n"
        f'<body data-ready="no">\n<main>\n{main}\n</main>\n'
        f"<script>\n{_asset('script.js')}\n</script>\n</body>\n</html>\n"
    )


def is_report(path: Path) -> bool:
    """Whether ``path`` is a page this module wrote (its head carries :data:`GENERATOR_META`)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return GENERATOR_META in f.read(4096)
    except OSError:
        return False


def _unwritable(output: Path, error: OSError) -> Exception:
    return unwritable(output, error, ReportError, "give a writable path with -o/--output")


def _check_output(output: Path) -> None:
    """Refuse a directory, or a file that is not an earlier report; before the drawing, so that a refused
    path costs no time."""
    try:
        is_dir, exists = output.is_dir(), output.exists()
    except OSError as error:  # a parent that cannot be searched
        raise _unwritable(output, error) from None
    if is_dir:
        raise ReportError(f"--output {output} is a directory; give the path of the HTML file to write")
    if exists and not is_report(output):
        raise ReportError(
            f"{output} exists and is not a report written by `verl report`; refusing to overwrite it "
            "(remove it, or give another path with -o/--output)"
        )


def write_page(output: Path, page: bytes) -> None:
    """Write the page at ``output``, creating its missing parent directories. Atomic: a browser reloading
    the page, or a second `verl report`, never sees half a file. When the OS refuses (a read-only or
    immutable directory, ``/sys``, a path through a file, a full disk) it is a one-line :class:`ReportError`
    (a :class:`~verl.errors.StorageError` for a full or failing file system) naming ``output`` and the
    reason, and nothing is left behind: no temporary file, no directory the write made."""
    created = missing_dirs(output.parent)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(output, page, readable=True)
    except OSError as error:
        remove_created(created)
        raise _unwritable(output, error) from None


def build_report(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> Path:
    """Write the HTML report of ``run_dir`` to ``output`` (default ``<run_dir>/report.html``) and return its
    path. A file already there is replaced only when it is an earlier report; anything else is refused."""
    data = load_run(run_dir, max_rows=MAX_ROWS_PER_STEP)
    out = Path(output).expanduser() if output is not None else data.run_dir / DEFAULT_NAME
    _check_output(out)
    write_page(out, render_report(data, out).encode("utf-8"))
    return out
