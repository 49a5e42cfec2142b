"""The hostile-checkpoints group of the hostile-user round (``benchmarks/misuse_round.py``): checkpoints that carry code (pickles) or were swapped, resumed or exported."""

from __future__ import annotations

from benchmarks.misuse_round import Case


def hostile_checkpoint_cases() -> list[Case]:
    return []
