"""The open chat bindings in PostgreSQL (`[store] backend = "postgres"`), shared by every replica.

A binding opened on one replica is appended to, grounded with and closed on any other: its row holds what
authorises a use (owner, tenant, session, the sha256 of its handle; never the handle) and when it was last
used, by the database's clock, which every replica shares. Its corpus lives in the catalog's binding store.

Bounds are per database: opening a binding past max_open_bindings deletes the least recently used others
(under an advisory lock, so replicas opening at once each see the others' rows), and any replica's call
deletes the bindings idle past binding_idle_seconds (a replica looks at most once a second, or once per idle
time when that is shorter: a binding may outlive its idle time by that second). A DELETE ... RETURNING hands
each removed binding to exactly one replica, which drops its corpus and counts it; other replicas find the
binding gone on the next use (UNKNOWN_BINDING). A replica that dies between deleting a binding's row and
dropping its corpus leaves the corpus behind, unreachable: a replica's sweep drops such corpora, at most once a
minute. All binding corpora together stay within retrieval.binding_store_bytes (store/postgres_documents.py).

A binding is found by its id alone, a random server-minted key with no caller part: its tenant and session
are then compared with the caller's like its owner and handle (PERMISSION_DENIED, as in the embedded store).
With [store] row_level_security another tenant's row is not even visible, so its id is UNKNOWN_BINDING.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.storage import Binding
from ragsidecar.store.cursors import across_tenants
from ragsidecar.store.database import one_row
from ragsidecar.store.postgres_documents import drop_orphaned_corpora

if TYPE_CHECKING:
    import psycopg

    from ragsidecar.store.database import Database

# Seconds between a replica's sweeps for idle bindings (at most: never longer than the idle time itself).
_SWEEP_EVERY_S = 1.0
# Seconds between a replica's sweeps for corpora whose binding is gone (rare: only a replica's death leaves one).
_ORPHAN_SWEEP_EVERY_S = 60.0
# pg_advisory_xact_lock key of opening bindings ("ragsidecar bindings" in ASCII, truncated).
_OPEN_LOCK = 0x7261_6773_6269_6E64

_COLUMNS = "id, tenant, session, owner_id, source, top_k, declared, handle_digest"
_INSERT = f"""
INSERT INTO ragsidecar_chat_bindings ({_COLUMNS}, last_used)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, clock_timestamp())
"""
_EVICT = f"""
DELETE FROM ragsidecar_chat_bindings WHERE id IN (
    SELECT id FROM ragsidecar_chat_bindings WHERE id <> %(kept)s ORDER BY last_used DESC, id OFFSET %(others)s
) RETURNING {_COLUMNS}
"""
_IDLE = f"""
DELETE FROM ragsidecar_chat_bindings WHERE last_used < clock_timestamp() - make_interval(secs => %s)
RETURNING {_COLUMNS}
"""


class PostgresRegistry:
    def __init__(self, database: Database) -> None:
        self._database = database
        self._swept = self._orphans_swept = -float("inf")

    async def add(self, binding: Binding, max_open: int) -> list[Binding]:
        return await self._database.run(lambda c: self._add(c, binding, max_open), tenant=binding.scope.tenant)

    @staticmethod
    def _add(connection: psycopg.Connection, binding: Binding, max_open: int) -> list[Binding]:
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_OPEN_LOCK,))
        scope = binding.scope
        connection.execute(
            _INSERT,
            (
                binding.id,
                scope.tenant,
                scope.session,
                binding.owner_id,
                binding.source,
                binding.top_k,
                binding.declared,
                binding.handle_digest,
            ),
        )
        across_tenants(connection)  # the bound is the database's: every tenant's bindings count
        return [_binding(row) for row in connection.execute(_EVICT, {"kept": binding.id, "others": max_open - 1})]

    async def find(self, binding_id: str, tenant: str) -> Binding | None:
        row = await self._database.run(
            lambda c: c.execute(
                f"SELECT {_COLUMNS} FROM ragsidecar_chat_bindings WHERE id = %s", (binding_id,)
            ).fetchone(),
            tenant=tenant,
        )
        return None if row is None else _binding(row)

    async def use(self, binding: Binding) -> None:
        await self._database.run(
            lambda c: c.execute(
                "UPDATE ragsidecar_chat_bindings SET last_used = clock_timestamp() WHERE id = %s AND tenant = %s",
                (binding.id, binding.scope.tenant),
            ),
            tenant=binding.scope.tenant,
        )

    async def remove(self, binding: Binding) -> bool:
        deleted = await self._database.run(
            lambda c: (
                c.execute(
                    "DELETE FROM ragsidecar_chat_bindings WHERE id = %s AND tenant = %s",
                    (binding.id, binding.scope.tenant),
                ).rowcount
            ),
            tenant=binding.scope.tenant,
        )
        return deleted > 0

    async def remove_idle(self, idle_seconds: float) -> list[Binding]:
        now = time.monotonic()
        if now - self._swept < min(idle_seconds, _SWEEP_EVERY_S):
            return []
        self._swept = now
        rows = await self._database.run(lambda c: _across_tenants(c, _IDLE, (idle_seconds,)).fetchall())
        if now - self._orphans_swept >= _ORPHAN_SWEEP_EVERY_S:
            self._orphans_swept = now
            await self._database.run(drop_orphaned_corpora)
        return [_binding(row) for row in rows]

    async def count(self) -> int:
        return await self._database.run(_count)


def _across_tenants(connection: psycopg.Connection, query: str, params: tuple = ()) -> psycopg.Cursor:
    across_tenants(connection)
    return connection.execute(query, params)


def _count(connection: psycopg.Connection) -> int:
    across_tenants(connection)
    return one_row(connection, "SELECT count(*) FROM ragsidecar_chat_bindings")[0]


def _binding(row: tuple) -> Binding:
    binding_id, tenant, session, owner_id, source, top_k, declared, handle_digest = row
    return Binding(binding_id, owner_id, Scope(tenant, session), source, top_k, declared, bytes(handle_digest))
