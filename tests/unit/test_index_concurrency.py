"""The hybrid index (knowledge/index.py) under concurrency: searches run at once, and searches beside a stream of
writes, find exactly what the same searches find one at a time, see a replacement whole or not at all, and lose no
write."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ragsidecar.knowledge import filters as f
from ragsidecar.knowledge import index as index_module
from ragsidecar.knowledge.fusion import FusionSettings
from ragsidecar.knowledge.index import Hit, HybridIndex, IndexedChunk

COUNT, DIMENSIONS, THREADS = 3000, 32, 8
# Every search's fusion: feedback on, as the default [retrieval] settings have it.
FUSION = FusionSettings(method="minmax", dense_weight=0.625, feedback_documents=2, feedback_weight=0.5)
ROUNDS = 60


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _chunk(i: int, version: str = "a") -> IndexedChunk:
    return IndexedChunk(
        f"c{i}-{version}",
        f"note {i} ident{i} version {version} on topic{i % 23} and word{i % 7}",
        {"fields": {"n": float(i)}},
    )


def _built(rng: np.random.Generator) -> tuple[HybridIndex, np.ndarray]:
    vectors = _unit(rng.standard_normal((COUNT, DIMENSIONS)))
    chunks = [_chunk(i) for i in range(COUNT)]
    return HybridIndex.build(chunks, vectors, keys=[f"k{i}" for i in range(COUNT)]), vectors


Search = tuple[np.ndarray, str, int, dict[str, object]]


def _searches(rng: np.random.Generator, vectors: np.ndarray) -> list[Search]:
    """Hybrid, dense-only, lexical-only and filtered searches (the graph asked for more neighbours than usual, and
    the exact scan of a small selection), with several k (one past the fused head)."""
    searches: list[Search] = []
    for n in range(48):
        target = int(rng.integers(COUNT))
        query = _unit(vectors[target] + 0.3 * rng.standard_normal(DIMENSIONS).astype(np.float32)[None])[0]
        text = f"topic{target % 23} word{n % 7} note {target}"
        options: list[dict[str, object]] = [
            {},
            {"use_lexical": False},
            {"use_dense": False},
            {"keep": f.Compare("n", f.Op.LESS, 1500.0)},
            {"keep": f.Compare("n", f.Op.LESS, 40.0)},
        ]
        searches.append((query, text, (10, 3, 120)[n % 3], options[n % len(options)]))
    return searches


def _run(index: HybridIndex, search: Search) -> list[tuple[str, float, float | None, float]]:
    query, text, k, options = search
    hits: list[Hit] = index.search(query, text, k, 100, fusion=FUSION, **options)  # type: ignore[arg-type]
    return [(h.chunk.id, h.dense, h.bm25, h.fused) for h in hits]


def test_searches_at_once_find_what_they_find_one_at_a_time() -> None:
    rng = np.random.default_rng(3)
    index, vectors = _built(rng)
    searches = _searches(rng, vectors)
    alone = [_run(index, s) for s in searches]
    order = [n for _ in range(4) for n in rng.permutation(len(searches)).tolist()]
    with ThreadPoolExecutor(THREADS) as pool:
        together = list(pool.map(lambda n: (n, _run(index, searches[n])), order))
    for n, hits in together:
        assert hits == alone[n], f"search {n} found other hits beside other searches"


def _write(index: HybridIndex, vectors: np.ndarray, round_: int) -> None:
    """Round r: chunk r's key replaced by a new version (removed and added in one step), a new chunk added and an
    old one removed."""
    old, new = round_, COUNT + round_
    replacement = _unit(vectors[old][None] + 0.05)
    index.update([f"k{old}"], [_chunk(old, f"v{round_}")], replacement, [f"k{old}-v{round_}"])
    index.add([_chunk(new)], vectors[new % COUNT][None] * -1, [f"k{new}"])
    index.remove([f"k{COUNT - 1 - round_}"])


def test_searches_beside_writes_see_each_write_whole_and_lose_none() -> None:
    rng = np.random.default_rng(4)
    index, vectors = _built(rng)
    searches = _searches(rng, vectors)
    done = threading.Event()
    seen_torn: list[str] = []
    searched = [0]

    def search_while_writing(worker: int) -> None:
        n = worker
        while not done.is_set() or n < worker + THREADS * len(searches):
            hits = _run(index, searches[n % len(searches)])
            ids = [chunk_id for chunk_id, *_ in hits]
            if len(set(ids)) != len(ids):
                seen_torn.append(f"a chunk twice: {ids}")
            # A replaced chunk is found in one version or the other, never in none nor both (a replacement is one step).
            replaced = n % ROUNDS
            found = index.search(vectors[replaced], f"ident{replaced}", 5, use_dense=False)
            if len(found) != 1:
                seen_torn.append(f"{[h.chunk.id for h in found]} for ident{replaced}")
            searched[0] += 1
            n += THREADS

    with ThreadPoolExecutor(THREADS) as pool:
        readers = [pool.submit(search_while_writing, worker) for worker in range(THREADS - 1)]
        for round_ in range(ROUNDS):
            _write(index, vectors, round_)
        done.set()
        for reader in readers:
            reader.result()
    assert not seen_torn
    assert searched[0] >= (THREADS - 1) * len(searches)

    # Nothing lost: the index holds exactly the writes' outcome, and searches find what searches of the same
    # writes made one at a time find (the graph and BM25 side took the same changes in the same order).
    serial, _ = _built(np.random.default_rng(4))
    for round_ in range(ROUNDS):
        _write(serial, vectors, round_)
    expected = (
        {f"k{i}" for i in range(ROUNDS, COUNT - ROUNDS)}
        | {f"k{i}-v{i}" for i in range(ROUNDS)}
        | {f"k{COUNT + i}" for i in range(ROUNDS)}
    )
    assert index.keys() == serial.keys() == expected
    for search in searches:
        assert _run(index, search) == _run(serial, search)
    for round_ in range(ROUNDS):
        (hit,) = index.search(_unit(vectors[round_][None] + 0.05)[0], "", 1, use_lexical=False)
        assert hit.chunk.id == f"c{round_}-v{round_}"


def test_a_change_does_not_wait_for_a_search_fusing_what_it_found(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    index, vectors = _built(rng)
    query, text, _, _ = _searches(rng, vectors)[0]
    before = _run(index, (query, text, 10, {}))
    fusing, fused = threading.Event(), threading.Event()
    fuse = index_module.fuse_scores

    def held_fuse(*args: object, **kwargs: object) -> object:
        fusing.set()
        fused.wait(60)
        return fuse(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(index_module, "fuse_scores", held_fuse)
    with ThreadPoolExecutor(2) as pool:
        searching = pool.submit(_run, index, (query, text, 10, {}))
        assert fusing.wait(60)
        writing = pool.submit(_write, index, vectors, 0)
        try:
            writing.result(timeout=30)  # returns while the search still fuses: it holds no lock the change needs
        finally:
            fused.set()
        assert searching.result() == before  # the search answers from the lists it found before the change


def test_searches_of_every_index_run_at_most_searches_at_once_together(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    (first, vectors), (second, _) = _built(rng), _built(rng)
    searches = _searches(rng, vectors)
    inside, most = [0], [0]
    counting = threading.Lock()
    fuse = index_module.fuse_scores

    def counted_fuse(*args: object, **kwargs: object) -> object:
        with counting:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)  # lets go of the GIL: any other search allowed in gets to fuse meanwhile
        with counting:
            inside[0] -= 1
        return fuse(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(index_module, "fuse_scores", counted_fuse)
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda n: _run((first, second)[n % 2], searches[n % len(searches)]), range(4 * THREADS)))
    assert most[0] == index_module.SEARCHES_AT_ONCE
