"""MEMORY knowledge: documents the host upserts and deletes by id, partitioned by (tenant, session, source).

Each partition is one JSON file under the data folder, named by `key_of(tenant, session, source)` (so no
choice of ids can make two partitions share a file), rewritten atomically (temp file, fsync, rename) on
every change: a crash leaves either the old or the new document set, never a mix. Files named the way
earlier versions did (a hash of a separator join) are renamed at start-up; their body names their scope.

Partitions are held in a byte-bounded LRU. In a persisted store every partition in memory is already on
disk, so the least recently used are evicted and read back on demand. A store without a folder (the live
corpora of chat bindings, lost on restart) is their only copy: it evicts nothing and refuses a write that
would pass its bound (RESOURCE_EXHAUSTED). Every change draws a new version token, written with the
partition, so an index keyed on it survives eviction and is rebuilt after any change.

All reads and writes run off the event loop; those of one partition are serialised by a striped lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from ragsidecar import metrics
from ragsidecar.cache import ByteLRU
from ragsidecar.errors import ErrorKind, SidecarError, Violation, invalid
from ragsidecar.identifiers import key_of
from ragsidecar.knowledge import leftovers
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.sources import Provenance, Unit

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (tenant, session, source)

_STRIPES = 64
# Bookkeeping per resident document beyond its UTF-8 bytes (objects, dict slot).
_DOCUMENT_OVERHEAD = 200
# Earlier versions named a partition file by the first 40 hex digits of sha256("\0".join(key)).
_LEGACY_NAME_CHARS = 40


@dataclass(frozen=True)
class MemoryDocument:
    id: str
    text: str
    metadata: dict[str, str]

    def size(self) -> int:
        """UTF-8 bytes of the id, text and metadata: what the per-call limit counts."""
        return sum(len(s.encode("utf-8", "surrogatepass"))
                   for s in (self.id, self.text, *self.metadata.keys(), *self.metadata.values()))


@dataclass(frozen=True)
class UpsertOutcome:
    inserted: int
    replaced: int
    unchanged: int
    count: int


@dataclass(frozen=True)
class DeleteOutcome:
    deleted: int
    not_found: int
    count: int


def check_request_size(documents: list[MemoryDocument], limit: int) -> None:
    """Refuses one call's documents past retrieval.max_memory_bytes_per_request (INVALID_ARGUMENT, LIMIT_EXCEEDED)."""
    size = sum(d.size() for d in documents)
    if size > limit:
        raise invalid([Violation("documents", f"{size} bytes exceed the limit of {limit} "
                                              "bytes per call (retrieval.max_memory_bytes_per_request)",
                                 "LIMIT_EXCEEDED")], "LIMIT_EXCEEDED")


@dataclass(frozen=True)
class _Partition:
    documents: dict[str, MemoryDocument]
    version: str  # "" for a partition never written

    def size(self) -> int:
        return sum(d.size() + _DOCUMENT_OVERHEAD for d in self.documents.values())


_EMPTY = _Partition({}, "")


class MemoryStore:
    def __init__(self, folder: Path | None, *, resident_bytes: int, max_request_bytes: int, name: str) -> None:
        self._folder = folder
        self._resident: ByteLRU[Key, _Partition] = ByteLRU(resident_bytes)
        self._max_request_bytes = max_request_bytes
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        metrics.track_size(name, self._resident)
        if folder is not None:
            self._migrate_legacy_names(folder)

    async def units(self, scope: Scope, name: str) -> list[Unit]:
        documents = (await asyncio.to_thread(self._get, _key(scope, name))).documents.values()
        return [Unit(d.text, Provenance(document_id=d.id, char_end=len(d.text))) for d in documents]

    def count(self, scope: Scope, name: str) -> int:
        return len(self._get(_key(scope, name)).documents)

    def version(self, scope: Scope, name: str) -> str:
        """Changes whenever the partition's documents change (keys its index). Reads the disk: call it off
        the event loop when the store is persisted."""
        return self._get(_key(scope, name)).version

    async def upsert(self, scope: Scope, name: str, documents: list[MemoryDocument]) -> UpsertOutcome:
        return await asyncio.to_thread(self._upsert, _key(scope, name), documents)

    async def delete(self, scope: Scope, name: str, ids: list[str]) -> DeleteOutcome:
        return await asyncio.to_thread(self._delete, _key(scope, name), ids)

    async def clear(self, scope: Scope, name: str) -> None:
        """Empties the partition (a new version, so its index rebuilds)."""
        key = _key(scope, name)
        await asyncio.to_thread(self._locked_commit, key, {})

    async def drop(self, scope: Scope, name: str) -> None:
        """Forgets the partition of an in-memory store entirely (a closed chat binding)."""
        key = _key(scope, name)
        with self._stripe(key):
            self._resident.pop(key)

    def sweep(self) -> tuple[int, int]:
        """Removes temp files of writes killed mid-way; returns (files, bytes) removed."""
        if self._folder is None or not self._folder.is_dir():
            return 0, 0
        removed = [leftovers.remove(f) for f in self._folder.glob("*.tmp") if leftovers.orphaned(f.name)]
        return len(removed), sum(removed)

    # -- one partition, under its stripe lock ----------------------------------------------------------

    def _upsert(self, key: Key, documents: list[MemoryDocument]) -> UpsertOutcome:
        check_request_size(documents, self._max_request_bytes)
        with self._stripe(key):
            partition = dict(self._read_through(key).documents)
            inserted = replaced = unchanged = 0
            for document in documents:
                old = partition.get(document.id)
                inserted += old is None
                replaced += old is not None and old != document
                unchanged += old == document
                partition[document.id] = document
            if inserted or replaced:
                self._commit(key, partition)
            return UpsertOutcome(inserted, replaced, unchanged, len(partition))

    def _delete(self, key: Key, ids: list[str]) -> DeleteOutcome:
        with self._stripe(key):
            partition = dict(self._read_through(key).documents)
            wanted = list(dict.fromkeys(ids))
            deleted = [i for i in wanted if partition.pop(i, None) is not None]
            if deleted:
                self._commit(key, partition)
            return DeleteOutcome(len(deleted), len(wanted) - len(deleted), len(partition))

    def _locked_commit(self, key: Key, documents: dict[str, MemoryDocument]) -> None:
        with self._stripe(key):
            self._commit(key, documents)

    def _get(self, key: Key) -> _Partition:
        with self._stripe(key):
            return self._read_through(key)

    def _read_through(self, key: Key) -> _Partition:
        partition = self._resident.get(key)
        if partition is None and self._folder is not None:
            partition = self._read(self._file(key))
            self._resident.put(key, partition, partition.size())
        return partition or _EMPTY

    def _commit(self, key: Key, documents: dict[str, MemoryDocument]) -> None:
        partition = _Partition(documents, uuid.uuid4().hex)
        if self._folder is None:
            if not self._resident.put_within_bound(key, partition, partition.size()):
                raise SidecarError(ErrorKind.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED",
                                   "the in-memory knowledge store is full (retrieval.binding_store_bytes); "
                                   "close or reset bindings, or raise the limit")
            return
        self._write(self._file(key), key, partition)
        self._resident.put(key, partition, partition.size())


    def _stripe(self, key: Key) -> threading.Lock:
        return self._stripes[hash(key) % _STRIPES]

    # -- files -----------------------------------------------------------------------------------------

    def _file(self, key: Key) -> Path:
        assert self._folder is not None
        return self._folder / (key_of(*key) + ".json")

    @staticmethod
    def _read(file: Path) -> _Partition:
        try:
            body = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return _EMPTY
        documents = {r["id"]: MemoryDocument(r["id"], r["text"], r.get("metadata", {})) for r in body["documents"]}
        # Files written before versions were stored: a token that changes with the file.
        stat = file.stat()
        return _Partition(documents, body.get("version") or f"file:{stat.st_mtime_ns}:{stat.st_size}")

    @staticmethod
    def _write(file: Path, key: Key, partition: _Partition) -> None:
        file.parent.mkdir(parents=True, exist_ok=True)
        body = {"tenant": key[0], "session": key[1], "source": key[2], "version": partition.version,
                "documents": [{"id": d.id, "text": d.text, "metadata": d.metadata}
                              for d in partition.documents.values()]}
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=file.parent, prefix=leftovers.owner_tag(),
                                         suffix=".tmp", delete=False) as tmp:
            json.dump(body, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, file)

    def _migrate_legacy_names(self, folder: Path) -> None:
        """Renames partition files named the old way to `key_of` names; a file the new version already
        wrote for the same partition is newer, so the legacy one is then removed."""
        legacy = [f for f in folder.glob("*.json") if len(f.stem) == _LEGACY_NAME_CHARS] if folder.is_dir() else []
        for file in legacy:
            try:
                body = json.loads(file.read_text(encoding="utf-8"))
                target = self._file((body["tenant"], body["session"], body["source"]))
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("MEMORY partition file %s is unreadable (%s); left as it is", file, err)
                continue
            if target.exists():
                file.unlink()
            else:
                os.replace(file, target)
        if legacy:
            log.info("renamed %d MEMORY partition files to their unambiguous names", len(legacy))


def _key(scope: Scope, name: str) -> Key:
    return (scope.tenant, scope.session, name)
