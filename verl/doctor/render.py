"""``verl doctor``'s report as aligned plain text (colour only on a terminal) or as JSON (``--json``)."""

from __future__ import annotations

import os
import sys
from typing import Any

from verl.doctor.environment import ABSENT, CLASH, MISSING, OK, TOO_OLD, UNTESTED
from verl.doctor.memory_advice import PHASE_NAMES
from verl.doctor.memory_terms import ACCURACY
from verl.doctor.report import Report
from verl.utils.cpu import CPU_FEATURES
from verl.utils.units import fmt_bytes

COLOURS = {OK: "32", UNTESTED: "33", TOO_OLD: "31", CLASH: "31", MISSING: "31", "fits": "32", "FAIL": "31"}


def use_colour(stream: Any = None) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set."""
    stream = stream or sys.stdout
    return hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")


def _paint(text: str, key: str, colour: bool) -> str:
    code = COLOURS.get(key)
    return f"\033[{code}m{text}\033[0m" if colour and code else text


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _environment_lines(report: Report, colour: bool) -> list[str]:
    rows = [["package", "installed", "required / tested", "status"]]
    notes = []
    for row in report.packages:
        wanted = row.wanted + (f" (for {row.feature})" if row.feature else "")
        rows.append([row.name, row.installed or "-", wanted, row.status])
        if row.status not in (OK, ABSENT) and row.advice:
            notes.append(f"    {row.name}: {row.advice}")
    lines = _table(rows)
    for i, row in enumerate(report.packages, start=1):  # colour after aligning
        lines[i] = lines[i][: lines[i].rfind(row.status)] + _paint(row.status, row.status, colour)
    return lines + notes


def _machine_lines(report: Report) -> list[str]:
    m = report.machine
    quota = f", cgroup CPU quota {m.cpu_quota:g}" if m.cpu_quota else ""
    lines = [["cpu", f"{m.cpu.model}; {m.cores} cores usable (sched_getaffinity){quota}"]]
    for flag, meaning in CPU_FEATURES.items():
        lines.append(["", f"{flag:<12} {'yes' if flag in m.cpu.flags else 'no ':<3}  {meaning}"])
    mem = m.memory
    limit = f", cgroup limit {fmt_bytes(mem.cgroup_limit)}" if mem.cgroup_limit else ""
    lines.append(
        ["memory", f"{fmt_bytes(mem.total)} total, {fmt_bytes(mem.available)} available{limit}; "
         f"{fmt_bytes(m.ram_for_run)} for a run (with doctor's own {fmt_bytes(m.doctor_rss)} back)"]
    )  # fmt: skip
    if m.gpus:
        groups: dict[tuple[str, int, int], list[int]] = {}
        for gpu in m.gpus:  # identical GPUs on one line
            groups.setdefault((gpu.name, gpu.total, gpu.free), []).append(gpu.index)
        for (name, total, free), indices in groups.items():
            contiguous = indices == list(range(indices[0], indices[-1] + 1))
            which = (
                ",".join(map(str, indices))
                if len(indices) < 3 or not contiguous
                else f"{indices[0]}-{indices[-1]}"
            )
            lines.append(["gpu", f"{which}: {name}, {fmt_bytes(total)} ({fmt_bytes(free)} free)"])
    else:
        lines.append(["gpu", "none visible (torch.cuda)"])
    asked = report.device_setting
    lines.append(
        ["training on", report.device + (f" (trainer.device={asked})" if asked != report.device else "")]
    )
    for what, where, free in report.disks:
        text = where if what == "checkpoint size" else f"{where}: {fmt_bytes(free)} free"
        lines.append(["disk", f"{what}: {text}"])
    return _table(lines)


def _estimate_lines(report: Report, colour: bool) -> list[str]:
    if report.estimate is None:
        return [f"  unavailable: {report.estimate_unavailable}"]
    est = report.estimate
    lines = [f"  {line}" for line in report.models]
    lines.append(f"  an estimate, +-{ACCURACY:.0%} (docs/doctor.md compares it with a measured run)")
    for device in est.devices():
        where = "per GPU (one rank)" if device == "gpu" else (
            "CPU memory" + (f" of the node ({est.ranks_per_node} ranks)" if est.ranks_per_node > 1 else "")
        )  # fmt: skip
        terms = [t for t in est.terms if t.device == device]
        if not terms:
            continue
        lines.append(f"  {where}:")
        rows = [["role", "what", "size", "held", "how"]]
        for t in terms:
            held = "always" if t.phases is None else ", ".join(sorted(t.phases))
            count = est.ranks_per_node if t.per_rank and device == "cpu" and est.ranks_per_node > 1 else 1
            size = fmt_bytes(t.bytes * count) + (f" ({count} ranks)" if count > 1 else "")
            rows.append([t.role, t.what, size, held, t.formula])
        lines += _table(rows, "    ")
        phases = [f"{PHASE_NAMES.get(p, p)} {fmt_bytes(est.in_phase(device, p))}" for p in est.phases]
        lines.append(f"    by phase: {'; '.join(phases)}")
    for v in report.verdicts:
        where = "per GPU" if v.device == "gpu" else "CPU memory"
        head = f"  peak {where}: {fmt_bytes(v.need)} ({PHASE_NAMES.get(v.phase, v.phase)})"
        if v.have is None:
            why = "not compared: --gpu-memory plans for another machine" if report.planned else "no GPU here"
            lines.append(f"{head}; {why}")
        elif v.fits:
            note = ", within the margin: it may not fit" if v.tight else ""
            verdict = _paint("fits", "fits", colour)
            lines.append(
                f"{head} of {fmt_bytes(v.have)} available: {verdict}, {fmt_bytes(v.have - v.need)} headroom{note}"
            )
        else:
            lines.append(
                f"{head} of {fmt_bytes(v.have)} available: {_paint('does not fit', 'FAIL', colour)}, "
                f"{fmt_bytes(v.need - v.have)} short"
            )
    if report.knobs:
        lines.append("  to fit:")
        lines += [f"    - {knob}" for knob in report.knobs]
    return lines


def render_text(report: Report, colour: bool = False) -> str:
    """The report as aligned plain text (colour only when asked)."""
    out = ["verl doctor", ""]
    out += [f"  {line}" for line in report.recipe]
    if report.notices:
        out.append("  verl settings read with a difference here:")
        out += [f"    - {line}" for line in report.notices]
    out += ["", "environment"] + _environment_lines(report, colour)
    out += ["", "machine"] + _machine_lines(report)
    if report.batches is not None:
        out += ["", "batch arithmetic (per RL step; 'per rank' = one data-parallel worker)"]
        for title, lines in report.batches.sections:
            out.append(f"  {title}")
            out += [f"    {line.text()}" for line in lines]
    out += ["", "memory estimate"] + _estimate_lines(report, colour)
    out.append("")
    if report.warnings:
        out.append("warnings")
        out += [f"  - {w}" for w in report.warnings]
        out.append("")
    if report.failures:
        out.append(_paint(f"cannot run ({len(report.failures)} reason(s)):", "FAIL", colour))
        out += [f"  - {f}" for f in report.failures]
    else:
        out.append(_paint("ok: nothing found that stops this config from running here", "fits", colour))
    return "\n".join(out) + "\n"


def report_json(report: Report) -> dict[str, Any]:
    """The report as plain JSON-able data (``verl doctor --json``)."""
    m = report.machine
    est = report.estimate
    return {
        "exit_code": report.exit_code,
        "recipe": report.recipe,
        "notices": report.notices,
        "packages": [
            {
                "name": r.name,
                "installed": r.installed,
                "wanted": r.wanted,
                "status": r.status,
                "advice": r.advice,
                "feature": r.feature,
                "clashes": [c.describe() for c in r.clashes],
            }
            for r in report.packages
        ],
        "machine": None
        if m is None
        else {
            "cpu": m.cpu.model,
            "cpu_flags": {flag: flag in m.cpu.flags for flag in CPU_FEATURES},
            "cores": m.cores,
            "cpu_quota": m.cpu_quota,
            "memory_total": m.memory.total,
            "memory_available": m.memory.available,
            "cgroup_limit": m.memory.cgroup_limit,
            "ram_for_run": m.ram_for_run,
            "gpus": [{"index": g.index, "name": g.name, "total": g.total, "free": g.free} for g in m.gpus],
            "disks": [{"what": w, "where": p, "free": f} for w, p, f in report.disks],
        },
        "device": report.device,
        "planned_gpus": report.planned,
        "batches": None
        if report.batches is None
        else {
            "dp": report.batches.dp,
            "seq_len": report.batches.seq_len,
            "sections": {
                title: [
                    {"label": x.label, "value": x.value, "formula": x.formula, "note": x.note} for x in lines
                ]
                for title, lines in report.batches.sections
            },
            "passes": {
                name: {"rows": p.rows, "tokens": p.tokens, "head_tokens": p.head_tokens, "grad": p.grad}
                for name, p in report.batches.passes.items()
            },
        },
        "models": report.models,
        "estimate": None
        if est is None
        else {
            "accuracy": ACCURACY,
            "terms": [
                {
                    "role": t.role,
                    "what": t.what,
                    "bytes": t.bytes,
                    "formula": t.formula,
                    "device": t.device,
                    "phases": None if t.phases is None else sorted(t.phases),
                    "per_rank": t.per_rank,
                }
                for t in est.terms
            ],
            "by_phase": {d: {p: est.in_phase(d, p) for p in est.phases} for d in est.devices()},
        },
        "estimate_unavailable": report.estimate_unavailable,
        "verdicts": [
            {"device": v.device, "need": v.need, "phase": v.phase, "have": v.have, "fits": v.fits}
            for v in report.verdicts
        ],
        "knobs": report.knobs,
        "warnings": report.warnings,
        "failures": report.failures,
    }
