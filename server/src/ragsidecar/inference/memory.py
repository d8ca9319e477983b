"""Hands memory freed by unloaded models back to the operating system.

glibc keeps freed blocks in its per-thread arenas for reuse: a swapped-out onnxruntime session (its
weights, arena and the buffers its worker threads allocated) left tens of MiB of resident memory
behind on every reload, so RSS grew with each hot swap. malloc_trim returns free pages of every arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)


def _malloc_trim() -> ctypes._CFuncPtr | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Collects unreachable cycles, then trims the C heap. Blocking: call it off the event loop."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
