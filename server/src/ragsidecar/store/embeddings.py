"""The embedding cache shared by every replica (`[store] backend = "postgres"`): (model fingerprint, chunk
content hash) -> the chunk's vector, so a replica does not embed what another already embedded.

The catalog looks in its own LRU first, then here (one batched query), embeds only what is still missing and
writes it back (ON CONFLICT DO NOTHING: replicas embedding the same chunk at once both succeed, the first
row stays, and both rows would be equal anyway). Vectors are stored as their little-endian float32 bytes, so
they round-trip exactly: an index built from the cache is the index the embedder would have built.

Sharing across tenants (`[store] share_embeddings`): a row holds a hash of the chunk's text and the vector
the model makes of it, nothing that names a tenant; but a replica that finds a chunk already cached builds
its index faster, so with "all" a tenant able to time its own calls could learn that some tenant embedded
exactly that text before. The embedded store's in-process cache has always behaved so within one pod, which
is why "all" is the default. With "tenant", rows of the text callers send (MEMORY, chat bindings, INLINE) are
kept per tenant and found only by their tenant; files under the knowledge roots, the operator's and read by
every tenant alike, stay shared (partition "").

The table is bounded by `[store] embedding_cache_rows`: writing past it deletes the rows used least recently
(a hit renews a row's use at most once an hour, so a build that finds 100k cached chunks does not rewrite
them all every time). Counting the table scans it, so a replica counts (and prunes) at its first write and
then once per 1% of the bound it has written: between counts each replica may pass the bound by that much.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ragsidecar import metrics
from ragsidecar.errors import SidecarError
from ragsidecar.store.cursors import prune_to

if TYPE_CHECKING:
    import psycopg

    from ragsidecar.store.database import Database

log = logging.getLogger(__name__)

# Hashes per lookup statement: bounds one statement's size on very large sources.
_LOOKUP_BATCH = 8192
# Share of the bound a replica writes between two counts of the table.
_COUNT_EVERY = 0.01
# pg_advisory_xact_lock key of pruning ("ragsidecar embeddings" in ASCII, truncated).
_PRUNE_LOCK = 0x7261_6773_656D_6264
_VECTOR = np.dtype("<f4")

_FETCH = """
WITH hit AS (
    SELECT content_hash, vector, last_used FROM ragsidecar_embeddings
    WHERE tenant = %(partition)s AND model = %(model)s AND content_hash = ANY(%(hashes)s)
), renewed AS (
    UPDATE ragsidecar_embeddings SET last_used = clock_timestamp()
    WHERE tenant = %(partition)s AND model = %(model)s
      AND content_hash IN (SELECT content_hash FROM hit WHERE last_used < clock_timestamp() - interval '1 hour')
)
SELECT content_hash, vector FROM hit
"""
_KEEP = """
INSERT INTO ragsidecar_embeddings (tenant, model, content_hash, vector, last_used)
SELECT %(partition)s, %(model)s, h, v, clock_timestamp()
FROM unnest(%(hashes)s::text[], %(vectors)s::bytea[]) AS t(h, v)
ON CONFLICT DO NOTHING
"""
_PRUNE = """
DELETE FROM ragsidecar_embeddings AS e USING (
    SELECT tenant, model, content_hash FROM ragsidecar_embeddings
    ORDER BY last_used, tenant, model, content_hash LIMIT %(excess)s
) AS old
WHERE e.tenant = old.tenant AND e.model = old.model AND e.content_hash = old.content_hash
"""


class SharedEmbeddings:
    def __init__(self, database: Database, max_rows: int) -> None:
        self._database = database
        self._max_rows = max_rows
        self._count_every = max(1, int(max_rows * _COUNT_EVERY))
        self._written = self._count_every  # rows written since the last count: the first write counts

    async def fetch(self, partition: str, model: str, hashes: list[str]) -> dict[str, np.ndarray]:
        """The cached vectors among `hashes`; none while the database is unreachable (the caller embeds)."""
        try:
            return await self._database.run(
                lambda c: self._fetch(c, partition, model, hashes), tenant=partition or None
            )
        except SidecarError as err:
            log.warning("shared embedding cache not read (%s); embedding locally", err)
            return {}

    async def keep(self, partition: str, model: str, vectors: dict[str, np.ndarray]) -> None:
        """Stores newly embedded vectors for every replica; skipped while the database is unreachable."""
        try:
            self._written += await self._database.run(
                lambda c: self._keep(c, partition, model, vectors), tenant=partition or None
            )
            if self._written >= self._count_every:
                self._written = 0
                metrics.SHARED_EMBEDDINGS.set(await self._database.run(self._prune))
        except SidecarError as err:
            log.warning("shared embedding cache not written (%s)", err)

    @staticmethod
    def _fetch(connection: psycopg.Connection, partition: str, model: str, hashes: list[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(hashes), _LOOKUP_BATCH):
            rows = connection.execute(
                _FETCH, {"partition": partition, "model": model, "hashes": hashes[start : start + _LOOKUP_BATCH]}
            )
            found.update((digest, np.frombuffer(vector, dtype=_VECTOR).astype(np.float32)) for digest, vector in rows)
        metrics.SHARED_EMBEDDING_HITS.inc(len(found))
        return found

    @staticmethod
    def _keep(connection: psycopg.Connection, partition: str, model: str, vectors: dict[str, np.ndarray]) -> int:
        """Rows written (a row another replica wrote first stays as it is)."""
        return connection.execute(
            _KEEP,
            {
                "partition": partition,
                "model": model,
                "hashes": list(vectors),
                "vectors": [np.asarray(v, dtype=_VECTOR).tobytes() for v in vectors.values()],
            },
        ).rowcount

    def _prune(self, connection: psycopg.Connection) -> int:
        """Deletes the least recently used rows past the bound (every partition's); returns how many are left."""
        return prune_to(connection, "ragsidecar_embeddings", self._max_rows, _PRUNE_LOCK, _PRUNE)
