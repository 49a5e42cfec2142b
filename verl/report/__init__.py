"""``verl report RUN_DIR``: one self-contained HTML page about a run (curves, timing, validation samples,
config), readable offline. See docs/report.md.

The names are imported lazily, so ``verl``'s argument parser can import :mod:`verl.report.cli` without
loading matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_report": "verl.report.page",
    "render_report": "verl.report.page",
    "is_report": "verl.report.page",
    "load_run": "verl.report.data",
    "read_metrics": "verl.report.data",
    "read_validation": "verl.report.data",
    "ReportError": "verl.report.data",
    "RunData": "verl.report.data",
    "Series": "verl.report.data",
    "MetricsLog": "verl.report.data",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'verl.report' has no attribute {name!r}")
