"""glibc's allocator set for a serving process: freed memory kept for reuse, not returned.

A batched decoder allocates and frees buffers of a few MB many times a second: each prefill's
activations, the batch KV cache regrown as rows join and leave, the prompt cache's clones.
glibc's ``malloc`` serves a block above its mmap threshold (128 KB, raised dynamically only
after such a block is freed) with a fresh ``mmap`` and returns it with ``munmap``, and trims
the top of its heap back to the OS above 128 KB free. So the next buffer of the same size
arrives as new pages, and the kernel zeroes each one on first touch: in a burst of distinct
questions through the batched serving path that is a large share of the page faults and system
time, which :func:`keep_freed_memory` removes; the unbatched path barely churns (the
measurements: docs/serving.md, *Starting it*, and docs/benchmarks.md, *Chat UI load*).

Why not a library: jemalloc or tcmalloc would do the same but must be preloaded before the
process starts (``LD_PRELOAD``), which ``python -m rag.serve`` cannot do for its user;
``mallopt`` is glibc's own knob and takes effect at once. Where the C library is not glibc
(musl, macOS) nothing changes.

The cost: the process keeps up to :data:`TRIM_THRESHOLD` of freed memory mapped for reuse (its
resident size stays near its peak, as it would under jemalloc), and blocks up to
:data:`MMAP_THRESHOLD` come from the heap. Called once by the servers at start-up
(``rag.serve``, ``ui.app``, ``benchmarks.serve_load``); a library user's process is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("rag.generate.allocator")

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 * 2**20  # blocks below it come from the heap (glibc's maximum on 64-bit)
TRIM_THRESHOLD = 2**30  # free memory at the heap's top kept rather than given back to the OS
TOP_PAD = 64 * 2**20  # extra memory asked of the OS each time the heap grows
# the mallopt parameter -> value pairs keep_freed_memory sets
SETTINGS = {M_MMAP_THRESHOLD: MMAP_THRESHOLD, M_TRIM_THRESHOLD: TRIM_THRESHOLD, M_TOP_PAD: TOP_PAD}

_done: bool | None = None  # the outcome of the first call


def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc with ``mallopt``, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # glibc alone has gnu_get_libc_version (musl does not)
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def keep_freed_memory(libc: ctypes.CDLL | None = None) -> bool:
    """Set glibc's allocator for a serving process (module docstring); returns whether every
    setting took. Idempotent: later calls return the first outcome. ``libc``: for tests."""
    global _done
    if _done is not None and libc is None:
        return _done
    lib = libc if libc is not None else _glibc()
    ok = lib is not None and all(lib.mallopt(p, v) == 1 for p, v in SETTINGS.items())
    if lib is not None and not ok:
        log.warning("mallopt refused a setting: the allocator keeps its defaults in part")
    if libc is None:
        _done = ok
    return ok
