"""A replica that joins with no snapshot of its own, through real sidecars sharing a real PostgreSQL: its first
Search loads the partition's snapshot another replica shared through the database and replays the writes made
after it (every acknowledged write found, a deleted document gone), instead of building the index from the rows;
also under row-level security, as an ordinary role, where each tenant's shared snapshot is its own."""

from __future__ import annotations

import time

import psycopg
import pytest
from memory_helpers import sharing_replica, upsert_documents
from retrieval_helpers import PRINCIPAL, SCOPE, entry, stub, target
from sidecar import Sidecar

from ragsidecar.v1 import retrieval_pb2 as pb

NOTES = entry("notes", "MEMORY", "SEARCH")


def found(server: Sidecar, query: str) -> list[str]:
    request = pb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=target([NOTES]), query=query, top_k=40)
    return [h.provenance.document_id for h in stub(server).Search(request, timeout=120).hits]


def shared(dsn: str, timeout: float = 60.0) -> None:
    """Waits for SCOPE's tenant's shared snapshot (the only one its row-level security, if any, lets it see)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("SELECT set_config('ragsidecar.tenant', %s, false)", (SCOPE.tenant,))
        while connection.execute("SELECT count(*) FROM ragsidecar_memory_snapshots").fetchone() == (0,):
            assert time.monotonic() < deadline, "no snapshot shared"
            time.sleep(0.1)


@pytest.mark.parametrize("row_level_security", [False, True], ids=["superuser", "row-level security"])
def test_a_replica_with_no_snapshot_serves_from_the_shared_one_plus_the_writes_after_it(
    postgres, tmp_path, row_level_security: bool
) -> None:
    name = f"shared_snapshot_replicas_{int(row_level_security)}"
    dsn = postgres.owned_database(name) if row_level_security else postgres.database(name)
    a = sharing_replica(tmp_path / "a", dsn, row_level_security=row_level_security)
    try:
        upsert_documents(a, SCOPE, {f"n{i}": f"parcel {i} left the depot on route {i % 3}" for i in range(30)})
        assert found(a, "parcel depot route")
        shared(dsn)
        upsert_documents(
            a, SCOPE, {"late": "a parcel written after the shared snapshot", "n4": "parcel 4 was returned"}
        )
        stub(a).DeleteDocuments(
            pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge="notes", ids=["n7"]), timeout=60
        )
        b = sharing_replica(tmp_path / "b", dsn, row_level_security=row_level_security)
        try:
            hits = found(b, "parcel written after the shared snapshot returned depot")
            assert b.metric("ragsidecar_index_snapshots_total", how="fetched") == 1
            assert b.metric("ragsidecar_partition_catch_ups_total", how="reload") == 0
            assert "late" in hits and "n4" in hits and "n7" not in hits
            assert sorted(found(b, "parcel")) == sorted(found(a, "parcel"))
        finally:
            b.stop()
    finally:
        a.stop()
