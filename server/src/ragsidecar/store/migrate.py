"""The store's schema: versioned SQL files applied in order, each once, each in its own transaction.

`migrations/NNNN_name.sql` (numbered from 0001 without gaps) are applied by the sidecar at start-up, or by
`ragsidecar db migrate`. Each runs in a transaction that first takes a transaction-level advisory lock, so
replicas starting together apply each file exactly once (the others wait, then see it recorded), and records
itself in `ragsidecar_schema_migrations`. A file once released is never edited: a change is a new file.

A database whose schema is newer than this build knows (a newer replica migrated it) is refused: an older
build cannot know what the newer schema means.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

MIGRATIONS = Path(__file__).with_name("migrations")
TABLE = "ragsidecar_schema_migrations"
# pg_advisory_xact_lock's key: "ragsidec" as a big-endian 64-bit integer, unlikely to collide with a host's own.
_LOCK_KEY = int.from_bytes(b"ragsidec", "big")
_FILE_NAME = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
# The released migrations target pgvector 0.8.0 (its iterative HNSW scans), and every one must apply as released.
PGVECTOR_MINIMUM = (0, 8, 0)


class SchemaError(Exception):
    """The database's schema cannot be used by this build (too new, or too old with migrations off)."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


def known() -> list[Migration]:
    """This build's migrations in order; a misnumbered file is a packaging bug, reported as such."""
    migrations = []
    for path in sorted(MIGRATIONS.glob("*.sql")):
        match = _FILE_NAME.fullmatch(path.name)
        if not match:
            raise RuntimeError(f"migration file {path.name} is not named NNNN_name.sql")
        migrations.append(Migration(int(match.group(1)), match.group(2), path))
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(migrations) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..N without gaps or repeats, found {versions}")
    return migrations


def latest() -> int:
    return len(known())


def applied(connection: psycopg.Connection) -> dict[int, str]:
    """Version -> name of the migrations recorded in the database (none before 0001 ran)."""
    with connection.transaction():
        return _recorded(connection)


def migrate(connection: psycopg.Connection) -> list[Migration]:
    """Applies the pending migrations (an autocommit connection); returns those this call applied."""
    done = []
    for migration in known():
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            recorded = _recorded(connection)
            _refuse_newer(recorded)
            if migration.version in recorded:
                continue
            connection.execute(migration.path.read_text())
            connection.execute(
                f"INSERT INTO {TABLE} (version, name, applied_at) VALUES (%s, %s, now())",
                (migration.version, migration.name),
            )
            done.append(migration)
    require_pgvector(connection)
    return done


def check(connection: psycopg.Connection) -> None:
    """Refuses a schema this build cannot use without migrating (with `migrate_on_start = false`)."""
    recorded = applied(connection)
    _refuse_newer(recorded)
    missing = [m.label for m in known() if m.version not in recorded]
    if missing:
        raise SchemaError(
            f"the database's schema lacks migrations {', '.join(missing)} that this build needs, and "
            "store.migrate_on_start is false: run `ragsidecar db migrate` first"
        )
    require_pgvector(connection)


def require_pgvector(connection: psycopg.Connection) -> None:
    """Refuses a pgvector older than PGVECTOR_MINIMUM (searches would fail on every call instead)."""
    with connection.transaction():
        row = connection.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    installed = row[0] if row else None
    if not pgvector_supported(installed):
        wanted = ".".join(map(str, PGVECTOR_MINIMUM))
        raise SchemaError(
            f"the store needs pgvector {wanted} or newer in this database, found "
            f"{installed or 'none'}: run `ALTER EXTENSION vector UPDATE` (or install a newer pgvector)"
        )


def pgvector_supported(installed: str | None) -> bool:
    """Whether an extension version string ("0.8.0", "0.7.4", None when absent) is new enough."""
    if not installed:
        return False
    numbers = [int(part) for part in re.findall(r"\d+", installed)[:3]]
    return tuple(numbers + [0] * (3 - len(numbers))) >= PGVECTOR_MINIMUM


def version(connection: psycopg.Connection) -> int:
    """The highest migration recorded in the database (0: none)."""
    return max(applied(connection), default=0)


def enable_row_level_security(connection: psycopg.Connection) -> None:
    """Every ragsidecar table with a tenant column gets a policy admitting only the rows of the transaction's
    `ragsidecar.tenant` (FORCE: the owning role too; superusers always bypass row-level security)."""
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT c.table_name FROM information_schema.columns c JOIN information_schema.tables t "
                "USING (table_schema, table_name) WHERE c.column_name = 'tenant' AND t.table_type = 'BASE TABLE' "
                "AND c.table_name LIKE 'ragsidecar\\_%' AND c.table_schema = current_schema()"
            ).fetchall()
        ]
        for table in tables:
            connection.execute(f'ALTER TABLE "{table}" ENABLE ROW LEVEL SECURITY')
            connection.execute(f'ALTER TABLE "{table}" FORCE ROW LEVEL SECURITY')
            exists = connection.execute(
                "SELECT 1 FROM pg_policies WHERE schemaname = current_schema() AND "
                "tablename = %s AND policyname = 'ragsidecar_tenant'",
                (table,),
            ).fetchone()
            if not exists:
                connection.execute(
                    f'CREATE POLICY ragsidecar_tenant ON "{table}" '
                    "USING (tenant = current_setting('ragsidecar.tenant', true))"
                )


def _recorded(connection: psycopg.Connection) -> dict[int, str]:
    if connection.execute("SELECT to_regclass(%s)", (TABLE,)).fetchone() == (None,):  # no such table
        return {}
    return dict(connection.execute(f"SELECT version, name FROM {TABLE}").fetchall())


def _refuse_newer(recorded: dict[int, str]) -> None:
    newest = max(recorded, default=0)
    if newest > latest():
        raise SchemaError(
            f"the database's schema is at version {newest} ({recorded[newest]}), newer than this build "
            f"knows (up to {latest()}): upgrade ragsidecar, or use another database"
        )
