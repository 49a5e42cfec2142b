"""The report's timing section (:mod:`verl.report.page`): the ``timing_s/`` metrics split into the phases of
every step and the occasional ones (:func:`timing_breakdown`), drawn as a stacked figure and summed in a table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from verl.report.data import Series
from verl.report.markup import Figures, _figure, _missing, esc

TIMING_PREFIX = "timing_s/"
TIMING_TOTAL = "timing_s/step"


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
