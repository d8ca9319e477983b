"""What a knowledge file is read into: units with their provenance, and the error that refuses a file.

A unit is one retrievable document of a source (a whole text file, one JSONL record, one CSV row,
one PDF page) with its provenance, so a search hit can say where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE_UNREADABLE = "SOURCE_UNREADABLE"
LIMIT_EXCEEDED = "LIMIT_EXCEEDED"

# Record fields (JSON keys, CSV columns) that carry a document's id, in order of preference.
ID_FIELDS = ("id", "_id")


@dataclass(frozen=True)
class Provenance:
    """Where a unit (or chunk) came from; what a search hit reports to the host."""

    # Path relative to the knowledge root holding it, "/"-separated ("" for INLINE/MEMORY).
    file: str = ""
    # MEMORY document id, or a .json/.jsonl/.csv record's "id"/"_id" field when present.
    document_id: str = ""
    # 1-based first and (inclusive) last line in the file; None where lines mean nothing (PDF, HTML).
    line_start: int | None = None
    line_end: int | None = None
    # 1-based PDF page holding the start of the text.
    page: int | None = None
    # Code-point offsets in the unit's document's extracted text (for a unit: 0..len(text)).
    char_start: int = 0
    char_end: int = 0


@dataclass(frozen=True)
class Unit:
    """One document-level unit of a source, in source order."""

    text: str
    provenance: Provenance


class SourceError(Exception):
    """A knowledge file that cannot be served; reason is SOURCE_UNREADABLE or LIMIT_EXCEEDED."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message
