"""What names a source's index: its identity (one source whatever its content), the fingerprint of the model its
vectors came from, and the key hashing everything the index depends on (equal keys mean an identical index)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ragsidecar.config import RetrievalConfig
from ragsidecar.identifiers import key_of
from ragsidecar.inference.models import BiEncoder
from ragsidecar.knowledge.declarations import Entry, SourceType


def model_fingerprint(embedder: BiEncoder, retrieval: RetrievalConfig) -> str:
    """Everything that changes a chunk's or a query's vector: the embedder's files, its pooling and
    max_length (a reload may change them under the same model id), the query prefix, the chunking."""
    return key_of(
        embedder.fingerprint,
        embedder.spec.pooling,
        str(embedder.spec.max_length),
        retrieval.query_prefix,
        str(retrieval.chunk_tokens),
        str(retrieval.chunk_overlap_tokens),
    )


def source_identity(entry: Entry) -> str:
    """One source whatever its content: its name, type and location."""
    location = "inline:" + key_of(entry.inline_text) if entry.type is SourceType.INLINE else entry.path
    return key_of(entry.name, str(entry.type), location)


def index_key(
    entry: Entry, model: str, retrieval: RetrievalConfig, files: Iterable[tuple[Path, os.stat_result]]
) -> str:
    """Hash of everything the index depends on: the source, the model, the index settings and (FILE and
    DIRECTORY) each file with its size and modification time."""
    parts = [source_identity(entry), model, retrieval.index_dtype, retrieval.lexical_language]
    for file, stat in files:
        parts += [str(file), str(stat.st_size), str(stat.st_mtime_ns)]
    return key_of(*parts)[:32]
