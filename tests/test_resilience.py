"""Client resilience, the server's side: a sidecar that is still warming up says so with a status clients retry,
and the table of retried calls in docs/clients.md is the one the protos declare (idempotency_level)."""

from __future__ import annotations

import re

import grpc
import httpx
import pytest
from google.protobuf import descriptor_pb2
from sidecar import REPO, default_config, error_details, free_port

from ragsidecar.v1 import chat_knowledge_pb2, common_pb2, reranker_pb2, retrieval_pb2, retrieval_pb2_grpc

DEFAULT_MODEL = "ms-marco-MiniLM-L-12-v2"
CLIENTS_DOC = REPO / "docs" / "clients.md"
SEARCH = retrieval_pb2.SearchRequest(
    principal=common_pb2.Principal(id="agent-host"),
    scope=common_pb2.Scope(tenant="acme"),
    query="delivery day",
    target=retrieval_pb2.Target(
        name="agent",
        knowledge=[
            retrieval_pb2.KnowledgeEntry(
                name="notes", type=retrieval_pb2.KNOWLEDGE_TYPE_MEMORY, use=retrieval_pb2.KNOWLEDGE_USE_SEARCH
            )
        ],
    ),
)
_LEVELS = {
    descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS: "NO_SIDE_EFFECTS",
    descriptor_pb2.MethodOptions.IDEMPOTENT: "IDEMPOTENT",
}


def test_a_rerank_sent_as_soon_as_the_port_answers_is_unavailable_warming_up(make_sidecar) -> None:
    config = default_config()
    config["http"] = {"port": free_port()}
    server = make_sidecar(config).start(wait_serving=False)
    stub = server.reranker()
    request = reranker_pb2.RerankRequest(
        query="what is a cross encoder?", documents=[reranker_pb2.RerankDocument(id="a", text="a reranker")]
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.Rerank(request, timeout=30)  # no model: the default one, which is still loading
    warming = httpx.post(f"{server.http_url}/v2/rerank", json={"query": "q", "documents": ["a"]}, timeout=30)
    with pytest.raises(grpc.RpcError) as searched:  # retrieval needs the embedder, which is loading too
        retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).Search(SEARCH, timeout=30)
    # Models leave LOADING once, all together: a model still LOADING after both answers proves both came while the
    # sidecar was warming up (and not from a sidecar that had just become ready).
    listed = stub.ListModels(reranker_pb2.ListModelsRequest(), timeout=10)
    assert reranker_pb2.MODEL_STATE_LOADING in [m.state for m in listed.models], "warm-up ended before the calls"
    info, _ = error_details(caught.value)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info is not None and info.reason == "WARMING_UP" and info.metadata["model"] == DEFAULT_MODEL
    assert "warming up" in (caught.value.details() or "")
    assert searched.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_details(searched.value)[0].reason == "WARMING_UP"
    assert warming.status_code == 503 and warming.headers["retry-after"] == "1"
    assert warming.json()["reason"] == "WARMING_UP"
    server.wait_health(1)  # SERVING
    assert stub.Rerank(request, timeout=30).model == DEFAULT_MODEL


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
