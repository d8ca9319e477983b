"""PDF (.pdf): one unit per page with text, numbered as in the file."""

from __future__ import annotations

import io
from typing import Any

from ragsidecar.knowledge.sources.plain_text import normalise_newlines
from ragsidecar.knowledge.sources.units import SOURCE_UNREADABLE, Provenance, SourceError, Unit


def pdf_units(data: bytes, rel: str) -> list[Unit]:
    """A PDF's pages with text as units; refuses a malformed PDF or one that needs a password."""
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
    return [normalise_newlines(page.extract_text() or "").replace("\x00", "") for page in reader.pages]


def _decrypts_without_password(reader: Any) -> bool:
    """Many PDFs are encrypted only against editing, with an empty user password: those read fine."""
    try:
        return bool(reader.decrypt(""))
    except Exception:  # noqa: BLE001 - e.g. DependencyError when AES needs a missing crypto package
        return False
