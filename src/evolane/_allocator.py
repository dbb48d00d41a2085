"""The process's allocator policy: a fixed glibc mmap threshold (what the CLI sets).

glibc serves a request of at least the mmap threshold (128 KiB at start) with its own
mapping, returned to the kernel when freed. Its threshold is dynamic: freeing a mapped chunk
raises it to that chunk's size (up to 32 MiB). After a large measurement has freed one
multi-megabyte buffer (a dataset file read whole, a dict table, a numpy column), every later
allocation below that size comes from the heap, and what is freed in the middle of the heap
stays resident. At 100,000 cases that kept ~15-20 MiB of freed memory in RSS. A fixed
threshold turns the dynamic one off (mallopt(3)).
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 128 * 1024
"""glibc's own starting threshold, kept fixed."""

_M_MMAP_THRESHOLD = -3  # <malloc.h>


def operator_set_threshold() -> bool:
    """Whether the environment already sets glibc's mmap threshold (``MALLOC_MMAP_THRESHOLD_``
    or the ``glibc.malloc.mmap_threshold`` tunable): an operator's choice is left alone."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return "MALLOC_MMAP_THRESHOLD_" in os.environ or "malloc.mmap_threshold" in tunables


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this whole process, so freed
    large buffers go back to the kernel rather than raising the bar for later ones. True
    when set; False where the environment sets the threshold already
    (`operator_set_threshold`), where the C library has no working ``mallopt`` (musl's
    refuses, macOS and Windows have none), or where it refuses the value.

    Process-wide: the CLI calls it for itself; a host embedding evolane decides for its own
    process (nothing in the runtime calls it)."""
    if not 0 < threshold <= 32 * 1024 * 1024:  # glibc's HEAP_MAX / 2 on 64-bit
        raise ValueError(f"mmap threshold must be in (0, 32 MiB], got {threshold}")
    if operator_set_threshold():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # TypeError: no CDLL(None) on Windows
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
