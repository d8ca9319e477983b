"""One behaviour suite for both storage backends (`[store] backend`: embedded, postgres), through the real
server: MEMORY upsert, delete and search (Search and Enforce); writers at once each reading their own write;
chat bindings, their reset (the one RPC that clears a corpus) and close; SEQUENTIAL cursors; tenants,
look-alike scopes and same-named sources apart; the byte bounds refusing with their status while the server
serves on; a kill -9 during writes losing no acknowledged write and leaving no stray file. Then, for the
embedded store: a data folder 0.2.0 wrote (tests/data/memory-0.2.0) imported at start-up with nothing lost,
and a DIRECTORY source updated file by file."""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import ir_data
import pytest
from retrieval_helpers import PRINCIPAL, entry, llm, params, retrieval_config, scifact_ids, target
from sidecar import Sidecar, error_details

from ragsidecar.v1 import chat_knowledge_pb2 as cpb
from ragsidecar.v1 import chat_knowledge_pb2_grpc, common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

BACKENDS = ["embedded", "postgres"]
NOTES = entry("notes", "MEMORY", "SEARCH")
STEPS = 4
SEQUENCE = entry("steps", "FILE", "SEQUENTIAL", "steps.jsonl")
FIXTURE_0_2_0 = Path(__file__).resolve().parents[1] / "data" / "memory-0.2.0"
# What a data folder may hold: the SQLite database with its WAL and shared-memory files, the FILE and
# DIRECTORY indexes' folder and the partition index snapshots' folder.
DATA_FILES = {"memory.sqlite3", "memory.sqlite3-wal", "memory.sqlite3-shm", "indexes", "snapshots"}
_databases = itertools.count()


def scope(tenant: str, session: str = "s1") -> common_pb2.Scope:
    return common_pb2.Scope(tenant=tenant, session=session)


def retrieval(server: Sidecar) -> retrieval_pb2_grpc.RetrievalServiceStub:
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel())


def chat(server: Sidecar) -> chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub:
    return chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub(server.channel())


Documents = dict[str, str | tuple[str, dict[str, str]]]  # id -> text, or (text, metadata)


def memory_documents(documents: Documents) -> list[pb.MemoryDocument]:
    return [
        pb.MemoryDocument(id=i, text=d, metadata={})
        if isinstance(d, str)
        else pb.MemoryDocument(id=i, text=d[0], metadata=d[1])
        for i, d in documents.items()
    ]


def upsert(
    server: Sidecar, at: common_pb2.Scope, documents: Documents, knowledge: str = "notes"
) -> pb.UpsertDocumentsResponse:
    return retrieval(server).UpsertDocuments(
        pb.UpsertDocumentsRequest(
            principal=PRINCIPAL, scope=at, knowledge=knowledge, documents=memory_documents(documents)
        ),
        timeout=120,
    )


def delete(
    server: Sidecar, at: common_pb2.Scope, ids: list[str], knowledge: str = "notes"
) -> pb.DeleteDocumentsResponse:
    return retrieval(server).DeleteDocuments(
        pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=at, knowledge=knowledge, ids=ids), timeout=120
    )


def hits(
    server: Sidecar, at: common_pb2.Scope, query: str, knowledge: str = "notes", top_k: int = 10
) -> list[tuple[str, str]]:
    """(document id, chunk text) of a MEMORY search's hits, best first."""
    request = pb.SearchRequest(
        principal=PRINCIPAL, scope=at, target=target([entry(knowledge, "MEMORY", "SEARCH")]), query=query, top_k=top_k
    )
    return [(h.provenance.document_id, h.text) for h in retrieval(server).Search(request, timeout=120).hits]


def found(server: Sidecar, at: common_pb2.Scope, query: str, knowledge: str = "notes") -> list[str]:
    return [doc_id for doc_id, _ in hits(server, at, query, knowledge)]


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    info, _ = error_details(caught.value)
    return caught.value.code(), info.reason if info else ""


@dataclass
class Store:
    """One backend's state (a data folder; for postgres also a fresh database), and sidecars started on it."""

    backend: str
    root: Path
    data: Path
    dsn: str = ""
    started: list[Sidecar] = field(default_factory=list)

    def sidecar(self, workdir: Path, **retrieval_settings: object) -> Sidecar:
        config = retrieval_config(self.root, self.data)
        config["inference"]["cache_bytes"] = 0
        config["retrieval"].update(retrieval_settings)
        config["store"] = {"backend": self.backend}
        env = {"RAGSIDECAR_STORE_DSN": self.dsn} if self.dsn else {}
        workdir.mkdir(parents=True, exist_ok=True)
        server = Sidecar(workdir, config, env=env)
        self.started.append(server)
        return server.start()

    def stop(self) -> None:
        for server in self.started:
            server.stop()


def open_store(backend: str, folder: Path, request: pytest.FixtureRequest) -> Store:
    root = folder / "knowledge"
    root.mkdir(parents=True)
    (root / "steps.jsonl").write_text(
        "".join(json.dumps({"id": f"s{i}", "text": f"Step {i} of the drill."}) + "\n" for i in range(1, STEPS + 1))
    )
    dsn = ""
    if backend == "postgres":  # the session's PostgreSQL, started only when a postgres case runs
        dsn = request.getfixturevalue("postgres").database(f"backends_{next(_databases)}")
    return Store(backend, root, folder / "data", dsn)


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """One sidecar per backend for the cases that need no settings of their own (each uses its own tenants)."""
    store = open_store(request.param, tmp_path_factory.mktemp(f"backend-{request.param}"), request)
    try:
        yield store.sidecar(store.data.parent / "server")
    finally:
        store.stop()


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend, for cases that start (and kill) sidecars of their own on it."""
    fresh = open_store(request.param, tmp_path, request)
    try:
        yield fresh
    finally:
        fresh.stop()


# -- MEMORY ---------------------------------------------------------------------------------------------------


def test_upserts_and_deletes_report_their_counts_and_the_next_search_follows_each(server) -> None:
    at = scope("acme-writes")
    first = upsert(
        server,
        at,
        {
            "bob": ("The customer Bob prefers delivery on Saturdays.", {"kind": "pref"}),
            "osaka": "The Osaka order ships by sea freight and takes six weeks.",
        },
    )
    assert (first.inserted, first.replaced, first.unchanged, first.document_count) == (2, 0, 0, 2)
    assert found(server, at, "when does Bob want his delivery?")[0] == "bob"

    again = upsert(
        server,
        at,
        {
            "bob": ("The customer Bob prefers delivery on Saturdays.", {"kind": "pref"}),
            "osaka": "The Osaka order ships by air freight and takes two days.",
            "kayak": "The kayak is stored in the boathouse by the lake.",
        },
    )
    assert (again.inserted, again.replaced, again.unchanged, again.document_count) == (1, 1, 1, 3)
    assert (
        upsert(server, at, {"bob": ("The customer Bob prefers delivery on Saturdays.", {"kind": "vip"})}).replaced == 1
    )  # metadata alone is a change
    osaka = hits(server, at, "how does the Osaka order travel?")
    assert osaka[0] == ("osaka", "The Osaka order ships by air freight and takes two days.")
    assert not any("sea freight" in text for _, text in hits(server, at, "sea freight six weeks"))
    assert found(server, at, "where is the kayak kept?")[0] == "kayak"
    enforced = retrieval(server).Enforce(
        pb.EnforceRequest(
            principal=PRINCIPAL,
            scope=at,
            target=target([NOTES], {"answer": ["notes"]}),
            action="answer",
            params=params(question="where is the kayak kept?"),
            llm=llm(),
        ),
        timeout=120,
    )
    assert "boathouse" in enforced.retrieved_context and "sea freight" not in enforced.retrieved_context

    gone = delete(server, at, ["kayak", "kayak", "never-written"])
    assert (gone.deleted, gone.not_found, gone.document_count) == (1, 1, 2)
    assert "kayak" not in found(server, at, "where is the kayak kept?")
    emptied = delete(server, at, ["bob", "osaka"])
    assert (emptied.deleted, emptied.document_count) == (2, 0)
    assert found(server, at, "when does Bob want his delivery?") == []
    assert upsert(server, at, {"bob": "Bob now prefers Sunday delivery."}).document_count == 1
    assert found(server, at, "when does Bob want his delivery?") == ["bob"]


def test_writers_at_once_each_find_their_own_write_at_once(server) -> None:
    at = scope("acme-concurrent")
    abstracts = ir_data.corpus("scifact")
    ids = scifact_ids()[:24]

    def write_then_find(doc_id: str) -> tuple[str, list[str]]:
        upsert(server, at, {doc_id: abstracts[doc_id]})
        return doc_id, found(server, at, abstracts[doc_id][:300])[:1]

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(write_then_find, ids))
    assert [(doc_id, [doc_id]) for doc_id in ids] == outcomes
    assert delete(server, at, ["none"]).document_count == len(ids)


def test_tenants_look_alike_scopes_and_same_named_sources_stay_apart(server) -> None:
    # (tenant, session, source) triples a separator join would merge, and the same source name elsewhere.
    partitions = [
        ("a", "b:c", "notes"),
        ("a:b", "c", "notes"),
        ("a", "b", "c:notes"),
        ("a", "", "notes"),
        ("a", "b", "notes"),
        ("b", "c", "notes"),
        ("a b", "c", "notes"),
        ("a", "b c", "notes"),
    ]
    for i, (tenant, session, source) in enumerate(partitions):
        assert (
            upsert(
                server, scope(tenant, session), {"same-id": f"Parcel {i} waits at depot number {i}."}, source
            ).document_count
            == 1
        )

    def each_sees_only_its_own() -> None:
        for i, (tenant, session, source) in enumerate(partitions):
            assert hits(server, scope(tenant, session), "which depot is the parcel at?", source) == [
                ("same-id", f"Parcel {i} waits at depot number {i}.")
            ], (tenant, session, source)

    each_sees_only_its_own()
    # A write or a delete in one partition touches no other.
    tenant, session, source = partitions[0]
    assert delete(server, scope(tenant, session), ["same-id"], source).deleted == 1
    assert hits(server, scope(tenant, session), "which depot is the parcel at?", source) == []
    assert (
        upsert(server, scope(tenant, session), {"same-id": "Parcel 0 waits at depot number 0."}, source).inserted == 1
    )
    each_sees_only_its_own()


# -- chat bindings --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    at: common_pb2.Scope
    id: str
    handle: str
    owner: str = "ada"

    def append(self, server: Sidecar, documents: Documents) -> cpb.AppendToBindingResponse:
        return chat(server).AppendToBinding(
            cpb.AppendToBindingRequest(
                principal=PRINCIPAL,
                scope=self.at,
                binding_id=self.id,
                owner_id=self.owner,
                binding_handle=self.handle,
                documents=memory_documents(documents),
            ),
            timeout=60,
        )

    def grounded(self, server: Sidecar, question: str, at: common_pb2.Scope | None = None) -> str:
        """The fenced knowledge of a turn grounded on the binding ("" when nothing was given)."""
        response = chat(server).GroundTurn(
            cpb.GroundTurnRequest(
                principal=PRINCIPAL,
                conversation=[
                    cpb.ChatMessage(role="system", content="You help."),
                    cpb.ChatMessage(role="user", content=question),
                ],
                owners=[cpb.ChatOwner(owner_id=self.owner, knowledge=[entry("orders", "MEMORY", "SEARCH")])],
                llm=llm(),
                bindings=[cpb.TurnBinding(binding_id=self.id, owner_id=self.owner, binding_handle=self.handle)],
                context=cpb.ChatRetrievalContext(scope=at or self.at),
            ),
            timeout=120,
        )
        system = next(m.content for m in reversed(response.conversation) if m.role == "system")
        return system.partition("<tnsai-memory>")[2].partition("</tnsai-memory>")[0]

    def reset(self, server: Sidecar) -> int:
        return (
            chat(server)
            .InvalidateBinding(
                cpb.InvalidateBindingRequest(
                    principal=PRINCIPAL,
                    scope=self.at,
                    binding_id=self.id,
                    owner_id=self.owner,
                    reset=True,
                    binding_handle=self.handle,
                ),
                timeout=60,
            )
            .document_count
        )

    def close(self, server: Sidecar) -> bool:
        return (
            chat(server)
            .CloseBinding(
                cpb.CloseBindingRequest(
                    principal=PRINCIPAL,
                    scope=self.at,
                    binding_id=self.id,
                    owner_id=self.owner,
                    binding_handle=self.handle,
                ),
                timeout=60,
            )
            .was_open
        )


def open_binding(server: Sidecar, at: common_pb2.Scope, source: str = "orders") -> Bound:
    opened = chat(server).OpenBinding(
        cpb.OpenBindingRequest(principal=PRINCIPAL, scope=at, owner_id="ada", source=source, declared=True), timeout=60
    )
    return Bound(at, opened.binding_id, opened.binding_handle)


def test_a_binding_appends_grounds_resets_and_closes(server) -> None:
    binding = open_binding(server, scope("acme-binding"))
    first = binding.append(
        server,
        {
            "o1": "Order 1001: the Blender X2 shipped on Monday.",
            "o2": "Order 1002: the Kettle K1 is back-ordered until next month.",
        },
    )
    assert (first.appended, first.replaced, first.document_count) == (2, 0, 2)
    assert "Blender X2 shipped on Monday" in binding.grounded(server, "when did the blender ship?")
    second = binding.append(server, {"o1": "Order 1001: the Blender X2 was returned on Friday."})
    assert (second.appended, second.replaced, second.document_count) == (0, 1, 2)
    seen = binding.grounded(server, "what happened to the blender order?")
    assert "returned on Friday" in seen and "shipped on Monday" not in seen
    assert binding.reset(server) == 0
    assert binding.grounded(server, "what happened to the blender order?") == ""
    assert binding.append(server, {"o3": "Order 1003: a toaster arrived."}).document_count == 1
    assert "toaster arrived" in binding.grounded(server, "did the toaster arrive?")
    assert binding.close(server) and not binding.close(server)
    assert refused(lambda: binding.append(server, {"o4": "late"})) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_BINDING")


def test_bindings_of_look_alike_scopes_stay_apart(server) -> None:
    one, two = open_binding(server, scope("a:b", "c")), open_binding(server, scope("a", "b:c"))
    one.append(server, {"v": "The vault code of a:b is 4417."})
    two.append(server, {"v": "The vault code of a is 9021."})
    assert "4417" in one.grounded(server, "vault code") and "9021" not in one.grounded(server, "vault code")
    assert "9021" in two.grounded(server, "vault code") and "4417" not in two.grounded(server, "vault code")
    assert refused(lambda: one.grounded(server, "vault code", at=two.at)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "PERMISSION_DENIED",
    )
    assert one.close(server) and two.close(server)


# -- SEQUENTIAL cursors ---------------------------------------------------------------------------------------


def next_step(server: Sidecar, at: common_pb2.Scope) -> int | None:
    request = pb.EnforceRequest(
        principal=PRINCIPAL, scope=at, target=target([SEQUENCE], {"answer": ["steps"]}), action="answer", llm=llm()
    )
    context = retrieval(server).Enforce(request, timeout=60).retrieved_context
    return int(context.split("Step ", 1)[1].split()[0]) if "Step " in context else None


def test_sequential_cursors_advance_one_unit_per_dispatch_per_scope(server) -> None:
    first, look_alike, other = scope("a:b", "cursor"), scope("a", "b:cursor"), scope("acme-cursor")
    assert [next_step(server, first) for _ in range(2)] == [1, 2]
    assert next_step(server, look_alike) == 1 and next_step(server, other) == 1
    assert [next_step(server, first) for _ in range(STEPS - 1)] == [3, 4, None]  # once every unit was given
    assert next_step(server, look_alike) == 2


# -- bounds ---------------------------------------------------------------------------------------------------


def test_writes_past_the_bounds_are_refused_and_the_server_serves_on_with_nothing_lost(store, tmp_path) -> None:
    server = store.sidecar(tmp_path / "bounded", max_memory_bytes_per_request=2000, binding_store_bytes=3000)
    at = scope("acme-bounds")
    assert upsert(server, at, {"small": "The parcel waits at the depot. " * 10}).document_count == 1
    assert refused(lambda: upsert(server, at, {"a": "y" * 1000, "b": "z" * 1000})) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "LIMIT_EXCEEDED",
    )
    assert refused(lambda: open_binding(server, at).append(server, {"big": "w" * 2500})) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "LIMIT_EXCEEDED",
    )
    assert upsert(server, at, {"small": "The parcel waits at the depot. " * 10}).unchanged == 1
    assert found(server, at, "where is the parcel?") == ["small"]

    full = open_binding(server, at)
    assert full.append(server, {"r1": "The first tool result is long. " * 48}).document_count == 1
    other = open_binding(server, scope("globex-bounds"))  # the bound spans every binding, of every tenant
    assert refused(lambda: other.append(server, {"r": "The second tool result is long. " * 48})) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "LIMIT_EXCEEDED",
    )
    assert refused(lambda: full.append(server, {"r2": "The first tool result has a sequel. " * 45})) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "LIMIT_EXCEEDED",
    )
    seen = full.grounded(server, "the first tool result")
    assert "first tool result is long" in seen and "sequel" not in seen  # unchanged
    assert other.grounded(server, "the second tool result") == ""
    assert full.close(server)  # closing frees its bytes
    assert other.append(server, {"r": "The second tool result is long. " * 48}).document_count == 1
    assert "second tool result" in other.grounded(server, "the second tool result")


# -- kill -9 --------------------------------------------------------------------------------------------------


class Writers:
    """Threads upserting one SciFact abstract per call, each recording the ids acknowledged, until the server
    dies under them."""

    def __init__(self, server: Sidecar, at: common_pb2.Scope, threads: int = 2) -> None:
        self.abstracts = ir_data.corpus("scifact")
        ids = scifact_ids()
        self.acknowledged: list[list[str]] = [[] for _ in range(threads)]
        self._threads = [
            threading.Thread(target=self._write, args=(server, at, ids[i::threads], self.acknowledged[i]))
            for i in range(threads)
        ]

    def document(self, doc_id: str) -> tuple[str, dict[str, str]]:
        return self.abstracts[doc_id], {"corpus-id": doc_id}

    def _write(self, server: Sidecar, at: common_pb2.Scope, ids: list[str], acknowledged: list[str]) -> None:
        for doc_id in ids:
            try:
                upsert(server, at, {doc_id: self.document(doc_id)})
            except grpc.RpcError:
                return
            acknowledged.append(doc_id)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self) -> list[str]:
        for thread in self._threads:
            thread.join(120)
        return [doc_id for ids in self.acknowledged for doc_id in ids]

    def count(self) -> int:
        return sum(len(ids) for ids in self.acknowledged)


def stray_files(data: Path) -> list[str]:
    """What the data folder holds beyond the store's own files: temp files, or anything else left behind."""
    if not data.exists():
        return []
    strays = [p.name for p in data.iterdir() if p.name not in DATA_FILES]
    return strays + [str(p.relative_to(data)) for p in data.rglob("*") if ".tmp" in p.name or ".old" in p.name]


def test_a_kill_9_during_writes_loses_no_acknowledged_write_and_leaves_no_stray_file(store, tmp_path) -> None:
    at = scope("acme-crash")
    first = store.sidecar(tmp_path / "first")
    writers = Writers(first, at)
    writers.start()
    deadline = time.monotonic() + 300
    while writers.count() < 40:
        assert time.monotonic() < deadline and first.process.poll() is None, first.log()
        time.sleep(0.01)
    first.signal(signal.SIGKILL)
    first.process.wait(30)
    acknowledged = writers.join()
    assert len(acknowledged) >= 40

    second = store.sidecar(tmp_path / "second")
    assert stray_files(store.data) == []
    # Every acknowledged document is there as written; at most the one call in flight per writer also landed.
    again = upsert(second, at, {i: writers.document(i) for i in acknowledged})
    assert (again.inserted, again.replaced, again.unchanged) == (0, 0, len(acknowledged))
    assert len(acknowledged) <= again.document_count <= len(acknowledged) + 2
    for doc_id in acknowledged[:3] + acknowledged[-3:]:
        assert doc_id in found(second, at, writers.abstracts[doc_id][:300]), doc_id
    second.stop()
    assert stray_files(store.data) == []


# -- 0.2.0's data folder (embedded) ---------------------------------------------------------------------------


def partitions_of_0_2_0() -> dict[tuple[str, str, str], dict[str, tuple[str, dict[str, str]]]]:
    """What 0.2.0 held: (tenant, session, source) -> {id: (text, metadata)}, read from its files."""
    partitions = {}
    for file in FIXTURE_0_2_0.glob("*.json"):
        body = json.loads(file.read_text(encoding="utf-8"))
        partitions[(body["tenant"], body["session"], body["source"])] = {
            d["id"]: (d["text"], d["metadata"]) for d in body["documents"]
        }
    return partitions


def test_a_data_folder_written_by_0_2_0_is_imported_at_start_up_with_nothing_lost(make_sidecar, tmp_path) -> None:
    old = partitions_of_0_2_0()
    assert (len(old), sum(map(len, old.values()))) == (6, 12)
    root, data = tmp_path / "knowledge", tmp_path / "data"
    root.mkdir()
    shutil.copytree(FIXTURE_0_2_0, data / "memory", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    first = make_sidecar(retrieval_config(root, data)).start()
    assert list((data / "memory").glob("*.json")) == []  # imported at start-up, before any call
    assert "imported 6 MEMORY partition files" in first.log()

    def everything_is_there(server: Sidecar) -> None:
        for (tenant, session, source), documents in old.items():
            at = scope(tenant, session)
            # Each document as 0.2.0 held it, text and metadata: unchanged, and no other document with them.
            again = upsert(server, at, dict(documents), source)
            assert (again.unchanged, again.document_count) == (len(documents), len(documents)), (tenant, session)
            for doc_id, (text, _) in documents.items():
                assert hits(server, at, text, source)[0] == (doc_id, text), (tenant, session, doc_id)

    everything_is_there(first)
    tenant_wide = scope("acme", "")
    assert upsert(first, tenant_wide, {"new": "The Leeds warehouse reopens on Tuesday."}).document_count == 3
    first.stop()
    # As if a crash had stopped the import between a file's transaction and its removal: the files are back.
    shutil.copytree(
        FIXTURE_0_2_0, data / "memory", ignore=shutil.ignore_patterns("*.py", "__pycache__"), dirs_exist_ok=True
    )

    second = make_sidecar(retrieval_config(root, data)).start()
    assert list((data / "memory").glob("*.json")) == []  # removed, their partitions left as they are now
    assert found(second, tenant_wide, "when does the Leeds warehouse reopen?")[0] == "new"
    assert delete(second, tenant_wide, ["new"]).document_count == 2
    everything_is_there(second)
    assert second.metric("ragsidecar_embedded_chunks_total") == 0  # their chunks were kept, not made again
    assert stray_files(data) == []  # 0.2.0's folder went with its last file


# -- DIRECTORY sources, file by file --------------------------------------------------------------------------

SCIENCE = entry("science", "DIRECTORY", "SEARCH", "science")
ZEBRAFISH = "Zebrafish regenerate their heart after injury: cardiomyocytes near the wound divide again."


def load_science(server: Sidecar) -> int:
    request = pb.RequireLoadedRequest(
        principal=PRINCIPAL, scope=scope("acme"), target=target([SCIENCE]), names=["science"]
    )
    return retrieval(server).RequireLoaded(request, timeout=300).counts[0].count


def science_hits(server: Sidecar, query: str) -> list[tuple[str, str]]:
    """(file, chunk text) of a search of the DIRECTORY source, best first; its files rescanned, so that an edit just
    made is searched without waiting for the watcher's event."""
    request = pb.SearchRequest(
        principal=PRINCIPAL, scope=scope("acme"), target=target([SCIENCE]), query=query, top_k=5, rescan=True
    )
    return [(Path(h.provenance.file).name, h.text) for h in retrieval(server).Search(request, timeout=120).hits]


def loads(server: Sidecar) -> dict[str, float]:
    return {how: server.metric("ragsidecar_index_loads_total", how=how) for how in ("built", "updated", "disk")}


def test_a_directory_source_re_embeds_only_the_file_edited_and_drops_a_file_removed(make_sidecar, tmp_path) -> None:
    root, data = tmp_path / "knowledge", tmp_path / "data"
    (root / "science").mkdir(parents=True)
    abstracts = ir_data.corpus("scifact")
    files = {f"abstract{n:02}.txt": abstracts[doc_id] for n, doc_id in enumerate(scifact_ids()[:30])}
    for name, text in files.items():
        (root / "science" / name).write_text(text)
    server = make_sidecar(retrieval_config(root, data)).start()
    assert load_science(server) == 30
    assert loads(server) == {"built": 1, "updated": 0, "disk": 0}
    embedded = server.metric("ragsidecar_embedded_chunks_total")

    edited, removed = "abstract07.txt", "abstract11.txt"
    (root / "science" / edited).write_text(ZEBRAFISH)
    assert science_hits(server, "can zebrafish regrow heart tissue?")[0] == (edited, ZEBRAFISH)
    assert loads(server) == {"built": 1, "updated": 1, "disk": 0}
    assert server.metric("ragsidecar_embedded_chunks_total") == embedded + 1  # the edited file's one chunk
    assert all(text == ZEBRAFISH for file, text in science_hits(server, files[edited][:300]) if file == edited)

    assert removed in [file for file, _ in science_hits(server, files[removed][:300])]
    (root / "science" / removed).unlink()
    assert removed not in [file for file, _ in science_hits(server, files[removed][:300])]
    assert load_science(server) == 29
    assert loads(server) == {"built": 1, "updated": 2, "disk": 0}
    assert server.metric("ragsidecar_embedded_chunks_total") == embedded + 1
    server.stop()

    restarted = make_sidecar(retrieval_config(root, data)).start()
    assert load_science(restarted) == 29
    assert loads(restarted) == {"built": 0, "updated": 0, "disk": 1}  # the updated index, read back
    assert restarted.metric("ragsidecar_embedded_chunks_total") == 0
    assert science_hits(restarted, "can zebrafish regrow heart tissue?")[0] == (edited, ZEBRAFISH)
    assert removed not in [file for file, _ in science_hits(restarted, files[removed][:300])]
    assert len(list((data / "indexes").iterdir())) == 1  # the superseded indexes left the disk
