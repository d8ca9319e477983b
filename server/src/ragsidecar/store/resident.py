"""Partition indexes held in process memory, shared by both document stores (embedded and postgres).

One incremental HybridIndex per partition, for the space (embedder fingerprint, lexical analysis) last asked
for, in an LRU bounded by estimated bytes (retrieval.memory_cache_bytes per store). With snapshots
(store/snapshots.py), an evicted index is reopened from its partition's snapshot plus the changes after it;
without one it is rebuilt from the stored chunks and vectors. Nothing is embedded again either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragsidecar import metrics
from ragsidecar.cache import ByteLRU
from ragsidecar.identifiers import key_of
from ragsidecar.knowledge import filters
from ragsidecar.knowledge.chunking import Chunk, chunk_meta
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk
from ragsidecar.store.snapshots import PartitionSnapshots


def space_of(model: str, analysis: str) -> str:
    """The space of chunks one embedder and one lexical analysis made."""
    return key_of(model, analysis)


def chunk_keys(chunks: list[Chunk]) -> list[str]:
    """Each chunk's key in its partition: its document and its order within that document, so that two
    documents of equal text (equal chunk ids) never share a key and a replaced document's chunks are found."""
    seen: dict[str, int] = {}
    keys = []
    for chunk in chunks:
        document = chunk.provenance.document_id
        ordinal = seen.get(document, 0)
        seen[document] = ordinal + 1
        keys.append(key_of(document, str(ordinal)))
    return keys


def indexed(chunk: Chunk) -> IndexedChunk:
    return IndexedChunk(chunk.id, chunk.text, chunk_meta(chunk))


def with_fields(chunk: IndexedChunk, fields: Mapping[str, filters.Value]) -> IndexedChunk:
    """The chunk with its document's fields in its meta, where filters (index.fields_of) and hits read them."""
    return IndexedChunk(chunk.id, chunk.text, {**chunk.meta, "fields": filters.to_json(fields)})


@dataclass
class Resident:
    index: HybridIndex
    space: str
    documents: int  # the partition's documents, as of the last change applied
    # How far the index is caught up with its partition (the postgres store's change sequence; 0 embedded).
    position: int = 0


class ResidentIndexes:
    def __init__(
        self, name: str, max_bytes: int, threads: int, dtype: str, snapshots: PartitionSnapshots | None = None
    ) -> None:
        self._lru: ByteLRU[str, Resident] = ByteLRU(max_bytes)
        self._threads, self._dtype = threads, dtype
        self._snapshots = snapshots
        metrics.track_size(name, self._lru)

    def restore(self, partition: str, space: str) -> HybridIndex | None:
        """The partition's index as its last snapshot of `space` holds it (its `position` says up to which
        change), or None: no snapshot, or one that cannot be trusted."""
        return None if self._snapshots is None else self._snapshots.load(partition, space)

    def incoming(self, partition: str) -> Path | None:
        """An empty folder to receive a snapshot of the partition into (snapshots.py); None without snapshots."""
        return None if self._snapshots is None else self._snapshots.incoming(partition)

    def adopt(self, partition: str, incoming: Path) -> None:
        """Makes the received snapshot in `incoming` the partition's own (snapshots.py)."""
        assert self._snapshots is not None
        self._snapshots.adopt(partition, incoming)

    def changed(self, partition: str, resident: Resident, chunks: int) -> None:
        """Holds (re-measured) the partition's index after `chunks` chunk changes were applied to it (its whole
        size when it was just built), and lets its snapshot follow."""
        self.keep(partition, resident)
        if self._snapshots is not None and chunks:
            self._snapshots.changed(partition, resident.space, resident.index, chunks)

    def get(self, partition: str, space: str) -> Resident | None:
        resident = self._lru.get(partition)
        return resident if resident is not None and resident.space == space else None

    def keep(self, partition: str, resident: Resident) -> None:
        """Holds (or re-measures, after a change) the partition's index."""
        self._lru.put(partition, resident, resident.index.nbytes())

    def drop(self, partition: str) -> None:
        self._lru.pop(partition)

    def close(self) -> None:
        """Writes no more snapshots, once the one in flight is done."""
        if self._snapshots is not None:
            self._snapshots.close()

    def forget(self, partition: str) -> None:
        """Drops the partition's index and its snapshot (the partition was dropped or emptied)."""
        self.drop(partition)
        if self._snapshots is not None:
            self._snapshots.forget(partition)

    def build(
        self,
        keys: list[str],
        chunks: list[IndexedChunk],
        vectors: np.ndarray,
        analysis: str,
        dimensions: int,
        position: int = 0,
    ) -> HybridIndex:
        return HybridIndex.build(
            chunks,
            vectors.reshape(len(chunks), dimensions),
            self._threads,
            self._dtype,
            lexical_language=analysis,
            keys=keys,
            position=position,
        )
