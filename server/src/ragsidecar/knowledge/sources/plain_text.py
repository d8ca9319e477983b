"""Plain text and Markdown (.txt, .md): the whole file is one unit. Also the UTF-8 decoding every text format
shares."""

from __future__ import annotations

from ragsidecar.knowledge.sources.units import SOURCE_UNREADABLE, Provenance, SourceError, Unit


def decode(data: bytes, rel: str) -> str:
    """A text file's bytes -> its text, one newline convention; refuses binary and non-UTF-8 content."""
    if b"\x00" in data:
        raise SourceError(SOURCE_UNREADABLE, f"{rel}: binary content (NUL bytes) in a text file")
    try:
        # utf-8-sig drops a leading byte-order mark, which editors on Windows like to write.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SourceError(
            SOURCE_UNREADABLE, f"{rel}: not valid UTF-8 (byte {e.start}): binary or another encoding"
        ) from e
    return normalise_newlines(text)


def normalise_newlines(text: str) -> str:
    # One newline convention, so line numbers and chunk boundaries mean the same for every file.
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def whole_text_units(text: str, rel: str) -> list[Unit]:
    """The text as one unit spanning all its lines; none when it is whitespace only."""
    if not text.strip():
        return []
    prov = Provenance(file=rel, line_start=1, line_end=_last_line(text), char_end=len(text))
    return [Unit(text, prov)]


def _last_line(text: str) -> int:
    """1-based number of the last line of text (a trailing newline does not open a new line)."""
    newlines = text.count("\n")
    return newlines if text.endswith("\n") else newlines + 1
