"""The filter language (knowledge/filters.py): evaluation of every operator and kind, the filter index agreeing
with evaluation, and validation of hostile filters."""

from __future__ import annotations

import math
import random

import pytest
from filter_helpers import random_fields, random_filter

from ragsidecar.knowledge import filters as f

T0 = f.Instant(1_700_000_000_000_000_000)
DOC: dict[str, f.Value] = {
    "author": "ada",
    "year": 2021.0,
    "draft": False,
    "seen": T0,
    "tags": ("ml", "notes"),
    f.ID: "doc-1",
}


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (f.Compare("author", f.Op.EQUAL, "ada"), True),
        (f.Compare("author", f.Op.NOT_EQUAL, "ada"), False),
        (f.Compare("author", f.Op.LESS, "bob"), True),
        (f.Compare("author", f.Op.GREATER_OR_EQUAL, "bob"), False),
        (f.Compare("year", f.Op.EQUAL, 2021.0), True),
        (f.Compare("year", f.Op.LESS, 2021.0), False),
        (f.Compare("year", f.Op.LESS_OR_EQUAL, 2021.0), True),
        (f.Compare("year", f.Op.GREATER, 2020.5), True),
        (f.Compare("year", f.Op.GREATER_OR_EQUAL, 2022.0), False),
        (f.Compare("draft", f.Op.EQUAL, False), True),
        (f.Compare("draft", f.Op.NOT_EQUAL, True), True),
        (f.Compare("seen", f.Op.LESS, f.Instant(T0.nanos + 1)), True),
        (f.Compare("seen", f.Op.GREATER, T0), False),
        (f.Compare("tags", f.Op.EQUAL, "ml"), True),
        (f.Compare("tags", f.Op.EQUAL, ("ml", "notes")), True),
        (f.Compare("tags", f.Op.EQUAL, ("notes", "ml")), False),
        (f.Compare("tags", f.Op.NOT_EQUAL, "art"), True),
        (f.In("author", ("bob", "ada")), True),
        (f.In("author", ("bob", "ada"), negated=True), False),
        (f.In("tags", ("art", "notes")), True),
        (f.In("year", (2020.0, 2022.0)), False),
        (f.Exists("seen"), True),
        (f.Exists("missing"), False),
        # a missing field or another kind: no match, except for the negations
        (f.Compare("missing", f.Op.EQUAL, "x"), False),
        (f.Compare("missing", f.Op.NOT_EQUAL, "x"), True),
        (f.In("missing", ("x",), negated=True), True),
        (f.Compare("year", f.Op.EQUAL, "2021"), False),
        (f.Compare("draft", f.Op.EQUAL, 0.0), False),
        (f.Compare("year", f.Op.LESS, "z"), False),
        (f.All((f.Compare("author", f.Op.EQUAL, "ada"), f.Not(f.Exists("missing")))), True),
        (f.AnyOf((f.Compare("author", f.Op.EQUAL, "bob"), f.Compare("year", f.Op.GREATER, 2000.0))), True),
        (f.AnyOf(()), False),
        (f.All(()), True),
        (
            f.Not(f.All((f.Exists("author"), f.AnyOf((f.Exists("missing"), f.Compare(f.ID, f.Op.EQUAL, "doc-1")))))),
            False,
        ),
    ],
)
def test_every_operator_and_kind(node: f.Filter, expected: bool) -> None:
    assert f.problems(node, "filter") == []
    assert f.matches(node, DOC) is expected
    index = f.FieldIndex()
    index.add(7, DOC)
    assert index.select(node) == ({7} if expected else set())


def test_the_index_selects_what_evaluation_keeps_through_changes() -> None:
    rng = random.Random(31)
    index = f.FieldIndex()
    held: dict[int, dict[str, f.Value]] = {}
    for i in range(400):
        held[i] = random_fields(rng, i)
        index.add(i, held[i])
    for i in rng.sample(range(400), 120):  # removed, some written again with other fields
        index.remove(i)
        del held[i]
        if rng.random() < 0.5:
            held[i] = random_fields(rng, i + 1000)
            index.add(i, held[i])
    for _ in range(300):
        node = random_filter(rng)
        assert f.problems(node, "filter") == []
        assert index.select(node) == {m for m, fields in held.items() if f.matches(node, fields)}, node


def _deep(levels: int) -> f.Filter:
    node: f.Filter = f.Exists("a")
    for _ in range(levels - 1):
        node = f.Not(node)
    return node


@pytest.mark.parametrize(
    ("node", "field", "words"),
    [
        (_deep(33), "filter" + ".negation" * 32, "deeper than 32"),
        (f.AnyOf(tuple(f.Exists("a") for _ in range(1100))), "filter", "more than 1024"),
        (f.Compare("a", f.Op.EQUAL, "x" * 65536), "filter.comparison.value", "4096 bytes"),
        (f.Compare("a", f.Op.LESS, math.nan), "filter.comparison.value", "finite"),
        (f.Compare("a", f.Op.GREATER, math.inf), "filter.comparison.value", "finite"),
        (f.Compare("a", f.Op.LESS, True), "filter.comparison.value", "does not order a boolean"),
        (f.Compare("a", f.Op.LESS, ("x",)), "filter.comparison.value", "does not order a string list"),
        (f.All((f.Exists("a"), f.In("a", ("x", 1.0)))), "filter.all.filters[1].membership.values[1]", "one kind"),
        (f.In("a", ()), "filter.membership.values", "1 to 1024"),
        (f.In("a", (("x",),)), "filter.membership.values[0]", "single values"),
        (f.Compare(f.CREATED, f.Op.LESS, "yesterday"), "filter.comparison.value", "$created is a timestamp"),
        (f.Compare("$nope", f.Op.EQUAL, "x"), "filter.comparison.field", "not a reserved field"),
        (f.Exists(""), "filter.exists.field", "required"),
        (f.Exists("a\x00b"), "filter.exists.field", "control"),
        (f.Compare("a", f.Op.EQUAL, tuple("x" for _ in range(300))), "filter.comparison.value", "at most 256"),
    ],
)
def test_hostile_filters_are_refused_naming_the_part(node: f.Filter, field: str, words: str) -> None:
    found = f.problems(node, "filter")
    assert found, node
    assert found[0].field == field
    assert words in found[0].description
    assert found[0].reason == "INVALID_REQUEST"


def test_file_sources_know_only_their_reserved_fields() -> None:
    files = (f.PATH, f.FILE_NAME)
    assert f.problems(f.Compare(f.FILE_NAME, f.Op.EQUAL, "a.md"), "filter", files) == []
    assert (
        f.problems(f.Compare(f.CREATED, f.Op.GREATER, f.Instant(0)), "filter", files)[0].field
        == "filter.comparison.field"
    )


def test_fields_survive_their_json_form() -> None:
    assert f.from_json(f.to_json(DOC)) == DOC
    assert f.from_json({"n": 3}) == {"n": 3.0}
