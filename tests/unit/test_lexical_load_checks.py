"""What a BM25 load checks, case by case: a saved index of several segments with dead postings loads as it was
saved, and each kind of damage its checks look for is refused (ValueError), whether the postings it hits are all
held or some are dead."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import ir_data
import numpy as np
import pytest

from ragsidecar.knowledge.lexical import Lexical

ABSTRACTS = list(ir_data.corpus("scifact").values())[:300]


def saved(folder: Path, removed: range = range(0)) -> Lexical:
    """Texts added in batches (several segments, the memtable saved as one more), `removed` after them."""
    index = Lexical("english")
    for start in range(0, len(ABSTRACTS), 100):
        index.add(range(start, start + 100), ABSTRACTS[start : start + 100])
    index.remove(removed)
    index.save(folder)
    return index


def rewrite(folder: Path, name: str, change: Callable[[np.ndarray], None]) -> None:
    array = np.load(folder / name)
    change(array)
    np.save(folder / name, array)


def longer_text(lengths: np.ndarray) -> None:
    lengths[7] += 1  # its postings' shapes now name a shorter text


def slot_past_the_end(slots: np.ndarray) -> None:
    slots[3] = 10_000


def negative_slot(slots: np.ndarray) -> None:
    slots[-1] = -2


def shape_past_the_end(shapes: np.ndarray) -> None:
    shapes[0] = np.iinfo(np.uint32).max


def term_past_the_end(terms: np.ndarray) -> None:
    terms[-1] = 1 << 30


def owned_twice(docs: np.ndarray) -> None:
    docs[1] = docs[0]  # a text in its segment twice


DAMAGE = {
    "text_lengths.npy": [longer_text],
    "slots.npy": [slot_past_the_end, negative_slot],
    "shapes.npy": [shape_past_the_end],
    "terms.npy": [term_past_the_end],
    "docs.npy": [owned_twice],
}
CASES = [(name, change) for name, changes in DAMAGE.items() for change in changes]


def test_a_saved_index_with_dead_postings_loads_as_saved(tmp_path: Path) -> None:
    index = saved(tmp_path, range(0, 300, 7))
    loaded = Lexical.load(tmp_path, "english")
    assert loaded.segments > 1 and loaded.dead_postings == index.dead_postings > 0
    assert len(loaded) == len(index)
    for query in ("cell", "protein expression in tumours", "vitamin d"):
        assert loaded.top(query, 10) == index.top(query, 10)


@pytest.mark.parametrize("dead", [False, True], ids=["all held", "some dead"])
@pytest.mark.parametrize(("name", "change"), CASES, ids=[c.__name__ for _, c in CASES])
def test_damage_is_refused(tmp_path: Path, name: str, change: Callable[[np.ndarray], None], dead: bool) -> None:
    saved(tmp_path, range(1, 300, 5) if dead else range(0))
    if change is longer_text:
        # Only a load that counts the dead postings from every posting (a save of before they were saved) checks
        # each against its text's length; otherwise the snapshot manifest's checksum is what catches this.
        forget_dead_postings(tmp_path)
    rewrite(tmp_path, name, change)
    with pytest.raises(ValueError):
        Lexical.load(tmp_path, "english")


def forget_dead_postings(folder: Path) -> None:
    """The index's meta as a version that did not save the segments' dead postings wrote it."""
    meta = json.loads((folder / "lexical.json").read_text(encoding="utf-8"))
    del meta["dead"]
    (folder / "lexical.json").write_text(json.dumps(meta), encoding="utf-8")


def test_an_index_saved_without_its_dead_postings_loads_as_saved(tmp_path: Path) -> None:
    index = saved(tmp_path, range(0, 300, 7))
    forget_dead_postings(tmp_path)
    loaded = Lexical.load(tmp_path, "english")
    assert loaded.dead_postings == index.dead_postings > 0
    assert loaded.top("cell", 10) == index.top("cell", 10)


def test_a_vocabulary_of_other_than_terms_is_refused(tmp_path: Path) -> None:
    saved(tmp_path)
    words = json.loads((tmp_path / "vocabulary.json").read_text(encoding="utf-8"))
    (tmp_path / "vocabulary.json").write_text(json.dumps([*words[:-1], 5]), encoding="utf-8")
    with pytest.raises(ValueError, match="vocabulary"):
        Lexical.load(tmp_path, "english")
