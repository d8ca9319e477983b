"""Partition index snapshots through the real server, both backends (`[store] backend`): a restart serves a
MEMORY partition from its snapshot with every acknowledged write found; a kill -9 while snapshots are being
written, while writes are replayed and while the index is compacted loses nothing acknowledged, never serves a
half-written snapshot, and the next start sweeps what it left; a torn snapshot is refused and the partition
rebuilt from its rows."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from pathlib import Path

import grpc
import ir_data
import pytest
from memory_helpers import upsert_documents
from retrieval_helpers import PRINCIPAL, entry, retrieval_config, scifact_ids, target
from sidecar import Sidecar

from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

BACKENDS = ["embedded", "postgres"]
AT = common_pb2.Scope(tenant="acme-snap", session="s1")
_databases = itertools.count()


class Store:
    """One backend's rows (a data folder; for postgres also a fresh database) and the sidecars started on them,
    with snapshots due after `after_changes` chunk changes or 0.2 s idle."""

    def __init__(self, backend: str, folder: Path, dsn: str) -> None:
        self.backend, self.folder, self.dsn = backend, folder, dsn
        self.root, self.data = folder / "knowledge", folder / "data"
        self.root.mkdir(parents=True)
        self.started: list[Sidecar] = []

    def sidecar(self, after_changes: int = 1000) -> Sidecar:
        config = retrieval_config(self.root, self.data)
        config["inference"]["cache_bytes"] = 0
        config["store"] = {"backend": self.backend, "snapshot_after_changes": after_changes, "snapshot_idle_s": 0.2}
        server = Sidecar(self.folder / f"s{len(self.started)}", config, env={"RAGSIDECAR_STORE_DSN": self.dsn})
        server.workdir.mkdir(parents=True, exist_ok=True)
        self.started.append(server)
        return server.start()

    def snapshots(self) -> list[Path]:
        """Complete snapshot folders."""
        return [m.parent for m in self.data.glob("snapshots/*/*/manifest.json") if not m.parent.name.startswith(".")]

    def leftovers(self) -> list[Path]:
        return [p for p in self.data.glob("snapshots/*/.*") if ".tmp-" in p.name or ".old-" in p.name]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path):
    dsn = ""
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres").database(f"snapshot_restarts_{next(_databases)}")
    opened = Store(request.param, tmp_path, dsn)
    try:
        yield opened
    finally:
        for server in opened.started:
            server.stop()


def stub(server: Sidecar) -> retrieval_pb2_grpc.RetrievalServiceStub:
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel())


def found(server: Sidecar, query: str) -> list[str]:
    request = pb.SearchRequest(
        principal=PRINCIPAL, scope=AT, target=target([entry("notes", "MEMORY", "SEARCH")]), query=query, top_k=5
    )
    return [h.provenance.document_id for h in stub(server).Search(request, timeout=120).hits]


def count(server: Sidecar, documents: dict[str, str]) -> int:
    """Documents the partition holds, as an upsert of `documents` (all stored already) reports it."""
    response = upsert_documents(server, AT, documents)
    assert response.unchanged == len(documents), "an acknowledged document was lost or altered"
    return response.document_count


def waited(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def abstracts(count: int, start: int = 0) -> dict[str, str]:
    corpus = ir_data.corpus("scifact")
    return {doc_id: corpus[doc_id] for doc_id in scifact_ids()[start : start + count]}


def test_a_restart_serves_from_the_snapshot_with_every_acknowledged_write_found(store: Store) -> None:
    first = store.sidecar()
    before = abstracts(60)
    upsert_documents(first, AT, before)
    found(first, "a first search builds the index")
    waited(lambda: len(store.snapshots()) == 1)
    after = abstracts(5, start=60)  # written after the snapshot: replayed at the restart
    upsert_documents(first, AT, after)
    first.signal(signal.SIGKILL)
    first.process.wait(30)

    second = store.sidecar()
    for doc_id, text in list(after.items()) + list(before.items())[:3]:
        assert doc_id in found(second, text[:300]), doc_id
    assert second.metric("ragsidecar_index_loads_total", how="snapshot") == 1
    assert rebuilt(second) == 0
    assert count(second, before | after) == 65


class Writers:
    """Threads upserting one abstract per call, each keeping the ids acknowledged, until the server dies."""

    def __init__(self, server: Sidecar, documents: dict[str, str], threads: int = 2) -> None:
        ids = list(documents)
        self.documents = documents
        self.acknowledged: list[str] = []
        self._threads = [threading.Thread(target=self._write, args=(server, ids[i::threads])) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def _write(self, server: Sidecar, ids: list[str]) -> None:
        for doc_id in ids:
            try:
                upsert_documents(server, AT, {doc_id: self.documents[doc_id]})
                found(server, self.documents[doc_id][:200])  # each write applied to the index, so snapshots follow
            except grpc.RpcError:
                return
            self.acknowledged.append(doc_id)

    def join(self) -> list[str]:
        for thread in self._threads:
            thread.join(120)
        return self.acknowledged


def test_a_kill_9_while_snapshots_are_written_loses_nothing_and_the_next_start_sweeps_their_leftovers(
    store: Store,
) -> None:
    first = store.sidecar(after_changes=1)  # a snapshot after every write: kills land during one
    base = abstracts(40)
    upsert_documents(first, AT, base)
    found(first, "a first search builds the index")
    written = abstracts(120, start=40)
    writers = Writers(first, written)
    waited(lambda: len(writers.acknowledged) >= 15 and len(store.snapshots()) == 1, timeout=300)
    first.signal(signal.SIGKILL)
    first.process.wait(30)
    acknowledged = writers.join()

    second = store.sidecar()
    assert store.leftovers() == []  # swept at start
    assert count(second, base | {i: written[i] for i in acknowledged}) in range(
        40 + len(acknowledged), 40 + len(acknowledged) + 3
    )
    for doc_id in acknowledged[-4:]:
        assert doc_id in found(second, written[doc_id][:300]), doc_id
    assert second.metric("ragsidecar_index_snapshots_total", how="refused") == 0


def test_a_kill_9_during_the_replay_loses_nothing_and_a_torn_snapshot_is_never_served(store: Store) -> None:
    first = store.sidecar()
    base = abstracts(60)
    upsert_documents(first, AT, base)
    found(first, "a first search builds the index")
    waited(lambda: len(store.snapshots()) == 1)
    later = abstracts(30, start=60)
    upsert_documents(first, AT, later)
    first.stop()

    # Killed while its first search replays the writes after the snapshot: nothing was acknowledged meanwhile,
    # and the snapshot and the rows are as they were.
    replaying = store.sidecar()
    searching = threading.Thread(target=lambda: _search_quietly(replaying))
    searching.start()
    time.sleep(0.05)
    replaying.signal(signal.SIGKILL)
    replaying.process.wait(30)
    searching.join(60)

    (snapshot,) = store.snapshots()
    vectors = snapshot / "vectors.npy"
    vectors.write_bytes(vectors.read_bytes()[: vectors.stat().st_size // 2])  # torn
    third = store.sidecar()
    for doc_id in list(later)[-3:] + list(base)[:3]:
        text = (base | later)[doc_id]
        assert doc_id in found(third, text[:300]), doc_id
    assert third.metric("ragsidecar_index_snapshots_total", how="refused") == 1
    assert third.metric("ragsidecar_index_loads_total", how="snapshot") == 0
    assert count(third, base | later) == 90


def rebuilt(server: Sidecar) -> float:
    """Partition indexes built from all their rows: embedded builds, postgres reloads from the database."""
    return server.metric("ragsidecar_index_loads_total", how="built") + server.metric(
        "ragsidecar_partition_catch_ups_total", how="reload"
    )


def _search_quietly(server: Sidecar) -> None:
    try:
        found(server, "the replay")
    except grpc.RpcError:
        pass


@pytest.mark.timeout(900)
def test_a_kill_9_during_compactions_loses_nothing_acknowledged(store: Store) -> None:
    """Every write replaces the same 40 documents, so removed chunks soon outnumber live ones and the index is
    compacted in the background (and snapshotted after every write) while the writes go on. The texts cycle
    through three versions (their vectors come from the embedding cache after the first three writes): after
    the restart each document holds the last acknowledged version or the one in flight, never the one before."""
    first = store.sidecar(after_changes=1)
    base = {doc_id: text[:200] for doc_id, text in abstracts(40).items()}  # one chunk each
    acknowledged, version, compacted_at = -1, 0, None
    deadline = time.monotonic() + 600
    while compacted_at is None or version < compacted_at + 3:  # a few writes past the first compaction
        assert time.monotonic() < deadline, first.log()
        upsert_documents(first, AT, {doc_id: f"{text} version {version % 3}" for doc_id, text in base.items()})
        found(first, f"version {version % 3}")  # applies the write to the index (postgres: at the search)
        acknowledged, version = version, version + 1
        if compacted_at is None and first.metric("ragsidecar_index_compactions_total") >= 1:
            compacted_at = version
    writing = threading.Thread(
        target=lambda: _upsert_quietly(first, {i: f"{t} version {version % 3}" for i, t in base.items()})
    )
    writing.start()
    first.signal(signal.SIGKILL)
    first.process.wait(30)
    writing.join(60)

    second = store.sidecar()
    for doc_id in list(base)[:3]:
        request = pb.SearchRequest(
            principal=PRINCIPAL,
            scope=AT,
            target=target([entry("notes", "MEMORY", "SEARCH")]),
            query=base[doc_id],
            top_k=1,
        )
        (hit,) = stub(second).Search(request, timeout=120).hits
        assert hit.provenance.document_id == doc_id
        assert hit.text.endswith((f"version {acknowledged % 3}", f"version {version % 3}")), hit.text[-40:]
    assert store.leftovers() == []


def _upsert_quietly(server: Sidecar, documents: dict[str, str]) -> None:
    try:
        upsert_documents(server, AT, documents)
    except grpc.RpcError:
        pass
