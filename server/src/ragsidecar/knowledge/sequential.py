"""SEQUENTIAL knowledge: one unit per dispatch, a cursor per scope, target and entry."""

from __future__ import annotations

from ragsidecar.knowledge.catalog import Catalog
from ragsidecar.knowledge.declarations import Entry, Scope, Target, Use
from ragsidecar.knowledge.results import Block, Hit, provenance_of
from ragsidecar.knowledge.tokens import Tokens


class Cursors:
    def __init__(self, catalog: Catalog, tokens: Tokens) -> None:
        self._catalog = catalog
        self._tokens = tokens
        self._positions: dict[tuple[str, str, str, str], int] = {}

    async def next_unit(self, entry: Entry, target: Target, scope: Scope) -> Block | None:
        """The scope's next unit of the source (cut to max_tokens), or None once every unit was given."""
        units = await self._catalog.units(entry, scope)
        key = (scope.tenant, scope.session, target.name, entry.name)
        position = self._positions.get(key, 0)
        if position >= len(units):
            return None
        self._positions[key] = position + 1
        unit = units[position]
        text = self._tokens.cut(unit.text, entry.max_tokens) if entry.max_tokens else unit.text
        provenance = {"position": position, **provenance_of(unit)}
        return Block(entry.name, Use.SEQUENTIAL, [Hit(f"{entry.name}:{position}", entry.name, text, provenance)])
