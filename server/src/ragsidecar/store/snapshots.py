"""Partition index snapshots: a MEMORY partition's (or binding corpus's) resident index saved beside the store.

A snapshot is the index's folder (knowledge/index.py `save`: the HNSW graph, the BM25 segments, the float32
vectors and the chunks, with a manifest of sizes and sha256 checksums written last), stamped with the partition
key, the space (embedder and analysis) and the store's change sequence it holds every change up to. The rows
in SQLite or PostgreSQL stay the source of truth: opening a partition loads its snapshot and replays only the
changes after that position, and a snapshot that is torn, altered, of another space or partition is refused
by its manifest (the partition is then rebuilt from its rows, as before snapshots).

Snapshots are written by one background thread per process (`snapshotter`), never on a write's path: after
`after_changes` chunk changes since the last one, or once the partition has seen no change for `idle_s`
(`SnapshotPolicy`). The write goes to a temp folder renamed into place; a process killed meanwhile leaves a
temp folder that the next start sweeps. Evicting an index from the resident LRU drops it from memory once its
pending snapshot, if any, is written (the snapshotter holds it until then: an index evicted right after its
build is saved, not built again on every search); the next search of its partition loads its snapshot and
replays what came after.

With the postgres store a snapshot may also be shared through the database (store/shared_snapshots.py): `share`
runs after each local write of one, on the snapshot thread, and `adopt` puts a downloaded one (in an `incoming`
folder) in place of the partition's own, under the same lock as the writes, before it is loaded like any other.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ragsidecar import metrics
from ragsidecar.config import StoreConfig
from ragsidecar.knowledge import index_files, leftovers
from ragsidecar.knowledge.index import HybridIndex, IndexCorrupt

log = logging.getLogger(__name__)

# How often the background thread looks for idle partitions with changes not yet saved.
_TICK_S = 0.5


@dataclass(frozen=True)
class SnapshotPolicy:
    """When a partition's index is due for a snapshot (store.snapshot_after_changes, store.snapshot_idle_s)."""

    after_changes: int = 1000
    idle_s: float = 10.0

    def due(self, unsaved: int, idle_for: float) -> bool:
        """`unsaved`: chunk changes since the last snapshot (a whole index when it has none); `idle_for`: seconds
        since the last change. Many changes: at once, so a reopen replays few; a few: once the partition rests."""
        return unsaved > 0 and (unsaved >= self.after_changes or idle_for >= self.idle_s)


def policy_of(store: StoreConfig) -> SnapshotPolicy | None:
    """When partition indexes are snapshotted ([store] snapshot_*); None when snapshots are off."""
    if store.snapshot_after_changes == 0:
        return None
    return SnapshotPolicy(store.snapshot_after_changes, store.snapshot_idle_s)


class PartitionSnapshots:
    """The snapshots of one store's partitions, one folder each under `folder` (named by a hash of the key)."""

    def __init__(
        self,
        folder: Path,
        threads: int,
        policy: SnapshotPolicy,
        share: Callable[[str, str, Path, int], None] | None = None,
    ) -> None:
        """`share(partition, space, folder, chunks)` runs after each snapshot written (on the snapshot thread)."""
        self.folder = folder
        self.policy = policy
        self.closed = False
        self._threads = threads
        self._share = share
        folder.mkdir(parents=True, exist_ok=True)
        removed, removed_bytes = index_files.sweep(folder)
        if removed:
            log.info("swept %d snapshot leftovers (%d bytes) from %s", removed, removed_bytes, folder)

    def path(self, partition: str) -> Path:
        return self.folder / hashlib.sha256(partition.encode()).hexdigest()[:40]

    def load(self, partition: str, space: str) -> HybridIndex | None:
        """The partition's snapshot of `space`, or None when there is none or it cannot be trusted."""
        path = self.path(partition)
        if not path.exists() and not any(self.folder.glob(f".{path.name}.old-*")):
            return None
        try:
            index = HybridIndex.load(path, self._threads, expect={"partition": partition, "space": space})
        except IndexCorrupt as error:
            log.warning("partition snapshot refused, the partition is rebuilt from its rows: %s", error)
            metrics.INDEX_SNAPSHOTS.labels("refused").inc()
            return None
        metrics.INDEX_LOADS.labels("snapshot").inc()
        return index

    def changed(self, partition: str, space: str, index: HybridIndex, chunks: int) -> None:
        """Notes `chunks` chunk changes applied to the partition's resident index (a whole index just built or
        caught up: its size); the background thread saves it when the policy says so."""
        snapshotter.note(self, partition, space, index, chunks)

    def forget(self, partition: str) -> None:
        """Drops the partition's snapshot (a dropped partition). A snapshot racing this is harmless: stale, the
        replay removes what the rows no longer hold."""
        snapshotter.cancel(self, partition)
        shutil.rmtree(self.path(partition), ignore_errors=True)

    def close(self) -> None:
        snapshotter.close(self)

    def save(self, partition: str, space: str, index: HybridIndex) -> None:
        path = self.path(partition)
        index.save(path, source=partition, stamp={"partition": partition, "space": space})
        if self._share is not None:
            try:
                self._share(partition, space, path, len(index))
            except Exception:  # the local snapshot stands; the next one is shared instead
                log.exception("sharing a partition snapshot failed")

    def incoming(self, partition: str) -> Path:
        """An empty temp folder for a snapshot of the partition received from elsewhere (`adopt` then puts it in
        place); one left by a process killed meanwhile is swept at the next start. Not named as a save's temp
        folder: a save of the partition meanwhile removes those of its own process, taking them for leftovers."""
        name = self.path(partition).name
        return Path(tempfile.mkdtemp(prefix=f".{name}.incoming.tmp-{leftovers.owner_tag()}", dir=self.folder))

    def adopt(self, partition: str, incoming: Path) -> None:
        """Makes the `incoming` folder the partition's snapshot, in place of its own (snapshot writes wait)."""
        with snapshotter.saving:
            index_files.swap_in(incoming, self.path(partition))


@dataclass
class _Pending:
    snapshots: PartitionSnapshots
    partition: str
    space: str
    index: HybridIndex
    unsaved: int = 0
    last_change: float = field(default_factory=time.monotonic)


class _Snapshotter:
    """One daemon thread writing the snapshots that are due, one at a time. It holds each index with changes not
    yet saved (an evicted one too) until its snapshot is written."""

    def __init__(self) -> None:
        self._pending: dict[tuple[int, str], _Pending] = {}
        self._wake = threading.Condition()
        self.saving = threading.Lock()  # held through each save, and while a shared snapshot is put in place
        self._thread: threading.Thread | None = None
        metrics.INDEX_SNAPSHOTS_PENDING.set_function(lambda: len(self._pending))

    def note(self, snapshots: PartitionSnapshots, partition: str, space: str, index: HybridIndex, chunks: int) -> None:
        with self._wake:
            key = (id(snapshots), partition)
            entry = self._pending.get(key)
            if entry is None or entry.index is not index or entry.space != space:
                entry = self._pending[key] = _Pending(snapshots, partition, space, index)
            entry.unsaved += chunks
            entry.last_change = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="index-snapshots", daemon=True)
                self._thread.start()
            if snapshots.policy.due(entry.unsaved, 0.0):
                self._wake.notify()

    def close(self, snapshots: PartitionSnapshots) -> None:
        """Waits for the save in flight, if any, and writes no more of `snapshots` (its store is closing: a save
        cut off by the process's exit would leave a temp folder for the next start to sweep)."""
        with self.saving, self._wake:
            snapshots.closed = True
            for key in [key for key, entry in self._pending.items() if entry.snapshots is snapshots]:
                del self._pending[key]

    def cancel(self, snapshots: PartitionSnapshots, partition: str) -> None:
        with self._wake:
            self._pending.pop((id(snapshots), partition), None)

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait(_TICK_S)
                now = time.monotonic()
                due = [
                    (key, entry, entry.unsaved)
                    for key, entry in self._pending.items()
                    if entry.snapshots.policy.due(entry.unsaved, now - entry.last_change)
                ]
            for key, entry, unsaved in due:
                with self.saving:
                    self._save(key, entry, unsaved)

    def _save(self, key: tuple[int, str], entry: _Pending, unsaved: int) -> None:
        index = entry.index
        if not entry.snapshots.closed:
            try:
                started = time.perf_counter()
                entry.snapshots.save(entry.partition, entry.space, index)
                metrics.INDEX_SNAPSHOTS.labels("written").inc()
                log.debug("snapshot of %d chunks in %.3f s", len(index), time.perf_counter() - started)
            except Exception:  # the index keeps serving; its next change asks again
                log.exception("partition snapshot failed")
                return
        with self._wake:
            if self._pending.get(key) is entry:
                entry.unsaved -= unsaved
                if entry.unsaved <= 0:
                    del self._pending[key]


snapshotter = _Snapshotter()
