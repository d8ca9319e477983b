"""The clients' retry table (docs/clients.md) is what the protos declare safe to repeat."""

from __future__ import annotations

import re

from google.protobuf import descriptor_pb2
from sidecar import REPO

from ragsidecar.v1 import chat_knowledge_pb2, reranker_pb2, retrieval_pb2


def test_the_documented_retry_table_is_what_the_protos_declare() -> None:
    assert documented_retries() == declared_retries()
    assert "ragsidecar.v1.RerankerService/Rerank" in declared_retries()
    assert "ragsidecar.v1.RetrievalService/Search" in declared_retries()
    assert (
        not {
            "ragsidecar.v1.RetrievalService/UpsertDocuments",
            "ragsidecar.v1.RetrievalService/Enforce",
            "ragsidecar.v1.RetrievalService/DeleteDocuments",
        }
        & declared_retries().keys()
    )


def documented_retries() -> dict[str, str]:
    """The table "Calls the clients retry" of docs/clients.md: method -> idempotency level."""
    section = CLIENTS_DOC.read_text().split("## Calls the clients retry", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+/\w+)` \| (\w+) \|", section, re.MULTILINE)
    return dict(rows)


def declared_retries() -> dict[str, str]:
    """Every method whose proto declares it safe to repeat, plus the standard health check."""
    declared = {"grpc.health.v1.Health/Check": "NO_SIDE_EFFECTS"}
    for module in (reranker_pb2, retrieval_pb2, chat_knowledge_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                level = method.GetOptions().idempotency_level
                if level in _LEVELS:
                    declared[f"{service.full_name}/{method.name}"] = _LEVELS[level]
    return declared


CLIENTS_DOC = REPO / "docs" / "clients.md"


_LEVELS = {
    descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS: "NO_SIDE_EFFECTS",
    descriptor_pb2.MethodOptions.IDEMPOTENT: "IDEMPOTENT",
}
