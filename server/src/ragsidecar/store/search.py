"""Hybrid search of one space of a PostgreSQL partition (store/memory.py): the embedded HybridIndex's contract.

Both sides run in SQL and are fused in Python by the same `fusion.fuse` as the embedded index, so a partition
ranks alike in either backend (the reranker then runs on top, unchanged):

- dense: a space of up to `EXACT_SEARCH_UP_TO` chunks is scanned exactly (float32 cosine of every chunk:
  a few milliseconds, and no approximation). A larger one is searched on the HNSW index of its dimension
  (halfvec, cosine) with iterative scans, so the space and tenant filter cannot starve the results; the
  candidates are re-scored with the exact float32 cosine, as the embedded index re-scores its f16 graph's.
  Should the graph still return fewer candidates than asked, the exact scan answers instead.
- lexical: BM25 as bm25s computes it (the "lucene" variant, k1 1.5, b 0.75), over postings and collection
  statistics stored at write time with `lexical.terms`, the analysis the embedded index applies.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

import numpy as np
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

from ragsidecar import metrics
from ragsidecar.knowledge import lexical
from ragsidecar.knowledge.fusion import FusionSettings, fuse
from ragsidecar.knowledge.index import Hit, IndexedChunk

if TYPE_CHECKING:
    from ragsidecar.store.database import Database

log = logging.getLogger(__name__)

# Spaces up to this many chunks are searched exactly (measured by bench/store.py).
EXACT_SEARCH_UP_TO = 10_000
# bm25s's defaults (method "lucene"), which the embedded index's BM25 uses.
BM25_K1 = 1.5
BM25_B = 0.75
# HNSW settings: the embedded index's connectivity and search expansion (index.DEFAULT_CONNECTIVITY,
# DEFAULT_EXPANSION_SEARCH); pgvector's default construction expansion (64, not the embedded 128): every write
# maintains the index, and at 128 it took twice as long (4 ms a 384-d chunk on a 2-core machine) for little recall
# once candidates are re-scored exactly.
_HNSW_M = 16
_HNSW_EF_CONSTRUCTION = 64
_HNSW_EF_SEARCH = 64
_HNSW_EF_SEARCH_MAX = 1000  # pgvector's limit
# pgvector's limit for an HNSW index on halfvec.
_HNSW_MAX_DIMENSIONS = 4000
# pg_advisory_xact_lock key of creating a dense index ("ragsidecar hnsw" in ASCII, truncated).
_INDEX_LOCK = 0x7261_6773_686E_7377

# BM25 in one pass over the query terms' postings: each term's document frequency is a window count over its own
# rows (counting them in a separate step reads every posting twice).
_BM25 = f"""
WITH q AS (SELECT term, count(*)::float8 AS weight FROM unnest(%(terms)s::text[]) AS t(term) GROUP BY term),
s AS (SELECT chunks::float8 AS n, terms::float8 / nullif(chunks, 0) AS avgdl FROM ragsidecar_memory_spaces
      WHERE id = %(space)s AND tenant = %(tenant)s),
p AS (SELECT chunk, term, tf, terms, count(*) OVER (PARTITION BY term)::float8 AS df FROM ragsidecar_memory_postings
      WHERE space = %(space)s AND tenant = %(tenant)s AND term = ANY(%(terms)s::text[]))
SELECT p.chunk, sum(q.weight * ln(1 + (s.n - p.df + 0.5) / (p.df + 0.5))
                    * p.tf / (p.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * p.terms / s.avgdl))) AS score
FROM p JOIN q USING (term) CROSS JOIN s
GROUP BY p.chunk ORDER BY score DESC, p.chunk LIMIT %(count)s
"""
_EXACT = """
SELECT id, 1 - (embedding <=> %(query)b::vector) AS cosine FROM ragsidecar_memory_chunks
WHERE space = %(space)s AND tenant = %(tenant)s ORDER BY cosine DESC, id LIMIT %(count)s
"""
# The dimension is a literal: the partial index's predicate and the halfvec type need constants.
_APPROXIMATE = """
WITH near AS MATERIALIZED (
    SELECT id, embedding FROM ragsidecar_memory_chunks
    WHERE space = %(space)s AND tenant = %(tenant)s AND vector_dims(embedding) = {d}
    ORDER BY embedding::halfvec({d}) <=> %(query)b::vector::halfvec({d}) LIMIT %(count)s)
SELECT id, 1 - (embedding <=> %(query)b::vector) AS cosine FROM near ORDER BY cosine DESC, id
"""
_FETCH = """
SELECT id, chunk_id, text, meta, 1 - (embedding <=> %(query)b::vector) FROM ragsidecar_memory_chunks
WHERE id = ANY(%(ids)s) AND space = %(space)s AND tenant = %(tenant)s
"""


class PostgresIndex:
    """One space of a partition, searched in the database at every call (nothing of it is held here)."""

    def __init__(self, database: Database, tenant: str, space: int | None, chunks: int, analysis: str) -> None:
        self._database = database
        self._tenant = tenant
        self._space = space
        self._chunks = chunks  # as loaded: callers use it to bound how wide they search
        self._analysis = analysis

    def __len__(self) -> int:
        return self._chunks

    def search(
        self, query_vector: np.ndarray, query_text: str, k: int, candidates: int = 50,
        use_dense: bool = True, use_lexical: bool = True, fusion: FusionSettings = FusionSettings(),
    ) -> list[Hit]:
        """HybridIndex.search over the database: best `k` chunks by `fusion` of the dense and BM25
        top-`candidates` lists (ties: higher cosine first); every hit gets its exact cosine. Runs on the caller's
        thread (the ranker's worker thread), in one read transaction."""
        if k <= 0 or self._space is None or self._chunks == 0:
            return []
        query = _unit(query_vector)
        terms = lexical.terms([query_text or ""], self._analysis)[0]
        depth = min(max(candidates, k), self._chunks)
        return self._database.run_sync(
            lambda c: self._search(c, query, terms, k, depth, use_dense, use_lexical, fusion), tenant=self._tenant)

    def _search(self, connection: psycopg.Connection, query: np.ndarray, terms: list[str], k: int, depth: int,
                use_dense: bool, use_lexical: bool, fusion: FusionSettings) -> list[Hit]:
        use_vectors(connection)
        dense = self._dense_top(connection, query, depth) if use_dense else []
        lexical_top = self._lexical_top(connection, terms, depth) if use_lexical and terms else []
        fused = fuse(dense, lexical_top, fusion if use_dense and use_lexical else FusionSettings())
        if not fused:
            return []
        rows = {r[0]: r for r in connection.execute(_FETCH, {"query": Vector(query), "ids": list(fused),
                                                              "space": self._space, "tenant": self._tenant})}
        order = sorted(rows, key=lambda i: (-fused[i], -rows[i][4], rows[i][1]))[:k]
        bm25 = dict(lexical_top)
        return [Hit(IndexedChunk(rows[i][1], rows[i][2], rows[i][3]), float(rows[i][4]), bm25.get(i), fused[i])
                for i in order]

    def _dense_top(self, connection: psycopg.Connection, query: np.ndarray, count: int) -> list[tuple[int, float]]:
        parameters = {"query": Vector(query), "space": self._space, "tenant": self._tenant, "count": count}
        if self._chunks > EXACT_SEARCH_UP_TO and query.shape[0] <= _HNSW_MAX_DIMENSIONS:
            ef_search = min(max(count, _HNSW_EF_SEARCH), _HNSW_EF_SEARCH_MAX)
            connection.execute("SELECT set_config('hnsw.ef_search', %s, true), "
                               "set_config('hnsw.iterative_scan', 'relaxed_order', true)", (str(ef_search),))
            found = connection.execute(_APPROXIMATE.format(d=int(query.shape[0])), parameters).fetchall()
            if len(found) >= count:
                metrics.STORE_DENSE_SEARCHES.labels("approximate").inc()
                return [(i, float(cosine)) for i, cosine in found]
            metrics.STORE_DENSE_SEARCHES.labels("approximate_short").inc()
        else:
            metrics.STORE_DENSE_SEARCHES.labels("exact").inc()
        return [(i, float(cosine)) for i, cosine in connection.execute(_EXACT, parameters)]

    def _lexical_top(self, connection: psycopg.Connection, terms: list[str], count: int) -> list[tuple[int, float]]:
        rows = connection.execute(_BM25, {"terms": terms, "space": self._space, "tenant": self._tenant,
                                          "count": count})
        return [(i, float(score)) for i, score in rows if score > 0]


def _unit(query_vector: np.ndarray) -> np.ndarray:
    query = np.asarray(query_vector, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(query))
    return query / norm if norm > 0 else query


# -- dense indexes, one per dimension ---------------------------------------------------------------------------

def ensure_dense_index(connection: psycopg.Connection, dimensions: int) -> None:
    """Creates the HNSW index of this dimension's vectors (halfvec, cosine) if it does not exist yet. Replicas
    meeting a new dimension together take turns (an advisory lock), so each index is built once. A role not
    allowed to create it (the schema migrated by an administrator) is warned about; searches then scan exactly."""
    if dimensions > _HNSW_MAX_DIMENSIONS:
        return
    name = f"ragsidecar_memory_chunks_hnsw_{int(dimensions)}"
    if connection.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None:
        try:
            with connection.transaction():
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (_INDEX_LOCK,))
                connection.execute(
                    f"CREATE INDEX IF NOT EXISTS {name} ON ragsidecar_memory_chunks USING hnsw "
                    f"((embedding::halfvec({int(dimensions)})) halfvec_cosine_ops) "
                    f"WITH (m = {_HNSW_M}, ef_construction = {_HNSW_EF_CONSTRUCTION}) "
                    f"WHERE vector_dims(embedding) = {int(dimensions)}")
        except psycopg.errors.InsufficientPrivilege as err:
            log.warning("cannot create the dense index %s (%s): MEMORY searches scan exactly; create it as the "
                        "tables' owner", name, err)


# -- vectors on the wire ----------------------------------------------------------------------------------------

class Vector:
    """A float vector sent in pgvector's binary form (`%b::vector`), without formatting floats as text."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Vector) -> bytes:
        values = np.asarray(obj.values, dtype=">f4").reshape(-1)
        return struct.pack(">HH", values.shape[0], 0) + values.tobytes()


def use_vectors(connection: psycopg.Connection) -> None:
    """Lets `Vector` parameters through on this connection (a pool's connections predate this module)."""
    connection.adapters.register_dumper(Vector, _VectorDumper)
