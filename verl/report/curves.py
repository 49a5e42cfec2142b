"""The report's figures of named metrics (:mod:`verl.report.page`): which training and throughput / memory
metrics are drawn together (:class:`PlotSpec`), the validation curves per data source (``val-core/...``), and a
small figure for every other logged metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verl.report.data import Series
from verl.report.markup import Figures, _figure, _missing, _non_finite_note, esc


@dataclass(frozen=True)
class PlotSpec:
    """A figure of named metrics: drawn when at least one of its keys was logged."""

    title: str
    ylabel: str
    keys: tuple[tuple[str, str], ...]
    """(metric key, legend label)"""
    band: tuple[str, str] | None = None
    """(min key, max key) shaded around the first line"""
    optional: bool = False
    """only some runs log it (on-policy distillation): not named among the curves not recorded"""


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
    PlotSpec(
        "Distillation loss (to the teacher)",
        "",
        (("actor/distillation/loss", "distillation loss"),),
        band=("actor/distillation/loss_min", "actor/distillation/loss_max"),
        optional=True,
    ),
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
        elif not spec.optional:
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
