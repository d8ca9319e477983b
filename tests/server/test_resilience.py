"""Client resilience, the server's side: a sidecar that is still warming up says so with a status clients retry,
and the table of retried calls in docs/clients.md is the one the protos declare (idempotency_level)."""

from __future__ import annotations

import grpc
import httpx
import pytest
from sidecar import default_config, error_details, free_port

from ragsidecar.v1 import common_pb2, reranker_pb2, retrieval_pb2, retrieval_pb2_grpc

DEFAULT_MODEL = "ms-marco-MiniLM-L-12-v2"
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


def test_a_rerank_sent_as_soon_as_the_port_answers_is_unavailable_warming_up(make_sidecar) -> None:
    config = default_config(packaged=True)  # the packaged models' warm-up is long enough to call into
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
