"""knowledge/conversation.py: which written documents are conversation turns, which turn follows which, and the
units a write indexes (a turn alone, and with the turn before it). No server, no models."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pytest

from ragsidecar.knowledge.conversation import (
    MAX_TURN_CHARS,
    Scored,
    follows,
    own_text,
    turn_time,
    units_of,
    with_neighbours,
)
from ragsidecar.knowledge.filters import Instant, Value


@dataclass(frozen=True)
class Doc:
    id: str
    text: str
    metadata: dict[str, str] = field(default_factory=dict)
    typed: dict[str, Value] = field(default_factory=dict)


def turn(id: str, text: str, time: str = "2023-05-08T13:56:00") -> Doc:
    return Doc(id, text, {"speaker": text.split(":")[0], "time": time})


def test_a_document_is_a_turn_when_its_time_is_iso_8601() -> None:
    assert turn_time({"time": "2023-05-08T13:56:00"}) is not None
    assert turn_time({"time": "2023-05-08T13:56:00+02:00"}) is not None
    assert turn_time({"time": "8 May, 2023"}) is None
    assert turn_time({"speaker": "Jon"}) is None


def test_a_typed_timestamp_makes_a_turn_as_an_iso_string_does() -> None:
    """A host writing `time` as typed metadata (a timestamp, as the framework stores do) writes turns too."""
    at = dt.datetime(2023, 5, 8, 13, 56, tzinfo=dt.UTC)
    nanos = int(at.timestamp()) * 1_000_000_000
    assert turn_time({}, {"time": Instant(nanos)}) == at
    first = Doc("1", "Jon: hi", typed={"time": Instant(nanos)})
    later = Doc("2", "Gina: hello", typed={"time": Instant(nanos + 60 * 1_000_000_000)})
    assert follows(first, later)
    assert len(units_of([later], first)) == 2


@pytest.mark.parametrize(
    "earlier, later, expected",
    [
        ("2023-05-08T13:56:00", "2023-05-08T13:56:00", True),  # one time for the whole session
        ("2023-05-08T13:56:00", "2023-05-08T14:50:00", True),  # within the session gap
        ("2023-05-08T13:56:00", "2023-05-08T15:00:00", False),  # a new session
        ("2023-05-08T14:00:00", "2023-05-08T13:59:00", False),  # written before it: not its continuation
        ("2023-05-08T13:56:00", "2023-05-08T13:57:00+00:00", False),  # naive and aware times do not compare
    ],
)
def test_a_turn_follows_the_one_before_it_within_a_session(earlier: str, later: str, expected: bool) -> None:
    assert follows(turn("a", "Jon: hi", earlier), turn("b", "Gina: hello", later)) is expected


def test_long_texts_and_documents_without_time_are_not_turns_in_a_session() -> None:
    assert not follows(Doc("a", "Jon: hi"), turn("b", "Gina: hello"))
    assert not follows(turn("a", "Jon: " + "x" * MAX_TURN_CHARS), turn("b", "Gina: hello"))


def test_a_following_turn_is_indexed_alone_and_with_the_turn_before_it_over_one_span() -> None:
    first, second, third = turn("D1:1", "Jon: How is the boiler?"), turn("D1:2", "Gina: Fixed."), Doc("n", "a note")
    units = units_of([second, third], first)
    assert [u.text for u in units] == ["Gina: Fixed.", "Jon: How is the boiler?\nGina: Fixed.", "a note"]
    spans = [(u.provenance.document_id, u.provenance.char_start, u.provenance.char_end) for u in units]
    assert spans == [("D1:2", 0, 12), ("D1:2", 0, 12), ("n", 0, 6)]


def test_the_first_document_of_an_empty_partition_is_its_text_alone() -> None:
    units = units_of([turn("D1:1", "Jon: hi"), turn("D1:2", "Gina: hello")], None)
    assert [u.text for u in units] == ["Jon: hi", "Gina: hello", "Jon: hi\nGina: hello"]


def test_a_hit_on_either_unit_shows_the_turns_own_text() -> None:
    first, second = turn("a", "Jon: how is the boiler?"), turn("b", "Gina: the valve rusted")
    for unit in units_of([first, second], None):
        span = unit.provenance
        assert (
            own_text(unit.text, span.char_start, span.char_end) == {"a": first.text, "b": second.text}[span.document_id]
        )
    assert own_text("a longer chunk of a note", 0, 24) == "a longer chunk of a note"


def scored(document: str, text: str, score: float, before: str = "") -> Scored:
    return Scored(document, f"{before}\n{text}" if before else text, text, score)


def test_a_turn_gains_a_share_of_its_best_neighbours_score_above_the_lowest() -> None:
    chunks = [
        scored("a", "Jon: the boiler broke", 3.0),
        scored("b", "Gina: the valve rusted", 1.0),
        scored("b", "Gina: the valve rusted", 2.0, before="Jon: the boiler broke"),  # names "a" as before "b"
        scored("c", "Jon: see you", 0.0),
    ]
    # "a" and "b" are neighbours (b's second unit), "c" none of theirs: the lowest score (0.0) is the floor.
    assert with_neighbours(chunks, 0.5) == {"a": 0.5 * 2.0, "b": 0.5 * 3.0}
    assert with_neighbours(chunks, 0.0) == {"a": 0.0, "b": 0.0}


def test_a_text_several_documents_hold_names_no_neighbour() -> None:
    chunks = [
        scored("a", "Jon: ok", 3.0),
        scored("x", "Jon: ok", 2.0),
        scored("b", "Gina: right", 1.0, before="Jon: ok"),
        scored("c", "Gina: bye", 0.0),
    ]
    assert with_neighbours(chunks, 0.5) == {}
