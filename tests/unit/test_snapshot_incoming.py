"""A partition's snapshot received from elsewhere (store/snapshots.py `incoming`, where a PostgreSQL replica
downloads the one shared through the database) while the same process saves that partition's own: the save's
clean-up of its earlier leftovers leaves the download in flight alone, and the next start sweeps one left by a
killed process."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ragsidecar.knowledge.index import HybridIndex, IndexedChunk
from ragsidecar.store.snapshots import PartitionSnapshots, SnapshotPolicy


def test_a_save_leaves_a_download_of_the_same_partition_alone_and_the_next_start_sweeps_it(tmp_path: Path) -> None:
    snapshots = PartitionSnapshots(tmp_path, 1, SnapshotPolicy())
    incoming = snapshots.incoming("acme/notes")
    (incoming / "chunks.jsonl").write_bytes(b"part of a download\n")
    index = HybridIndex.build([IndexedChunk("c0", "a parcel left the depot", {})], np.ones((1, 8), np.float32))
    snapshots.save("acme/notes", "1", index)
    assert (incoming / "chunks.jsonl").read_bytes() == b"part of a download\n"
    assert (snapshots.path("acme/notes") / "manifest.json").is_file()

    PartitionSnapshots(tmp_path, 1, SnapshotPolicy())  # a start: this process's own download is no longer in flight
    assert not incoming.exists()
    assert (snapshots.path("acme/notes") / "manifest.json").is_file()
