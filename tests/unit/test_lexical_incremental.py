"""The incremental BM25 (knowledge/lexical.py's Lexical): whatever sequence of adds, replacements, removals and
merges led to its texts, its scores are bm25s's built afresh on the live texts. Fast unit tests: no server, no
models; real abstracts (tests/data/scifact). The memtable and tiers are shrunk so that a few hundred texts go
through flushes, merges and rewrites of mostly dead segments."""

from __future__ import annotations

import json
import random
from pathlib import Path

import bm25s
import ir_data
import numpy as np
import pytest

from ragsidecar.knowledge import lexical
from ragsidecar.knowledge.lexical import Lexical, terms
from ragsidecar.knowledge.merge_policy import TieredMergePolicy

ABSTRACTS = list(ir_data.corpus("scifact").values())
CLAIMS = list(ir_data.queries("scifact").values())
RELATIVE = 1e-4


@pytest.fixture
def small_tiers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lexical, "FLUSH_TEXTS", 16)
    monkeypatch.setattr(lexical, "MERGE_POLICY", TieredMergePolicy(fanout=3, base=1000))
    monkeypatch.setattr(lexical, "INLINE_MERGE_POSTINGS", 6000)
    monkeypatch.setattr(lexical, "VOCABULARY_FLOOR", 256)


def fresh_scores(live: dict[int, str], query: str, language: str = "english") -> dict[int, float]:
    """bm25s (as the index used it before: lucene, at the index's k1 and b) built on the live texts:
    slot -> score > 0."""
    slots = sorted(live)
    model = bm25s.BM25(k1=lexical.K1, b=lexical.B)
    model.index(terms([live[s] for s in slots], language), show_progress=False)
    ids = model.get_tokens_ids(terms([query], language)[0])
    if not ids:
        return {}
    scores = model.get_scores_from_ids(ids)
    return {slots[i]: float(scores[i]) for i in np.flatnonzero(scores > 0)}


def assert_same_ranking(index: Lexical, live: dict[int, str], query: str, count: int = 10) -> None:
    """Same scores as a fresh build, and the same top `count` apart from the order of tied texts."""
    expected = fresh_scores(live, query)
    found = index.top(query, count)
    best = sorted(expected.items(), key=lambda item: (-item[1], item[0]))[:count]
    assert len(found) == len(best), query
    for (slot, score), (_, fresh) in zip(found, best, strict=True):
        assert score == pytest.approx(expected[slot], rel=RELATIVE), (query, slot)
        assert score == pytest.approx(fresh, rel=RELATIVE), query  # the same order: ties aside
    assert found == sorted(found, key=lambda item: (-item[1], item[0]))
    # Every text sharing a term with the query, and no other, is found.
    assert {slot for slot, _ in index.top(query, len(live) + 1)} == set(expected)


def test_random_adds_replacements_and_removals_score_as_a_fresh_build(small_tiers: None) -> None:
    rng = random.Random(19)
    index, live = Lexical("english"), {}
    merged = 0
    for step in range(400):
        roll = rng.random()
        if roll < 0.55:  # adds, some of them replacing a slot's text
            slots = [rng.randrange(300) for _ in range(rng.randint(1, 6))]
            texts = [rng.choice(ABSTRACTS) for _ in slots]
            index.add(slots, texts)
            live.update(zip(slots, texts, strict=True))
        elif roll < 0.9:  # removals, absent slots among them
            slots = [rng.randrange(320) for _ in range(rng.randint(1, 8))]
            index.remove(slots)
            for slot in slots:
                live.pop(slot, None)
        else:
            merged += index.merge()
        assert len(index) == len(live)
        if step % 50 == 49:
            for query in rng.sample(CLAIMS, 8):
                assert_same_ranking(index, live, query)
    assert merged and index.segments > 1  # the sequence went through segments and merges


def test_query_terms_that_repeat_count_each_time() -> None:
    live = dict(enumerate(ABSTRACTS[:60]))
    index = Lexical.build(list(live.values()), "english")
    for query in ("sleep sleep study", "cells cells cells in the tumour tumour", CLAIMS[0] + " " + CLAIMS[0]):
        assert_same_ranking(index, live, query)


def test_texts_without_terms_count_in_the_collection_and_match_nothing() -> None:
    live = {0: "The sleep lab runs a study.", 1: "the of and", 2: "", 3: "Bread needs flour."}
    index = Lexical.build(list(live.values()), "english")
    assert len(index) == 4
    assert_same_ranking(index, live, "study of bread")
    # N = 4, df = 1: idf ln(1 + 3.5 / 1.5), as bm25s has it.
    assert index.top("bread", 5)[0][0] == 3
    index.remove([0, 3])
    assert index.top("bread", 5) == [] and len(index) == 2


def test_nothing_to_find_gives_an_empty_list() -> None:
    empty = Lexical("english")
    assert empty.top("sleep", 5) == [] and len(empty) == 0
    index = Lexical.build(ABSTRACTS[:20], "english")
    assert index.top("the of and", 5) == []  # stopwords only
    assert index.top("zyxwvut", 5) == []  # no known term
    assert index.top("", 5) == []
    assert index.top(CLAIMS[0], 0) == []
    index.remove(range(20))
    assert index.top(CLAIMS[0], 5) == [] and len(index) == 0


def test_add_replaces_a_slot_and_remove_ignores_absent_slots() -> None:
    index = Lexical("english")
    index.add([5, 9], ["night shifts disturb sleep", "bread needs flour"])
    index.add([5], ["ovens bake bread"])  # replaced: the sleep text is gone
    assert index.top("sleep", 5) == []
    assert {slot for slot, _ in index.top("bread", 5)} == {5, 9}
    index.remove([5, 5, 1000, 3])
    assert [slot for slot, _ in index.top("bread", 5)] == [9] and len(index) == 1
    with pytest.raises(ValueError):
        index.add([1, 2], ["one text"])
    with pytest.raises(ValueError):
        index.add([-1], ["negative slot"])
    with pytest.raises(ValueError, match="klingon"):
        Lexical("klingon")


def test_merges_drop_the_postings_and_terms_of_removed_texts(small_tiers: None) -> None:
    index = Lexical("english")
    index.add(range(300), ABSTRACTS[:300])
    while index.merge():
        pass
    full = index.nbytes()
    kept = range(0, 300, 20)
    index.remove(slot for slot in range(300) if slot not in kept)
    while index.merge():
        pass
    assert index.dead_postings == 0  # mostly dead segments were rewritten
    # Postings and vocabulary follow the live texts (shapes, a few thousand (tf, length) pairs at most, stay).
    assert index.nbytes() < full / 2
    live = {slot: ABSTRACTS[slot] for slot in kept}
    for query in CLAIMS[:10] + [ABSTRACTS[20][:100]]:
        assert_same_ranking(index, live, query)
    index.add([1], [ABSTRACTS[1]])  # a term dropped from the vocabulary comes back
    live[1] = ABSTRACTS[1]
    assert_same_ranking(index, live, ABSTRACTS[1][:100])


def test_a_merge_run_outside_the_lock_keeps_the_changes_made_meanwhile(
    small_tiers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lexical, "INLINE_MERGE_POSTINGS", 0)  # every merge left to merge() / start_merge()
    index = Lexical("english")
    index.add(range(260), ABSTRACTS[:260])
    assert index.needs_merge()
    merge = index.start_merge()
    assert merge is not None and index.start_merge(max_postings=0) is None
    held = sorted(int(slot) for s in merge.segments for slot in s.docs)
    changed = held[1::4] + held[::8]  # while the merge runs: removed, replaced, removed and added again
    index.remove(held[::2])
    index.add(changed, [ABSTRACTS[300]] * len(changed))
    merge.run()
    index.finish_merge(merge)
    live = {slot: ABSTRACTS[slot] for slot in range(260) if slot not in held[::2]}
    live.update({slot: ABSTRACTS[300] for slot in changed})
    assert len(index) == len(live)
    for query in CLAIMS[:10] + [ABSTRACTS[300][:80]]:
        assert_same_ranking(index, live, query)


def test_a_cancelled_merge_gives_its_segments_back(small_tiers: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lexical, "INLINE_MERGE_POSTINGS", 0)
    index = Lexical("english")
    index.add(range(100), ABSTRACTS[:100])
    merge = index.start_merge()
    assert merge is not None
    index.cancel_merge(merge)  # as after a failed run
    again = index.start_merge()
    assert again is not None and {s.id for s in again.segments} == {s.id for s in merge.segments}


def test_save_and_load_keep_every_score_and_the_index_keeps_changing(tmp_path: Path, small_tiers: None) -> None:
    index, live = Lexical("english"), dict(enumerate(ABSTRACTS[:150]))
    index.add(list(live), list(live.values()))
    index.remove(range(0, 150, 3))
    live = {slot: text for slot, text in live.items() if slot % 3}
    index.save(tmp_path / "bm25")  # segments, dead postings and the memtable
    loaded = Lexical.load(tmp_path / "bm25", "english")
    assert len(loaded) == len(live) and loaded.segments >= index.segments
    for query in CLAIMS[:10]:
        assert loaded.top(query, 10) == index.top(query, 10)
    loaded.add([0, 151], [ABSTRACTS[200], ABSTRACTS[201]])
    loaded.remove([1])
    live.update({0: ABSTRACTS[200], 151: ABSTRACTS[201]})
    del live[1]
    for query in CLAIMS[:10]:
        assert_same_ranking(loaded, live, query)
    empty = tmp_path / "empty"
    Lexical("none").save(empty)
    assert Lexical.load(empty, "none").top("anything", 3) == []


def damage_array(folder: Path) -> None:
    slots = np.load(folder / "slots.npy")
    np.save(folder / "slots.npy", slots[:-1])


def damage_offsets(folder: Path) -> None:
    starts = np.load(folder / "starts.npy")
    starts[1] = starts[2] + 1
    np.save(folder / "starts.npy", starts)


def damage_owner(folder: Path) -> None:
    owner = np.load(folder / "owner.npy")
    owner[0] = 999
    np.save(folder / "owner.npy", owner)


def damage_meta(folder: Path) -> None:
    meta = json.loads((folder / "lexical.json").read_text())
    meta["segments"][0][2] += 1
    (folder / "lexical.json").write_text(json.dumps(meta))


def damage_dtype(folder: Path) -> None:
    np.save(folder / "shapes.npy", np.load(folder / "shapes.npy").astype(np.float64))


def truncate_vocabulary(folder: Path) -> None:
    (folder / "vocabulary.json").write_text((folder / "vocabulary.json").read_text()[:-10])


@pytest.mark.parametrize(
    "damage", [damage_array, damage_offsets, damage_owner, damage_meta, damage_dtype, truncate_vocabulary]
)
def test_load_refuses_damaged_files(tmp_path: Path, damage) -> None:
    Lexical.build(ABSTRACTS[:40], "english").save(tmp_path)
    damage(tmp_path)
    with pytest.raises(ValueError):
        Lexical.load(tmp_path, "english")


def test_load_refuses_another_analysis(tmp_path: Path) -> None:
    Lexical.build(ABSTRACTS[:5], "english").save(tmp_path)
    with pytest.raises(ValueError, match="english"):
        Lexical.load(tmp_path, "none")
