"""Partition indexes held in process memory, shared by both document stores (embedded and postgres).

One incremental HybridIndex per partition, for the space (embedder fingerprint, lexical analysis) last asked
for, in an LRU bounded by estimated bytes (retrieval.memory_cache_bytes per store). An evicted index is
rebuilt from the stored chunks and vectors on its next search: nothing is embedded again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ragsidecar import metrics
from ragsidecar.cache import ByteLRU
from ragsidecar.identifiers import key_of
from ragsidecar.knowledge.chunking import Chunk, chunk_meta
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk


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


@dataclass
class Resident:
    index: HybridIndex
    space: str
    documents: int  # the partition's documents, as of the last change applied
    # How far the index is caught up with its partition (the postgres store's change sequence; 0 embedded).
    position: int = 0


class ResidentIndexes:
    def __init__(self, name: str, max_bytes: int, threads: int, dtype: str) -> None:
        self._lru: ByteLRU[str, Resident] = ByteLRU(max_bytes)
        self._threads, self._dtype = threads, dtype
        metrics.track_size(name, self._lru)

    def get(self, partition: str, space: str) -> Resident | None:
        resident = self._lru.get(partition)
        return resident if resident is not None and resident.space == space else None

    def keep(self, partition: str, resident: Resident) -> None:
        """Holds (or re-measures, after a change) the partition's index."""
        self._lru.put(partition, resident, resident.index.nbytes())

    def drop(self, partition: str) -> None:
        self._lru.pop(partition)

    def build(
        self, keys: list[str], chunks: list[IndexedChunk], vectors: np.ndarray, analysis: str, dimensions: int
    ) -> HybridIndex:
        return HybridIndex.build(
            chunks,
            vectors.reshape(len(chunks), dimensions),
            self._threads,
            self._dtype,
            lexical_language=analysis,
            keys=keys,
        )
