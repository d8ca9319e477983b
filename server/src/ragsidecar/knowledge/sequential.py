"""SEQUENTIAL knowledge: one unit per dispatch, a cursor per scope, target and entry.

Cursors live in server memory, at most retrieval.max_sequential_cursors of them: past that, the least
recently used one is forgotten and its next dispatch starts again from the first unit, as after a restart.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from ragsidecar import metrics
from ragsidecar.identifiers import key_of
from ragsidecar.knowledge.catalog import Catalog
from ragsidecar.knowledge.declarations import Entry, Scope, Target, Use
from ragsidecar.knowledge.results import Block, Hit, provenance_of
from ragsidecar.knowledge.tokens import Tokens


class Cursors:
    def __init__(self, catalog: Catalog, tokens: Tokens, limit: int) -> None:
        self._catalog = catalog
        self._tokens = tokens
        self._limit = limit
        self._positions: OrderedDict[str, int] = OrderedDict()
        metrics.SEQUENTIAL_CURSORS.set_function(lambda: len(self._positions))

    async def next_unit(self, entry: Entry, target: Target, scope: Scope) -> Block | None:
        """The scope's next unit of the source (cut to max_tokens), or None once every unit was given."""
        entry.require_location()
        units = await self._catalog.units(entry, scope)
        key = key_of(scope.tenant, scope.session, target.name, entry.name)
        position = self._positions.get(key, 0)
        if position >= len(units):
            return None
        self._advance(key, position + 1)
        unit = units[position]
        body = await asyncio.to_thread(self._tokens.measure, unit.text)
        if entry.max_tokens:
            body = body.first(entry.max_tokens)
        provenance = {"position": position, **provenance_of(unit)}
        return Block(entry.name, Use.SEQUENTIAL, [Hit(f"{entry.name}:{position}", entry.name, body.text, provenance)],
                     body=body)

    def _advance(self, key: str, position: int) -> None:
        self._positions[key] = position
        self._positions.move_to_end(key)
        while len(self._positions) > self._limit:
            self._positions.popitem(last=False)
