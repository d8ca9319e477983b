"""The background upkeep of incremental indexes: one daemon thread running each index's `maintain()` (its
compaction once removed chunks outnumber live ones, and the BM25 merges too large to run inside a write), so that
no write and no search waits for them."""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from typing import Protocol

from ragsidecar import metrics

log = logging.getLogger(__name__)


class Maintained(Protocol):
    def maintain(self) -> None: ...


class _Compactor:
    """One background thread keeping up the indexes that asked (each at most once in its queue): compactions
    and large BM25 merges, so that no write and no search waits for them; an index dropped meanwhile is skipped."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[int, weakref.ref[Maintained]]] = queue.SimpleQueue()
        self._queued: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        metrics.INDEX_COMPACTIONS_PENDING.set_function(lambda: len(self._queued))

    def request(self, index: Maintained) -> None:
        with self._lock:
            if id(index) in self._queued:
                return
            self._queued.add(id(index))
            self._queue.put((id(index), weakref.ref(index)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="index-compactor", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            identity, reference = self._queue.get()
            with self._lock:
                self._queued.discard(identity)
            index = reference()
            if index is None:
                continue
            try:
                index.maintain()
            except Exception:  # the index keeps serving as it is; its next change asks again
                log.exception("index upkeep failed")


compactor = _Compactor()
