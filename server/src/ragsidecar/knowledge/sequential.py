"""SEQUENTIAL knowledge: one unit per dispatch, a cursor per scope, target and entry.

At most retrieval.max_sequential_cursors cursors are kept: past that, the least recently used one is
forgotten and its next dispatch starts again from the first unit, as after a restart. Where they are kept
is the positions' business: in server memory (the embedded store: this process only), or in PostgreSQL
(`[store] backend = "postgres"`, store/cursors.py), where replicas share them and advance them atomically,
so two replicas dispatching at once never give the same unit twice.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Protocol

from ragsidecar import metrics
from ragsidecar.identifiers import key_of
from ragsidecar.knowledge.catalog import Catalog
from ragsidecar.knowledge.declarations import Entry, Scope, Target, Use
from ragsidecar.knowledge.results import Block, Hit, provenance_of
from ragsidecar.knowledge.tokens import Tokens
from ragsidecar.store.cursors import PostgresPositions


class Positions(Protocol):
    async def take(self, key: str, tenant: str, units: int) -> int | None:
        """The cursor's position, which then moves on by one; None (and no move) once it reached `units`."""


class Cursors:
    def __init__(self, catalog: Catalog, tokens: Tokens, limit: int) -> None:
        self._catalog = catalog
        self._tokens = tokens
        self._positions = _positions(catalog, limit)

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
        return Block(entry.name, Use.SEQUENTIAL, [Hit(f"{entry.name}:{position}", entry.name, body.text, provenance)],
                     body=body)


class InMemoryPositions:
    """This process's cursors, least recently used first."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._positions: OrderedDict[str, int] = OrderedDict()
        metrics.SEQUENTIAL_CURSORS.set_function(lambda: len(self._positions))

    async def take(self, key: str, tenant: str, units: int) -> int | None:
        position = self._positions.get(key, 0)
        if position >= units:
            return None
        self._positions[key] = position + 1
        self._positions.move_to_end(key)
        while len(self._positions) > self._limit:
            self._positions.popitem(last=False)
        return position


def _positions(catalog: Catalog, limit: int) -> Positions:
    return InMemoryPositions(limit) if catalog.database is None else PostgresPositions(catalog.database, limit)
