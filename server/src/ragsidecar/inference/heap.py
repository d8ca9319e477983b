"""Hands memory freed by unloaded models back to the operating system.

glibc keeps freed blocks in its per-thread arenas for reuse: a swapped-out onnxruntime session (its
weights, arena and the buffers its worker threads allocated) left tens of MiB of resident memory
behind on every reload, so RSS grew with each hot swap. Two settings stop that (bench/reload.py):

- a fixed mmap threshold: glibc otherwise raises it to the size of each large block freed, after which
  blocks of many MiB (session weights, onnxruntime's arena chunks) come from the heap, where freed
  ones fragment it instead of going back to the system. Blocks over the threshold are mapped and
  unmapped on their own; inference time is unchanged (onnxruntime's arena reuses its chunks);
- malloc_trim after a model is unloaded, which returns the free pages of every arena; and whenever resident
  memory has grown by TRIM_GROWTH_BYTES since the last trim: a request of up to 64 MiB (max_message_bytes) is
  parsed into blocks that are freed once it is answered, but stay resident in the arenas otherwise. That trim
  follows a full garbage collection: a refused call's AbortError stays in a reference cycle with the frames that
  held its request, so only a full collection, which may not come for a long while, frees the request.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os

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
    _trim_heap()


def _trim_heap() -> None:
    """Returns the free pages of every arena to the system. Blocking, though not holding the GIL (a ctypes call)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


# How far resident memory may grow past its size after the last trim before the heap is trimmed again, and how
# often that is looked at: trims stay rare while memory in use (indexes, caches) grows.
TRIM_GROWTH_BYTES = 64 * 1024 * 1024
_TRIM_CHECK_S = 2.0
# Trims that left memory high are retried this many times, each after twice the wait, before that memory counts as
# in use (about two minutes).
_TRIM_RETRIES = 5


async def trim_as_memory_grows() -> None:
    """Runs until cancelled: collects and trims the C heap, off the event loop, whenever resident memory has grown
    by TRIM_GROWTH_BYTES since the last trim (reading the size costs the same whatever it is). The collection holds
    the GIL while it runs, but runs only after such growth.

    A trim that runs while large requests are still being answered cannot give their memory back; once they end,
    that memory stays resident without growing further, so no later growth would trim it. A trim that leaves
    memory high is therefore retried, each time after twice the wait, until memory comes down or _TRIM_RETRIES
    retries have not moved it: then it is memory in use (an index loaded, a cache filled) and the new floor. A trim
    that gives memory back keeps the lower floor, so what a trim in the middle of a burst left cannot raise it."""
    floor, retries = _resident_bytes(), 0
    while _LIBC is not None and floor:
        await asyncio.sleep(_TRIM_CHECK_S * 2**retries)
        if _resident_bytes() <= floor + TRIM_GROWTH_BYTES:
            retries = 0
            continue
        await asyncio.to_thread(release_free_memory)
        resident = _resident_bytes()
        if resident <= floor + TRIM_GROWTH_BYTES:  # given back: the floor never creeps up on what a trim left
            floor, retries = min(floor, resident), 0
        elif retries < _TRIM_RETRIES:
            retries += 1
        else:
            floor, retries = resident, 0


def _resident_bytes() -> int:
    """This process's resident memory (0 where /proc has no statm: nothing to watch)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
