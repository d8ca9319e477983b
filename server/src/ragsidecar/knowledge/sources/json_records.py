"""JSON and JSONL (.json, .jsonl): one unit per record (a top-level array's elements, or each line), with the
lines it spans and its "id"/"_id" field."""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from typing import Any

from ragsidecar.knowledge.sources.units import ID_FIELDS, SOURCE_UNREADABLE, Provenance, SourceError, Unit

# Fields whose value is the document's body, in order of preference.
_TEXT_FIELDS = ("text", "content", "body")


def json_units(text: str, rel: str) -> list[Unit]:
    """A .json file: a top-level array is one unit per element, any other value one unit."""
    decoder = json.JSONDecoder()
    try:
        start = _skip_ws(text, 0)
        if start < len(text) and text[start] == "[":
            spans = _array_elements(decoder, text, start)
        else:
            value, end = decoder.raw_decode(text, start)
            spans = [(value, start, end)]
            if _skip_ws(text, end) != len(text):
                raise json.JSONDecodeError("extra data after the document", text, end)
    except json.JSONDecodeError as e:
        raise SourceError(SOURCE_UNREADABLE, f"{rel}: malformed JSON at line {e.lineno}: {e.msg}") from e
    lines = _LineIndex(text)
    units = []
    for value, begin, end in spans:
        unit = _record_unit(value, rel, lines.line(begin), lines.line(end - 1))
        if unit is not None:
            units.append(unit)
    return units


def jsonl_units(text: str, rel: str) -> list[Unit]:
    """A .jsonl file: one unit per non-blank line."""
    units = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise SourceError(SOURCE_UNREADABLE, f"{rel}: malformed JSON on line {number}: {e.msg}") from e
        unit = _record_unit(value, rel, number, number)
        if unit is not None:
            units.append(unit)
    return units


def _record_text(value: Any) -> str:
    """A record's searchable text: its text/content/body field (title on the line before),
    else its compact JSON, so records of any shape still index."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        body = next((value[k] for k in _TEXT_FIELDS if value.get(k) is not None), None)
        if body is not None:
            body_text = body if isinstance(body, str) else _compact(body)
            title = value.get("title")
            if isinstance(title, str) and title.strip():
                return f"{title}\n{body_text}"
            return body_text
    return _compact(value)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _record_id(value: Any) -> str:
    if not isinstance(value, dict):
        return ""
    found = next((value[k] for k in ID_FIELDS if value.get(k) is not None), None)
    if found is None or isinstance(found, (dict, list)):
        return ""
    return str(found)


def _record_unit(value: Any, rel: str, line_start: int | None, line_end: int | None) -> Unit | None:
    text = _record_text(value)
    if not text.strip():
        return None
    prov = Provenance(
        file=rel,
        document_id=_record_id(value),
        line_start=line_start,
        line_end=line_end,
        char_end=len(text),
    )
    return Unit(text, prov)


class _LineIndex:
    """Maps character offsets of a text to 1-based line numbers (binary search over newlines)."""

    def __init__(self, text: str):
        self._newlines = [m.start() for m in re.finditer("\n", text)]

    def line(self, offset: int) -> int:
        return bisect_left(self._newlines, offset) + 1


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\n\r":
        pos += 1
    return pos


def _array_elements(decoder: json.JSONDecoder, text: str, pos: int) -> list[tuple[Any, int, int]]:
    """Decodes a top-level array element by element, keeping each element's span in the text;
    the spans are what give every element its line numbers."""
    elements: list[tuple[Any, int, int]] = []
    pos = _skip_ws(text, pos + 1)
    if pos < len(text) and text[pos] == "]":
        pos += 1
    else:
        while True:
            value, end = decoder.raw_decode(text, pos)
            elements.append((value, pos, end))
            pos = _skip_ws(text, end)
            if pos < len(text) and text[pos] == ",":
                pos = _skip_ws(text, pos + 1)
                continue
            if pos < len(text) and text[pos] == "]":
                pos += 1
                break
            raise json.JSONDecodeError("expected ',' or ']'", text, pos)
    if _skip_ws(text, pos) != len(text):
        raise json.JSONDecodeError("extra data after the array", text, pos)
    return elements
