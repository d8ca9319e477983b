"""The postgres backend (`[store] backend = "postgres"`): state shared by every replica through one PostgreSQL
database with pgvector (docs/store.md). It assembles the parts: documents (postgres_documents.py), bindings
(bindings.py), cursors (cursors.py) and the shared embedding cache (embeddings.py), over one `Database`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ragsidecar.config import Config
from ragsidecar.knowledge.storage import LocalVectors, Namespace, Prepare, VectorCache
from ragsidecar.store.cursors import PostgresPositions
from ragsidecar.store.database import Database
from ragsidecar.store.embeddings import SharedEmbeddings
from ragsidecar.store.postgres_bindings import PostgresRegistry
from ragsidecar.store.postgres_documents import PostgresMemoryStore
from ragsidecar.store.resident import ResidentIndexes
from ragsidecar.store.shared_snapshots import SharePolicy, sharer
from ragsidecar.store.snapshots import PartitionSnapshots, policy_of


class PostgresBackend:
    name = "postgres"

    def __init__(self, config: Config, database: Database) -> None:
        self.database = database
        self._config = config
        self._indexes: list[ResidentIndexes] = []

    @property
    def healthy(self) -> bool:
        return self.database.healthy

    def on_health_change(self, callback: Callable[[bool], None]) -> None:
        self.database.on_health_change(callback)

    async def start(self) -> None:
        await self.database.start()

    async def close(self) -> None:
        for indexes in self._indexes:
            await asyncio.to_thread(indexes.close)  # waits for a snapshot in flight
        await self.database.close()

    def documents(self, namespace: Namespace, prepare: Prepare) -> PostgresMemoryStore:
        retrieval = self._config.retrieval
        # This replica's own snapshots (an emptyDir or a volume): a restart replays the change log after them.
        policy = policy_of(self._config.store)
        folder = self._config.resolve(self._config.paths.data_dir) / "snapshots" / namespace
        store = self._config.store
        # Large partitions' snapshots also go to the database, for replicas that have none of their own.
        shared = SharePolicy(
            store.shared_snapshot_chunks, store.shared_snapshot_interval_s, store.shared_snapshot_max_bytes
        )
        share = sharer(self.database, shared) if shared.min_chunks else None
        snapshots = None if policy is None else PartitionSnapshots(folder, retrieval.index_threads, policy, share)
        indexes = ResidentIndexes(
            f"{namespace}_indexes",
            retrieval.memory_cache_bytes,
            retrieval.index_threads,
            retrieval.index_dtype,
            snapshots,
        )
        self._indexes.append(indexes)
        return PostgresMemoryStore(
            self.database,
            namespace=namespace,
            prepare=prepare,
            indexes=indexes,
            max_request_bytes=retrieval.max_memory_bytes_per_request,
            max_namespace_bytes=retrieval.binding_store_bytes if namespace == "binding" else None,
            shared_snapshots=share is not None,
        )

    def binding_registry(self, clock: Callable[[], float] = time.monotonic) -> PostgresRegistry:
        return PostgresRegistry(self.database)  # the database's clock, which every replica shares

    def cursor_positions(self, limit: int) -> PostgresPositions:
        return PostgresPositions(self.database, limit)

    def vector_cache(self) -> VectorCache:
        rows = self._config.store.embedding_cache_rows
        return SharedEmbeddings(self.database, rows) if rows > 0 else LocalVectors()
