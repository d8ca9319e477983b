"""Chat bindings: an owner's live corpus of one source name, for one tenant and session.

A binding's corpus is a partition of the catalog's binding store keyed by (tenant, session, binding id),
indexed by the catalog's MEMORY path (incrementally: only new chunks are embedded). Only its owner, in its
tenant and session, presenting its handle, may use it.

The handle stands in for the host's reference identity of the owner (a Java binding is authorised by the
owner object it holds, which no other caller can name). It is a secret of 256 random bits returned once by
OpenBinding; the binding id, which is logged and echoed in error details, is not enough to use a binding.
Only the handle's sha256 is kept (in memory or in the database), compared in constant time with the digest
of the handle presented; a handle is never logged (`repr=False`), stored or put in an error.

Where the open bindings are kept is the storage backend's business (its BindingRegistry): in server memory
(the embedded backend: this process only), or in PostgreSQL (store/postgres_bindings.py), where a binding opened on one
replica is used and closed on any other. Either way open bindings are bounded (count, least recently
used closed first) and closed after an idle time, so a host that forgets to close them cannot grow the
server without limit; both are counted in metrics.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import replace

from ragsidecar import metrics
from ragsidecar.errors import ErrorKind, SidecarError
from ragsidecar.knowledge.catalog import Catalog
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.storage import Binding, MemoryDocument, UpsertOutcome

# Random bytes of a binding id (not a secret) and of a handle (the secret).
_ID_BYTES, _HANDLE_BYTES = 18, 32


class Bindings:
    """The open bindings. Ids are minted here (random, unique), so a plain id is an unambiguous key: no
    caller-supplied part goes into it."""

    def __init__(
        self, catalog: Catalog, max_open: int, idle_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._catalog = catalog
        self._store = catalog.bindings
        self._max_open, self._idle_seconds = max_open, idle_seconds
        self._registry = catalog.backend.binding_registry(clock)

    async def open(self, owner_id: str, scope: Scope, source: str, top_k: int, declared: bool) -> Binding:
        await self._close_idle()
        handle = secrets.token_urlsafe(_HANDLE_BYTES)
        binding = Binding(secrets.token_urlsafe(_ID_BYTES), owner_id, scope, source, top_k, declared, _digest(handle))
        await self._released(await self._registry.add(binding, self._max_open), "lru")
        metrics.OPEN_BINDINGS.set(await self._registry.count())
        return replace(binding, handle=handle)

    async def get(self, binding_id: str, owner_id: str, scope: Scope | None, handle: str) -> Binding:
        """The open binding, if the handle is its own, `owner_id` owns it and (when given) `scope` is its
        tenant and session; a use makes it the most recently used."""
        await self._close_idle()
        binding = await self._find(binding_id, scope)
        if binding is None:
            raise SidecarError(
                ErrorKind.NOT_FOUND,
                "UNKNOWN_BINDING",
                f"binding {binding_id!r} is not open",
                metadata={"binding_id": binding_id},
            )
        _authorize(binding, owner_id, scope, handle)
        await self._registry.use(binding)
        return binding

    async def is_open(self, binding: Binding) -> bool:
        return await self._registry.find(binding.id, binding.scope.tenant) is not None

    async def append(self, binding: Binding, documents: list[MemoryDocument]) -> UpsertOutcome:
        outcome = await self._store.upsert(binding.scope, binding.id, documents)
        if not await self.is_open(binding):  # closed while this append waited: leave nothing behind
            await self._store.drop(binding.scope, binding.id)
        return outcome

    async def invalidate(self, binding: Binding, reset: bool) -> int:
        if reset:
            await self._store.clear(binding.scope, binding.id)
        self._catalog.forget(binding.entry, binding.scope)
        return await self._store.count(binding.scope, binding.id)

    async def close(self, binding_id: str, owner_id: str, scope: Scope, handle: str) -> bool:
        """Releases an open binding; an id that is not open is already closed (False)."""
        binding = await self._find(binding_id, scope)
        if binding is None:
            return False
        _authorize(binding, owner_id, scope, handle)
        if not await self._registry.remove(binding):
            return False
        metrics.OPEN_BINDINGS.set(await self._registry.count())
        await self._released([binding], "closed")
        return True

    async def _find(self, binding_id: str, scope: Scope | None) -> Binding | None:
        # The caller's tenant only scopes row security; the binding's own tenant is checked by _authorize.
        return await self._registry.find(binding_id, scope.tenant if scope else "")

    async def _close_idle(self) -> None:
        idle = await self._registry.remove_idle(self._idle_seconds)
        if idle:
            metrics.OPEN_BINDINGS.set(await self._registry.count())
            await self._released(idle, "idle")

    async def _released(self, bindings: list[Binding], why: str) -> None:
        """Counts bindings the registry has just removed and drops what they held."""
        for binding in bindings:
            metrics.CLOSED_BINDINGS.labels(why).inc()
            self._catalog.forget(binding.entry, binding.scope)
            await self._store.drop(binding.scope, binding.id)


def _digest(handle: str) -> bytes:
    # Any text a caller sends hashes (surrogatepass): a non-ASCII or malformed handle is simply wrong.
    return hashlib.sha256(handle.encode("utf-8", "surrogatepass")).digest()


def _authorize(binding: Binding, owner_id: str, scope: Scope | None, handle: str) -> None:
    right_handle = hmac.compare_digest(_digest(handle), binding.handle_digest)
    if not right_handle or binding.owner_id != owner_id or (scope is not None and scope != binding.scope):
        raise SidecarError(
            ErrorKind.PERMISSION_DENIED,
            "PERMISSION_DENIED",
            f"binding {binding.id!r} is not usable with this handle, owner, tenant and session",
        )
