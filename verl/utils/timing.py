"""Wall-clock timers that write verl's ``timing_s/<name>`` metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def marked_timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    """Add the seconds spent in the block to ``timing[name]`` (blocks of the same name accumulate)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start
