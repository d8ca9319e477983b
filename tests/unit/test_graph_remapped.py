"""A save of an index of at least index.MAPPED_FROM slots whose graph is in memory (built, or copied by a change) and
unchanged since the save's copy maps the graph from the file it wrote: the index lets go of its graph at its
snapshot (its resident estimate drops by the graph) and searches as before, through later changes, saves that
replace the folder, and searches running in other threads meanwhile."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from ragsidecar.knowledge.index import MAPPED_FROM, HybridIndex, IndexedChunk

COUNT = MAPPED_FROM + 76
DIMENSIONS = 32


def unit_vectors(count: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, DIMENSIONS)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def chunk(i: int) -> IndexedChunk:
    return IndexedChunk(f"c{i}", f"entry {i} of the ledger names account a{i}", {})


def best_ids(index: HybridIndex, vectors: np.ndarray, rows: list[int]) -> list[list[str]]:
    return [[hit.chunk.id for hit in index.search(vectors[row], chunk(row).text, k=5)] for row in rows]


def test_a_save_maps_the_graph_it_wrote_and_the_index_searches_alike_through_changes(tmp_path: Path) -> None:
    vectors = unit_vectors(COUNT, 1)
    index = HybridIndex.build([chunk(i) for i in range(COUNT)], vectors, dtype="f16", lexical_language="english")
    rows = [0, 17, 600, COUNT - 1]
    expected = best_ids(index, vectors, rows)
    held = index.nbytes()
    index.save(tmp_path / "snapshot")
    graph_bytes = (tmp_path / "snapshot" / "dense.usearch").stat().st_size
    assert index.nbytes() <= held - graph_bytes * 0.9  # the graph is the file's pages now
    assert best_ids(index, vectors, rows) == expected
    mapped = index.nbytes()

    extra = unit_vectors(3, 2)
    for i in range(3):
        index.update([f"c{i}"], [chunk(COUNT + i)], extra[i : i + 1])  # the graph copied into memory
        assert index.nbytes() >= mapped + graph_bytes * 0.9
        index.save(tmp_path / "snapshot")  # replaces the folder the graph was mapped from
        assert index.nbytes() <= mapped + graph_bytes * 0.1
        (hit,) = index.search(extra[i], chunk(COUNT + i).text, k=1)
        assert hit.chunk.id == f"c{COUNT + i}"
        assert f"c{i}" not in [h.chunk.id for h in index.search(vectors[i], chunk(i).text, k=5)]
    reopened = HybridIndex.load(tmp_path / "snapshot")
    assert best_ids(reopened, vectors, rows[1:]) == best_ids(index, vectors, rows[1:])


def test_searches_in_other_threads_run_through_changes_and_saves_that_map_the_graph(tmp_path: Path) -> None:
    vectors = unit_vectors(COUNT, 3)
    index = HybridIndex.build([chunk(i) for i in range(COUNT)], vectors, dtype="f16", lexical_language="english")
    expected = best_ids(index, vectors, [5, 900])
    stop = threading.Event()
    failures: list[object] = []

    def search() -> None:
        while not stop.is_set():
            try:
                if best_ids(index, vectors, [5, 900]) != expected:
                    failures.append("other hits")
            except Exception as error:  # reported below
                failures.append(error)

    searchers = [threading.Thread(target=search) for _ in range(2)]
    for thread in searchers:
        thread.start()
    try:
        extra = unit_vectors(6, 4)
        for i in range(6):
            index.add([chunk(COUNT + i)], extra[i : i + 1])
            index.save(tmp_path / "snapshot")
    finally:
        stop.set()
        for thread in searchers:
            thread.join()
    assert failures == []
    assert [h.chunk.id for h in index.search(extra[5], chunk(COUNT + 5).text, k=1)] == [f"c{COUNT + 5}"]
