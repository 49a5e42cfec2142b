"""Small pieces of the report page's HTML (:mod:`verl.report.page`): escaping and number formatting, a figure
and a section around their content, the "not recorded" line, durations and lists of steps, and the salts that
keep the ids inside one page's SVGs unique.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from verl.report.data import Series


class Figures:
    """Hands out page-unique salts, so the ids inside the SVGs of one page never collide."""

    def __init__(self) -> None:
        self.count = 0

    def salt(self) -> str:
        self.count += 1
        return f"verl-report-{self.count}"


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
    """The caption of a figure that left values out: how many were nan / inf (gaps), and how many were not
    numbers at all (``true``, text, corrupt magnitudes; see the header's data problems)."""
    series = list(series)
    notes = []
    n = sum(s.non_finite for s in series)
    if n:
        notes.append(f"{n} non-finite value{'s' if n != 1 else ''} (nan/inf) not drawn")
    skipped = sum(s.skipped for s in series)
    if skipped:
        notes.append(
            f"{skipped} value{'s' if skipped != 1 else ''} that {'is' if skipped == 1 else 'are'} not a "
            "measurement (true/false, text, beyond float32's range) not drawn"
        )
    return "; ".join(notes)


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
