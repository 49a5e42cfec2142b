"""release_free_heap: the pages a fragmented C heap holds free go back to the system (glibc)."""

from __future__ import annotations

import ctypes

import pytest

from verl.utils.heap import _malloc_trim, release_free_heap

pytestmark = pytest.mark.skipif(_malloc_trim() is None, reason="not glibc: no malloc_trim")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_the_free_holes_of_a_fragmented_heap_go_back_to_the_system():
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 4096 blocks of 32 KiB (below the mmap threshold: they come from the heap), written so they are resident
    blocks = [libc.malloc(32 * 1024) for _ in range(4096)]
    for block in blocks:
        ctypes.memset(block, 1, 32 * 1024)
    for i, block in enumerate(blocks):  # free 7 of every 8: holes between live blocks, the heap's top kept
        if i % 8 != 7:
            libc.free(block)
    try:
        before = _rss_mb()
        assert release_free_heap()
        released = before - _rss_mb()
        assert released > 60, f"only {released:.0f} MB of the ~112 MB freed went back"  # 7/8 of 128 MB
    finally:
        for block in blocks[7::8]:
            libc.free(block)


def test_only_a_long_worker_call_is_followed_by_a_trim(monkeypatch):
    import verl.utils.heap as heap

    trims = []
    monkeypatch.setattr(heap, "release_free_heap", lambda: trims.append(1) or True)
    assert heap.trim_after_long_call(heap.TRIM_AFTER_CALL_S / 10) is False
    assert trims == []  # a short call (the tiny model's): its freed pages stay for the next call to reuse
    assert heap.trim_after_long_call(heap.TRIM_AFTER_CALL_S) is True
    assert trims == [1]
