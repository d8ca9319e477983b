"""The one place that picks the storage backend, at start-up, from `[store] backend`."""

from __future__ import annotations

from collections.abc import Mapping

from ragsidecar.config import Config
from ragsidecar.knowledge.storage import Backend
from ragsidecar.store.embedded import EmbeddedBackend
from ragsidecar.store.snapshots import policy_of


def open_backend(config: Config, environ: Mapping[str, str] | None = None) -> Backend:
    """The configured backend, not yet started (`start()` connects and migrates the postgres one)."""
    if config.store.backend == "postgres":
        # psycopg is imported only with this backend (the `postgres` extra).
        from ragsidecar.store.database import open_database
        from ragsidecar.store.postgres import PostgresBackend

        database = open_database(config, environ)
        assert database is not None
        return PostgresBackend(config, database)
    retrieval = config.retrieval
    return EmbeddedBackend(
        config.resolve(config.paths.data_dir),
        retrieval.memory_cache_bytes,
        retrieval.binding_store_bytes,
        retrieval.max_memory_bytes_per_request,
        retrieval.index_threads,
        retrieval.index_dtype,
        policy_of(config.store),
    )


def describe_backend(config: Config) -> dict:
    """What `ragsidecar doctor` reports of the store, without starting it: the backend and, for postgres, whether
    its database answers and its schema's version (the DSN's secrets redacted)."""
    store = config.store
    if store.backend != "postgres":
        return {"backend": store.backend}
    from ragsidecar.store import migrate
    from ragsidecar.store.database import connect_once, redactor

    dsn = store.dsn()
    report: dict = {"backend": store.backend, "dsn_env": store.dsn_env, "schema_latest": migrate.latest()}
    try:
        with connect_once(dsn, store.connect_timeout_s) as connection:
            report |= {"reachable": True, "schema_version": migrate.version(connection)}
    except Exception as err:  # noqa: BLE001 - psycopg's errors, imported lazily; the message is redacted
        report |= {"reachable": False, "error": redactor(dsn)(str(err).strip())}
    return report
