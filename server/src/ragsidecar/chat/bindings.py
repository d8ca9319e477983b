"""Chat bindings: an owner's live corpus of one source name, held in server memory for one tenant and session.

A binding's corpus is a partition of the catalog's in-memory binding store keyed by (tenant, session,
binding id), indexed by the catalog's MEMORY path (incrementally: only new chunks are embedded). Only its
owner, in its tenant and session, presenting its handle, may use it.

The handle stands in for the host's reference identity of the owner (a Java binding is authorised by the
owner object it holds, which no other caller can name). It is a secret of 256 random bits returned once by
OpenBinding; the binding id, which is logged and echoed in error details, is not enough to use a binding.
Handles are compared in constant time, never logged (`repr=False`) and never put in an error.

Open bindings are bounded (count, least recently used closed first) and closed after an idle time, so a
host that forgets to close them cannot grow the server without limit; both are counted in metrics.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ragsidecar import metrics
from ragsidecar.errors import ErrorKind, SidecarError
from ragsidecar.knowledge.catalog import Catalog
from ragsidecar.knowledge.declarations import Entry, Scope, SourceType, Use
from ragsidecar.knowledge.memory import MemoryDocument, UpsertOutcome

# Random bytes of a binding id (not a secret) and of a handle (the secret).
_ID_BYTES, _HANDLE_BYTES = 18, 32


@dataclass(frozen=True)
class Binding:
    id: str
    owner_id: str
    scope: Scope
    source: str
    top_k: int
    declared: bool
    handle: str = field(default="", repr=False, compare=False)

    @property
    def entry(self) -> Entry:
        """The binding as a SEARCH source; hits name it by id until the turn renames them to `source`."""
        return Entry(self.id, SourceType.BINDING, Use.SEARCH, top_k=self.top_k)


class Bindings:
    """The open bindings, least recently used first. Ids are minted here (random, unique), so a plain id is
    an unambiguous key: no caller-supplied part goes into it."""

    def __init__(self, catalog: Catalog, max_open: int, idle_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._catalog = catalog
        self._store = catalog.bindings
        self._max_open, self._idle_seconds, self._clock = max_open, idle_seconds, clock
        self._open: OrderedDict[str, Binding] = OrderedDict()
        self._used: dict[str, float] = {}

    async def open(self, owner_id: str, scope: Scope, source: str, top_k: int, declared: bool) -> Binding:
        await self._close_idle()
        while len(self._open) >= self._max_open:
            await self._release(next(iter(self._open)), "lru")
        binding = Binding(secrets.token_urlsafe(_ID_BYTES), owner_id, scope, source, top_k, declared,
                          secrets.token_urlsafe(_HANDLE_BYTES))
        self._open[binding.id] = binding
        self._touch(binding.id)
        metrics.OPEN_BINDINGS.set(len(self._open))
        return binding

    async def get(self, binding_id: str, owner_id: str, scope: Scope | None, handle: str) -> Binding:
        """The open binding, if the handle is its own, `owner_id` owns it and (when given) `scope` is its
        tenant and session; a use makes it the most recently used."""
        await self._close_idle()
        binding = self._open.get(binding_id)
        if binding is None:
            raise SidecarError(ErrorKind.NOT_FOUND, "UNKNOWN_BINDING", f"binding {binding_id!r} is not open",
                               metadata={"binding_id": binding_id})
        _authorize(binding, owner_id, scope, handle)
        self._touch(binding_id)
        return binding

    def is_open(self, binding: Binding) -> bool:
        return self._open.get(binding.id) is binding

    async def append(self, binding: Binding, documents: list[MemoryDocument]) -> UpsertOutcome:
        outcome = await self._store.upsert(binding.scope, binding.id, documents)
        if not self.is_open(binding):  # closed while this append waited: leave nothing behind
            await self._store.drop(binding.scope, binding.id)
        return outcome

    async def invalidate(self, binding: Binding, reset: bool) -> int:
        if reset:
            await self._store.clear(binding.scope, binding.id)
        self._catalog.forget(binding.entry, binding.scope)
        return self._store.count(binding.scope, binding.id)

    async def close(self, binding_id: str, owner_id: str, scope: Scope, handle: str) -> bool:
        """Releases an open binding; an id that is not open is already closed (False)."""
        binding = self._open.get(binding_id)
        if binding is None:
            return False
        _authorize(binding, owner_id, scope, handle)
        await self._release(binding_id, "closed")
        return True

    def _touch(self, binding_id: str) -> None:
        self._open.move_to_end(binding_id)
        self._used[binding_id] = self._clock()

    async def _close_idle(self) -> None:
        """Closes bindings unused for the idle time: the oldest uses come first, so this stops at the first
        binding still in use (the cost is the number closed)."""
        oldest_allowed = self._clock() - self._idle_seconds
        while self._open:
            binding_id = next(iter(self._open))
            if self._used[binding_id] > oldest_allowed:
                break
            await self._release(binding_id, "idle")

    async def _release(self, binding_id: str, why: str) -> None:
        binding = self._open.pop(binding_id)
        del self._used[binding_id]
        metrics.OPEN_BINDINGS.set(len(self._open))
        metrics.CLOSED_BINDINGS.labels(why).inc()
        self._catalog.forget(binding.entry, binding.scope)
        await self._store.drop(binding.scope, binding.id)


def _authorize(binding: Binding, owner_id: str, scope: Scope | None, handle: str) -> None:
    # Compared as bytes: compare_digest refuses non-ASCII str, and a caller may send any text.
    right_handle = hmac.compare_digest(handle.encode("utf-8", "surrogatepass"), binding.handle.encode())
    if not right_handle or binding.owner_id != owner_id or (scope is not None and scope != binding.scope):
        raise SidecarError(ErrorKind.PERMISSION_DENIED, "PERMISSION_DENIED",
                           f"binding {binding.id!r} is not usable with this handle, owner, tenant and session")
