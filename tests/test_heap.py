"""The C heap's statistics (harness/run/heap.py) against allocations whose size is known."""

from __future__ import annotations

import ctypes

import pytest

from harness.run.heap import HeapStats, TimeBudget

MiB = 2**20

heap = HeapStats()
pytestmark = pytest.mark.skipif(not heap.available, reason="no glibc mallinfo2 here")


def test_a_large_allocation_is_in_use_until_freed() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = heap.read()["heap_in_use_bytes"]
    p = libc.malloc(64 * MiB)  # above malloc's mmap threshold (32 MiB at most): mapped on its own
    try:
        held = heap.read()["heap_in_use_bytes"]
    finally:
        libc.free(p)
    after = heap.read()["heap_in_use_bytes"]
    assert held - before >= 64 * MiB
    assert held - after >= 64 * MiB


def test_small_frees_stay_in_the_heap_as_free_bytes() -> None:
    # 200 chunks of 64 KiB, far below the mmap threshold: they come from an arena, and freed
    # (all but the last, so the arena's top is not trimmed away) they stay there as free bytes
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(64 * 1024) for _ in range(200)]
    ctypes.memset(chunks[0], 1, 64 * 1024)
    in_use = heap.read()
    for p in chunks[:-1]:
        libc.free(p)
    freed = heap.read()
    libc.free(chunks[-1])
    assert in_use["heap_in_use_bytes"] - freed["heap_in_use_bytes"] >= 199 * 64 * 1024
    assert freed["heap_free_bytes"] - in_use["heap_free_bytes"] >= 199 * 64 * 1024


def test_a_tensor_is_heap_in_use() -> None:
    torch = pytest.importorskip("torch")
    before = heap.read()["heap_in_use_bytes"]
    t = torch.ones(4 * MiB // 4, dtype=torch.float32)
    assert heap.read()["heap_in_use_bytes"] - before >= 4 * MiB
    del t


def test_a_time_budget_keeps_reads_within_its_share_of_the_time() -> None:
    # a share so small that the next read is due only after a minute: one read, then nothing
    rare = TimeBudget(share=1e-9)
    assert rare.due()
    rare.spent()
    assert not rare.due() and not rare.due()
    # a share of 1: due again as soon as the read's own time has passed
    every = TimeBudget(share=1.0)
    for _ in range(3):
        assert every.due()
        every.spent()
