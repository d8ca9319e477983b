"""Snapshot manifests' checksums through the DocumentStore interface, in process, both backends: new snapshots name
their checksum (xxh3_128) and a flipped byte under it is refused; a snapshot written before, its manifest of sha256
digests, is still verified and served."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from store_helpers import ANALYSIS, AT, MODEL, Stores, snapshots_written

from ragsidecar import metrics
from ragsidecar.knowledge.storage import MemoryDocument


def documents(count: int) -> list[MemoryDocument]:
    return [MemoryDocument(f"d{i}", f"note {i} about parcel p{i}", {}) for i in range(count)]


def counted(metric: object, label: str) -> float:
    return metric.labels(label)._value.get()  # type: ignore[attr-defined]


async def snapshot_of(stores: Stores, count: int) -> Path:
    """The folder of a partition's snapshot, written and the store closed."""
    store = await stores.open()
    await store.upsert(AT, "notes", documents(count))
    await store.index(AT, "notes", MODEL, ANALYSIS)
    (folder,) = snapshots_written(stores.data)
    await asyncio.sleep(0.3)  # past the idle time: the snapshot holds the last change
    await stores.close_all()
    return folder


def as_written_with_sha256(folder: Path) -> None:
    """Rewrites the manifest as snapshots were written before: no "checksum", each file's sha256."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    del manifest["checksum"]
    for name, entry in manifest["files"].items():
        del entry["xxh3_128"]
        entry["sha256"] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    path.write_text(json.dumps(manifest), encoding="utf-8")


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


async def test_a_new_snapshot_names_its_checksum_and_a_flipped_byte_is_refused(stores: Stores) -> None:
    folder = await snapshot_of(stores, 30)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["checksum"] == "xxh3_128"
    assert all(len(entry["xxh3_128"]) == 32 for entry in manifest["files"].values())
    flip_last_byte(folder / "vectors.npy")  # same size: only the checksum tells

    refused = counted(metrics.INDEX_SNAPSHOTS, "refused")
    partition = await (await stores.open()).index(AT, "notes", MODEL, ANALYSIS)
    assert counted(metrics.INDEX_SNAPSHOTS, "refused") == refused + 1
    assert len(partition.index) == 30


async def test_a_snapshot_with_a_sha256_manifest_is_still_served(stores: Stores) -> None:
    folder = await snapshot_of(stores, 30)
    as_written_with_sha256(folder)

    loaded = counted(metrics.INDEX_LOADS, "snapshot")
    partition = await (await stores.open()).index(AT, "notes", MODEL, ANALYSIS)
    assert counted(metrics.INDEX_LOADS, "snapshot") == loaded + 1
    assert sorted(c.text for c in partition.index.chunks()) == sorted(d.text for d in documents(30))


async def test_a_flipped_byte_under_a_sha256_manifest_is_refused(stores: Stores) -> None:
    folder = await snapshot_of(stores, 30)
    as_written_with_sha256(folder)
    flip_last_byte(folder / "vectors.npy")

    refused = counted(metrics.INDEX_SNAPSHOTS, "refused")
    partition = await (await stores.open()).index(AT, "notes", MODEL, ANALYSIS)
    assert counted(metrics.INDEX_SNAPSHOTS, "refused") == refused + 1
    assert len(partition.index) == 30
