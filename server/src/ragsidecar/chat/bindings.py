"""Chat bindings: an owner's live corpus of one source name, held in server memory for one tenant and session.

A binding's corpus is a partition of the catalog's in-memory binding store keyed by (tenant, session,
binding id), indexed by the catalog's MEMORY path (incrementally: only new chunks are embedded). Only its
owner, in its tenant and session, may use it; ids are unguessable and die with the process.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from ragsidecar.errors import ErrorKind, SidecarError
from ragsidecar.knowledge.catalog import Catalog
from ragsidecar.knowledge.declarations import Entry, Scope, SourceType, Use
from ragsidecar.knowledge.memory import MemoryDocument, UpsertOutcome


@dataclass(frozen=True)
class Binding:
    id: str
    owner_id: str
    scope: Scope
    source: str
    top_k: int
    declared: bool

    @property
    def entry(self) -> Entry:
        """The binding as a SEARCH source; hits name it by id until the turn renames them to `source`."""
        return Entry(self.id, SourceType.BINDING, Use.SEARCH, top_k=self.top_k)


class Bindings:
    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._store = catalog.bindings
        self._open: dict[str, Binding] = {}

    def open(self, owner_id: str, scope: Scope, source: str, top_k: int, declared: bool) -> Binding:
        binding = Binding(secrets.token_urlsafe(24), owner_id, scope, source, top_k, declared)
        self._open[binding.id] = binding
        return binding

    def get(self, binding_id: str, owner_id: str, scope: Scope | None) -> Binding:
        """The open binding, if `owner_id` owns it and (when given) `scope` is its tenant and session."""
        binding = self._open.get(binding_id)
        if binding is None:
            raise SidecarError(ErrorKind.NOT_FOUND, "UNKNOWN_BINDING", f"binding {binding_id!r} is not open",
                               metadata={"binding_id": binding_id})
        _authorize(binding, owner_id, scope)
        return binding

    async def append(self, binding: Binding, documents: list[MemoryDocument]) -> UpsertOutcome:
        outcome = await self._store.upsert(binding.scope, binding.id, documents)
        if binding.id not in self._open:  # closed while this append waited: leave nothing behind
            await self._store.drop(binding.scope, binding.id)
        return outcome

    async def invalidate(self, binding: Binding, reset: bool) -> int:
        if reset:
            await self._store.clear(binding.scope, binding.id)
        self._catalog.forget(binding.entry, binding.scope)
        return self._store.count(binding.scope, binding.id)

    async def close(self, binding_id: str, owner_id: str, scope: Scope) -> bool:
        """Releases an open binding; an id that is not open is already closed (False)."""
        binding = self._open.get(binding_id)
        if binding is None:
            return False
        _authorize(binding, owner_id, scope)
        del self._open[binding_id]
        self._catalog.forget(binding.entry, binding.scope)
        await self._store.drop(binding.scope, binding.id)
        return True


def _authorize(binding: Binding, owner_id: str, scope: Scope | None) -> None:
    if binding.owner_id != owner_id or (scope is not None and scope != binding.scope):
        raise SidecarError(ErrorKind.PERMISSION_DENIED, "PERMISSION_DENIED",
                           f"binding {binding.id!r} belongs to another owner, tenant or session")
