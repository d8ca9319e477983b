"""Issue 14: chat bindings, SEQUENTIAL cursors and the embedding cache shared through PostgreSQL.

Two sidecars (replicas A and B: own data folders, own processes) on one real PostgreSQL database: whatever one
opens, advances or embeds, the other continues from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import psycopg
import psycopg.conninfo
import pytest
from retrieval_helpers import PRINCIPAL, entry, llm, target
from sidecar import Sidecar, default_config, error_details

from ragsidecar.v1 import chat_knowledge_pb2 as cpb
from ragsidecar.v1 import chat_knowledge_pb2_grpc, common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

STEPS = 20
SEQUENCE = entry("steps", "FILE", "SEQUENTIAL", "steps.jsonl")
GUIDE = entry("guide", "FILE", "SEARCH", "guide.md")
KNOWLEDGE = [entry("orders", "MEMORY", "SEARCH")]
ORDERS = [
    ("o1", "Order 1001: the Blender X2 shipped on Monday and arrives Thursday."),
    ("o2", "Order 1002: the Kettle K1 is back-ordered until next month."),
]


@pytest.fixture(scope="module")
def knowledge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat-knowledge")
    (root / "steps.jsonl").write_text(
        "".join(json.dumps({"id": f"s{i}", "text": f"Step {i} of the drill."}) + "\n" for i in range(1, STEPS + 1))
    )
    (root / "guide.md").write_text(
        "\n\n".join(
            f"# Section {i}\n\nThe returns desk on floor {i} opens at {8 + i % 3} and handles parcel number {i * 7}."
            for i in range(1, 40)
        )
    )
    return root


def replica_config(root: Path, store: dict | None = None, **retrieval) -> dict:
    config = default_config()
    config["paths"]["knowledge_roots"] = [str(root)]
    config["retrieval"].update(retrieval)
    config["store"] = {"backend": "postgres", **(store or {})}
    return config


@pytest.fixture(scope="module")
def database(postgres) -> str:
    return postgres.database("store_chat")


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, knowledge: Path, database: str
) -> Iterator[tuple[Sidecar, Sidecar]]:
    started = []
    try:
        for name in ("a", "b"):
            server = Sidecar(
                tmp_path_factory.mktemp(f"replica-{name}"),
                replica_config(knowledge, max_open_bindings=8),
                env={"RAGSIDECAR_STORE_DSN": database},
            )
            started.append(server)
            server.start()
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


def chat(server: Sidecar) -> chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub:
    return chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub(server.channel())


def retrieval(server: Sidecar) -> retrieval_pb2_grpc.RetrievalServiceStub:
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel())


def scope(tenant: str, session: str = "s1") -> common_pb2.Scope:
    return common_pb2.Scope(tenant=tenant, session=session)


ACME_FILES = scope("acme-files")


def raised(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def reason(err: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return err.code(), error_details(err)[0].reason


def open_binding(server: Sidecar, at: common_pb2.Scope, source: str = "orders") -> tuple[str, str]:
    opened = chat(server).OpenBinding(
        cpb.OpenBindingRequest(principal=PRINCIPAL, scope=at, owner_id="ada", source=source, declared=True), timeout=30
    )
    return opened.binding_id, opened.binding_handle


def append(server: Sidecar, at: common_pb2.Scope, binding: tuple[str, str], documents) -> cpb.AppendToBindingResponse:
    return chat(server).AppendToBinding(
        cpb.AppendToBindingRequest(
            principal=PRINCIPAL,
            scope=at,
            binding_id=binding[0],
            owner_id="ada",
            binding_handle=binding[1],
            documents=[pb.MemoryDocument(id=i, text=t) for i, t in documents],
        ),
        timeout=30,
    )


def close(server: Sidecar, at: common_pb2.Scope, binding: tuple[str, str]) -> bool:
    return (
        chat(server)
        .CloseBinding(
            cpb.CloseBindingRequest(
                principal=PRINCIPAL, scope=at, binding_id=binding[0], owner_id="ada", binding_handle=binding[1]
            ),
            timeout=30,
        )
        .was_open
    )


def grounded(server: Sidecar, at: common_pb2.Scope, binding: tuple[str, str], question: str) -> str:
    """The fenced knowledge of a turn grounded on the binding ("" when nothing was given)."""
    response = chat(server).GroundTurn(
        cpb.GroundTurnRequest(
            principal=PRINCIPAL,
            conversation=[
                cpb.ChatMessage(role="system", content="You help."),
                cpb.ChatMessage(role="user", content=question),
            ],
            owners=[cpb.ChatOwner(owner_id="ada", knowledge=KNOWLEDGE)],
            llm=llm(),
            bindings=[cpb.TurnBinding(binding_id=binding[0], owner_id="ada", binding_handle=binding[1])],
            context=cpb.ChatRetrievalContext(scope=at),
        ),
        timeout=120,
    )
    system = next(m.content for m in reversed(response.conversation) if m.role == "system")
    return system.partition("<tnsai-memory>")[2].partition("</tnsai-memory>")[0]


def next_step(server: Sidecar, at: common_pb2.Scope) -> str:
    request = pb.EnforceRequest(
        principal=PRINCIPAL, scope=at, target=target([SEQUENCE], {"answer": ["steps"]}), action="answer", llm=llm()
    )
    return retrieval(server).Enforce(request, timeout=60).retrieved_context


def search_guide(server: Sidecar, at: common_pb2.Scope = ACME_FILES) -> list[tuple[str, float]]:
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=at,
        target=target([GUIDE]),
        query="when does the returns desk on floor 12 open?",
        top_k=5,
    )
    return [(h.chunk_id, h.scores.dense) for h in retrieval(server).Search(request, timeout=120).hits]


def step_number(context: str) -> int | None:
    return int(context.split("Step ", 1)[1].split()[0]) if "Step " in context else None


def test_a_binding_opened_on_one_replica_is_used_and_closed_on_the_other(replicas, database) -> None:
    a, b = replicas
    at = scope("acme-replicas")
    binding = open_binding(a, at)
    assert append(b, at, binding, ORDERS).document_count == 2
    assert "Blender X2 shipped" in grounded(b, at, binding, "Where is my blender order?")
    assert "Blender X2 shipped" in grounded(a, at, binding, "Where is my blender order?")
    # B demands the handle as A would: a wrong one, another owner, another tenant or session are refused.
    wrong = (binding[0], binding[1][:-1] + ("A" if binding[1][-1] != "A" else "B"))
    for call in (
        lambda: append(b, at, wrong, ORDERS),
        lambda: grounded(b, at, wrong, "blender"),
        lambda: append(b, scope("globex-replicas"), binding, ORDERS),
        lambda: append(b, scope("acme-replicas", "s2"), binding, ORDERS),
        lambda: close(b, at, wrong),
    ):
        assert reason(raised(call)) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    # Only a digest of the handle is stored, never the handle.
    with psycopg.connect(database) as connection:
        rows = connection.execute("SELECT * FROM ragsidecar_chat_bindings WHERE id = %s", (binding[0],)).fetchall()
    assert len(rows) == 1 and hashlib.sha256(binding[1].encode()).digest() in [
        bytes(v) for v in rows[0] if isinstance(v, (bytes, memoryview))
    ]
    assert binding[1] not in str(rows)
    assert close(b, at, binding) and not close(a, at, binding)
    for call in (lambda: append(a, at, binding, ORDERS), lambda: grounded(a, at, binding, "blender")):
        assert reason(raised(call)) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_BINDING")


def test_open_bindings_are_bounded_per_database(replicas) -> None:
    a, b = replicas
    at = scope("acme-bound")
    before = a.metric("ragsidecar_closed_bindings_total", why="lru") + b.metric(
        "ragsidecar_closed_bindings_total", why="lru"
    )
    bindings = [open_binding(a if i % 2 else b, at, f"s{i}") for i in range(8)]  # the cap: 8 in the database
    append(b, at, bindings[0], ORDERS)  # now the second is the least recently used
    newest = open_binding(b, at, "s8")
    assert reason(raised(lambda: append(a, at, bindings[1], ORDERS))) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_BINDING")
    for binding in (bindings[0], *bindings[2:], newest):
        assert append(a, at, binding, ORDERS[:1]).document_count >= 1
    after = a.metric("ragsidecar_closed_bindings_total", why="lru") + b.metric(
        "ragsidecar_closed_bindings_total", why="lru"
    )
    assert after - before >= 1 and b.metric("ragsidecar_open_bindings") == 8
    for binding in (bindings[0], *bindings[2:], newest):
        assert close(a, at, binding)


def test_replicas_opening_at_once_hold_the_database_to_its_cap(replicas, database) -> None:
    a, b = replicas
    at = scope("acme-crowd")

    def open_count() -> int:
        with psycopg.connect(database) as connection:
            return connection.execute("SELECT count(*) FROM ragsidecar_chat_bindings").fetchone()[0]

    def lru_closed() -> float:
        return sum(s.metric("ragsidecar_closed_bindings_total", why="lru") for s in (a, b))

    open_before, closed_before = open_count(), lru_closed()
    with ThreadPoolExecutor(8) as pool:
        opened = list(pool.map(lambda i: open_binding((a, b)[i % 2], at, f"c{i}"), range(16)))
    assert open_count() == 8 and lru_closed() - closed_before == open_before + 16 - 8
    usable = []
    for binding in opened:
        try:
            usable.append(append(a, at, binding, ORDERS[:1]).document_count)
        except grpc.RpcError as err:
            assert reason(err) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_BINDING")
    assert usable == [1] * 8


def test_a_sequential_cursor_advanced_on_one_replica_continues_on_the_other(replicas) -> None:
    a, b = replicas
    at = scope("acme-cursor")
    assert [step_number(next_step(server, at)) for server in (a, b, a, b)] == [1, 2, 3, 4]
    assert step_number(next_step(b, scope("acme-cursor", "other"))) == 1


def test_replicas_dispatching_at_once_never_give_a_unit_twice(replicas) -> None:
    a, b = replicas
    at = scope("acme-race")
    with ThreadPoolExecutor(8) as pool:
        given = list(pool.map(lambda i: step_number(next_step((a, b)[i % 2], at)), range(STEPS + 6)))
    assert sorted(n for n in given if n is not None) == list(range(1, STEPS + 1))
    assert given.count(None) == 6


def test_tenants_bindings_and_cursors_stay_apart(replicas) -> None:
    a, b = replicas
    acme, globex = scope("acme-apart"), scope("globex-apart")
    assert [step_number(next_step(a, acme)) for _ in range(3)] == [1, 2, 3]
    assert step_number(next_step(b, globex)) == 1 and step_number(next_step(a, acme)) == 4
    acme_binding, globex_binding = open_binding(a, acme), open_binding(b, globex)
    append(a, acme, acme_binding, [("v", "Acme's vault code is 4417.")])
    append(b, globex, globex_binding, [("v", "Globex's vault code is 9021.")])
    acme_seen, globex_seen = (
        grounded(b, acme, acme_binding, "vault code"),
        grounded(a, globex, globex_binding, "vault code"),
    )
    assert "4417" in acme_seen and "9021" not in acme_seen
    assert "9021" in globex_seen and "4417" not in globex_seen
    err = raised(lambda: grounded(a, globex, (acme_binding[0], acme_binding[1]), "vault code"))
    assert reason(err) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")


def test_a_file_embedded_by_one_replica_is_not_embedded_again_by_the_other(replicas, database) -> None:
    a, b = replicas

    embedded_a, embedded_b = (s.metric("ragsidecar_embedded_chunks_total") for s in (a, b))
    on_a = search_guide(a)
    assert a.metric("ragsidecar_embedded_chunks_total") > embedded_a
    hits_b = b.metric("ragsidecar_shared_embedding_hits_total")
    on_b = search_guide(b)
    assert b.metric("ragsidecar_embedded_chunks_total") == embedded_b  # B embedded nothing: A's vectors served
    assert b.metric("ragsidecar_shared_embedding_hits_total") > hits_b
    assert on_b == on_a  # vectors round-trip exactly: the same hits with the same dense scores
    with psycopg.connect(database) as connection:
        rows, tenants = connection.execute(
            "SELECT count(*), array_agg(DISTINCT tenant) FROM ragsidecar_embeddings"
        ).fetchone()
    assert rows >= a.metric("ragsidecar_embedded_chunks_total") - embedded_a and tenants == [""]


def test_under_row_level_security_the_bounds_still_span_every_tenant(make_sidecar, postgres, knowledge) -> None:
    """Row-level security shows a transaction only its tenant's rows; the per-database bounds and the shared
    embedding rows must still work for a role that is not a superuser (superusers bypass every policy). The
    embedding cache is held to 2 rows here, least recently used deleted first."""
    dsn = postgres.database("store_chat_rls")
    with psycopg.connect(dsn, autocommit=True) as connection:
        if connection.execute("SELECT 1 FROM pg_roles WHERE rolname = 'ragsidecar_rls'").fetchone() is None:
            connection.execute("CREATE ROLE ragsidecar_rls LOGIN")
        connection.execute('ALTER DATABASE "store_chat_rls" OWNER TO ragsidecar_rls')
        connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
    env = {"RAGSIDECAR_STORE_DSN": psycopg.conninfo.make_conninfo(dsn, user="ragsidecar_rls")}
    config = replica_config(
        knowledge,
        {"row_level_security": True, "embedding_cache_rows": 2},
        max_open_bindings=2,
        max_sequential_cursors=2,
    )
    a, b = make_sidecar(config, env=env).start(), make_sidecar(config, env=env).start()
    acme, globex, initech = scope("acme-rls"), scope("globex-rls"), scope("initech-rls")
    first, second = open_binding(a, acme), open_binding(b, globex)
    append(b, acme, first, ORDERS)  # now globex's is the least recently used
    open_binding(a, initech)
    assert reason(raised(lambda: append(a, globex, second, ORDERS))) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_BINDING")
    assert a.metric("ragsidecar_open_bindings") == 2 and a.metric("ragsidecar_closed_bindings_total", why="lru") == 1
    # Another tenant's binding is not even visible: unknown rather than refused.
    assert reason(raised(lambda: append(b, globex, first, ORDERS))) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_BINDING")
    assert "Blender X2" in grounded(b, acme, first, "Where is my blender order?")
    # Cursors: the third tenant's cursor pushes out the least recently used one, whichever tenant's it is.
    assert [step_number(next_step(s, at)) for s, at in ((a, acme), (b, acme), (a, globex), (b, initech))] == [
        1,
        2,
        1,
        1,
    ]
    assert step_number(next_step(a, acme)) == 1 and b.metric("ragsidecar_sequential_cursors") == 2
    # The shared embedding rows belong to no tenant: B reads what A wrote, all but what pruning deleted.
    embedded_a, embedded_b = (s.metric("ragsidecar_embedded_chunks_total") for s in (a, b))
    on_a = search_guide(a, acme)
    chunks = a.metric("ragsidecar_embedded_chunks_total") - embedded_a
    assert chunks > 2 and a.metric("ragsidecar_shared_embeddings") == 2
    assert search_guide(b, globex) == on_a
    assert b.metric("ragsidecar_embedded_chunks_total") - embedded_b == chunks - 2
    assert b.metric("ragsidecar_shared_embeddings") == 2
    with psycopg.connect(dsn) as connection:
        assert connection.execute("SELECT count(*) FROM ragsidecar_embeddings").fetchone()[0] == 2
        forced = connection.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE 'ragsidecar\\_%' AND relkind = 'r' "
            "AND relrowsecurity AND relforcerowsecurity"
        ).fetchall()
    assert {"ragsidecar_chat_bindings", "ragsidecar_sequential_cursors", "ragsidecar_embeddings"} <= {
        name for (name,) in forced
    }


def test_idle_bindings_are_closed_and_tenant_embeddings_stay_the_tenants(make_sidecar, postgres, knowledge) -> None:
    """Any replica's call closes the bindings idle past binding_idle_seconds. With share_embeddings = "tenant" the
    text a tenant sends is embedded (and cached) for that tenant alone, while files stay shared."""
    dsn = postgres.database("store_chat_idle")
    config = replica_config(knowledge, {"share_embeddings": "tenant"}, binding_idle_seconds=1e-6)
    server = make_sidecar(config, env={"RAGSIDECAR_STORE_DSN": dsn}).start()
    at = scope("acme-idle")
    binding = open_binding(server, at)  # idle by the next call
    assert reason(raised(lambda: append(server, at, binding, ORDERS))) == (grpc.StatusCode.NOT_FOUND, "UNKNOWN_BINDING")
    assert server.metric("ragsidecar_closed_bindings_total", why="idle") == 1
    assert server.metric("ragsidecar_open_bindings") == 0
    embedded = server.metric("ragsidecar_embedded_chunks_total")
    for tenant in ("acme-idle", "globex-idle", "acme-idle"):
        retrieval(server).UpsertDocuments(
            pb.UpsertDocumentsRequest(
                principal=PRINCIPAL,
                scope=scope(tenant, "s2"),
                knowledge="notes",
                documents=[pb.MemoryDocument(id="n1", text="The warehouse in Leeds closes at 6pm.")],
            ),
            timeout=60,
        )
    assert server.metric("ragsidecar_embedded_chunks_total") - embedded == 2  # once per tenant
    search_guide(server, at)
    with psycopg.connect(dsn) as connection:
        tenants = dict(connection.execute("SELECT tenant, count(*) FROM ragsidecar_embeddings GROUP BY tenant"))
    assert tenants.keys() == {"", "acme-idle", "globex-idle"} and tenants["acme-idle"] == tenants["globex-idle"] == 1


def test_binding_corpora_stay_within_the_store_bytes_of_the_database(make_sidecar, postgres, knowledge) -> None:
    """retrieval.binding_store_bytes bounds every binding's corpus together, across replicas: past it an append is
    RESOURCE_EXHAUSTED and leaves nothing; closing a binding frees its bytes. MEMORY documents do not count."""
    dsn = postgres.database("store_chat_bytes")
    config = replica_config(knowledge, binding_store_bytes=3000)
    a, b = (make_sidecar(config, env={"RAGSIDECAR_STORE_DSN": dsn}).start() for _ in range(2))
    retrieval(a).UpsertDocuments(
        pb.UpsertDocumentsRequest(
            principal=PRINCIPAL,
            scope=scope("acme-bytes"),
            knowledge="notes",
            documents=[pb.MemoryDocument(id="big", text="Warehouse notes. " * 400)],
        ),
        timeout=60,
    )
    first, second = open_binding(a, scope("acme-bytes")), open_binding(b, scope("globex-bytes"))
    append(a, scope("acme-bytes"), first, [("t1", "x" * 1400)])
    append(b, scope("globex-bytes"), second, [("t1", "y" * 1400)])
    refused = raised(lambda: append(b, scope("globex-bytes"), second, [("t2", "z" * 400)]))
    assert reason(refused) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert "binding_store_bytes" in refused.details()
    assert "z" * 400 not in grounded(b, scope("globex-bytes"), second, "What is stored?")  # nothing of it stayed
    assert close(a, scope("acme-bytes"), first)
    append(b, scope("globex-bytes"), second, [("t2", "z" * 400)])  # the closed binding's bytes are free again


def test_a_corpus_left_by_a_replica_that_died_is_dropped_by_a_sweep(make_sidecar, postgres, knowledge) -> None:
    """A replica killed between deleting a binding's row and dropping its corpus leaves the corpus behind (made
    here by deleting the row by hand); the next replica's sweep drops it, bytes and all."""
    dsn = postgres.database("store_chat_orphans")
    server = make_sidecar(replica_config(knowledge), env={"RAGSIDECAR_STORE_DSN": dsn}).start()
    kept, orphaned = open_binding(server, scope("acme-orphans")), open_binding(server, scope("acme-orphans"))
    for binding in (kept, orphaned):
        append(server, scope("acme-orphans"), binding, ORDERS)
    with psycopg.connect(dsn) as connection:
        connection.execute("DELETE FROM ragsidecar_chat_bindings WHERE id = %s", (orphaned[0],))
    other = make_sidecar(replica_config(knowledge), env={"RAGSIDECAR_STORE_DSN": dsn}).start()
    assert "Blender" in grounded(other, scope("acme-orphans"), kept, "Where is my blender?")  # its first call sweeps
    with psycopg.connect(dsn) as connection:
        sources = [
            r[0]
            for r in connection.execute("SELECT source FROM ragsidecar_memory_partitions WHERE namespace = 'binding'")
        ]
        left = connection.execute("SELECT count(*) FROM ragsidecar_memory_documents").fetchone()[0]
    assert sources == [kept[0]] and left == len(ORDERS)
