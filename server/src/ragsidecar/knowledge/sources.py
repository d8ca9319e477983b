"""Knowledge sources: finding knowledge files and reading them into document-level units.

A unit is one retrievable document of a source (a whole text file, one JSONL record, one CSV row,
one PDF page) with its provenance, so a search hit can say where it came from. Chunking splits
units further; nothing here knows about tokens, indexes or gRPC.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from bisect import bisect_left
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

SUPPORTED_SUFFIXES = (".txt", ".md", ".json", ".jsonl", ".csv", ".html", ".htm", ".pdf")

SOURCE_UNREADABLE = "SOURCE_UNREADABLE"
LIMIT_EXCEEDED = "LIMIT_EXCEEDED"

_GLOB_CHARS = frozenset("*?[")
# Fields whose value is the document's body, in order of preference.
_TEXT_FIELDS = ("text", "content", "body")
_ID_FIELDS = ("id", "_id")


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


# --------------------------------------------------------------------------------------------
# Finding files


def list_files(path: Path) -> list[Path]:
    """FILE or DIRECTORY location -> the supported files, sorted.

    A folder is searched recursively; a path containing glob characters (*?[) is a glob (recursive
    ** allowed) relative to its non-glob prefix. Hidden files/folders (dot-prefixed) are skipped,
    and symlinked folders are not descended into (no cycles; the caller checks roots anyway).
    A file named directly is returned whatever its suffix, so reading it fails loudly with
    SOURCE_UNREADABLE instead of the source silently coming up empty. A missing path (or glob
    prefix) -> FileNotFoundError; a glob matching nothing -> [].
    """
    text = str(path)
    if any(c in _GLOB_CHARS for c in text):
        return _glob_files(path)
    if path.is_dir():
        return _walk_files(path)
    if path.is_file():
        return [path]
    if path.exists():
        raise FileNotFoundError(f"{path} is neither a file nor a folder")
    raise FileNotFoundError(f"{path} does not exist")


def _is_supported(path: Path) -> bool:
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def _walk_files(folder: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        # Pruning in place stops os.walk from descending into hidden folders at all.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            candidate = Path(dirpath, name)
            if not name.startswith(".") and _is_supported(candidate) and candidate.is_file():
                found.append(candidate)
    return sorted(found)


def _glob_files(path: Path) -> list[Path]:
    parts = path.parts
    split = next(i for i, part in enumerate(parts) if any(c in _GLOB_CHARS for c in part))
    base = Path(*parts[:split]) if split else Path(".")
    pattern = str(Path(*parts[split:]))
    if not base.is_dir():
        raise FileNotFoundError(f"{base} (the folder of glob {path}) does not exist")
    found = []
    for candidate in base.glob(pattern):
        relative = candidate.relative_to(base).parts
        if any(part.startswith(".") for part in relative):
            continue
        if _is_supported(candidate) and candidate.is_file():
            found.append(candidate)
    return sorted(set(found))


# --------------------------------------------------------------------------------------------
# Reading files


def read_units(file: Path, root: Path, max_bytes: int) -> list[Unit]:
    """Parses one file into units (whitespace-only documents yield none).

    Raises SourceError(LIMIT_EXCEEDED) when the file is larger than max_bytes (checked before
    reading), SourceError(SOURCE_UNREADABLE) when it is binary, not UTF-8, unreadable, malformed or
    of an unsupported suffix.
    """
    suffix = file.suffix.lower()
    # Errors name the file as its provenance does: relative to the root, never by the server's own folders.
    rel = provenance_path(file, root)
    if suffix not in SUPPORTED_SUFFIXES:
        raise SourceError(SOURCE_UNREADABLE, f"{rel}: unsupported file type {suffix or '(none)'!r}")
    data = _read_bytes(file, max_bytes, rel)
    if suffix == ".pdf":
        return _pdf_units(data, rel)
    text = _decode(data, rel)
    if suffix in (".txt", ".md"):
        return _whole_text_units(text, rel)
    if suffix == ".json":
        return _json_units(text, rel)
    if suffix == ".jsonl":
        return _jsonl_units(text, rel)
    if suffix == ".csv":
        return _csv_units(text, rel)
    return _html_units(text, rel)


def inline_units(text: str) -> list[Unit]:
    """INLINE knowledge: one unit, lines counted like a text file."""
    return _whole_text_units(_normalise_newlines(text), "")


def _read_bytes(file: Path, max_bytes: int, rel: str) -> bytes:
    try:
        size = file.stat().st_size
        if size > max_bytes:
            raise SourceError(LIMIT_EXCEEDED, f"{rel}: {size} bytes exceeds the limit of {max_bytes}")
        with file.open("rb") as handle:
            # Read one byte past the limit: the file may have grown since stat().
            data = handle.read(max_bytes + 1)
    except OSError as e:
        raise SourceError(SOURCE_UNREADABLE, f"{rel}: cannot read: {e.strerror or type(e).__name__}") from e
    if len(data) > max_bytes:
        raise SourceError(LIMIT_EXCEEDED, f"{rel}: more than {max_bytes} bytes")
    return data


def provenance_path(file: Path, root: Path) -> str:
    """The provenance path: relative to the root when the file lies under it, else as given."""
    for f, r in ((file, root), (file.resolve(), root.resolve())):
        try:
            rel = f.relative_to(r)
        except ValueError:
            continue
        # A FILE source's root may be the file itself: name it rather than ".".
        return rel.as_posix() if rel.parts else file.name
    return file.as_posix()


def _decode(data: bytes, rel: str) -> str:
    if b"\x00" in data:
        raise SourceError(SOURCE_UNREADABLE, f"{rel}: binary content (NUL bytes) in a text file")
    try:
        # utf-8-sig drops a leading byte-order mark, which editors on Windows like to write.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SourceError(
            SOURCE_UNREADABLE, f"{rel}: not valid UTF-8 (byte {e.start}): binary or another encoding"
        ) from e
    return _normalise_newlines(text)


def _normalise_newlines(text: str) -> str:
    # One newline convention, so line numbers and chunk boundaries mean the same for every file.
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _last_line(text: str) -> int:
    """1-based number of the last line of text (a trailing newline does not open a new line)."""
    newlines = text.count("\n")
    return newlines if text.endswith("\n") else newlines + 1


def _whole_text_units(text: str, rel: str) -> list[Unit]:
    if not text.strip():
        return []
    prov = Provenance(file=rel, line_start=1, line_end=_last_line(text), char_end=len(text))
    return [Unit(text, prov)]


# --- JSON, JSONL -----------------------------------------------------------------------------


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
    found = next((value[k] for k in _ID_FIELDS if value.get(k) is not None), None)
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


def _json_units(text: str, rel: str) -> list[Unit]:
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


def _jsonl_units(text: str, rel: str) -> list[Unit]:
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


# --- CSV -------------------------------------------------------------------------------------


def _csv_units(text: str, rel: str) -> list[Unit]:
    # The default field limit (128 KiB) would reject long text cells; the file size is already
    # bounded by max_bytes, so let a field be as long as the file. Only ever raised, never lowered.
    if csv.field_size_limit() < len(text) + 1:
        csv.field_size_limit(len(text) + 1)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return []
        names = [name.strip() or f"column {i + 1}" for i, name in enumerate(header)]
        id_column = next((i for i, n in enumerate(names) if n.lower() in _ID_FIELDS), None)
        units = []
        previous_line = reader.line_num
        for row in reader:
            line_start, previous_line = previous_line + 1, reader.line_num
            unit = _csv_row_unit(row, names, id_column, rel, line_start, reader.line_num)
            if unit is not None:
                units.append(unit)
    except csv.Error as e:
        raise SourceError(SOURCE_UNREADABLE, f"{rel}: malformed CSV near line {reader.line_num}: {e}") from e
    return units


def _csv_row_unit(
    row: list[str], names: list[str], id_column: int | None, rel: str, line_start: int, line_end: int
) -> Unit | None:
    # Cells past the header still carry content; name them by position rather than drop them.
    pairs = [(names[i] if i < len(names) else f"column {i + 1}", value.strip()) for i, value in enumerate(row)]
    text = "\n".join(f"{name}: {value}" for name, value in pairs if value)
    if not text:
        return None
    document_id = row[id_column].strip() if id_column is not None and id_column < len(row) else ""
    prov = Provenance(file=rel, document_id=document_id, line_start=line_start, line_end=line_end, char_end=len(text))
    return Unit(text, prov)


# --- HTML ------------------------------------------------------------------------------------

# Elements whose content is never shown to a reader.
_HIDDEN_TAGS = frozenset({"script", "style", "template", "noscript"})
# Elements that start a new line when rendered; everything else flows inline.
_BLOCK_TAGS = frozenset(
    """address article aside blockquote br caption dd details dialog div dl dt fieldset figcaption
    figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr li main nav ol p pre section summary
    table tbody thead tfoot tr ul""".split()
)
_CELL_TAGS = frozenset({"td", "th"})
_SPACES = re.compile(r"[ \t\f\v\u00a0\u2000-\u200a\u202f\u205f\u3000]+")


class _VisibleText(HTMLParser):
    """Collects the text a browser would show, one block element per line."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0
        self._in_head = False
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "head":
            self._in_head = True
        elif tag == "body":
            # A missing </head> must not hide the whole page.
            self._in_head = False
        elif tag in _HIDDEN_TAGS:
            self._hidden += 1
        elif tag == "pre":
            self._pre += 1
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")
        elif tag in _CELL_TAGS:
            self.parts.append(" ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # <br/>, <hr/>: a line break, and no nesting to track (a self-closed <script/> hides nothing).
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "head":
            self._in_head = False
        elif tag in _HIDDEN_TAGS:
            self._hidden = max(0, self._hidden - 1)
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._hidden or self._in_head:
            return
        # Outside <pre>, source newlines are just whitespace to a browser.
        self.parts.append(data if self._pre else re.sub(r"\s+", " ", data))

    def text(self) -> str:
        lines = (_SPACES.sub(" ", line).strip() for line in "".join(self.parts).split("\n"))
        return "\n".join(line for line in lines if line)


def _html_units(text: str, rel: str) -> list[Unit]:
    parser = _VisibleText()
    parser.feed(text)
    parser.close()
    visible = parser.text()
    if not visible:
        return []
    return [Unit(visible, Provenance(file=rel, char_end=len(visible)))]


# --- PDF -------------------------------------------------------------------------------------


def _pdf_units(data: bytes, rel: str) -> list[Unit]:
    try:
        pages = _pdf_page_texts(data)
    except SourceError as e:
        raise SourceError(e.reason, f"{rel}: {e.message}") from e
    except Exception as e:  # noqa: BLE001 - pypdf raises many types on bad input (PdfReadError, ValueError, KeyError, ...)
        raise SourceError(SOURCE_UNREADABLE, f"{rel}: malformed PDF: {type(e).__name__}: {e}") from e
    units = []
    for number, page_text in enumerate(pages, start=1):
        if page_text.strip():
            prov = Provenance(file=rel, page=number, char_end=len(page_text))
            units.append(Unit(page_text, prov))
    return units


def _pdf_page_texts(data: bytes) -> list[str]:
    # Imported here: only PDF sources pay pypdf's import time.
    import pypdf

    reader = pypdf.PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not _decrypts_without_password(reader):
        raise SourceError(SOURCE_UNREADABLE, "encrypted PDF (a password is needed)")
    # NULs can come out of badly mapped fonts; they are never meaningful text.
    return [_normalise_newlines(page.extract_text() or "").replace("\x00", "") for page in reader.pages]


def _decrypts_without_password(reader: Any) -> bool:
    """Many PDFs are encrypted only against editing, with an empty user password: those read fine."""
    try:
        return bool(reader.decrypt(""))
    except Exception:  # noqa: BLE001 - e.g. DependencyError when AES needs a missing crypto package
        return False
