"""A snapshot's field index (knowledge/field_columns.py) under filters.FieldIndex: the members it saved, with
members removed and added since, select exactly what evaluating each member's fields keeps, and so does the
field index a second save writes from the first one and the changes."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from filter_helpers import random_fields, random_filter

from ragsidecar.knowledge import field_columns
from ragsidecar.knowledge import filters as f
from ragsidecar.knowledge.field_columns import FieldColumns


def _opened(folder: Path, held: dict[int, dict[str, f.Value]], count: int) -> f.FieldIndex:
    saved = FieldColumns(folder)
    alive = np.zeros(count, dtype=bool)
    alive[[m for m in held if m < count]] = True
    return f.FieldIndex(saved, alive, lambda member: held[member])


def _changed(index: f.FieldIndex, held: dict[int, dict[str, f.Value]], rng: random.Random, first: int) -> int:
    """Removes a third of the members, adds as many new ones from `first` on; returns the next free member."""
    for member in rng.sample(sorted(held), len(held) // 3):
        index.remove(member)
        del held[member]
        held[first] = random_fields(rng, first)
        index.add(first, held[first])
        first += 1
    return first


def _expect_selected_as_evaluated(index: f.FieldIndex, held: dict[int, dict[str, f.Value]], rng: random.Random) -> None:
    for _ in range(300):
        node = random_filter(rng)
        assert index.select(node) == {m for m, fields in held.items() if f.matches(node, fields)}, node


def test_a_saved_field_index_selects_what_evaluation_keeps_through_changes_and_a_second_save(tmp_path: Path) -> None:
    rng = random.Random(47)
    held = {i: random_fields(rng, i) for i in range(400)}
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    field_columns.write(first, 400, None, np.zeros(0, dtype=bool), sorted(held.items()))
    index = _opened(first, held, 400)
    _expect_selected_as_evaluated(index, held, rng)

    following = _changed(index, held, rng, 400)
    _expect_selected_as_evaluated(index, held, rng)

    kept = np.zeros(400, dtype=bool)
    kept[[m for m in held if m < 400]] = True
    field_columns.write(second, following, FieldColumns(first), kept, sorted(m for m in held.items() if m[0] >= 400))
    reopened = _opened(second, held, following)
    _expect_selected_as_evaluated(reopened, held, rng)
    _changed(reopened, held, rng, following)
    _expect_selected_as_evaluated(reopened, held, rng)


def test_saved_values_are_kept_as_saved_while_most_are_held_and_written_afresh_after(tmp_path: Path) -> None:
    first, second, third = tmp_path / "1", tmp_path / "2", tmp_path / "3"
    for folder in (first, second, third):
        folder.mkdir()
    saved = [(0, {"user": "ann"}), (1, {"user": "bo"}), (2, {"user": "di"})]
    field_columns.write(first, 3, None, np.zeros(0, dtype=bool), saved)
    # Two of three held: the saved values stay as they are, "ann" again gets a code of its own.
    field_columns.write(second, 4, FieldColumns(first), np.array([True, True, False]), [(3, {"user": "ann"})])
    column = FieldColumns(second).column("user")
    assert column is not None and column.values == ["ann", "bo", "di", "ann"]
    alive = np.array([True, True, False, True])
    index = f.FieldIndex(FieldColumns(second), alive)
    assert index.select(f.Compare("user", f.Op.EQUAL, "ann")) == {0, 3}
    assert index.select(f.Compare("user", f.Op.GREATER, "b")) == {1}
    # One of four held: written afresh, the values held only.
    field_columns.write(third, 5, FieldColumns(second), np.array([False, False, False, True]), [(4, {"user": "cy"})])
    column = FieldColumns(third).column("user")
    assert column is not None and column.values == ["ann", "cy"] and column.slots.tolist() == [3, 4]
