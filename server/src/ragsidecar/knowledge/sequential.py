"""SEQUENTIAL knowledge: one unit per dispatch, a cursor per scope, target and entry.

At most retrieval.max_sequential_cursors cursors are kept: past that, the least recently used one is
forgotten and its next dispatch starts again from the first unit, as after a restart. Where they are kept
is the storage backend's business (its CursorPositions): in server memory (the embedded backend: this process
only), or in PostgreSQL (store/cursors.py), where replicas share them and advance them atomically, so two
replicas dispatching at once never give the same unit twice.
"""

from __future__ import annotations

import asyncio

from ragsidecar.identifiers import key_of
from ragsidecar.knowledge.catalog import Catalog
from ragsidecar.knowledge.declarations import Entry, Scope, Target, Use
from ragsidecar.knowledge.results import Block, Hit, provenance_of
from ragsidecar.knowledge.tokens import Tokens


class Cursors:
    def __init__(self, catalog: Catalog, tokens: Tokens, limit: int) -> None:
        self._catalog = catalog
        self._tokens = tokens
        self._positions = catalog.backend.cursor_positions(limit)

    async def next_unit(self, entry: Entry, target: Target, scope: Scope) -> Block | None:
        """The scope's next unit of the source (cut to max_tokens), or None once every unit was given."""
        entry.require_location()
        units = await self._catalog.units(entry, scope)
        key = key_of(scope.tenant, scope.session, target.name, entry.name)
        position = await self._positions.take(key, scope.tenant, len(units))
        if position is None:
            return None
        unit = units[position]
        body = await asyncio.to_thread(self._tokens.measure, unit.text)
        if entry.max_tokens:
            body = body.first(entry.max_tokens)
        provenance = {"position": position, **provenance_of(unit)}
        return Block(
            entry.name, Use.SEQUENTIAL, [Hit(f"{entry.name}:{position}", entry.name, body.text, provenance)], body=body
        )
