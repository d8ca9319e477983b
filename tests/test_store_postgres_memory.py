"""MEMORY documents on the PostgreSQL store, through real sidecars sharing a real PostgreSQL: what one replica
writes the other reads at once, deletes too; a replica killed during a burst of writes loses none it
acknowledged; tenants and look-alike scopes stay apart (also under row-level security); a restart keeps
everything; and a partition ranks as the embedded store ranks it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import signal
import threading
import time

import grpc
import numpy as np
import psycopg
import pytest
from grpc_health.v1 import health_pb2

import ir_data
from ragsidecar import metrics
from ragsidecar.knowledge.chunking import Chunk
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk
from ragsidecar.knowledge.memory import MemoryDocument
from ragsidecar.knowledge.sources import Provenance
from ragsidecar.store import search as store_search
from ragsidecar.store.database import Database
from ragsidecar.store.memory import PartitionKey, Prepared, write
from ragsidecar.store.search import PostgresIndex, ensure_dense_index
from ragsidecar.v1 import common_pb2, retrieval_pb2 as pb, retrieval_pb2_grpc
from retrieval_helpers import PRINCIPAL, entry, target
from sidecar import Sidecar, default_config

NOTES = entry("notes", "MEMORY", "SEARCH")
SERVING = health_pb2.HealthCheckResponse.SERVING
# Pairs of scopes that a separator join ("tenant" + sep + "session") would merge into one key.
LOOK_ALIKE_SCOPES = [(("a:b", "c"), ("a", "b:c")), (("t/u", "s"), ("t", "u/s"))]
APP_ROLE = "ragsidecar_app"


def postgres_sidecar(workdir, dsn: str, **store) -> Sidecar:
    config = default_config()
    config["inference"]["cache_bytes"] = 0
    config["store"] = {"backend": "postgres", **store}
    return Sidecar(workdir, config, env={"RAGSIDECAR_STORE_DSN": dsn})


def stub(server: Sidecar) -> retrieval_pb2_grpc.RetrievalServiceStub:
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel())


def scope(tenant: str, session: str = "s1") -> common_pb2.Scope:
    return common_pb2.Scope(tenant=tenant, session=session)


def upsert(server: Sidecar, where: common_pb2.Scope, documents: dict[str, str],
           knowledge: str = "notes") -> pb.UpsertDocumentsResponse:
    return stub(server).UpsertDocuments(pb.UpsertDocumentsRequest(
        principal=PRINCIPAL, scope=where, knowledge=knowledge,
        documents=[pb.MemoryDocument(id=i, text=t) for i, t in documents.items()]), timeout=120)


def search(server: Sidecar, where: common_pb2.Scope, query: str, top_k: int = 10) -> list[pb.RetrievedChunk]:
    return list(stub(server).Search(pb.SearchRequest(principal=PRINCIPAL, scope=where, target=target([NOTES]),
                                                     query=query, top_k=top_k), timeout=120).hits)


def found_ids(server: Sidecar, where: common_pb2.Scope, query: str, top_k: int = 10) -> list[str]:
    return [h.provenance.document_id for h in search(server, where, query, top_k)]


@pytest.fixture(scope="module")
def replicas(postgres, tmp_path_factory):
    """Two sidecars on one database: replicas of one agent behind a load balancer."""
    dsn = postgres.database("pgb_memory")
    servers = [postgres_sidecar(tmp_path_factory.mktemp(f"replica{i}"), dsn) for i in range(2)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


def test_a_document_upserted_on_one_replica_is_found_by_the_other_at_once(replicas) -> None:
    a, b = replicas
    where = scope("acme")
    written = upsert(a, where, {"bob": "The customer Bob prefers delivery on Saturdays.",
                                "leeds": "The Leeds warehouse closes at 6pm on weekdays."})
    assert (written.inserted, written.replaced, written.unchanged, written.document_count) == (2, 0, 0, 2)
    assert found_ids(b, where, "when does Bob want his parcel delivered?")[0] == "bob"
    assert found_ids(b, where, "warehouse opening hours")[0] == "leeds"
    hit = search(b, where, "Saturday delivery")[0]
    assert hit.text == "The customer Bob prefers delivery on Saturdays." and hit.source == "notes"
    assert hit.scores.HasField("bm25") and 0 < hit.scores.dense <= 1
    # Upserting the same documents again through B changes nothing; a changed text replaces the old one.
    again = upsert(b, where, {"bob": "The customer Bob prefers delivery on Saturdays.",
                              "leeds": "The Leeds warehouse now closes at 8pm on weekdays."})
    assert (again.inserted, again.replaced, again.unchanged, again.document_count) == (0, 1, 1, 2)
    assert "8pm" in search(a, where, "warehouse closing time", top_k=1)[0].text


def test_a_document_deleted_on_one_replica_is_gone_on_the_other(replicas) -> None:
    a, b = replicas
    where = scope("acme", "deletes")
    upsert(a, where, {"keep": "Invoices are sent on the first day of each month.",
                      "drop": "Invoices for Ada go to her office in Lyon."})
    assert "drop" in found_ids(b, where, "where do Ada's invoices go?")
    deleted = stub(a).DeleteDocuments(pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=where, knowledge="notes",
                                                                ids=["drop", "never-there"]), timeout=60)
    assert (deleted.deleted, deleted.not_found, deleted.document_count) == (1, 1, 1)
    assert found_ids(b, where, "where do Ada's invoices go?") == ["keep"]


def test_tenants_and_look_alike_scopes_never_see_each_other(replicas) -> None:
    a, b = replicas
    written = {}
    for pair, (one, two) in enumerate(LOOK_ALIKE_SCOPES):
        for side, (tenant, session) in enumerate((one, two)):
            doc_id = f"pair{pair}-side{side}"
            upsert(a, scope(tenant, session), {doc_id: f"Delivery note {doc_id}: the parcel waits at the depot."})
            written[doc_id] = scope(tenant, session)
    for doc_id, where in written.items():
        assert found_ids(b, where, "where is the parcel?") == [doc_id], doc_id
    assert found_ids(b, scope("someone-else"), "where is the parcel?") == []


def test_postgres_ranks_like_the_embedded_store(replicas, sidecar) -> None:
    """The same SciFact abstracts upserted to the embedded store (the shared default sidecar) and to PostgreSQL:
    the same documents come first for real claims."""
    corpus, queries, judged = ir_data.corpus("scifact"), ir_data.queries("scifact"), ir_data.qrels("scifact")
    query_ids = sorted(judged)[:12]
    relevant = sorted({d for q in query_ids for d in judged[q]})
    others = [d for d in sorted(corpus) if d not in relevant][: 60 - len(relevant)]
    documents = {d: corpus[d] for d in relevant + others}
    where = scope("ranking-check")
    for server in (sidecar, replicas[0]):
        assert upsert(server, where, documents).document_count == len(documents)
    same_order = 0
    for query_id in query_ids:
        embedded, shared = (ranked(search(server, where, queries[query_id], 5)) for server in (sidecar, replicas[1]))
        assert shared[0] == embedded[0], queries[query_id]
        assert len(set(shared) & set(embedded)) >= 4, (queries[query_id], embedded, shared)
        same_order += shared == embedded
    assert same_order >= len(query_ids) - 2


def ranked(hits: list[pb.RetrievedChunk]) -> list[tuple[float, str, str]]:
    """(score, document, text) best first; hits of one score in a fixed order: the two stores' chunk ids, which
    break exact ties of the fused score, differ (positions count across a partition in one, per document in the
    other)."""
    return sorted((-h.score, h.provenance.document_id, h.text) for h in hits)


def test_a_replica_chunking_differently_searches_only_vectors_of_its_own_and_fills_in_the_rest(
        replicas, tmp_path) -> None:
    """A replica whose embedder fingerprint differs (here: its chunk size) never mixes the other's vectors into
    its own: on load it cuts and embeds the documents written by the other, and each keeps searching its own."""
    a, _ = replicas
    where = scope("fingerprints")
    long_text = " ".join(f"Paragraph {n}: the {word} depot ships parcels to customers every morning."
                         for n, word in enumerate(["Leeds", "York", "Hull", "Bath", "Kent", "Derby"] * 3))
    upsert(a, where, {"depots": long_text, "short": "Ada keeps the spare keys in the blue drawer."})
    narrow = postgres_sidecar(tmp_path, a.env["RAGSIDECAR_STORE_DSN"])
    narrow.config["retrieval"]["chunk_tokens"] = 48
    narrow.config["retrieval"]["chunk_overlap_tokens"] = 8
    narrow.start()
    try:
        wide_hits, narrow_hits = (search(server, where, "Which depot ships from Derby?") for server in (a, narrow))
        assert narrow_hits[0].provenance.document_id == wide_hits[0].provenance.document_id == "depots"
        assert max(len(h.text) for h in narrow_hits) < len(wide_hits[0].text)
        assert narrow.metric("ragsidecar_store_filled_chunks_total") > 0
        # A write through the narrow replica is seen by the wide one, which cuts and embeds it its own way.
        upsert(narrow, where, {"short": "Ada now keeps the spare keys under the mat."})
        assert "under the mat" in search(a, where, "where are Ada's spare keys?", top_k=1)[0].text
    finally:
        narrow.stop()


def test_a_replica_killed_during_a_burst_of_upserts_loses_nothing_it_acknowledged(replicas) -> None:
    a, b = replicas
    where = scope("burst")
    acknowledged: dict[str, str] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(worker: int) -> None:
        for n in range(1000):
            if stop.is_set():
                return
            doc_id, text = f"w{worker}-{n}", f"Burst note: parcel zq{worker}x{n} shipped from Leeds."
            try:
                upsert(a, where, {doc_id: text})
            except grpc.RpcError:
                return  # the replica died under this call: not acknowledged
            with lock:
                acknowledged[doc_id] = text

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        writers = [pool.submit(writer, w) for w in range(4)]
        deadline = time.monotonic() + 60
        while len(acknowledged) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        a.signal(signal.SIGKILL)
        stop.set()
        for done in writers:
            done.result()
    assert len(acknowledged) >= 12
    assert b.health() == SERVING
    # Every acknowledged document is stored, unchanged: writing it again through B changes nothing.
    again = upsert(b, where, acknowledged)
    assert again.unchanged == len(acknowledged) and again.inserted == 0
    for doc_id, text in list(acknowledged.items())[-4:]:
        assert found_ids(b, where, text.split()[3], top_k=3)[0] == doc_id
    # The killed replica comes back with everything (a restart keeps all: the state lives in the database).
    a = replicas[0] = Sidecar(a.workdir, a.config, env=a.env).start()
    assert found_ids(a, scope("acme"), "when does Bob want his parcel delivered?")[0] == "bob"
    first, text = next(iter(acknowledged.items()))
    assert found_ids(a, where, text.split()[3], top_k=3)[0] == first


def test_row_level_security_keeps_tenants_apart_for_a_role_that_is_not_a_superuser(postgres, tmp_path) -> None:
    """With [store] row_level_security the tables' policies admit only the transaction's tenant, even to the
    tables' owner (superusers bypass row-level security, so the sidecar runs as an ordinary role)."""
    dsn = _owned_database(postgres, "pgb_memory_rls")
    server = postgres_sidecar(tmp_path, dsn, row_level_security=True).start()
    try:
        upsert(server, scope("t1"), {"one": "Tenant one keeps its spare keys in the blue drawer."})
        upsert(server, scope("t2"), {"two": "Tenant two keeps its spare keys under the mat."})
        assert found_ids(server, scope("t1"), "where are the spare keys?") == ["one"]
        assert found_ids(server, scope("t2"), "where are the spare keys?") == ["two"]
        upsert(server, scope("t2"), {"two": "Tenant two now keeps its spare keys at the front desk."})
        for tenant in ("t1", "t2"):  # the same id in another tenant is another document
            stub(server).DeleteDocuments(pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=scope(tenant),
                                                                   knowledge="notes", ids=["one"]), timeout=60)
        assert found_ids(server, scope("t1"), "where are the spare keys?") == []
        assert "front desk" in search(server, scope("t2"), "where are the spare keys?")[0].text
    finally:
        server.stop()
    with psycopg.connect(dsn) as connection:
        tables = connection.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE 'ragsidecar\\_memory\\_%' AND relkind = 'r' "
            "AND relrowsecurity AND relforcerowsecurity").fetchall()
        assert len(tables) == 5
        assert connection.execute("SELECT count(*) FROM ragsidecar_memory_documents").fetchone()[0] == 0
        connection.execute("SELECT set_config('ragsidecar.tenant', 't2', false)")
        assert connection.execute("SELECT id FROM ragsidecar_memory_documents").fetchall() == [("two",)]
        assert {r[0] for r in connection.execute("SELECT DISTINCT tenant FROM ragsidecar_memory_postings")} == {"t2"}


def _owned_database(postgres, name: str) -> str:
    """A fresh database owned by an ordinary role (pgvector created by the superuser, as an administrator
    would); returns the role's DSN."""
    superuser_dsn = postgres.database(name)
    with psycopg.connect(superuser_dsn, autocommit=True) as connection:
        if not connection.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone():
            connection.execute(f"CREATE ROLE {APP_ROLE} LOGIN")
        connection.execute(f'ALTER DATABASE "{name}" OWNER TO {APP_ROLE}')
        connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return superuser_dsn.replace("postgresql://postgres:", f"postgresql://{APP_ROLE}:", 1)


def test_the_sql_search_ranks_as_the_embedded_index_both_exactly_and_through_hnsw(postgres, monkeypatch) -> None:
    """The store's search functions on their own, against a real PostgreSQL: the same chunks and vectors give the
    embedded HybridIndex's ranking, whether the dense side scans exactly or walks the HNSW index."""
    corpus, queries = ir_data.corpus("scifact"), ir_data.queries("scifact")
    texts = {d: corpus[d][:800] for d in sorted(corpus)[:300]}
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((len(texts), 24)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    chunks = [Chunk(f"notes:{n}", "notes", n, text, Provenance(document_id=d, char_end=len(text)),
                    hashlib.sha256(text.encode()).hexdigest(), 1) for n, (d, text) in enumerate(texts.items())]
    database = Database(postgres.database("pgb_sql_search"), 2, row_level_security=False)
    assert database.connect()
    try:
        database.run_sync(lambda c: ensure_dense_index(c, 24))
        database.run_sync(lambda c: write(c, PartitionKey("memory", "acme", "s1", "notes"),
                                          [MemoryDocument(d, t, {}) for d, t in texts.items()],
                                          Prepared("synthetic", "none", chunks, vectors)), tenant="acme")
        # Another tenant's partition, larger and right where the queries point: the HNSW walk must pass it by.
        crowd = np.repeat(vectors[:200:10], 100, axis=0) + 0.05 * rng.standard_normal((2000, 24)).astype(np.float32)
        crowd_chunks = [Chunk(f"notes:{n}", "notes", n, "crowd", Provenance(document_id=f"c{n}", char_end=5),
                              hashlib.sha256(b"crowd").hexdigest(), 1) for n in range(len(crowd))]
        database.run_sync(lambda c: write(c, PartitionKey("memory", "other", "s1", "notes"),
                                          [MemoryDocument(f"c{n}", "crowd", {}) for n in range(len(crowd))],
                                          Prepared("synthetic", "none", crowd_chunks, crowd)), tenant="other")
        space = database.run_sync(lambda c: c.execute("SELECT s.id FROM ragsidecar_memory_spaces s JOIN "
                                                      "ragsidecar_memory_partitions p ON p.id = s.partition "
                                                      "WHERE p.tenant = 'acme'").fetchone()[0])
        shared = PostgresIndex(database, "acme", space, len(chunks), "none")
        embedded = HybridIndex.build([IndexedChunk(c.provenance.document_id, c.text, {}) for c in chunks], vectors)
        claims = [queries[q] for q in sorted(queries)[:20]]
        near = [vectors[n] + 0.5 * rng.standard_normal(24).astype(np.float32) for n in range(0, 200, 10)]

        def rankings() -> list[tuple[list[str], list[str]]]:
            return [([h.chunk.id for h in embedded.search(v, claim, 10, 50)],
                     [h.chunk.meta["document_id"] for h in shared.search(v, claim, 10, 50)])
                    for v, claim in zip(near, claims)]

        exact = rankings()
        monkeypatch.setattr(store_search, "EXACT_SEARCH_UP_TO", 0)
        walked = metrics.STORE_DENSE_SEARCHES.labels("approximate")._value.get()
        approximate = rankings()
        assert metrics.STORE_DENSE_SEARCHES.labels("approximate")._value.get() - walked == len(claims)
        for found in (exact, approximate):
            assert all(ours[0] == theirs[0] and len(set(ours) & set(theirs)) >= 9 for theirs, ours in found)
            assert sum(ours == theirs for theirs, ours in found) >= len(claims) - 2
        # Another tenant's transaction finds nothing of it.
        assert PostgresIndex(database, "other", space, len(chunks), "none").search(near[0], claims[0], 10) == []
    finally:
        asyncio.run(database.close())
