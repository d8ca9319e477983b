"""MEMORY knowledge: documents the host upserts and deletes by id, partitioned by (tenant, session, source).

Each partition is one JSON file under the data folder, rewritten atomically (temp file, fsync, rename)
on every change, so a crash leaves either the old or the new document set, never a mix. A store without
a folder holds its partitions in memory only (the live corpora of chat bindings, lost on restart).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.sources import Provenance, Unit


@dataclass(frozen=True)
class MemoryDocument:
    id: str
    text: str
    metadata: dict[str, str]


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


class MemoryStore:
    def __init__(self, folder: Path | None) -> None:
        self._folder = folder
        self._partitions: dict[tuple[str, str, str], dict[str, MemoryDocument]] = {}
        self._versions: dict[tuple[str, str, str], int] = {}
        self._locks: dict[tuple[str, str, str], asyncio.Lock] = {}

    def units(self, scope: Scope, name: str) -> list[Unit]:
        documents = self._partition(scope, name).values()
        return [Unit(d.text, Provenance(document_id=d.id, char_end=len(d.text))) for d in documents]

    def count(self, scope: Scope, name: str) -> int:
        return len(self._partition(scope, name))

    def version(self, scope: Scope, name: str) -> int:
        """Changes whenever the partition's documents change (keys its index)."""
        return self._versions.get(_key(scope, name), 0)

    async def upsert(self, scope: Scope, name: str, documents: list[MemoryDocument]) -> UpsertOutcome:
        key = _key(scope, name)
        async with self._locks.setdefault(key, asyncio.Lock()):
            partition = dict(self._partition(scope, name))
            inserted = replaced = unchanged = 0
            for document in documents:
                old = partition.get(document.id)
                inserted += old is None
                replaced += old is not None and old != document
                unchanged += old == document
                partition[document.id] = document
            if inserted or replaced:
                await self._commit(key, partition)
            return UpsertOutcome(inserted, replaced, unchanged, len(partition))

    async def delete(self, scope: Scope, name: str, ids: list[str]) -> DeleteOutcome:
        key = _key(scope, name)
        async with self._locks.setdefault(key, asyncio.Lock()):
            partition = dict(self._partition(scope, name))
            wanted = list(dict.fromkeys(ids))
            deleted = [i for i in wanted if partition.pop(i, None) is not None]
            if deleted:
                await self._commit(key, partition)
            return DeleteOutcome(len(deleted), len(wanted) - len(deleted), len(partition))

    async def clear(self, scope: Scope, name: str) -> None:
        """Empties the partition (a new version, so its index rebuilds)."""
        key = _key(scope, name)
        async with self._locks.setdefault(key, asyncio.Lock()):
            await self._commit(key, {})

    async def drop(self, scope: Scope, name: str) -> None:
        """Forgets the partition of an in-memory store entirely (a closed chat binding)."""
        key = _key(scope, name)
        async with self._locks.setdefault(key, asyncio.Lock()):
            self._partitions.pop(key, None)
            self._versions.pop(key, None)
        self._locks.pop(key, None)

    def _partition(self, scope: Scope, name: str) -> dict[str, MemoryDocument]:
        key = _key(scope, name)
        if key not in self._partitions:
            self._partitions[key] = self._read(self._file(key)) if self._folder else {}
        return self._partitions[key]

    async def _commit(self, key: tuple[str, str, str], partition: dict[str, MemoryDocument]) -> None:
        if self._folder:
            await asyncio.to_thread(self._write, self._file(key), key, partition)
        self._partitions[key] = partition
        self._versions[key] = self._versions.get(key, 0) + 1

    def _file(self, key: tuple[str, str, str]) -> Path:
        return self._folder / (hashlib.sha256("\x00".join(key).encode()).hexdigest()[:40] + ".json")

    @staticmethod
    def _read(file: Path) -> dict[str, MemoryDocument]:
        if not file.exists():
            return {}
        rows = json.loads(file.read_text())["documents"]
        return {r["id"]: MemoryDocument(r["id"], r["text"], r.get("metadata", {})) for r in rows}

    @staticmethod
    def _write(file: Path, key: tuple[str, str, str], partition: dict[str, MemoryDocument]) -> None:
        file.parent.mkdir(parents=True, exist_ok=True)
        body = {"tenant": key[0], "session": key[1], "source": key[2],
                "documents": [{"id": d.id, "text": d.text, "metadata": d.metadata} for d in partition.values()]}
        with tempfile.NamedTemporaryFile("w", dir=file.parent, suffix=".tmp", delete=False) as tmp:
            json.dump(body, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, file)


def _key(scope: Scope, name: str) -> tuple[str, str, str]:
    return (scope.tenant, scope.session, name)
