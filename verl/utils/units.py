"""Byte sizes written for people: the one formatter the data-flow log, ``verl doctor`` and the report share."""

from __future__ import annotations

MiB, GiB = 1 << 20, 1 << 30


def fmt_bytes(n: float) -> str:
    """``12.3 GiB`` / ``456.0 MiB`` / ``7.8 KiB`` / ``789 B``."""
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    if abs(n) >= MiB:
        return f"{n / MiB:.1f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{int(n)} B"
