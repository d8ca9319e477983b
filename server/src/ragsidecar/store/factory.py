"""The one place that picks the storage backend, at start-up, from `[store] backend`."""

from __future__ import annotations

from collections.abc import Mapping

from ragsidecar.config import Config
from ragsidecar.store.embedded import EmbeddedBackend
from ragsidecar.store.interface import Backend


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
    return EmbeddedBackend(config.resolve(config.paths.data_dir), retrieval.memory_cache_bytes,
                           retrieval.binding_store_bytes, retrieval.max_memory_bytes_per_request,
                           retrieval.index_threads, retrieval.index_dtype)
