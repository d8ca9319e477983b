"""Caller-supplied identifiers: how they are checked, and the one way keys are built from them.

Every key built from caller ids (tenant, session, owner, binding, knowledge name, entry name) goes
through `key_of`: each part is length-prefixed before hashing, so no choice of characters inside one
id can make two different tuples share a key (the "acme\\0x"/"s" vs "acme"/"x\\0s" collision of a
separator join). Ids are also checked before anything is read or written: not longer than
MAX_ID_CHARS, and free of control characters (Unicode category Cc), which have no place in a name
and only serve to confuse logs and file names.
"""

from __future__ import annotations

import hashlib
import unicodedata

from ragsidecar.errors import Violation

# Longest id (in characters) a caller may send for a tenant, session, owner, binding, knowledge or entry
# name, a document id, or a principal. Documented in the README and the proto comments.
MAX_ID_CHARS = 256


def key_of(*parts: str) -> str:
    """An unambiguous key for a tuple of ids: sha256 over the length-prefixed UTF-8 of each part (hex)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def id_problems(value: str, field: str, *, required: bool = True) -> list[Violation]:
    """What is wrong with one caller id (empty when nothing): blank when required, too long, control chars."""
    if not value or value.isspace():  # no copy of the value: isspace stops at its first other character
        return [Violation(field, "required", "INVALID_REQUEST")] if required else []
    if len(value) > MAX_ID_CHARS:
        return [Violation(field, f"longer than {MAX_ID_CHARS} characters ({len(value)})", "INVALID_REQUEST")]
    if any(unicodedata.category(c) == "Cc" for c in value):
        return [Violation(field, "contains control characters", "INVALID_REQUEST")]
    return []
