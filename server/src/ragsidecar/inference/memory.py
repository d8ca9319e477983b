"""Hands memory freed by unloaded models back to the operating system.

glibc keeps freed blocks in its per-thread arenas for reuse: a swapped-out onnxruntime session (its
weights, arena and the buffers its worker threads allocated) left tens of MiB of resident memory
behind on every reload, so RSS grew with each hot swap. Two settings stop that (bench/reload.py):

- a fixed mmap threshold: glibc otherwise raises it to the size of each large block freed, after which
  blocks of many MiB (session weights, onnxruntime's arena chunks) come from the heap, where freed
  ones fragment it instead of going back to the system. Blocks over the threshold are mapped and
  unmapped on their own; inference time is unchanged (onnxruntime's arena reuses its chunks);
- malloc_trim after a model is unloaded, which returns the free pages of every arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)


# mallopt's parameter number for the mmap threshold, and the threshold: blocks this large or larger are mapped.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1024 * 1024


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


_LIBC = _glibc()  # None where the C library is not glibc (musl, macOS): nothing to tune


def fix_mmap_threshold() -> None:
    """Maps every block of MMAP_THRESHOLD_BYTES or more on its own, for good (call before models load)."""
    if _LIBC is not None and not _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        log.warning("mallopt(M_MMAP_THRESHOLD) failed; memory may grow across model reloads")


def release_free_memory() -> None:
    """Collects unreachable cycles, then trims the C heap. Blocking: call it off the event loop."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
