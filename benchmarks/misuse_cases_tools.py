"""The hung-tools, parser and chat-rows groups of the hostile-user round (``benchmarks/misuse_round.py``): tools that hang or exit, model output the tool-call parser must survive, and chat rows that inject roles."""

from __future__ import annotations

from benchmarks.misuse_round import Case


def tool_cases() -> list[Case]:
    return []
