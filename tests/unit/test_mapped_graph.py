"""An index opened from a snapshot of at least index.MAPPED_FROM slots maps its HNSW graph from the snapshot's file
(page cache, not counted in its resident estimate) and searches it as the index that saved it did, also once a save
replaced that file; its first change copies the graph into memory, and the changes and a later snapshot of it hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ragsidecar.knowledge.index import MAPPED_FROM, HybridIndex, IndexedChunk

COUNT = MAPPED_FROM + 76
DIMENSIONS = 32


def unit_vectors(count: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, DIMENSIONS)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def chunk(i: int) -> IndexedChunk:
    return IndexedChunk(f"c{i}", f"entry {i} of the ledger names account a{i}", {"position": i})


def best_ids(index: HybridIndex, vectors: np.ndarray, rows: list[int]) -> list[list[str]]:
    return [[hit.chunk.id for hit in index.search(vectors[row], chunk(row).text, k=5)] for row in rows]


def test_the_graph_is_mapped_until_a_change_and_searches_alike(tmp_path: Path) -> None:
    vectors = unit_vectors(COUNT, 1)
    built = HybridIndex.build([chunk(i) for i in range(COUNT)], vectors, dtype="f16", lexical_language="english")
    built.save(tmp_path / "first")
    graph_bytes = (tmp_path / "first" / "dense.usearch").stat().st_size
    rows = [0, 17, 600, COUNT - 1]

    opened = HybridIndex.load(tmp_path / "first")
    assert best_ids(opened, vectors, rows) == best_ids(built, vectors, rows)
    assert opened.nbytes() <= built.nbytes() - graph_bytes * 0.9  # the graph is the file's pages
    opened.save(tmp_path / "first")  # a mapped graph saved over the folder it is mapped from
    assert best_ids(HybridIndex.load(tmp_path / "first"), vectors, rows) == best_ids(built, vectors, rows)
    assert best_ids(opened, vectors, rows) == best_ids(built, vectors, rows)

    extra = unit_vectors(1, 2)
    opened.update(["c17"], [chunk(COUNT)], extra)  # the first change: the graph copied into memory
    assert opened.nbytes() >= built.nbytes() - graph_bytes * 0.1
    (hit,) = opened.search(extra[0], chunk(COUNT).text, k=1)
    assert hit.chunk.id == f"c{COUNT}"
    assert "c17" not in [h.chunk.id for h in opened.search(vectors[17], chunk(17).text, k=5)]

    opened.save(tmp_path / "first")  # replaces the folder the graph was first mapped from
    reopened = HybridIndex.load(tmp_path / "first")
    changed_rows = [0, 600, COUNT - 1]
    assert best_ids(reopened, vectors, changed_rows) == best_ids(opened, vectors, changed_rows)
    (hit,) = reopened.search(extra[0], chunk(COUNT).text, k=1)
    assert hit.chunk.id == f"c{COUNT}"
