"""The outputs group of the hostile-user round (``benchmarks/misuse_round.py``): outputs that cannot be written (report, export) and report inputs that would draw wrongly."""

from __future__ import annotations

from benchmarks.misuse_round import Case


def output_cases() -> list[Case]:
    return []
