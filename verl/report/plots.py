"""matplotlib figures of a run's metrics, each returned as an inline SVG string.

SVG keeps the page one offline file with no JavaScript for drawing; text stays text
(``svg.fonttype = none``) and long lines are thinned to a few hundred points, so a figure is a few tens of KB.
"""

from __future__ import annotations

import io
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from verl.report.data import Series

FIGSIZE = (5.0, 2.6)
"""inches; a figure is scaled to its grid cell by the page's CSS"""
SMALL_FIGSIZE = (3.6, 1.9)
WIDE_FIGSIZE = (10.0, 3.0)
MAX_POINTS = 600
"""points per line in the main figures (more are thinned, keeping each bucket's extremes)"""
SMALL_MAX_POINTS = 240
MARKERS_BELOW = 40
"""lines with fewer points than this are drawn with markers (validation, occasional phases)"""
OTHER_COLOR = "#c7c7c7"
"""the "other" band of the timing figure: the part of a step no phase accounts for"""
SMOOTH_ABOVE = 60
"""lines with more points than this are drawn faint, with their moving average on top"""

STYLE = {
    "svg.fonttype": "none",  # text as <text>, not glyph outlines: smaller and searchable
    "text.parse_math": False,  # a "$" in a metric key or data source is text, not TeX
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],  # matplotlib's own font, so its layout matches; one name per <text>
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.2,
    "legend.frameon": False,
    "axes.formatter.limits": (-3, 5),  # 1e-4 as "1e-4" above the axis, not "0.000100" on every tick
}


@dataclass(frozen=True)
class Line:
    """One line of a figure: a label and a series."""

    label: str
    series: Series


def thin(steps: Sequence[float], values: Sequence[float], max_points: int) -> tuple[list, list]:
    """At most about ``max_points`` points: each of ``max_points // 2`` buckets keeps its lowest and highest
    value (in step order), so spikes survive where every n-th point would drop them."""
    n = len(steps)
    if n <= max_points:
        return list(steps), list(values)
    buckets = max(1, max_points // 2)
    xs: list[float] = []
    ys: list[float] = []
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        idx = [i for i in range(lo, hi) if math.isfinite(values[i])]
        if not idx:
            xs.append(steps[lo])
            ys.append(math.nan)  # keep the gap
            continue
        i_min = min(idx, key=lambda i: values[i])
        i_max = max(idx, key=lambda i: values[i])
        for i in sorted({i_min, i_max}):
            xs.append(steps[i])
            ys.append(values[i])
    return xs, ys


def smoothing_window(n: int) -> int:
    """Steps in the moving average of a line of ``n`` points (0: drawn as it is)."""
    return max(5, n // 40) if n > SMOOTH_ABOVE else 0


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """The mean of each point's ``window`` neighbours (centred, fewer at the ends), ignoring nan."""
    v = np.asarray(values, dtype=float)
    ok = np.isfinite(v)
    kernel = np.ones(window)
    sums = np.convolve(np.where(ok, v, 0.0), kernel, mode="same")
    counts = np.convolve(ok.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return list(np.where(counts > 0, sums / counts, np.nan))


def _drawable(values: Sequence[float]) -> list[float]:
    """Infinite values as gaps (nan): matplotlib would otherwise stretch the axis to them."""
    return [v if math.isfinite(v) else math.nan for v in values]


def to_svg(fig: Figure, salt: str) -> str:
    """The figure as an ``<svg>`` element for inlining: no XML prolog, no metadata, and no fixed size (the
    page's CSS sizes it from its viewBox). ``salt`` makes its internal ids unique within the page and the
    output the same for the same data."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, count=1, flags=re.S)
    text = re.sub(r'(<svg[^>]*?) width="[^"]*" height="[^"]*"', r"\1", text, count=1)
    # Coordinates to 0.1 pt (the figure is a few hundred pt wide), in attribute values only: never in text.
    text = _ATTRIBUTE.sub(lambda m: _DECIMALS.sub(r"\1", m.group(0)), text)
    return re.sub(r"\s*\n\s*", "\n", text).strip()


_ATTRIBUTE = re.compile(r'="[^"]*"')
_DECIMALS = re.compile(r"(\d\.\d)\d+")


def _figure(figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """A figure of its own, not pyplot's: no GUI backend is touched and no global state kept (the SVG
    backend draws it on ``savefig``), so the caller's matplotlib setup is left as it is. The small ones of
    "all metrics" have fixed margins: the layout engine would double their drawing time."""
    if figsize == SMALL_FIGSIZE:
        fig = Figure(figsize=figsize)
        fig.subplots_adjust(left=0.16, right=0.97, bottom=0.2, top=0.8)
    else:
        fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots()


def _finish(ax: Axes, title: str, ylabel: str, xlabel: str = "step") -> None:
    if title:
        ax.set_title(title, loc="left")
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))


def line_plot(
    lines: Sequence[Line],
    title: str,
    ylabel: str = "",
    salt: str = "fig",
    band: tuple[Series, Series] | None = None,
    small: bool = False,
    percent: bool = False,
    legend: bool | None = None,
) -> str:
    """A line per series, optionally a shaded min..max ``band`` under the first; ``percent`` shows values in
    0..1 as percentages. A line of few points gets markers; a long one is drawn faint with its moving
    average (:func:`smoothing_window`) on top, so the trend shows through step-to-step noise."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(SMALL_FIGSIZE if small else FIGSIZE)
        limit = SMALL_MAX_POINTS if small else MAX_POINTS
        if band is not None:
            _draw_band(ax, band, limit)
        for line in lines:
            values = _drawable(line.series.values)
            window = smoothing_window(len(values))
            if window:
                (raw,) = ax.plot(*thin(line.series.steps, values, limit), alpha=0.3, linewidth=0.7)
                smooth = moving_average(values, window)
                ax.plot(*thin(line.series.steps, smooth, limit), color=raw.get_color(), label=line.label)
            else:
                marker = "o" if len(values) < MARKERS_BELOW else None
                ax.plot(line.series.steps, values, label=line.label, marker=marker, markersize=3)
        if percent:
            ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        _finish(ax, "" if small else title, ylabel)
        if small:  # above the axes' offset text ("1e-4"), which an axes title would dodge off the figure
            fig.text(0.02, 0.97, title, ha="left", va="top", fontsize=8)
        if legend or (legend is None and (len(lines) > 1 or band is not None)):
            ax.legend(loc="best")
        return to_svg(fig, salt)


def _draw_band(ax: Axes, band: tuple[Series, Series], limit: int) -> None:
    low, high = band
    common = sorted(set(low.steps) & set(high.steps))
    lo_map, hi_map = dict(low.items()), dict(high.items())
    lo = _drawable([lo_map[s] for s in common])
    hi = _drawable([hi_map[s] for s in common])
    if len(common) > limit:  # one bucket's lowest min and highest max, so the band keeps its extremes
        size = math.ceil(len(common) / limit)
        common = common[::size]
        with warnings.catch_warnings():  # a bucket of nan only stays nan (a gap)
            warnings.simplefilter("ignore", RuntimeWarning)
            lo = [np.nanmin(lo[i : i + size]) for i in range(0, len(lo), size)]
            hi = [np.nanmax(hi[i : i + size]) for i in range(0, len(hi), size)]
    ax.fill_between(common, lo, hi, alpha=0.15, linewidth=0, label="min..max", step="mid")


def _bin_means(steps: list[int], columns: dict[str, list[float]], max_points: int):
    """Average each column over consecutive bins of steps, so a stacked area of 1,000s of steps stays small."""
    n = len(steps)
    if n <= max_points:
        return steps, columns, 1
    size = math.ceil(n / max_points)
    starts = range(0, n, size)
    binned_steps = [steps[i] for i in starts]
    binned = {k: [sum(v[i : i + size]) / len(v[i : i + size]) for i in starts] for k, v in columns.items()}
    return binned_steps, binned, size


def stacked_timing_plot(
    steps: list[int], phases: dict[str, list[float]], total: list[float], salt: str = "timing"
) -> tuple[str, int]:
    """Seconds per step, one stacked band per phase (in the given order, bottom first), with the step's
    total as a line on top. Returns the SVG and the number of steps averaged per point (1 when none)."""
    with matplotlib.rc_context(STYLE):
        fig, ax = _figure(WIDE_FIGSIZE)
        xs, binned, size = _bin_means(steps, {**phases, "__total__": total}, MAX_POINTS // 2)
        total_binned = binned.pop("__total__")
        palette = matplotlib.colormaps["tab10" if len(binned) <= 10 else "tab20"].colors
        colors = [
            OTHER_COLOR if name == "other" else palette[i % len(palette)] for i, name in enumerate(binned)
        ]
        ax.stackplot(
            xs,
            *binned.values(),
            labels=list(binned),
            colors=colors,
            step="mid" if len(xs) < MARKERS_BELOW else None,
            linewidth=0,
        )
        ax.plot(xs, total_binned, color="black", linewidth=0.8, label="step (total)")
        _finish(
            ax, "Time per step by phase" + (f" (mean of {size} steps per point)" if size > 1 else ""), "s"
        )
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if len(binned) < 12 else 2)
        return to_svg(fig, salt), size
