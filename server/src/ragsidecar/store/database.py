"""The PostgreSQL connection behind `[store] backend = "postgres"`: a pool, its health, and one transaction per call.

Domain code hands `Database.run` a function of a psycopg (sync) connection; it runs on a worker thread (the
event loop never waits on the database) inside one transaction, committed when the function returns and rolled
back when it raises. With a tenant, the transaction first sets `ragsidecar.tenant` (SET LOCAL), which the
row-level security policies read. `run` has threads of its own, as many as the pool has connections: calls
beyond them wait in line holding no thread, so a burst of store calls never occupies the threads that
tokenization and ranking share (asyncio's default executor), nor times out waiting for a connection.

Health: a background probe asks the database every `[store] health_interval_s` (on a connection of its own when
the pool's are all busy: slow calls are no outage), so health flips on loss and recovery without traffic; a call
that loses its connection wakes the probe at once, but only the probe decides (one connection killed is no
outage either). While the database is down, calls fail at once with UNAVAILABLE (reason STORE_UNAVAILABLE)
instead of each waiting out a connect timeout. On (re)connection the schema is brought up to date (or, with
`migrate_on_start = false`, checked), then a fresh pool replaces the one that lost its server.

The DSN holds a password: it is never logged, and every message built from a driver error is redacted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ragsidecar import metrics
from ragsidecar.config import Config, ConfigError
from ragsidecar.errors import ErrorKind, SidecarError
from ragsidecar.store import migrate

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool
    from psycopg.abc import Params

log = logging.getLogger(__name__)

T = TypeVar("T")


def _driver() -> tuple[Any, Any]:
    """psycopg and its pool, imported only when the postgres backend is configured (an optional extra)."""
    try:
        import psycopg
        import psycopg_pool
    except ImportError:
        raise ConfigError(
            'store.backend is "postgres" but psycopg is not installed: pip install "ragsidecar[postgres]"'
        ) from None
    return psycopg, psycopg_pool


def one_row(connection: psycopg.Connection, query: str, params: Params | None = None) -> tuple[Any, ...]:
    """The row of a statement that always returns one: an aggregate, or a RETURNING of a row the transaction holds."""
    row = connection.execute(query, params).fetchone()
    if row is None:
        raise LookupError(f"no row returned by {query!r}")
    return row


def unavailable() -> SidecarError:
    return SidecarError(
        ErrorKind.UNAVAILABLE, "STORE_UNAVAILABLE", "the knowledge store (PostgreSQL) is unreachable; retry later"
    )


class Database:
    """A psycopg (sync) ConnectionPool for the configured DSN; calls run on worker threads, never on the loop."""

    def __init__(
        self,
        dsn: str,
        pool_size: int,
        *,
        row_level_security: bool,
        connect_timeout_s: float = 5.0,
        health_interval_s: float = 5.0,
        migrate_on_start: bool = True,
    ) -> None:
        self._psycopg, self._psycopg_pool = _driver()
        # The probe logs each loss and recovery once; the pool would warn at every failed attempt in between.
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        try:
            self._psycopg.conninfo.conninfo_to_dict(dsn)
        except self._psycopg.Error:
            raise ConfigError(
                "store: the DSN (in the variable store.dsn_env names) is not a PostgreSQL connection "
                "string (libpq key=value pairs or a postgresql:// URI)"
            ) from None
        self._dsn = dsn
        self.redact = redactor(dsn)
        self._pool_size = pool_size
        self._row_level_security = row_level_security
        self._connect_timeout_s = connect_timeout_s
        self._health_interval_s = health_interval_s
        self._migrate = migrate_on_start
        self._pool: psycopg_pool.ConnectionPool | None = None
        self._threads = concurrent.futures.ThreadPoolExecutor(pool_size, thread_name_prefix="ragsidecar-store")
        # Serializes (re)connecting: the probe and a CLI call never build two pools at once.
        self._lock = threading.Lock()
        self._healthy = False
        self._listeners: list[Callable[[bool], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probe: asyncio.Task | None = None
        # Set (from any thread, through the loop) to probe before the interval is up.
        self._wake: asyncio.Event | None = None
        self._closed = False
        # The last schema problem, logged once (not at every probe) until it changes.
        self._schema_problem = ""
        # Why the database was last out of reach (redacted), for the start-up warning.
        self._last_failure = ""

    # -- calls ---------------------------------------------------------------------------------------

    async def run(self, work: Callable[[psycopg.Connection], T], tenant: str | None = None) -> T:
        """work(connection) on a worker thread inside one transaction; STORE_UNAVAILABLE when the database is down."""
        call = functools.partial(contextvars.copy_context().run, self.run_sync, work, tenant)  # as asyncio.to_thread
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    def run_sync(self, work: Callable[[psycopg.Connection], T], tenant: str | None = None) -> T:
        """The same as `run`, for code already on a worker thread."""
        pool = self._pool
        if pool is None or not self._healthy:
            raise unavailable()
        try:
            with pool.connection(timeout=self._connect_timeout_s) as connection, connection.transaction():
                if tenant is not None:
                    connection.execute("SELECT set_config('ragsidecar.tenant', %s, true)", (tenant,))
                return work(connection)
        except self._psycopg.OperationalError as err:  # PoolTimeout (no free connection in time) is one too
            log.warning("store call failed: %s", self.redact(str(err).strip()))
            if _connection_lost(err):
                self._probe_now()
            raise unavailable() from None

    # -- health --------------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self._healthy

    def on_health_change(self, listener: Callable[[bool], None]) -> None:
        """listener(healthy) runs on the event loop (from `start`) each time reachability changes."""
        self._listeners.append(listener)

    async def start(self) -> None:
        """Connects (migrating or checking the schema) and starts the probe. An unreachable database is no error
        (health says NOT_SERVING until it is reached); a schema this build cannot use raises SchemaError."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        await asyncio.to_thread(self.connect)
        if not self._healthy:
            log.warning(
                "the store's database is unreachable (%s); retrieval and chat stay NOT_SERVING until it is "
                "(retrying every %.1fs)",
                self._last_failure,
                self._health_interval_s,
            )
        self._probe = self._loop.create_task(self._probe_forever())

    def connect(self) -> bool:
        """Checks the database, reconnecting (and migrating) when it was down; True when it is reachable now.

        Raises SchemaError only when the database is reached and its schema cannot be used."""
        with self._lock:
            if self._closed:
                return False
            if self._healthy and self._pool is not None and self._ping():
                return True
            # A pool that lost its server would retry on its own; a fresh one replaces it once the server is back.
            self._close_pool()
            try:
                self._prepare_schema()
            except self._psycopg.OperationalError as err:
                self._lost(err)
                return False
            self._open_pool()
            self._set_healthy(True)
            return True

    async def _probe_forever(self) -> None:
        assert self._wake is not None
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._health_interval_s)
            self._wake.clear()
            try:
                await asyncio.to_thread(self.connect)
            except migrate.SchemaError as err:
                self._set_healthy(False)
                if str(err) != self._schema_problem:
                    self._schema_problem = str(err)
                    log.error("the store's database cannot be used: %s", err)
            except Exception as err:  # noqa: BLE001 - the probe must outlive any one failure; log it and go on
                log.error("store health probe failed: %s", self.redact(repr(err)))  # no traceback: it may quote the DSN

    def _probe_now(self) -> None:
        if self._wake is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    def _ping(self) -> bool:
        """SELECT 1 on a pooled connection or, when none comes free in time, on a connection of its own: a pool
        whose connections are all busy says nothing about the database."""
        assert self._pool is not None
        try:
            try:
                with self._pool.connection(timeout=self._connect_timeout_s) as connection:
                    connection.execute("SELECT 1")
            except self._psycopg_pool.PoolTimeout:
                with connect_once(self._dsn, self._connect_timeout_s) as connection:
                    connection.execute("SELECT 1")
            return True
        except self._psycopg.OperationalError as err:
            self._lost(err)
            return False

    def _prepare_schema(self) -> None:
        with connect_once(self._dsn, self._connect_timeout_s) as connection:
            if self._migrate:
                applied = migrate.migrate(connection)
                if applied:
                    log.info("store schema migrated: %s", ", ".join(m.label for m in applied))
            else:
                migrate.check(connection)
            if self._row_level_security:
                migrate.enable_row_level_security(connection)
        self._schema_problem = ""

    def _open_pool(self) -> None:
        self._pool = self._psycopg_pool.ConnectionPool(
            self._dsn,
            min_size=1,
            max_size=self._pool_size,
            open=False,
            timeout=self._connect_timeout_s,
            kwargs=_connection_settings(self._dsn, self._connect_timeout_s),
            check=self._psycopg_pool.ConnectionPool.check_connection,
            name="ragsidecar-store",
        )
        self._pool.open(wait=False)

    def _close_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout=self._connect_timeout_s)

    def _lost(self, err: Exception) -> None:
        self._last_failure = self.redact(str(err).strip())
        if self._healthy:
            log.warning("the store's database became unreachable: %s", self._last_failure)
        self._set_healthy(False)

    def _set_healthy(self, healthy: bool) -> None:
        if healthy == self._healthy:
            return
        self._healthy = healthy
        metrics.STORE_UP.set(int(healthy))
        if healthy:
            log.info("the store's database is reachable")
        for listener in self._listeners:
            if self._loop is None or self._loop.is_closed():
                listener(healthy)
            else:
                self._loop.call_soon_threadsafe(listener, healthy)

    async def close(self) -> None:
        self._closed = True
        if self._probe is not None:
            self._probe.cancel()
        await asyncio.to_thread(self._shut)

    def _shut(self) -> None:
        with self._lock:
            self._close_pool()
            self._healthy = False
        self._threads.shutdown(wait=False, cancel_futures=True)


def redactor(dsn: str) -> Callable[[str], str]:
    """A function removing the DSN and its password from a text (driver messages may quote connection parameters)."""
    psycopg, _ = _driver()
    secrets = [dsn]
    try:
        secrets.append(psycopg.conninfo.conninfo_to_dict(dsn).get("password") or "")
    except psycopg.Error:
        pass  # a DSN the driver cannot parse: it is never used, and redacted whole
    secrets = sorted((s for s in secrets if s), key=len, reverse=True)

    def redact(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    return redact


def connect_once(dsn: str, timeout_s: float) -> psycopg.Connection:
    """One autocommit connection outside the pool: migrations, and the `db migrate` and `doctor` commands."""
    psycopg, _ = _driver()
    return psycopg.connect(dsn, autocommit=True, **_connection_settings(dsn, timeout_s))


# A server that vanishes without closing its connections (a partition, a lost host) would leave a call waiting
# for its answer as long as the operating system's TCP timeouts (many minutes), holding a worker thread that
# Rerank needs too; these bound the wait to about half a minute. A DSN that sets them itself keeps its own.
_TCP_SETTINGS = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


def _connection_settings(dsn: str, timeout_s: float) -> dict[str, int]:
    psycopg, _ = _driver()
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    # libpq's connect_timeout counts whole seconds, and 0 would mean forever.
    return {
        **{k: v for k, v in _TCP_SETTINGS.items() if k not in given},
        "connect_timeout": max(1, math.ceil(timeout_s)),
    }


def _connection_lost(err: Exception) -> bool:
    """Whether an OperationalError means the database is out of reach (not, say, a cancelled statement)."""
    state = getattr(err, "sqlstate", None)
    # No SQLSTATE: the client lost the connection or gave up waiting; 08: connection exception; 57P: the server
    # is shutting down or starting.
    return state is None or state.startswith(("08", "57P"))


def open_database(config: Config, environ: Mapping[str, str] | None = None) -> Database | None:
    """The configured store's database (None for the embedded backend); `start()` it to connect and migrate."""
    store = config.store
    if store.backend != "postgres":
        return None
    return Database(
        store.dsn(environ),
        store.pool_size,
        row_level_security=store.row_level_security,
        connect_timeout_s=store.connect_timeout_s,
        health_interval_s=store.health_interval_s,
        migrate_on_start=store.migrate_on_start,
    )
