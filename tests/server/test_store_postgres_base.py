"""The PostgreSQL store's foundation, through the real sidecar on a real PostgreSQL: start-up migration, the
`ragsidecar db migrate` command, schema versions, the DSN kept secret, and health through an outage."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2
from retrieval_helpers import PRINCIPAL, entry, target
from sidecar import Sidecar, default_config, error_details, to_toml

from ragsidecar.store import migrate
from ragsidecar.v1 import common_pb2, reranker_pb2, retrieval_pb2, retrieval_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
RERANKER = "ragsidecar.v1.RerankerService"
SCOPE = common_pb2.Scope(tenant="acme", session="s1")
RETRIEVAL = "ragsidecar.v1.RetrievalService"
CHAT = "ragsidecar.v1.ChatKnowledgeService"
PASSWORD = "not-in-logs-123"
# Probes often, so that an outage shows within seconds.
FAST_PROBE = {"health_interval_s": 0.5, "connect_timeout_s": 1.0}


def store_dsn(postgres, name: str) -> str:
    """A fresh database's DSN carrying a password (the test server trusts local connections, so any works)."""
    return f"{postgres.database(name)}&password={PASSWORD}"


def postgres_config(**store) -> dict:
    config = default_config()
    config["store"] = {"backend": "postgres", **store}
    return config


def sidecar(make_sidecar, dsn: str, **store) -> Sidecar:
    return make_sidecar(postgres_config(**store), env={"RAGSIDECAR_STORE_DSN": dsn})


def recorded(dsn: str) -> list[tuple[int, str, object]]:
    with psycopg.connect(dsn) as connection:
        return connection.execute(f"SELECT version, name, applied_at FROM {migrate.TABLE} ORDER BY version").fetchall()


def cli(*args: str, cwd: Path, dsn: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSIDECAR_")}
    if dsn is not None:
        env["RAGSIDECAR_STORE_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "ragsidecar", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120
    )


def config_file(folder: Path, **store) -> Path:
    path = folder / "ragsidecar.toml"
    path.write_text(to_toml(postgres_config(**store)))
    return path


def test_a_sidecar_migrates_at_start_up_and_a_second_one_applies_nothing_again(postgres, make_sidecar) -> None:
    dsn = store_dsn(postgres, "pga_start")
    first = sidecar(make_sidecar, dsn).start()
    applied = recorded(dsn)
    assert [(v, n) for v, n, _ in applied] == [(m.version, m.name) for m in migrate.known()]
    assert applied[0][:2] == (1, "base")
    with psycopg.connect(dsn) as connection:
        assert connection.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()
    second = sidecar(make_sidecar, dsn).start()
    assert recorded(dsn) == applied  # same rows, same times: nothing applied twice
    assert "store schema migrated: 0001_base" in first.log()
    assert "store schema migrated" not in second.log()
    for server in (first, second):
        assert server.health(RETRIEVAL) == server.health(CHAT) == server.health() == SERVING
        assert dsn not in server.log() and PASSWORD not in server.log()


def test_db_migrate_is_idempotent_and_start_up_without_migrating_refuses_an_old_schema(
    postgres, make_sidecar, tmp_path: Path
) -> None:
    dsn = store_dsn(postgres, "pga_cli")
    refused = sidecar(make_sidecar, dsn, migrate_on_start=False)
    with pytest.raises(RuntimeError, match="lacks migrations 0001_base.*run `ragsidecar db migrate`"):
        refused.start()
    assert refused.process.returncode == 1
    path = config_file(tmp_path, migrate_on_start=False)
    first, again = cli("db", "migrate", "--config", str(path), cwd=tmp_path, dsn=dsn), None
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("applied 0001_base") and f"at version {migrate.latest()}" in first.stdout
    applied = recorded(dsn)
    again = cli("db", "migrate", "--config", str(path), cwd=tmp_path, dsn=dsn)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("nothing to apply") and recorded(dsn) == applied
    started = sidecar(make_sidecar, dsn, migrate_on_start=False).start()
    assert started.health(RETRIEVAL) == SERVING and recorded(dsn) == applied
    for output in (first, again):
        assert PASSWORD not in output.stdout + output.stderr


def test_db_migrate_names_the_missing_variable(tmp_path: Path) -> None:
    result = cli("db", "migrate", "--config", str(config_file(tmp_path)), cwd=tmp_path, dsn=None)
    assert result.returncode == 2
    assert "RAGSIDECAR_STORE_DSN" in result.stderr and "not set" in result.stderr


def test_a_malformed_dsn_stops_start_up_without_being_printed(make_sidecar) -> None:
    server = sidecar(make_sidecar, f"host=db.example password={PASSWORD} sslmode")
    with pytest.raises(RuntimeError, match="not a PostgreSQL connection string"):
        server.start()
    assert server.process.returncode == 2 and PASSWORD not in server.log()


def test_a_database_migrated_by_a_newer_build_is_refused(postgres, make_sidecar, tmp_path: Path) -> None:
    dsn = store_dsn(postgres, "pga_future")
    newer = migrate.latest() + 1
    with psycopg.connect(dsn) as connection:
        connection.execute(
            f"CREATE TABLE {migrate.TABLE} (version integer PRIMARY KEY, name text NOT NULL, "
            "applied_at timestamptz NOT NULL)"
        )
        connection.execute(
            f"INSERT INTO {migrate.TABLE} SELECT v, 'm' || v, now() FROM generate_series(1, %s) v", (newer,)
        )
    server = sidecar(make_sidecar, dsn)
    with pytest.raises(RuntimeError, match=f"schema is at version {newer} .*newer than this build knows"):
        server.start()
    assert server.process.returncode == 1
    result = cli("db", "migrate", "--config", str(config_file(tmp_path)), cwd=tmp_path, dsn=dsn)
    assert result.returncode == 1 and "newer than this build knows" in result.stderr
    assert len(recorded(dsn)) == newer  # untouched


def test_a_database_without_a_recent_pgvector_is_refused(postgres, make_sidecar, tmp_path: Path) -> None:
    dsn = store_dsn(postgres, "pga_pgvector")
    path = config_file(tmp_path)
    assert cli("db", "migrate", "--config", str(path), cwd=tmp_path, dsn=dsn).returncode == 0
    with psycopg.connect(dsn) as connection:  # what an administrator's mistake (or an old image) leaves
        connection.execute("DROP EXTENSION vector CASCADE")
    result = cli("db", "migrate", "--config", str(path), cwd=tmp_path, dsn=dsn)
    assert result.returncode == 1 and "needs pgvector 0.8.0 or newer in this database, found none" in result.stderr
    server = sidecar(make_sidecar, dsn)
    with pytest.raises(RuntimeError, match="needs pgvector 0.8.0 or newer"):
        server.start()


def test_the_dsn_is_never_printed(postgres, tmp_path: Path) -> None:
    dsn = store_dsn(postgres, "pga_secret")
    path = config_file(tmp_path)
    shown = cli("config", "--config", str(path), cwd=tmp_path, dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    assert 'backend = "postgres"' in shown.stdout and 'dsn_env = "RAGSIDECAR_STORE_DSN"' in shown.stdout
    doctor = cli("doctor", "--config", str(path), cwd=tmp_path, dsn=dsn)
    assert doctor.returncode == 0, doctor.stderr
    assert '"reachable": true' in doctor.stdout and '"schema_version": 0' in doctor.stdout
    for output in (shown, doctor):
        assert PASSWORD not in output.stdout + output.stderr and dsn not in output.stdout + output.stderr


def rerank_request() -> reranker_pb2.RerankRequest:
    return reranker_pb2.RerankRequest(
        query="what is a cross encoder?",
        documents=[
            reranker_pb2.RerankDocument(id=f"d{i}", text=f"cross encoders score query and passage together {i}")
            for i in range(3)
        ],
    )


def upsert(server: Sidecar, documents: dict[str, str]) -> retrieval_pb2.UpsertDocumentsResponse:
    request = retrieval_pb2.UpsertDocumentsRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        knowledge="notes",
        documents=[retrieval_pb2.MemoryDocument(id=i, text=t) for i, t in documents.items()],
    )
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).UpsertDocuments(request, timeout=60)


def search(server: Sidecar, query: str) -> list[str]:
    hits = (
        retrieval_pb2_grpc.RetrievalServiceStub(server.channel())
        .Search(
            retrieval_pb2.SearchRequest(
                principal=PRINCIPAL,
                scope=SCOPE,
                target=target([entry("notes", "MEMORY", "SEARCH")]),
                query=query,
                top_k=3,
            ),
            timeout=60,
        )
        .hits
    )
    return [hit.provenance.document_id for hit in hits]


def wait_health(server: Sidecar, service: str, status: int, timeout: float = 20.0) -> None:
    server.wait_health(status, service=service, timeout=timeout)


def test_an_outage_turns_retrieval_and_chat_not_serving_while_rerank_serves(postgres, make_sidecar) -> None:
    dsn = store_dsn(postgres, "pga_outage")
    server = sidecar(make_sidecar, dsn, **FAST_PROBE).start()
    upsert(server, {"kept": "the warehouse ships parcels every weekday morning"})
    postgres.stop()
    try:
        for service in (RETRIEVAL, CHAT, ""):  # the probe finds the loss by itself, without any traffic
            wait_health(server, service, NOT_SERVING)
        assert server.metric("ragsidecar_store_up") == 0
        assert server.health(RERANKER) == SERVING
        assert len(server.reranker().Rerank(rerank_request(), timeout=30).results) == 3
        for call in (lambda: upsert(server, {"lost": "never acknowledged"}), lambda: search(server, "parcels")):
            with pytest.raises(grpc.RpcError) as failed:
                call()
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_details(failed.value)[0].reason == "STORE_UNAVAILABLE"
            assert PASSWORD not in failed.value.details()
        # A MEMORY source with on_failure CONTINUE drops out; a local source beside it still answers.
        degraded = retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).Search(
            retrieval_pb2.SearchRequest(
                principal=PRINCIPAL,
                scope=SCOPE,
                query="parcels",
                top_k=3,
                target=target(
                    [
                        entry("notes", "MEMORY", "SEARCH", on_failure=retrieval_pb2.KNOWLEDGE_ON_FAILURE_CONTINUE),
                        entry("policy", "INLINE", "SEARCH", inline_text="Parcels leave the depot at noon."),
                    ]
                ),
            ),
            timeout=60,
        )
        assert [hit.source for hit in degraded.hits] == ["policy"]
    finally:
        postgres.start()
    for service in (RETRIEVAL, CHAT, ""):
        wait_health(server, service, SERVING)
    assert server.metric("ragsidecar_store_up") == 1
    assert search(server, "when are parcels shipped?") == ["kept"]  # the same database, no restart
    assert "the store's database became unreachable" in server.log()
    assert server.log().count("the store's database is reachable") == 2  # at start-up and after the outage
    assert PASSWORD not in server.log()


def test_a_sidecar_started_while_the_database_is_down_serves_rerank_and_migrates_once_it_is_up(
    postgres, make_sidecar
) -> None:
    dsn = store_dsn(postgres, "pga_late")
    server = sidecar(make_sidecar, dsn, **FAST_PROBE)
    postgres.stop()
    try:
        server.start(wait_serving=False)
        wait_health(server, RERANKER, SERVING, timeout=90)
        assert len(server.reranker().Rerank(rerank_request(), timeout=30).results) == 3
        assert server.health(RETRIEVAL) == server.health(CHAT) == server.health() == NOT_SERVING
        assert "the store's database is unreachable" in server.log()
    finally:
        postgres.start()
    wait_health(server, RETRIEVAL, SERVING)
    assert [v for v, _, _ in recorded(dsn)] == [m.version for m in migrate.known()]


# -- configuration (no database) ------------------------------------------------------------------------


# -- the Database and migrations in-process, on the real server -----------------------------------------


def test_replicas_migrating_at_once_apply_each_migration_exactly_once(postgres) -> None:
    from concurrent.futures import ThreadPoolExecutor

    dsn = postgres.database("pga_race")

    def run_migrations(_: int) -> list[int]:
        with psycopg.connect(dsn, autocommit=True) as connection:
            return [m.version for m in migrate.migrate(connection)]

    with ThreadPoolExecutor(4) as pool:
        applied = list(pool.map(run_migrations, range(4)))
    assert sorted(v for each in applied for v in each) == [m.version for m in migrate.known()]
    assert [v for v, _, _ in recorded(dsn)] == [m.version for m in migrate.known()]


async def test_row_level_security_admits_only_the_rows_of_the_calls_tenant(postgres) -> None:
    from ragsidecar.store.database import Database

    admin = postgres.database("pga_rls")
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute("DROP ROLE IF EXISTS pga_app")
        connection.execute("CREATE ROLE pga_app LOGIN NOSUPERUSER NOBYPASSRLS")  # superusers bypass RLS
        connection.execute("ALTER DATABASE pga_rls OWNER TO pga_app")
        connection.execute("ALTER SCHEMA public OWNER TO pga_app")
        connection.execute("CREATE EXTENSION vector")  # an administrator's step where the role may not
    app = psycopg.conninfo.make_conninfo(admin, user="pga_app")
    with psycopg.connect(app, autocommit=True) as connection:
        connection.execute("CREATE TABLE ragsidecar_rls_probe (tenant text NOT NULL, note text NOT NULL)")
    database = Database(app, 2, row_level_security=True, health_interval_s=60.0)
    await database.start()
    try:
        assert database.healthy

        def insert(tenant: str):
            return lambda c: c.execute("INSERT INTO ragsidecar_rls_probe VALUES (%s, 'x')", (tenant,))

        def notes(c) -> int:
            return c.execute("SELECT count(*) FROM ragsidecar_rls_probe").fetchone()[0]

        await database.run(insert("a"), tenant="a")
        await database.run(insert("a"), tenant="a")
        assert await database.run(notes, tenant="a") == 2
        assert await database.run(notes, tenant="b") == 0  # no filter in the query: the policy alone
        assert await database.run(notes) == 0  # no tenant set: nothing
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            await database.run(insert("a"), tenant="b")
        assert await database.run(notes, tenant="a") == 2  # the refused call was rolled back
    finally:
        await database.close()


async def test_a_busy_pool_or_a_killed_connection_is_no_outage(postgres, monkeypatch) -> None:
    from ragsidecar.errors import SidecarError
    from ragsidecar.store.database import Database

    database = Database(
        postgres.database("pga_busy"), 1, row_level_security=False, connect_timeout_s=1.0, health_interval_s=0.2
    )
    await database.start()

    def pause(connection) -> int:
        connection.execute("SELECT pg_sleep(1.5)")
        return 1

    holding = threading.Event()

    def hold(connection) -> int:
        holding.set()  # the pool's one connection is taken for the next 1.5 s
        return pause(connection)

    # The probe's own check, observed: a check begun once the killed call has failed has seen what the kill left.
    killed, probed_since = threading.Event(), threading.Event()
    check = database.connect

    def observed_check() -> bool:
        begun_after_kill = killed.is_set()
        reachable = check()
        if begun_after_kill:
            probed_since.set()
        return reachable

    monkeypatch.setattr(database, "connect", observed_check)

    try:
        # Calls beyond the pool's connections wait in line, however long those ahead take (> connect_timeout_s).
        assert await asyncio.gather(*(database.run(pause) for _ in range(3))) == [1, 1, 1]
        # A caller on its own thread (run_sync) finding every connection busy past connect_timeout_s gives up;
        # the database stays healthy: the probe reaches it on a connection of its own.
        slow = asyncio.ensure_future(database.run(hold))
        assert await asyncio.to_thread(holding.wait, 30)
        with pytest.raises(SidecarError) as busy:
            await asyncio.to_thread(database.run_sync, lambda c: c.execute("SELECT 1"))
        assert busy.value.reason == "STORE_UNAVAILABLE"
        assert database.healthy
        await slow
        # The server ends the call's connection: that call fails, the probe finds the database, the next succeeds.
        with pytest.raises(SidecarError, match="unreachable"):
            await database.run(lambda c: c.execute("SELECT pg_terminate_backend(pg_backend_pid())"))
        killed.set()
        assert database.healthy
        assert await asyncio.to_thread(probed_since.wait, 30)  # the probe, woken by the lost connection, has looked
        assert database.healthy
        assert await database.run(lambda c: c.execute("SELECT 41 + 1").fetchone()[0]) == 42
    finally:
        await database.close()


def test_index_ahead_of_time_fills_the_embedding_cache_replicas_share(postgres, tmp_path: Path) -> None:
    dsn = store_dsn(postgres, "pga_index")
    root = tmp_path / "knowledge"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("Parcels leave the warehouse every weekday morning.")
    (root / "docs" / "b.md").write_text("Returns are accepted within thirty days of delivery.")
    config = postgres_config()
    config["paths"]["knowledge_roots"] = [str(root)]
    config["paths"]["data_dir"] = str(tmp_path / "data")
    path = tmp_path / "ragsidecar.toml"
    path.write_text(to_toml(config))
    done = cli("index", "--config", str(path), "docs", "--name", "docs", cwd=tmp_path, dsn=dsn)
    assert done.returncode == 0, done.stderr
    assert "indexed docs: 2 documents, 2 chunks" in done.stdout
    with psycopg.connect(dsn) as connection:  # migrated on the way, and the two chunks' vectors kept
        assert connection.execute("SELECT count(*) FROM ragsidecar_embeddings").fetchone()[0] == 2
    assert PASSWORD not in done.stdout + done.stderr
