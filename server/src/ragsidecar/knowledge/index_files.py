"""The folder a saved index (knowledge/index.py) lives in: the names of its files, its manifest with their sizes and
checksums, its atomic replacement, and the start-up sweep of what crashed saves and superseded indexes left.

A folder is replaced by two renames (`swap_in`): readers and crashes see the old complete index or the new one. The
manifest, written last, marks the folder complete; it names the format, each file's size and checksum, and the
source the index indexes, so `sweep` can keep only the newest index of each source."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import xxhash

from ragsidecar.knowledge import leftovers

FORMAT_VERSION = 2
# Format 1 (0.2.0): compact slots, bm25s files; read by rebuilding from vectors.npy and chunks.jsonl.
REBUILT_FORMATS = (1,)

VECTORS = "vectors.npy"
CHUNKS = "chunks.jsonl"
# Each slot's line in the chunks file (int64 byte offsets, one past the last line's end last); each slot's key and
# chunk id with the fields the live chunks hold (JSON): what a mapped index holds in memory of its chunks.
OFFSETS = "offsets.npy"
KEYS = "keys.json"
# The live chunks' fields, by field (knowledge/field_columns.py): which slots hold it, each one's value as a code
# (int32 pairs), the field's distinct values (one JSON line per field), and where each field's part of both starts.
FIELD_MEMBERS = "field_members.npy"
FIELD_VALUES = "field_values.jsonl"
FIELDS = "fields.json"
DENSE = "dense.usearch"
BM25 = "bm25"
MANIFEST = "manifest.json"
# The checksum a manifest's "checksum" names for its files (one that names none was written with sha256). A snapshot
# is a cache of the store's rows beside it, not a security boundary: the checksum is there to catch torn and corrupt
# files, so new manifests use xxh3_128 (non-cryptographic, 128 bits), which hashes about 7x faster than sha256 on
# this machine: sha256 took 0.9-1.3 s of a 100k-chunk snapshot's first search. Manifests of sha256 are still read.
_CHECKSUM = "xxh3_128"
_LEGACY_CHECKSUM = "sha256"
_CHECKSUMS: dict[str, Callable[[], Any]] = {_CHECKSUM: xxhash.xxh3_128, _LEGACY_CHECKSUM: hashlib.sha256}
# Threads hashing a snapshot's files (both hashes let go of the GIL).
_HASH_THREADS = 2

# `.NAME.tmp-<pid>-...` (a save in progress, or killed) and `.NAME.old-<pid>-...` (the index a save set aside).
_STRAY = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<tag>.*)")


class IndexCorrupt(Exception):
    """A persisted index is missing, incomplete or fails its checksum; the caller should rebuild it."""


def swap_in(temp: Path, folder: Path) -> None:
    """Two renames, the old folder set aside first: POSIX cannot rename a folder onto a non-empty one.

    A crash between them leaves no `folder` but a complete `.NAME.old-*`, which load falls back to."""
    if folder.exists():
        aside = folder.parent / f".{folder.name}.old-{leftovers.owner_tag()}{uuid.uuid4().hex}"
        os.rename(folder, aside)
        os.rename(temp, folder)
        fsync_dir(folder.parent)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(temp, folder)
        fsync_dir(folder.parent)


def remove_strays(folder: Path) -> None:
    """Temp and set-aside folders left by earlier crashed saves of this folder (not another live process's)."""
    for pattern in (f".{folder.name}.tmp-*", f".{folder.name}.old-*"):
        for stray in folder.parent.glob(pattern):
            match = _STRAY.fullmatch(stray.name)
            if match and leftovers.orphaned(match["tag"]):
                shutil.rmtree(stray, ignore_errors=True)


def sweep(index_dir: Path) -> tuple[int, int]:
    """Start-up clean-up of a folder of indexes; returns (folders, bytes) removed.

    Removes what killed saves left (temp folders; set-aside ones, unless a crash between the two renames
    left no index in their place: those are put back), and every index but the newest of each source.
    A complete index that names no source was written by an earlier version under a key no longer used."""
    if not index_dir.is_dir():
        return 0, 0
    removed = [
        _sweep_stray(path, stray) for path in sorted(index_dir.iterdir()) if (stray := _STRAY.fullmatch(path.name))
    ]
    newest: dict[str, list[Path]] = {}
    for path in sorted(index_dir.iterdir()):
        if path.name.startswith(".") or not path.is_dir():
            continue
        source = _indexed_source(path)
        if source:
            newest.setdefault(source, []).append(path)
        else:
            removed.append(leftovers.remove(path))
    for paths in newest.values():
        paths.sort(key=lambda p: (p / MANIFEST).stat().st_mtime_ns)
        removed += [leftovers.remove(p) for p in paths[:-1]]
    sizes = [size for size in removed if size is not None]
    return len(sizes), sum(sizes)


def _sweep_stray(path: Path, stray: re.Match[str]) -> int | None:
    """Bytes removed, or None when the stray was kept (its writer lives) or put back."""
    if not leftovers.orphaned(stray["tag"]):
        return None
    home = path.parent / stray["name"]
    if stray["kind"] == "old" and not home.exists() and (path / MANIFEST).is_file():
        os.rename(path, home)
        return None
    return leftovers.remove(path)


def _indexed_source(folder: Path) -> str:
    """The source a complete index names in its manifest ("" when it names none or is incomplete)."""
    try:
        return str(json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("source") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def readable_folder(folder: Path) -> Path:
    """`folder`, or when a save crashed between its two renames, the complete previous index it set aside."""
    if (folder / MANIFEST).is_file():
        return folder
    if not folder.exists():
        asides = sorted(folder.parent.glob(f".{folder.name}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        for aside in asides:
            if (aside / MANIFEST).is_file():
                return aside
        raise IndexCorrupt(f"no index at {folder}")
    raise IndexCorrupt(f"{folder}: manifest missing")


def write_manifest(folder: Path, header: dict[str, Any]) -> None:
    paths = files_of(folder)
    digests = _digests(paths, _CHECKSUM)
    files = {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, _CHECKSUM: digest}
        for p, digest in zip(paths, digests, strict=True)
    }
    path = folder / MANIFEST
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**header, "checksum": _CHECKSUM, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def verified_manifest(folder: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise IndexCorrupt(f"{folder}: unreadable manifest: {error}") from error
    if manifest.get("format") != FORMAT_VERSION:
        raise IndexCorrupt(f"{folder}: format {manifest.get('format')!r}, expected {FORMAT_VERSION}")
    checksum = manifest.get("checksum", _LEGACY_CHECKSUM)
    if checksum not in _CHECKSUMS:
        raise IndexCorrupt(f"{folder}: checksum {checksum!r} unknown")
    files: dict[str, dict[str, Any]] = manifest["files"]
    for name, expected in files.items():
        path = folder / name
        # The size check catches truncation without hashing; the hash catches everything else.
        if not path.is_file() or path.stat().st_size != expected["bytes"]:
            raise IndexCorrupt(f"{folder}: {name} is missing or truncated")
    digests = _digests([folder / name for name in files], checksum)
    for (name, expected), digest in zip(files.items(), digests, strict=True):
        if digest != expected[checksum]:
            raise IndexCorrupt(f"{folder}: {name} is altered")
    return manifest


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _digests(paths: list[Path], checksum: str) -> list[str]:
    """The files' hex digests, hashed side by side: the largest files take most of a large snapshot's hashing."""
    with ThreadPoolExecutor(_HASH_THREADS, thread_name_prefix="index-hash") as pool:
        return list(pool.map(lambda path: _digest(path, checksum), paths))


def _digest(path: Path, checksum: str) -> str:
    """One call over the memory-mapped file: no read copies it into a buffer first."""
    digest = _CHECKSUMS[checksum]()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                digest.update(view)
    return digest.hexdigest()


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    # Directory fsync makes the renames and new entries durable; not every platform allows opening a folder.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
