"""Filtered search in the hybrid index (knowledge/index.py): both dense strategies (the exact scan of a small
selection, the graph asked for more neighbours for a large one) find only what the filter keeps and agree with
exact filtered search; BM25 finds only kept chunks; `hide` removes what it selects; the field index follows
changes."""

from __future__ import annotations

import numpy as np
import pytest

from ragsidecar.knowledge import filters as f
from ragsidecar.knowledge import index as index_module
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk

COUNT, DIMENSIONS = 3000, 32


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def built() -> tuple[HybridIndex, np.ndarray]:
    rng = np.random.default_rng(5)
    vectors = _unit(rng.standard_normal((COUNT, DIMENSIONS)))
    chunks = [
        IndexedChunk(f"c{i}", f"word{i % 7} common", {"fields": {"bucket": float(i % 100), "$id": f"d{i}"}})
        for i in range(COUNT)
    ]
    return HybridIndex.build(chunks, vectors), vectors


@pytest.mark.parametrize("switch", [0, COUNT])  # 0: always the graph; COUNT: always the exact scan
@pytest.mark.parametrize(
    "keep", [f.Compare("bucket", f.Op.LESS, 3.0), f.Compare("bucket", f.Op.GREATER_OR_EQUAL, 40.0)], ids=["3%", "60%"]
)
def test_both_dense_strategies_find_only_what_the_filter_keeps(
    built: tuple[HybridIndex, np.ndarray], keep: f.Filter, switch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, vectors = built
    monkeypatch.setattr(index_module, "EXACT_ROWS_PER_NEIGHBOUR", switch)
    kept = np.array([i for i in range(COUNT) if f.matches(keep, {"bucket": float(i % 100)})])
    rng = np.random.default_rng(9)
    recalls = []
    for query in _unit(rng.standard_normal((20, DIMENSIONS))):
        hits = index.search(query, "", 10, use_lexical=False, keep=keep)
        found = {int(h.chunk.id[1:]) for h in hits}
        assert len(found) == 10 and found <= set(kept.tolist())
        truth = set(kept[np.argsort(-(vectors[kept] @ query))[:10]].tolist())
        recalls.append(len(found & truth) / 10)
    assert np.mean(recalls) >= (1.0 if switch else 0.9)


def test_bm25_finds_only_kept_chunks_and_hide_removes_what_it_selects(built: tuple[HybridIndex, np.ndarray]) -> None:
    index, vectors = built
    keep = f.Compare("bucket", f.Op.EQUAL, 14.0)  # chunks 14, 114, ...: word0 only where i % 7 == 0
    hits = index.search(vectors[0], "word0", 50, use_dense=False, keep=keep)
    assert {h.chunk.id for h in hits} == {f"c{i}" for i in range(14, COUNT, 100) if i % 7 == 0}
    hidden = f.In("$id", ("d14", "d114"))
    shown = index.search(vectors[14], "", 50, use_lexical=False, keep=keep, hide=hidden)
    assert {h.chunk.id for h in shown} == {f"c{i}" for i in range(214, COUNT, 100)}
    assert index.search(vectors[0], "", 5, keep=f.AnyOf(())) == []


def test_the_field_index_follows_changes() -> None:
    rng = np.random.default_rng(1)
    vectors = _unit(rng.standard_normal((4, DIMENSIONS)))
    chunks = [IndexedChunk(f"c{i}", "text", {"fields": {"user": "u1" if i < 2 else "u2"}}) for i in range(4)]
    index = HybridIndex.build(chunks, vectors)
    mine = f.Compare("user", f.Op.EQUAL, "u1")
    assert {h.chunk.id for h in index.search(vectors[0], "", 10, keep=mine)} == {"c0", "c1"}
    index.update(["c1"], [IndexedChunk("c9", "text", {"fields": {"user": "u1"}})], vectors[3:4])
    index.remove(["c0"])
    assert {h.chunk.id for h in index.search(vectors[0], "", 10, keep=mine)} == {"c9"}
