"""Finding a FILE or DIRECTORY source's files, and reading one file into units by its suffix."""

from __future__ import annotations

import os
from pathlib import Path

from ragsidecar.knowledge.sources.csv_rows import csv_units
from ragsidecar.knowledge.sources.html_text import html_units
from ragsidecar.knowledge.sources.json_records import json_units, jsonl_units
from ragsidecar.knowledge.sources.pdf_pages import pdf_units
from ragsidecar.knowledge.sources.plain_text import decode, normalise_newlines, whole_text_units
from ragsidecar.knowledge.sources.units import LIMIT_EXCEEDED, SOURCE_UNREADABLE, SourceError, Unit

SUPPORTED_SUFFIXES = (".txt", ".md", ".json", ".jsonl", ".csv", ".html", ".htm", ".pdf")

_GLOB_CHARS = frozenset("*?[")

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
        return pdf_units(data, rel)
    text = decode(data, rel)
    if suffix in (".txt", ".md"):
        return whole_text_units(text, rel)
    if suffix == ".json":
        return json_units(text, rel)
    if suffix == ".jsonl":
        return jsonl_units(text, rel)
    if suffix == ".csv":
        return csv_units(text, rel)
    return html_units(text, rel)


def inline_units(text: str) -> list[Unit]:
    """INLINE knowledge: one unit, lines counted like a text file."""
    return whole_text_units(normalise_newlines(text), "")


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
