"""SEQUENTIAL cursors in PostgreSQL (`[store] backend = "postgres"`), shared by every replica.

A cursor is one row keyed by (tenant, key_of(tenant, session, target, entry)). Handing out a unit is one
INSERT ... ON CONFLICT DO UPDATE ... RETURNING: the row lock orders concurrent dispatches, so replicas
dispatching at once each get their own position and none is given twice. At most `limit` cursors are
kept: creating one past that deletes the least recently used (under an advisory lock, so that replicas
creating cursors at once do not both delete for the same excess); counting the table costs a scan of its
index, paid only when a cursor is created, never when one advances.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragsidecar import metrics
from ragsidecar.store.database import Database, one_row

if TYPE_CHECKING:
    import psycopg

# pg_advisory_xact_lock key of cursor pruning (any constant; "ragsidecar cursors" in ASCII, truncated).
_PRUNE_LOCK = 0x7261_6773_6375_7273

_TAKE = """
INSERT INTO ragsidecar_sequential_cursors AS c (tenant, key, position, last_used)
VALUES (%(tenant)s, %(key)s, 1, clock_timestamp())
ON CONFLICT (tenant, key) DO UPDATE SET position = c.position + 1, last_used = clock_timestamp()
    WHERE c.position < %(units)s
RETURNING c.position - 1, c.xmax = 0
"""
_PRUNE = """
DELETE FROM ragsidecar_sequential_cursors AS c USING (
    SELECT tenant, key FROM ragsidecar_sequential_cursors ORDER BY last_used, tenant, key LIMIT %(excess)s
) AS old
WHERE c.tenant = old.tenant AND c.key = old.key
"""


def across_tenants(connection: psycopg.Connection) -> None:
    """Lets this transaction see every tenant's rows under row-level security (the `ragsidecar_maintenance`
    policies of migrations 0003 and 0004): for the per-database bounds, which count and delete across tenants."""
    connection.execute("SELECT set_config('ragsidecar.maintenance', 'on', true)")


def prune_to(connection: psycopg.Connection, table: str, limit: int, lock: int, prune: str) -> int:
    """Holds a table bounded per database: counts every tenant's rows and, past `limit`, runs `prune` (which
    deletes the `%(excess)s` least recently used) under the advisory lock `lock`, so that replicas pruning at
    once do not both delete for the same excess. Returns the rows left."""
    across_tenants(connection)
    connection.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
    (count,) = one_row(connection, f"SELECT count(*) FROM {table}")
    if count <= limit:
        return count
    return count - connection.execute(prune, {"excess": count - limit}).rowcount


class PostgresPositions:
    def __init__(self, database: Database, limit: int) -> None:
        self._database = database
        self._limit = limit

    async def take(self, key: str, tenant: str, units: int) -> int | None:
        if units <= 0:  # nothing to give: no cursor is created
            return None
        row = await self._database.run(
            lambda c: c.execute(_TAKE, {"tenant": tenant, "key": key, "units": units}).fetchone(), tenant=tenant
        )
        if row is None:
            return None
        position, created = row
        if created:
            metrics.SEQUENTIAL_CURSORS.set(await self._database.run(self._prune))
        return position

    def _prune(self, connection: psycopg.Connection) -> int:
        """Deletes the least recently used cursors past the limit (every tenant's); returns how many are left."""
        return prune_to(connection, "ragsidecar_sequential_cursors", self._limit, _PRUNE_LOCK, _PRUNE)
