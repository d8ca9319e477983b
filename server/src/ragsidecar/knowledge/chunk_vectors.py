"""The embedding caches: chunk vectors kept by model fingerprint and content hash, in memory and (postgres
backend) shared between replicas, so that only texts never embedded before reach the model."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from ragsidecar import metrics
from ragsidecar.cache import ByteLRU
from ragsidecar.identifiers import key_of
from ragsidecar.inference.models import BiEncoder
from ragsidecar.knowledge.chunking import Chunk
from ragsidecar.knowledge.index import HybridIndex
from ragsidecar.knowledge.storage import VectorCache

log = logging.getLogger(__name__)

_EMBED_BATCH = 128
_PROGRESS_EVERY_S = 5.0
_CACHE_BYTES = 256 * 1024 * 1024

# Called with (source name, chunks embedded, chunks to embed) as embedding advances (the CLI's bar).
Progress = Callable[[str, int, int], None]


class ChunkVectors:
    """Embeds chunks through the caches: this process's LRU first, then the vectors other replicas embedded."""

    def __init__(self, shared: VectorCache) -> None:
        self._vectors: ByteLRU[str, np.ndarray] = ByteLRU(_CACHE_BYTES)
        metrics.track_size("embeddings", self._vectors)
        # Vectors other replicas embedded (the postgres backend's), looked up where self._vectors misses.
        self._shared = shared

    async def embed(
        self,
        name: str,
        chunks: list[Chunk],
        embedder: BiEncoder,
        model: str,
        partition: str,
        on_progress: Progress | None,
    ) -> np.ndarray:
        """Vectors for the chunks; only texts not embedded before (by content hash), here or (postgres store) by
        any replica, reach the model. `partition` is whose cached vectors these are ("" for every tenant's)."""
        cache_key = key_of(model, partition) if partition else model
        found = {
            c.content_hash: vector
            for c in chunks
            if (vector := self._vectors.get(f"{cache_key}:{c.content_hash}")) is not None
        }
        missing = [c for c in chunks if c.content_hash not in found]
        if missing:
            hashes = list(dict.fromkeys(c.content_hash for c in missing))
            shared = await self._shared.fetch(partition, model, hashes)
            for digest, vector in shared.items():
                self._vectors.put(f"{cache_key}:{digest}", vector, vector.nbytes)
            found.update(shared)
            missing = [c for c in missing if c.content_hash not in found]
        embedded: dict[str, np.ndarray] = {}
        started, last_report = time.monotonic(), time.monotonic()
        for start in range(0, len(missing), _EMBED_BATCH):
            batch = missing[start : start + _EMBED_BATCH]
            vectors, *_ = await embedder.embed([c.text for c in batch])
            metrics.EMBEDDED_CHUNKS.inc(len(batch))
            for chunk, vector in zip(batch, vectors, strict=True):
                self._vectors.put(f"{cache_key}:{chunk.content_hash}", vector, vector.nbytes)
                embedded[chunk.content_hash] = vector
            done = start + len(batch)
            if on_progress:
                on_progress(name, done, len(missing))
            if time.monotonic() - last_report >= _PROGRESS_EVERY_S or done == len(missing):
                last_report = time.monotonic()
                rate = done / max(last_report - started, 1e-9)
                log.info(
                    "indexing %s: embedded %d/%d new chunks (%.1f chunks/s; %d reused)",
                    name,
                    done,
                    len(missing),
                    rate,
                    len(chunks) - len(missing),
                )
        if embedded:
            await self._shared.keep(partition, model, embedded)
        found.update(embedded)
        dimensions = embedder.dimensions
        return (
            np.stack([found[c.content_hash] for c in chunks]) if chunks else np.zeros((0, dimensions), dtype=np.float32)
        )

    def remember(self, index: HybridIndex, model: str) -> None:
        """Seeds the embedding cache from an index read back from disk (keyed on the same model
        fingerprint), so that after a restart a changed source re-embeds only its new chunks."""
        for chunk, vector in zip(index.chunks(), index.vectors(), strict=True):
            digest = chunk.meta.get("content_hash")
            if digest:
                self._vectors.put(f"{model}:{digest}", vector, vector.nbytes)
