"""Any base URL a client is given works (issue 33), through a real sidecar: a Cohere or Jina body posted to
TEI's `/rerank` is answered as Cohere answers, OpenAI's paths are served without `/v1`, a base URL ending in `/`
is served as without; responses carry what the real APIs always carry, errors name the fields as the caller
wrote them, a rerank answered from the cache reports the tokens its request holds, and a bearer token with
whitespace around it is treated alike by both APIs."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import openai
import pytest
from sidecar import Sidecar, default_config, free_port

from ragsidecar.v1 import reranker_pb2

CROSS = "ms-marco-MiniLM-L-12-v2"
BI = "bge-small-en-v1.5"
TOKEN = "s3cret-token"
QUERY = "What is the capital of France?"
DOCUMENTS = ["Berlin is the capital of Germany.", "Paris is the capital and largest city of France."]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """HTTP on, a token required, the result cache on (the default)."""
    config = default_config()
    config["http"] = {"port": free_port()}
    server = Sidecar(tmp_path_factory.mktemp("bases"), config, env={"RAGSIDECAR_TOKEN": TOKEN})
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def http(served: Sidecar) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.http_url, timeout=60, headers={"authorization": f"Bearer {TOKEN}"}) as client:
        yield client


def test_a_cohere_body_at_the_bare_base_is_answered_as_cohere(http: httpx.Client) -> None:
    body = {"model": CROSS, "query": QUERY, "documents": DOCUMENTS, "return_documents": True}
    bare, versioned = http.post("/rerank", json=body), http.post("/v2/rerank", json=body)
    assert bare.status_code == versioned.status_code == 200, bare.text
    answer = bare.json()
    assert [r["index"] for r in answer["results"]] == [1, 0]
    assert answer["results"] == versioned.json()["results"]
    assert answer["results"][0]["document"] == {"text": DOCUMENTS[1]}
    assert answer["id"] and answer["meta"]["billed_units"] == {"search_units": 1}
    # Jina's documents are objects with `text`.
    jina = http.post("/rerank", json={**body, "documents": [{"text": d} for d in DOCUMENTS]})
    assert jina.json()["results"] == answer["results"]


def test_a_tei_body_at_the_bare_base_is_still_tei(http: httpx.Client) -> None:
    response = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    assert response.status_code == 200 and [r["index"] for r in response.json()] == [1, 0]


def test_errors_at_the_bare_base_take_the_shape_of_the_body_sent(http: httpx.Client) -> None:
    cohere = http.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": 0})
    assert cohere.status_code == 400 and "max_tokens_per_doc" in cohere.json()["message"], cohere.text
    assert [v["field"] for v in cohere.json()["violations"]] == ["max_tokens_per_doc"]
    assert "max_document_tokens" not in cohere.text
    tei = http.post("/rerank", json={"query": QUERY, "texts": []})
    assert tei.status_code == 422 and tei.json()["error_type"] == "Validation", tei.text
    assert [v["field"] for v in tei.json()["violations"]] == ["texts"] and "documents" not in tei.text


@pytest.mark.parametrize("path", ["/v2/rerank", "/v1/rerank", "/rerank"])
def test_search_units_are_one_per_query_and_hundred_documents(http: httpx.Client, path: str) -> None:
    documents = [f"document {i} about France" for i in range(201)]
    response = http.post(path, json={"model": CROSS, "query": QUERY, "documents": documents, "top_n": 1})
    assert response.status_code == 200, response.text
    assert response.json()["meta"]["billed_units"] == {"search_units": 3}


def test_a_rerank_from_the_cache_reports_the_tokens_it_holds(served: Sidecar, http: httpx.Client) -> None:
    body = {"model": CROSS, "query": "cached tokens", "documents": ["one document", "and another one"]}
    hits = served.metric("ragsidecar_rerank_cache_hits_total")
    first, second = http.post("/v2/rerank", json=body).json(), http.post("/v2/rerank", json=body).json()
    assert served.metric("ragsidecar_rerank_cache_hits_total") == hits + 2
    assert second["meta"]["tokens"]["input_tokens"] == first["meta"]["tokens"]["input_tokens"] > 0
    assert second["usage"] == first["usage"]


@pytest.mark.parametrize("path", ["/v1//rerank", "//v2/rerank"])
def test_a_base_url_ending_in_a_slash_is_served_as_without(http: httpx.Client, path: str) -> None:
    response = http.post(path, json={"model": CROSS, "query": QUERY, "documents": DOCUMENTS})
    assert response.status_code == 200 and response.json()["results"][0]["index"] == 1, response.text


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_openai_sdk_embeds_with_or_without_v1(served: Sidecar, suffix: str) -> None:
    client = openai.OpenAI(base_url=served.http_url + suffix, api_key=TOKEN)
    vectors = client.embeddings.create(model=BI, input=DOCUMENTS).data
    assert len(vectors) == 2 and np.isclose(np.linalg.norm(vectors[0].embedding), 1.0, atol=1e-3)
    assert BI in [model.id for model in client.models.list().data]


def raw_status(server: Sidecar, credentials: str) -> int:
    """The status of a rerank sent with these credentials as they are (HTTP clients refuse to send some)."""
    body = json.dumps({"query": QUERY, "documents": DOCUMENTS}).encode()
    host, port = server.http_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        head = f"POST /v2/rerank HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
        connection.sendall(head.encode() + b"authorization: " + credentials.encode() + b"\r\n\r\n" + body)
        return int(connection.recv(65536).split(b" ", 2)[1])


def grpc_code(server: Sidecar, credentials: str) -> grpc.StatusCode:
    request = reranker_pb2.RerankRequest(query=QUERY, documents=[reranker_pb2.RerankDocument(id="a", text="b")])
    try:
        server.reranker().Rerank(request, metadata=[("authorization", credentials)], timeout=60)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


# gRPC's client refuses to send a tab in metadata; HTTP's spaces and tabs around a value are not part of it.
@pytest.mark.parametrize(
    ("credentials", "over_grpc"), [(f"Bearer {TOKEN} ", True), (f"bearer  {TOKEN}", True), (f"Bearer {TOKEN}\t", False)]
)
def test_whitespace_around_the_token_is_accepted_by_both_apis(
    served: Sidecar, credentials: str, over_grpc: bool
) -> None:
    assert raw_status(served, credentials) == 200
    if over_grpc:
        assert grpc_code(served, credentials) == grpc.StatusCode.OK


@pytest.mark.parametrize("credentials", [f"Bearer {TOKEN}x", f"Bearer {TOKEN} x", f"Bearer x{TOKEN}"])
def test_anything_else_beside_the_token_is_refused_by_both_apis(served: Sidecar, credentials: str) -> None:
    assert raw_status(served, credentials) == 401
    assert grpc_code(served, credentials) == grpc.StatusCode.UNAUTHENTICATED
