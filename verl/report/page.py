"""The report page: sections of HTML around the figures of :mod:`verl.report.plots`, written atomically.

Every piece of text from the run (metric keys, prompts, responses, config) goes through ``html.escape``;
the page loads nothing: the figures are inline SVG, the style and the search script are inline too.
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from verl.report.data import ReportError, RunData, Series, ValidationStep, load_run
from verl.utils.checkpoint import atomic_write_bytes

GENERATOR = "verl report"
GENERATOR_META = f'<meta name="generator" content="{GENERATOR}">'
"""the mark of a page this module wrote: only such a file is ever overwritten"""
DEFAULT_NAME = "report.html"
MAX_ROWS_PER_STEP = 200
MAX_CELL_CHARS = 2000
SAMPLE_BUDGET_CHARS = 2_000_000
"""text of validation samples on one page; older steps beyond it are listed, not shown"""
SAMPLE_FIELDS = ("input", "output", "gts", "score", "step")


@dataclass(frozen=True)
class PlotSpec:
    """A figure of named metrics: drawn when at least one of its keys was logged."""

    title: str
    ylabel: str
    keys: tuple[tuple[str, str], ...]
    """(metric key, legend label)"""
    band: tuple[str, str] | None = None
    """(min key, max key) shaded around the first line"""


TRAINING_PLOTS = (
    PlotSpec(
        "Score and reward",
        "mean per response",
        (("critic/score/mean", "score"), ("critic/rewards/mean", "reward")),
    ),
    PlotSpec(
        "Response length",
        "tokens",
        (("response_length/mean", "mean"),),
        band=("response_length/min", "response_length/max"),
    ),
    PlotSpec(
        "KL", "", (("actor/kl_loss", "kl_loss (to reference)"), ("actor/ppo_kl", "ppo_kl (to rollout)"))
    ),
    PlotSpec("Entropy", "per token", (("actor/entropy", "entropy"),)),
    PlotSpec("Gradient norm", "", (("actor/grad_norm", "actor"), ("critic/grad_norm", "critic"))),
    PlotSpec("Policy loss", "", (("actor/pg_loss", "pg_loss"),)),
    PlotSpec("Value loss", "", (("critic/vf_loss", "vf_loss"),)),
    PlotSpec("Clipped fraction", "fraction of tokens", (("actor/pg_clipfrac", "pg_clipfrac"),)),
    PlotSpec("Learning rate", "", (("actor/lr", "actor"), ("critic/lr", "critic"))),
)
PERF_PLOTS = (
    PlotSpec("Throughput", "tokens/s per device", (("perf/throughput", "throughput"),)),
    PlotSpec("Time per step", "s", (("perf/time_per_step", "time per step"),)),
    PlotSpec("Tokens per step", "tokens", (("perf/total_num_tokens", "prompt + response tokens"),)),
    PlotSpec(
        "Host memory of the driver process",
        "GiB",
        (("perf/cpu_memory_used_gb", "resident"), ("perf/max_rss_gb", "peak resident")),
    ),
    PlotSpec(
        "Accelerator memory",
        "GiB",
        (
            ("perf/max_memory_allocated_gb", "peak allocated"),
            ("perf/max_memory_reserved_gb", "peak reserved"),
        ),
    ),
)
TIMING_PREFIX = "timing_s/"
TIMING_TOTAL = "timing_s/step"


class Figures:
    """Hands out page-unique salts, so the ids inside the SVGs of one page never collide."""

    def __init__(self) -> None:
        self.count = 0

    def salt(self) -> str:
        self.count += 1
        return f"verl-report-{self.count}"


# ------------------------------------------------------------------------------------------------
# small formatting helpers


def esc(value: Any) -> str:
    """Text for HTML, quotes included."""
    return html.escape(str(value), quote=True)


def fmt(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.1%}" if percent else f"{value:.4g}"


def _local_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _missing(what: str) -> str:
    return f'<p class="missing">{esc(what)}: not recorded.</p>'


def _figure(svg: str, caption: str = "", css: str = "") -> str:
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure class="{css}">{svg}{cap}</figure>' if css else f"<figure>{svg}{cap}</figure>"


def _section(section_id: str, title: str, body: str) -> str:
    return f'<section id="{section_id}">\n<h2>{esc(title)}</h2>\n{body}\n</section>'


def _non_finite_note(series: Iterable[Series]) -> str:
    n = sum(s.non_finite for s in series)
    return f"{n} non-finite value{'s' if n != 1 else ''} (nan/inf) not drawn" if n else ""


# ------------------------------------------------------------------------------------------------
# header


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


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _step_list(steps: Sequence[int], limit: int = 12) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f" and {len(steps) - limit} more" if len(steps) > limit else "")


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
        f"{_headline(data.metrics.series)}\n{_facts(data, built)}\n<nav>{links}</nav>\n</header>"
    )


def _relative_href(target: Path, output: Path) -> str:
    rel = os.path.relpath(target.resolve(), output.resolve().parent)
    return quote(Path(rel).as_posix())


# ------------------------------------------------------------------------------------------------
# figures of named metrics


def spec_lines(spec: PlotSpec, series: dict[str, Series]) -> list[tuple[str, Series]]:
    """The (label, series) lines of ``spec`` that were logged; a series equal to an earlier one is folded
    into its label ("score = reward") rather than drawn over it."""
    lines: list[tuple[str, Series]] = []
    for key, label in spec.keys:
        s = series.get(key)
        if s is None or not len(s):
            continue
        same = next((i for i, (_, earlier) in enumerate(lines) if earlier == s), None)
        if same is None:
            lines.append((label, s))
        else:
            lines[same] = (f"{lines[same][0]} = {label}", s)
    return lines


def _spec_figure(spec: PlotSpec, series: dict[str, Series], figures: Figures) -> str | None:
    from verl.report.plots import Line, line_plot

    lines = [Line(label, s) for label, s in spec_lines(spec, series)]
    if not lines:
        return None
    band = None
    if spec.band and all(k in series for k in spec.band):
        band = (series[spec.band[0]], series[spec.band[1]])
    folded = any(" = " in line.label for line in lines)  # the legend says which series are one line
    svg = line_plot(lines, spec.title, spec.ylabel, salt=figures.salt(), band=band, legend=folded or None)
    return _figure(svg, _non_finite_note(line.series for line in lines))


def _spec_section(
    specs: Sequence[PlotSpec], series: dict[str, Series], figures: Figures, what: str
) -> tuple[str, set[str]]:
    """The figures of ``specs`` that have data (and a line naming those that have none), and the keys
    they drew."""
    shown, absent = [], []
    for spec in specs:
        figure = _spec_figure(spec, series, figures)
        if figure:
            shown.append(figure)
        else:
            absent.append(f"{spec.title} ({', '.join(k for k, _ in spec.keys)})")
    used = {k for spec in specs for k, _ in spec.keys} | {k for spec in specs for k in spec.band or ()}
    if not shown:
        return _missing(what), set()
    body = f'<div class="grid">\n{chr(10).join(shown)}\n</div>'
    if absent:
        body += f'\n<p class="note">Not recorded: {esc("; ".join(absent))}.</p>'
    return body, used & set(series)


def _validation_groups(series: dict[str, Series]) -> dict[tuple[str, str], dict[str, Series]]:
    """``val-core/<source>/<metric>/<stat>`` by (metric, stat), then by data source (which may hold "/")."""
    groups: dict[tuple[str, str], dict[str, Series]] = {}
    for key, s in series.items():
        if not key.startswith("val-core/"):
            continue
        rest = key[len("val-core/") :]
        parts = rest.rsplit("/", 2)
        source, metric, stat = parts if len(parts) == 3 else (key, rest, "")
        groups.setdefault((metric, stat), {})[source] = s
    return groups


def _validation_section(series: dict[str, Series], figures: Figures) -> tuple[str, set[str]]:
    from verl.report.plots import Line, line_plot

    groups = _validation_groups(series)
    if not groups:
        return _missing("Validation metrics (val-core/...)"), set()
    shown = []
    for (metric, stat), by_source in sorted(groups.items()):
        lines = [Line(source, s) for source, s in sorted(by_source.items())]
        title = f"Validation {metric} {stat}".strip()
        svg = line_plot(lines, title, metric, salt=figures.salt(), percent=metric == "acc")
        shown.append(_figure(svg, _non_finite_note(by_source.values())))
    used = {k for k in series if k.startswith("val-core/")}
    return f'<div class="grid">\n{chr(10).join(shown)}\n</div>', used


# ------------------------------------------------------------------------------------------------
# timing


@dataclass
class TimingBreakdown:
    """Seconds per step by phase (``timing_s/<phase>``), for the stacked figure and the table."""

    steps: list[int]
    regular: dict[str, list[float]]
    """phases timed on at least half of the steps, per step (0 where one did not run), largest mean first,
    then "other": the step's total minus all its phases, where positive"""
    occasional: dict[str, Series]
    """phases timed on fewer than half of the steps (testing, save_checkpoint): a band of them would be
    spikes that flatten every other band"""
    total: list[float]
    """``timing_s/step`` (the sum of the phases where it was not logged)"""


def timing_breakdown(series: dict[str, Series]) -> TimingBreakdown:
    """Split the ``timing_s/`` metrics into regular and occasional phases (see :class:`TimingBreakdown`).

    Phases of one step may overlap (the controller runs independent DAG steps concurrently), and a phase
    may be timed outside the step's total (here: testing, save_checkpoint), so the stack can rise above
    the total."""
    phase_keys = [k for k in series if k.startswith(TIMING_PREFIX) and k != TIMING_TOTAL]
    total_series = series.get(TIMING_TOTAL)
    if total_series is not None:
        steps = list(total_series.steps)
    else:
        steps = sorted({s for k in phase_keys for s in series[k].steps})
    if not steps:
        return TimingBreakdown([], {}, {}, [])
    columns: dict[str, list[float]] = {}
    occasional: dict[str, Series] = {}
    for key in phase_keys:
        name = key[len(TIMING_PREFIX) :]
        if 2 * len(series[key]) < len(steps):
            occasional[name] = series[key]
        values = dict(series[key].items())
        columns[name] = [_finite_or_zero(values.get(step, 0.0)) for step in steps]
    regular = {k: v for k, v in columns.items() if k not in occasional}
    # The occasional phases (testing, save_checkpoint) are timed outside timing_s/step by this trainer:
    # "other" is the step's total less its regular phases.
    sums = [sum(col[i] for col in regular.values()) for i in range(len(steps))]
    regular = dict(sorted(regular.items(), key=lambda kv: -sum(kv[1])))
    if total_series is not None:
        total = [_finite_or_zero(v) for v in total_series.values]
        other = [max(0.0, t - s) for t, s in zip(total, sums, strict=True)]
        if any(other):
            regular["other"] = other
    else:
        total = sums
    return TimingBreakdown(steps, regular, occasional, total)


def _finite_or_zero(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def _timing_table(t: TimingBreakdown) -> str:
    """Per phase: on how many steps it ran, its mean when it ran, its sum over the run and its share of the
    summed phase time."""
    per_phase = {name: [v for v in values if v > 0] for name, values in t.regular.items()}
    per_phase.update({name: [v for v in s.values if math.isfinite(v)] for name, s in t.occasional.items()})
    grand = sum(sum(v) for v in per_phase.values())
    rows = []
    for name, values in sorted(per_phase.items(), key=lambda kv: -sum(kv[1])):
        mean = sum(values) / len(values) if values else 0.0
        share = f"{sum(values) / grand:.0%}" if grand > 0 else "n/a"
        rows.append(
            f'<tr><td>{esc(name)}</td><td class="num">{len(values)}</td><td class="num">{mean:.3g}</td>'
            f'<td class="num">{sum(values):.4g}</td><td class="num">{share}</td></tr>'
        )
    n = len(t.total) or 1
    rows.append(
        f'<tr><th>step (timing_s/step)</th><th class="num">{len(t.total)}</th>'
        f'<th class="num">{sum(t.total) / n:.3g}</th><th class="num">{sum(t.total):.4g}</th><th></th></tr>'
    )
    head = (
        '<thead><tr><th>phase</th><th class="num">steps</th><th class="num">mean s (when run)</th>'
        '<th class="num">total s</th><th class="num">share of phase time</th></tr></thead>'
    )
    return f'<table class="timing">{head}<tbody>{"".join(rows)}</tbody></table>'


def _timing_section(series: dict[str, Series], figures: Figures) -> tuple[str, set[str]]:
    from verl.report.plots import Line, line_plot, stacked_timing_plot

    t = timing_breakdown(series)
    if not t.steps:
        return _missing("Timing (timing_s/...)"), set()
    parts = [
        '<p class="note">Seconds per step by phase. Phases that overlap in time (independent steps of the '
        "DAG run concurrently) or are timed outside the step stack above the black total line; "
        "&ldquo;other&rdquo; is the part of the step no phase accounts for.</p>"
    ]
    bands = {name: values for name, values in t.regular.items() if any(values)}  # not the phases never run
    if bands:
        svg, _ = stacked_timing_plot(t.steps, bands, t.total, salt=figures.salt())
        parts.append(_figure(svg, css="wide"))
    if t.occasional:
        lines = [Line(name, s) for name, s in sorted(t.occasional.items())]
        svg = line_plot(lines, "Occasional phases (on the steps they ran)", "s", salt=figures.salt())
        parts.append(f'<div class="grid">{_figure(svg)}</div>')
    parts.append(_timing_table(t))
    return "\n".join(parts), {k for k in series if k.startswith(TIMING_PREFIX)}


# ------------------------------------------------------------------------------------------------
# everything else, small


def _all_metrics_section(series: dict[str, Series], used: set[str], figures: Figures) -> str:
    from verl.report.plots import Line, line_plot

    rest = [k for k in series if k not in used and len(series[k])]
    if not rest:
        return '<p class="note">Every logged metric is drawn above.</p>'
    groups: dict[str, list[str]] = {}
    for key in rest:
        groups.setdefault(key.split("/", 1)[0], []).append(key)
    blocks = []
    for prefix, keys in sorted(groups.items()):
        plots = []
        for key in keys:
            svg = line_plot([Line(key, series[key])], key, salt=figures.salt(), small=True)
            plots.append(_figure(svg, _non_finite_note([series[key]])))
        blocks.append(
            f'<details><summary>{esc(prefix)}<span class="count">{len(keys)} metrics</span></summary>\n'
            f'<div class="grid small">\n{chr(10).join(plots)}\n</div>\n</details>'
        )
    intro = f'<p class="note">The {len(rest)} logged metrics not drawn above, by prefix.</p>'
    return intro + "\n" + "\n".join(blocks)


# ------------------------------------------------------------------------------------------------
# validation samples


def _cell_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= MAX_CELL_CHARS:
        return esc(text)
    cut = len(text) - MAX_CELL_CHARS
    return f'{esc(text[:MAX_CELL_CHARS])}<span class="cut"> &hellip; ({cut} more characters)</span>'


def _extra_fields(row: dict[str, Any]) -> str:
    parts = []
    for key, value in row.items():
        if key in SAMPLE_FIELDS:
            continue
        shown = fmt(value) if isinstance(value, float) else value
        parts.append(f"{key}: {_plain(shown)}")
    return _cell_text("\n".join(parts)) if parts else ""


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _sample_row(index: int, row: dict[str, Any]) -> str:
    from verl.report.data import as_number

    score = as_number(row.get("score"))
    gts = row.get("gts", row.get("ground_truth", ""))
    cells = (
        str(index),
        _cell_text(row.get("input", "")),
        _cell_text(row.get("output", "")),
        _cell_text(gts),
        fmt(score) if score is not None else "",
        _extra_fields(row),
    )  # no class per cell: the stylesheet styles the columns, which keeps thousands of rows small
    return '<tr class="sample">' + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def _sample_block(v: ValidationStep, is_open: bool) -> str:
    rows = "\n".join(_sample_row(i, row) for i, row in enumerate(v.rows, 1))
    shown = f"{len(v.rows)} of {v.total} rows" if len(v.rows) < v.total else f"{v.total} rows"
    mean = f", mean score {fmt(v.mean_score)}" if v.mean_score is not None else ""
    cut = (
        f'<p class="note">Showing the first {len(v.rows)} of {v.total} rows; all are in '
        f"<code>validation/{esc(v.path.name)}</code>.</p>"
        if len(v.rows) < v.total
        else ""
    )
    skipped = f'<p class="note">{v.skipped_lines} unreadable lines skipped.</p>' if v.skipped_lines else ""
    cols = '<colgroup><col class="idx"><col><col><col class="gts"><col class="score"><col class="extra"></colgroup>'
    head = (
        '<thead><tr><th class="num">#</th><th>prompt</th><th>response</th><th>ground truth</th>'
        '<th class="num">score</th><th>other fields</th></tr></thead>'
    )
    return (
        f'<details class="samples-step" data-step="{v.step}"{" open" if is_open else ""}>'
        f'<summary>step {v.step}<span class="count">{shown}{mean}</span>'
        f'<span class="count match-count"></span></summary>\n{cut}{skipped}'
        f'<table class="samples">{cols}{head}<tbody>\n{rows}\n</tbody></table>\n</details>'
    )


def _sample_size(v: ValidationStep) -> int:
    return sum(min(len(_plain(value)), MAX_CELL_CHARS) for row in v.rows for value in row.values())


def _samples_section(validation: list[ValidationStep]) -> str:
    if not validation:
        return _missing("Validation generations (validation/<step>.jsonl)")
    blocks, left_out, budget = [], [], SAMPLE_BUDGET_CHARS
    for v in reversed(validation):  # the newest step first, and it is open
        size = _sample_size(v)
        if blocks and size > budget:
            left_out.append(v.step)
            continue
        budget -= size
        blocks.append(_sample_block(v, is_open=not blocks))
    search = (
        '<div class="search"><input id="sample-search" type="search" '
        'placeholder="filter rows: prompt, response, ground truth..." aria-label="filter validation samples">'
        '<span id="search-count" class="note"></span></div>'
    )
    note = ""
    if left_out:
        note = (
            f'<p class="note">Not shown, to keep the page small: steps {_step_list(sorted(left_out))} '
            "(see <code>validation/&lt;step&gt;.jsonl</code>).</p>"
        )
    return f"{search}\n{note}\n" + "\n".join(blocks)


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


def _check_output(output: Path) -> None:
    if output.is_dir():
        raise ReportError(f"--output {output} is a directory; give the path of the HTML file to write")
    if output.exists() and not is_report(output):
        raise ReportError(
            f"{output} exists and is not a report written by `verl report`; refusing to overwrite it "
            "(remove it, or give another path with -o/--output)"
        )


def build_report(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> Path:
    """Write the HTML report of ``run_dir`` to ``output`` (default ``<run_dir>/report.html``) and return its
    path. A file already there is replaced only when it is an earlier report; anything else is refused."""
    data = load_run(run_dir, max_rows=MAX_ROWS_PER_STEP)
    out = Path(output).expanduser() if output is not None else data.run_dir / DEFAULT_NAME
    _check_output(out)
    # Atomic: a browser reloading the page, or a second `verl report`, never sees half a file.
    atomic_write_bytes(out, render_report(data, out).encode("utf-8"), readable=True)
    return out
