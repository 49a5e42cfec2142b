"""Giving the C heap's free pages back to the system (glibc's ``malloc_trim``).

PyTorch frees CPU tensors to malloc. With batch shapes that change every step (the responses' lengths),
glibc's arenas fragment: the freed pages between live blocks stay resident, and a long run's RSS creeps up
(benchmarks/README.md, "Memory over a long run"). ``malloc_trim(0)`` hands every free page back, those
inside the heap too. It walks the whole heap and the pages are faulted in again when reused, so the trainer
calls it every :data:`TRIM_EVERY_STEPS` steps, not every step, and a worker after each call that ran at least
:data:`TRIM_AFTER_CALL_S` (`trim_after_long_call`): a generation or an update of a real model frees hundreds of
megabytes of activations, KV cache and packed weights, and without the trim the next phase piles its own on
top of those pages (SmolLM2's recipe: 5.65 GB peak over 60 steps without, docs/performance.md).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

__all__ = ["TRIM_AFTER_CALL_S", "TRIM_EVERY_STEPS", "release_free_heap", "trim_after_long_call"]

TRIM_EVERY_STEPS = 50
"""How often the trainer trims the driver's heap: from step 1000 to 2000 of the default recipe RSS grew +5.1%
without it and +2.9% with it (fitted slopes), for an estimated 1 ms per step (a trim after every step cost
some 60 ms; not measured side by side)."""

TRIM_AFTER_CALL_S = 1.0
"""A worker call at least this long is followed by a trim: its cost (tens of milliseconds, plus faulting the
pages in again) stays a few percent of the call; the tiny model's calls, far shorter, are left alone."""


@functools.cache
def _malloc_trim() -> Any:
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator returns memory its own way
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Return the C heap's free pages to the system; False where the C library has no ``malloc_trim``."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def trim_after_long_call(seconds: float) -> bool:
    """After a worker call that took ``seconds``: trim the heap when the call was long enough
    (:data:`TRIM_AFTER_CALL_S`); whether it did."""
    return seconds >= TRIM_AFTER_CALL_S and release_free_heap()
