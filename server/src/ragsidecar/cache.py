"""A least-recently-used cache bounded by (estimated) bytes rather than entries."""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# Per-entry overhead of the OrderedDict slot, the key tuple and the value object.
_ENTRY_OVERHEAD = 200


class ByteLRU(Generic[K, V]):
    """Thread-safe: the event loop and worker threads (file parsing) share instances."""

    def __init__(self, max_bytes: int) -> None:
        self._lock = threading.Lock()
        self._max_bytes = max_bytes
        self._entries: collections.OrderedDict[K, tuple[V, int]] = collections.OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        """Whether the key is held (its recency unchanged)."""
        with self._lock:
            return key in self._entries

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V, value_bytes: int = 0) -> None:
        """Stores the value, evicting the least recently used entries (this one too) beyond the bound."""
        if self._max_bytes <= 0:
            return
        size = sys.getsizeof(key) + _ENTRY_OVERHEAD + value_bytes
        with self._lock:
            self._replace(key, value, size)
            while self.bytes > self._max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted

    def pop(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self.bytes -= entry[1]
            return entry[0]

    def _replace(self, key: K, value: V, size: int) -> None:
        if key in self._entries:
            self.bytes -= self._entries.pop(key)[1]
        self._entries[key] = (value, size)
        self.bytes += size
