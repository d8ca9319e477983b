"""MEMORY knowledge calls the store and isolation tests share: upserts, searches by scope, refusals."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from retrieval_helpers import PRINCIPAL, entry, stub, target
from sidecar import Sidecar, default_config, error_details

from ragsidecar.v1 import common_pb2
from ragsidecar.v1 import retrieval_pb2 as pb

NOTES = entry("notes", "MEMORY", "SEARCH")


def upsert(
    server: Sidecar,
    scope: common_pb2.Scope,
    doc_id: str,
    text: str,
    knowledge: str = "notes",
    principal: common_pb2.Principal = PRINCIPAL,
) -> pb.UpsertDocumentsResponse:
    return stub(server).UpsertDocuments(
        pb.UpsertDocumentsRequest(
            principal=principal, scope=scope, knowledge=knowledge, documents=[pb.MemoryDocument(id=doc_id, text=text)]
        ),
        timeout=60,
    )


def sharing_replica(workdir: Path, dsn: str, **store: object) -> Sidecar:
    """A started postgres replica on `dsn` whose data folder is under `workdir` (kept across its restarts),
    snapshotting after 0.2 s idle and sharing the snapshot of any partition; `store` adds [store] settings."""
    config = default_config()
    config["store"] = {"backend": "postgres", "snapshot_idle_s": 0.2, "shared_snapshot_chunks": 1, **store}
    workdir.mkdir(exist_ok=True)
    return Sidecar(workdir, config, env={"RAGSIDECAR_STORE_DSN": dsn}).start()


def upsert_documents(server: Sidecar, scope: common_pb2.Scope, documents: dict[str, str]) -> pb.UpsertDocumentsResponse:
    """One upsert of `documents` (id: text) into the scope's `notes`."""
    return stub(server).UpsertDocuments(
        pb.UpsertDocumentsRequest(
            principal=PRINCIPAL,
            scope=scope,
            knowledge="notes",
            documents=[pb.MemoryDocument(id=i, text=t) for i, t in documents.items()],
        ),
        timeout=120,
    )


def found_ids(server: Sidecar, scope: common_pb2.Scope, query: str) -> list[str]:
    hits = (
        stub(server)
        .Search(
            pb.SearchRequest(principal=PRINCIPAL, scope=scope, target=target([NOTES]), query=query, top_k=10),
            timeout=60,
        )
        .hits
    )
    return sorted(h.provenance.document_id for h in hits)


def refused(call) -> tuple[grpc.StatusCode, str, list[str]]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    info, violations = error_details(caught.value)
    return caught.value.code(), info.reason if info else "", [field for field, _ in violations]
