"""MEMORY documents on the PostgreSQL store, through real sidecars sharing a real PostgreSQL: what one replica
writes the other's next search finds, deletes too, round after round, each replica catching its resident index up
through the database's change log; a replica killed during a burst of writes loses none it acknowledged; tenants
and look-alike scopes stay apart (also under row-level security); a restart keeps everything; and a partition
ranks as the embedded store ranks it. The store on its own (two instances, one database): the change log stays
within its bound, a replica further behind reloads, and interleaved writes leave both replicas' indexes equal to
the database."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import random
import signal
import threading
import time

import grpc
import ir_data
import numpy as np
import psycopg
import pytest
from grpc_health.v1 import health_pb2
from retrieval_helpers import PRINCIPAL, entry, target
from sidecar import Sidecar, default_config
from store_helpers import DIMENSIONS, vector_of

from ragsidecar import metrics
from ragsidecar.knowledge.chunking import Chunk
from ragsidecar.knowledge.declarations import Scope
from ragsidecar.knowledge.sources.units import Unit
from ragsidecar.knowledge.storage import MemoryDocument, Prepared
from ragsidecar.store.database import Database
from ragsidecar.store.postgres_documents import PostgresMemoryStore
from ragsidecar.store.resident import ResidentIndexes
from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

NOTES = entry("notes", "MEMORY", "SEARCH")
SERVING = health_pb2.HealthCheckResponse.SERVING
# Pairs of scopes that a separator join ("tenant" + sep + "session") would merge into one key.
LOOK_ALIKE_SCOPES = [(("a:b", "c"), ("a", "b:c")), (("t/u", "s"), ("t", "u/s"))]


def postgres_sidecar(workdir, dsn: str, **store) -> Sidecar:
    config = default_config()
    config["inference"]["cache_bytes"] = 0
    config["store"] = {"backend": "postgres", **store}
    return Sidecar(workdir, config, env={"RAGSIDECAR_STORE_DSN": dsn})


def stub(server: Sidecar) -> retrieval_pb2_grpc.RetrievalServiceStub:
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel())


def scope(tenant: str, session: str = "s1") -> common_pb2.Scope:
    return common_pb2.Scope(tenant=tenant, session=session)


def upsert(
    server: Sidecar, where: common_pb2.Scope, documents: dict[str, str], knowledge: str = "notes"
) -> pb.UpsertDocumentsResponse:
    return stub(server).UpsertDocuments(
        pb.UpsertDocumentsRequest(
            principal=PRINCIPAL,
            scope=where,
            knowledge=knowledge,
            documents=[pb.MemoryDocument(id=i, text=t) for i, t in documents.items()],
        ),
        timeout=120,
    )


def search(server: Sidecar, where: common_pb2.Scope, query: str, top_k: int = 10) -> list[pb.RetrievedChunk]:
    return list(
        stub(server)
        .Search(
            pb.SearchRequest(principal=PRINCIPAL, scope=where, target=target([NOTES]), query=query, top_k=top_k),
            timeout=120,
        )
        .hits
    )


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
    written = upsert(
        a,
        where,
        {
            "bob": "The customer Bob prefers delivery on Saturdays.",
            "leeds": "The Leeds warehouse closes at 6pm on weekdays.",
        },
    )
    assert (written.inserted, written.replaced, written.unchanged, written.document_count) == (2, 0, 0, 2)
    assert found_ids(b, where, "when does Bob want his parcel delivered?")[0] == "bob"
    assert found_ids(b, where, "warehouse opening hours")[0] == "leeds"
    hit = search(b, where, "Saturday delivery")[0]
    assert hit.text == "The customer Bob prefers delivery on Saturdays." and hit.source == "notes"
    assert hit.scores.HasField("bm25") and 0 < hit.scores.dense <= 1
    # Upserting the same documents again through B changes nothing; a changed text replaces the old one.
    again = upsert(
        b,
        where,
        {
            "bob": "The customer Bob prefers delivery on Saturdays.",
            "leeds": "The Leeds warehouse now closes at 8pm on weekdays.",
        },
    )
    assert (again.inserted, again.replaced, again.unchanged, again.document_count) == (0, 1, 1, 2)
    assert "8pm" in search(a, where, "warehouse closing time", top_k=1)[0].text


def test_a_document_deleted_on_one_replica_is_gone_on_the_other(replicas) -> None:
    a, b = replicas
    where = scope("acme", "deletes")
    upsert(
        a,
        where,
        {
            "keep": "Invoices are sent on the first day of each month.",
            "drop": "Invoices for Ada go to her office in Lyon.",
        },
    )
    assert "drop" in found_ids(b, where, "where do Ada's invoices go?")
    deleted = stub(a).DeleteDocuments(
        pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=where, knowledge="notes", ids=["drop", "never-there"]),
        timeout=60,
    )
    assert (deleted.deleted, deleted.not_found, deleted.document_count) == (1, 1, 1)
    assert found_ids(b, where, "where do Ada's invoices go?") == ["keep"]


def test_every_write_on_either_replica_is_in_the_next_search_on_the_other(replicas) -> None:
    """Read-your-writes across replicas, round after round: each replica's resident index catches up through the
    change log (one reload, the partition's first search, then only changes), never serving a stale answer."""
    where = scope("acme", "rounds")
    upsert(replicas[0], where, {"base": "The depot opens at 7am and ships parcels every morning."})
    catch_ups = {
        how: [r.metric("ragsidecar_partition_catch_ups_total", how=how) for r in replicas]
        for how in ("changes", "reload")
    }
    for n in range(12):
        writer, reader = replicas[n % 2], replicas[1 - n % 2]
        token = f"zq{n}"
        upsert(writer, where, {f"note{n}": f"Parcel {token} waits at the Leeds depot for round {n}."})
        assert found_ids(reader, where, token, top_k=3)[0] == f"note{n}", n
        stub(writer).DeleteDocuments(
            pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=where, knowledge="notes", ids=[f"note{n}"]), timeout=60
        )
        assert f"note{n}" not in found_ids(reader, where, token, top_k=3), n
    for i, replica in enumerate(replicas):
        reloads = replica.metric("ragsidecar_partition_catch_ups_total", how="reload") - catch_ups["reload"][i]
        changes = replica.metric("ragsidecar_partition_catch_ups_total", how="changes") - catch_ups["changes"][i]
        # Each replica searched 12 times, each after a write of the other: the first search loaded the partition.
        assert reloads == 1 and changes == 11, (i, reloads, changes)


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
    replicas, tmp_path
) -> None:
    """A replica whose embedder fingerprint differs (here: its chunk size) never mixes the other's vectors into
    its own: on load it cuts and embeds the documents written by the other, and each keeps searching its own."""
    a, _ = replicas
    where = scope("fingerprints")
    long_text = " ".join(
        f"Paragraph {n}: the {word} depot ships parcels to customers every morning."
        for n, word in enumerate(["Leeds", "York", "Hull", "Bath", "Kent", "Derby"] * 3)
    )
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
    dsn = postgres.owned_database("pgb_memory_rls")
    server = postgres_sidecar(tmp_path, dsn, row_level_security=True).start()
    try:
        upsert(server, scope("t1"), {"one": "Tenant one keeps its spare keys in the blue drawer."})
        upsert(server, scope("t2"), {"two": "Tenant two keeps its spare keys under the mat."})
        assert found_ids(server, scope("t1"), "where are the spare keys?") == ["one"]
        assert found_ids(server, scope("t2"), "where are the spare keys?") == ["two"]
        upsert(server, scope("t2"), {"two": "Tenant two now keeps its spare keys at the front desk."})
        for tenant in ("t1", "t2"):  # the same id in another tenant is another document
            stub(server).DeleteDocuments(
                pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=scope(tenant), knowledge="notes", ids=["one"]),
                timeout=60,
            )
        assert found_ids(server, scope("t1"), "where are the spare keys?") == []
        assert "front desk" in search(server, scope("t2"), "where are the spare keys?")[0].text
    finally:
        server.stop()
    with psycopg.connect(dsn) as connection:
        tables = connection.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE 'ragsidecar\\_memory\\_%' AND relkind = 'r' "
            "AND relrowsecurity AND relforcerowsecurity"
        ).fetchall()
        assert {t for (t,) in tables} == {
            f"ragsidecar_memory_{t}"
            for t in ("partitions", "documents", "spaces", "chunks", "removals", "snapshots", "snapshot_parts")
        }
        assert connection.execute("SELECT count(*) FROM ragsidecar_memory_documents").fetchone()[0] == 0
        connection.execute("SELECT set_config('ragsidecar.tenant', 't2', false)")
        assert connection.execute("SELECT id FROM ragsidecar_memory_documents").fetchall() == [("two",)]
        # Both tenants logged removals (t2 replaced a document, t1 deleted one): t2 sees its own only.
        assert {r[0] for r in connection.execute("SELECT DISTINCT tenant FROM ragsidecar_memory_removals")} == {"t2"}


# -- the store on its own: two instances (replicas) on one database ----------------------------------------------


async def sentences(scope: Scope, name: str, units: list[Unit]) -> Prepared:
    """The catalog's chunk-and-embed, standing in for the models: one chunk per sentence, a vector per text."""
    chunks = [
        Chunk(f"{name}:{n}", name, n, text, unit.provenance, hashlib.sha256(text.encode()).hexdigest(), 1)
        for unit in units
        for n, text in enumerate(unit.text.split(". "))
    ]
    vectors = np.stack([vector_of(c.text) for c in chunks]) if chunks else np.zeros((0, DIMENSIONS), np.float32)
    return Prepared("sentences", "none", chunks, vectors)


def run_replicas(postgres, name: str, test, log_entries: int = 10_000) -> None:
    """Runs `test(database, a, b)` with two stores on a fresh database, as two replicas would have them."""

    async def main() -> None:
        database = Database(postgres.database(name), 4, row_level_security=False)
        await database.start()
        try:
            stores = [
                PostgresMemoryStore(
                    database,
                    namespace="memory",
                    prepare=sentences,
                    indexes=ResidentIndexes(f"{name}_{n}", 1 << 28, 1, "f16"),
                    max_request_bytes=1 << 20,
                    change_log_entries=log_entries,
                )
                for n in range(2)
            ]
            await test(database, *stores)
        finally:
            await database.close()

    asyncio.run(main())


async def stored_chunks(database: Database, tenant: str) -> dict[str, str]:
    """Chunk key -> text of the tenant's chunks, as the database holds them."""
    return dict(
        await database.run(
            lambda c: c.execute(
                "SELECT key, text FROM ragsidecar_memory_chunks WHERE tenant = %s", (tenant,)
            ).fetchall(),
            tenant=tenant,
        )
    )


def catch_ups(how: str) -> float:
    return metrics.PARTITION_CATCH_UPS.labels(how)._value.get()


def test_the_change_log_stays_within_its_bound_and_a_replica_behind_it_reloads(postgres) -> None:
    where = Scope("acme", "s1")

    async def test(database: Database, a: PostgresMemoryStore, b: PostgresMemoryStore) -> None:
        await a.upsert(where, "notes", [MemoryDocument("keep", "Ada keeps the keys. The depot opens at 7am", {})])
        behind = await b.index(where, "notes", "sentences", "none")  # at the first change
        await a.index(where, "notes", "sentences", "none")
        pruned, reloads, changes = (
            metrics.STORE_CHANGE_LOG_PRUNED._value.get(),
            catch_ups("reload"),
            catch_ups("changes"),
        )
        for n in range(20):  # each replacement of "twice" removes (and logs) two chunk keys
            await a.upsert(where, "notes", [MemoryDocument("twice", f"Round {n} starts. Round {n} ends", {})])
            log = await database.run(
                lambda c: c.execute(
                    "SELECT count(r.key), max(s.logged), max(s.log_from) FROM ragsidecar_memory_spaces s "
                    "LEFT JOIN ragsidecar_memory_removals r ON r.space = s.id"
                ).fetchone(),
                tenant="acme",
            )
            assert log[0] <= 6 and log[1] == log[0], (n, log)
            if n == 1:  # within the log: a's index catches up from it
                assert len((await a.index(where, "notes", "sentences", "none")).index) == 4
                assert (catch_ups("changes"), catch_ups("reload")) == (changes + 1, reloads)
        assert metrics.STORE_CHANGE_LOG_PRUNED._value.get() - pruned == 2 * 19 - log[0]
        caught_up = await b.index(where, "notes", "sentences", "none")  # behind the log's start: reloads
        assert catch_ups("reload") == reloads + 1
        assert caught_up.index is not behind.index and caught_up.documents == 2
        assert caught_up.index.search(vector_of("Round 19 ends"), "", 1)[0].chunk.text == "Round 19 ends"
        assert sorted(c.text for c in caught_up.index.chunks()) == sorted(
            (await stored_chunks(database, "acme")).values()
        )

    run_replicas(postgres, "pgb_change_log", test, log_entries=6)


def test_interleaved_writes_on_two_replicas_leave_both_indexes_equal_to_the_database(postgres) -> None:
    """Upserts, replacements and deletes on either replica, some at once, with searches on both in between: every
    acknowledged write is in the other's next index, and at the end both hold exactly the database's chunks."""
    where = Scope("acme", "s1")
    rng = random.Random(7)

    async def step(store: PostgresMemoryStore, n: int) -> None:
        if rng.random() < 0.3:
            await store.delete(where, "notes", [f"d{rng.randrange(12)}"])
        else:
            text = ". ".join(f"Note {n} part {p}" for p in range(rng.randint(1, 3)))
            await store.upsert(where, "notes", [MemoryDocument(f"d{rng.randrange(12)}", text, {})])

    async def test(database: Database, a: PostgresMemoryStore, b: PostgresMemoryStore) -> None:
        for n in range(40):
            writer, reader = (a, b) if rng.random() < 0.5 else (b, a)
            await asyncio.gather(
                step(writer, n), step(reader, 1000 + n), reader.index(where, "notes", "sentences", "none")
            )
            stored = await stored_chunks(database, "acme")
            for store in (reader, writer):
                index = (await store.index(where, "notes", "sentences", "none")).index
                assert index.keys() == set(stored) and sorted(c.text for c in index.chunks()) == sorted(
                    stored.values()
                ), n
        assert catch_ups("changes") > 40

    run_replicas(postgres, "pgb_interleaved", test)
