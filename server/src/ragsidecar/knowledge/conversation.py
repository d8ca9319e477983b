"""Conversation turns among the documents a host writes (MEMORY knowledge and chat bindings' corpora): how each becomes
the unit that is chunked, embedded and indexed.

A document is a turn when its metadata carries a `time`: a typed timestamp, or a string in ISO 8601. A turn that follows
another turn of the same session (the one written just before it in the partition, at most SESSION_GAP earlier, both
short) is indexed twice: its text, and "previous\\nturn" (a second unit of the same span). A question naming what the
previous turn said (the question an answer replies to, the photo a reply is about) reaches the turn that answers it
through the second, in the lexical and the dense list alike; one about the turn's own words still finds the first, whose
BM25 length and embedding no context dilutes; a hit shows the turn's own text whichever unit matched (`own_text`). On
the development half of LoCoMo (bench/memory.py, docs/retrieval.md) the context alone left "when" questions 0.04 R@5
below stemmed BM25; with both units every category is above it. Every other document is its text alone, as before:
file sources and notes without a time keep their figures.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ragsidecar.knowledge.filters import Instant, Value
from ragsidecar.knowledge.sources.units import Provenance, Unit

TIME_KEY = "time"
# The longest pause between two turns of one session: a later turn starts a session of its own, without context.
SESSION_GAP = dt.timedelta(hours=1)
# Turns longer than this (characters) are not short exchanges: neither gets the other as context.
MAX_TURN_CHARS = 1000
SEPARATOR = "\n"


class Document(Protocol):
    """What a written document offers (knowledge.storage.MemoryDocument)."""

    @property
    def id(self) -> str: ...

    @property
    def text(self) -> str: ...

    @property
    def metadata(self) -> Mapping[str, str]: ...

    @property
    def typed(self) -> Mapping[str, Value]: ...


def turn_time(metadata: Mapping[str, str], typed: Mapping[str, Value] | None = None) -> dt.datetime | None:
    """The document's `time` as a datetime: a typed timestamp (UTC), or a string metadata value in ISO 8601; None
    when it has neither."""
    stamp = (typed or {}).get(TIME_KEY)
    if isinstance(stamp, Instant):
        return dt.datetime.fromtimestamp(stamp.nanos / 1e9, dt.UTC)
    value = metadata.get(TIME_KEY)
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        return None


def follows(previous: Document, turn: Document) -> bool:
    """Whether `turn` continues the session of `previous`: both short turns with comparable times, `turn` at most
    SESSION_GAP after `previous` (and not before it)."""
    before, after = turn_time(previous.metadata, previous.typed), turn_time(turn.metadata, turn.typed)
    if before is None or after is None or (before.tzinfo is None) != (after.tzinfo is None):
        return False
    if max(len(previous.text), len(turn.text)) > MAX_TURN_CHARS:
        return False
    return dt.timedelta(0) <= after - before <= SESSION_GAP


def units_of(documents: Sequence[Document], last: Document | None) -> list[Unit]:
    """The units of documents written in this order after `last`, the partition's latest document before the
    write (None: empty, or the first document replaces one, whose place is not after `last`): each document's
    text, and for a turn that follows the one before it, a second unit "previous\\nturn". Both cover the
    document's whole text (char 0 to its length): they are one passage, which a search returns once."""
    units = []
    for document in documents:
        span = Provenance(document_id=document.id, char_end=len(document.text))
        units.append(Unit(document.text, span))
        if last is not None and follows(last, document):
            units.append(Unit(last.text + SEPARATOR + document.text, span))
        last = document
    return units


def own_text(text: str, char_start: int, char_end: int) -> str:
    """What a hit on a written document's chunk shows: the text of its span. A turn's second unit
    ("previous\\nturn") spans the turn alone and ends with it, so its span is its last characters; every other chunk
    of a written document is exactly its span."""
    span = char_end - char_start
    return text[len(text) - span :] if 0 < span < len(text) else text


@dataclass(frozen=True)
class Scored:
    """A fused chunk of a written document, as a hybrid search found it."""

    document: str  # the document's id
    text: str  # the chunk's text: a unit's, "previous\\nturn" for a turn's second unit
    own: str  # the document's own text in it (`own_text`)
    score: float  # fused


def with_neighbours(chunks: Sequence[Scored], weight: float) -> dict[str, float]:
    """What each document's neighbours add to the scores of its chunks among these (a search's fused candidates):
    `weight` times the best score of its neighbours' chunks above the lowest document score here; documents without
    neighbours are left out. A turn's neighbours are the turn before it and the turn after it in its session, when
    they are among the chunks: a turn's second unit names the turn before it by its text (a text that several
    documents here hold names none). The evidence for a question often sits beside the turn that matches it best:
    the question an answer replies to, the reply to a turn that matched."""
    best: dict[str, float] = {}
    holder: dict[str, str | None] = {}  # own text -> the one document holding it (None: several)
    for chunk in chunks:
        best[chunk.document] = max(best.get(chunk.document, chunk.score), chunk.score)
        holder[chunk.own] = chunk.document if holder.get(chunk.own, chunk.document) == chunk.document else None
    neighbours: dict[str, set[str]] = {}
    for chunk in chunks:
        if len(chunk.text) > len(chunk.own):
            before = holder.get(chunk.text[: len(chunk.text) - len(chunk.own) - len(SEPARATOR)])
            if before is not None and before != chunk.document:
                neighbours.setdefault(chunk.document, set()).add(before)
                neighbours.setdefault(before, set()).add(chunk.document)
    floor = min(best.values(), default=0.0)
    return {document: weight * max(best[n] - floor for n in near) for document, near in neighbours.items()}
