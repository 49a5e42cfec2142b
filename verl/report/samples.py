"""The report's validation samples (:mod:`verl.report.page`): a table of prompts, responses, ground truths and
scores per validation step, the newest open, long cells cut, older steps left out past a size budget.
"""

from __future__ import annotations

import json
from typing import Any

from verl.report.data import ValidationStep
from verl.report.markup import _missing, _step_list, esc, fmt

MAX_CELL_CHARS = 2000
SAMPLE_BUDGET_CHARS = 2_000_000
"""text of validation samples on one page; older steps beyond it are listed, not shown"""
SAMPLE_FIELDS = ("input", "output", "gts", "score", "step")


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
