"""Keep freed CPU memory inside the process, so every step's fresh tensors land in pages already mapped.

A batched step allocates and frees activation-sized tensors (6.5 MB each at 64 MLP clients) by the dozen.
glibc serves allocations above its mmap threshold with fresh mappings and gives freed heap tops back to
the kernel, so the next step faults the same memory in again (with transparent huge pages the kernel
zeroes 2 MB per fault): ~0.7 ms per such tensor, about 5 % of a batched MLP round (``docs/performance.md``).
Raising the mmap threshold to glibc's maximum (32 MiB) and the trim threshold out of reach makes freed
memory stay and be reused. The process's resident size then stays at its high-water mark, which the
engine reaches in its first round anyway. ``CFL_RETAIN_FREED_MEMORY=0`` opts out.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's ceiling on 64-bit systems


@functools.cache
def retain_freed_memory() -> bool:
    """Tune glibc's allocator once per process; False where that is not possible (not glibc) or opted out."""
    if os.environ.get("CFL_RETAIN_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
