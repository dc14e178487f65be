"""``release_freed_memory`` returns freed heap memory to the OS (measured in /proc RSS)."""

from __future__ import annotations

import ctypes
import sys

import pytest

from agentrl_jax.training.runtime.hostmem import _libc, release_freed_memory


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux") or _libc() is None,
                    reason="needs glibc's malloc_trim and /proc")
def test_freed_heap_memory_goes_back_to_the_os():
    libc = _libc()
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 2048  # below glibc's mmap threshold: chunks of the heap
    blocks = [libc.malloc(size) for _ in range(count)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, size)  # touched: resident
    # free every other block: the free chunks sit between live ones, so glibc cannot shrink
    # the heap's top and keeps them resident (~64 MB) until malloc_trim
    for b in blocks[::2]:
        libc.free(b)
    before = _rss_bytes()
    assert release_freed_memory()
    released = before - _rss_bytes()
    for b in blocks[1::2]:
        libc.free(b)
    assert released > 0.5 * (count // 2) * size, f"released only {released / 1e6:.1f} MB"
