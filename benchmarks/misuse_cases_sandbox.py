"""The sandbox group of the hostile-user round (``benchmarks/misuse_round.py``): code a model writes for the python tool trying to leave its sandbox, as root and as an ordinary user."""

from __future__ import annotations

from benchmarks.misuse_round import Case


def sandbox_cases() -> list[Case]:
    return []
