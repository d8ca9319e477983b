"""The HTTP API through a real sidecar: the cohere and openai SDKs, text-embeddings-inference's shape over raw
HTTP, every refusal with its status and body, the token, TLS and loopback rules, and docs/http.md's curl examples."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import cohere
import httpx
import ir_data
import numpy as np
import openai
import pytest
from sidecar import DEFAULT_CONFIG, REPO, Sidecar, default_config, free_port

from ragsidecar.config import InferenceConfig, ModelConfig
from ragsidecar.inference.models import load_model
from ragsidecar.v1 import reranker_pb2

CROSS = "ms-marco-MiniLM-L-12-v2"
BI = "bge-small-en-v1.5"
TOKEN = "s3cret-token"
TLS = Path(__file__).resolve().parents[1] / "data" / "tls"
LONG_TEXT = "a long document about reranking and retrieval " * 60


def http_config(packaged: bool = False, **inference: int) -> dict:
    config = default_config(packaged)
    config["inference"].update(cache_bytes=0, **inference)
    config["http"] = {"port": free_port()}
    return config


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar serving gRPC and HTTP (result cache off, so every call really scores)."""
    server = Sidecar(tmp_path_factory.mktemp("http"), http_config())
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(served: Sidecar) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.http_url, timeout=120) as http:
        yield http


def scifact_sets(count: int, size: int) -> list[tuple[str, list[str]]]:
    """(query, its relevant abstract among `size - 1` others) for judged SciFact test queries."""
    corpus, queries, judged = ir_data.corpus("scifact"), ir_data.queries("scifact"), ir_data.qrels("scifact")
    ids = sorted(corpus)
    sets = []
    for n, query_id in enumerate(sorted(judged)[:count]):
        others = [corpus[d] for d in ids[n * size : (n + 1) * size] if d not in judged[query_id]][: size - 1]
        relevant = corpus[next(iter(judged[query_id]))]
        sets.append((queries[query_id], others[: n % size] + [relevant] + others[n % size :]))
    return sets


def grpc_rerank(server: Sidecar, query: str, texts: list[str], **fields) -> reranker_pb2.RerankResponse:
    documents = [reranker_pb2.RerankDocument(id=str(i), text=t) for i, t in enumerate(texts)]
    return server.reranker().Rerank(reranker_pb2.RerankRequest(query=query, documents=documents, **fields), timeout=60)


# --- The SDKs ---


def test_the_cohere_sdk_reranks_as_grpc_does(served: Sidecar) -> None:
    co = cohere.ClientV2(api_key="unused", base_url=served.http_url)
    for query, texts in scifact_sets(count=6, size=8):
        answer = co.rerank(model=CROSS, query=query, documents=texts, top_n=5)
        expected = grpc_rerank(served, query, texts, model=CROSS, top_n=5)
        assert [(r.index, r.relevance_score) for r in answer.results] == [
            (r.index, r.relevance_score) for r in expected.results
        ]
        assert answer.meta.tokens.input_tokens == expected.usage.tokens > 0


def test_the_cohere_v1_sdk_takes_document_objects_and_returns_them(served: Sidecar) -> None:
    query, texts = scifact_sets(count=1, size=5)[0]
    co = cohere.Client(api_key="unused", base_url=served.http_url)
    answer = co.rerank(model=CROSS, query=query, documents=[{"text": t} for t in texts], return_documents=True)
    expected = grpc_rerank(served, query, texts, model=CROSS)
    assert [r.index for r in answer.results] == [r.index for r in expected.results]
    assert [r.document.text for r in answer.results] == [texts[r.index] for r in expected.results]


def test_jina_shape_on_v1_rerank(client: httpx.Client, served: Sidecar) -> None:
    query, texts = scifact_sets(count=1, size=4)[0]
    body = client.post(
        "/v1/rerank", json={"model": BI, "query": query, "documents": texts, "top_n": 2, "return_documents": True}
    ).json()
    expected = grpc_rerank(served, query, texts, model=BI, top_n=2)
    assert body["model"] == BI
    assert [(r["index"], r["relevance_score"], r["document"]["text"]) for r in body["results"]] == [
        (r.index, r.relevance_score, texts[r.index]) for r in expected.results
    ]
    assert body["usage"]["total_tokens"] == body["meta"]["tokens"]["input_tokens"]


def test_tei_rerank_shape(client: httpx.Client, served: Sidecar) -> None:
    query, texts = scifact_sets(count=1, size=6)[0]
    expected = grpc_rerank(served, query, texts)
    raw = client.post("/rerank", json={"query": query, "texts": texts, "raw_scores": True, "return_text": True})
    assert raw.status_code == 200
    assert [(r["index"], r["score"], r["text"]) for r in raw.json()] == [
        (r.index, r.raw_score, texts[r.index]) for r in expected.results
    ]
    scaled = client.post("/rerank", json={"query": query, "texts": texts}).json()
    assert [(r["index"], r["score"]) for r in scaled] == [(r.index, r.relevance_score) for r in expected.results]
    assert all("text" not in r for r in scaled)


async def test_the_openai_sdk_embeds_as_the_embedder_does(served: Sidecar) -> None:
    texts = [query for query, _ in scifact_sets(count=4, size=2)] + ["a", "word " * 2000]
    client = openai.OpenAI(api_key="unused", base_url=f"{served.http_url}/v1", max_retries=0)
    as_base64 = client.embeddings.create(model=BI, input=texts)  # the SDK's default encoding
    as_floats = client.embeddings.create(model=BI, input=texts, encoding_format="float", dimensions=384)
    one = client.embeddings.create(model=BI, input=texts[0])
    (served_embedder,) = [m for m in served.config["models"] if m["id"] == BI]
    spec = ModelConfig(id=BI, kind="bi-encoder", path=BI, pooling=served_embedder["pooling"])
    model = await load_model(spec, Path(served.config["paths"]["models_dir"]) / BI, InferenceConfig())
    try:
        expected = (await model.embed(texts)).vectors
    finally:
        await model.close()
    for answer in (as_base64, as_floats):
        assert answer.model == BI and [d.index for d in answer.data] == list(range(len(texts)))
        vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
        assert vectors.shape == (len(texts), 384)
        assert np.array_equal(vectors, expected)
        assert answer.usage.prompt_tokens == answer.usage.total_tokens > 512  # the long text counts its window
    assert np.array_equal(np.array(one.data[0].embedding, dtype=np.float32), expected[0])


def test_models_and_health(served: Sidecar, client: httpx.Client) -> None:
    listed = openai.OpenAI(api_key="unused", base_url=f"{served.http_url}/v1").models.list()
    assert [m.id for m in listed.data] == [CROSS, BI]
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models[CROSS]["kind"] == "cross-encoder" and models[CROSS]["default"] and models[BI]["state"] == "ready"
    health = client.get("/health")
    assert (health.status_code, health.json()) == (200, {"status": "SERVING"})


# --- Refusals: the status and body each API's clients read, never a 500 ---


def assert_refused(response: httpx.Response, status: int, reason: str, message: str = "") -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    shown = {
        "/v1/embeddings": lambda b: (b["error"]["code"], b["error"]["message"]),
        "/rerank": lambda b: (b["reason"], b["error"]),
    }.get(response.request.url.path, lambda b: (b["reason"], b["message"]))(body)
    assert shown[0] == reason and message in shown[1], body
    return body


REFUSALS = [
    # (path, raw body, status, reason, part of the message)
    ("/v2/rerank", b"{not json", 400, "INVALID_REQUEST", "not valid JSON"),
    ("/v2/rerank", b'{"query": "\xc3\x28"}', 400, "INVALID_REQUEST", "not valid JSON"),
    ("/v2/rerank", b"[" * 100_000, 400, "INVALID_REQUEST", "not valid JSON"),
    ("/v2/rerank", b'["query"]', 400, "INVALID_REQUEST", "must be a JSON object"),
    ("/v2/rerank", b'{"query": 3, "documents": "a"}', 400, "INVALID_REQUEST", "query: must be a string"),
    ("/v2/rerank", b'{"query": "q"}', 400, "INVALID_REQUEST", "documents: required"),
    ("/v2/rerank", b'{"query": "q", "documents": []}', 400, "INVALID_REQUEST", "at least one document"),
    (
        "/v2/rerank",
        b'{"query": "q", "documents": [{"title": "x"}]}',
        400,
        "INVALID_REQUEST",
        "documents[0].text: must be a string, not null",
    ),
    ("/v2/rerank", b'{"query": "\\ud800", "documents": ["a"]}', 400, "INVALID_REQUEST", "lone UTF-16 surrogate"),
    ("/v2/rerank", b'{"query": "q", "documents": ["a"], "top_n": -1}', 400, "INVALID_REQUEST", "top_n"),
    ("/v2/rerank", b'{"query": "q", "documents": ["a"], "top_n": 1.5}', 400, "INVALID_REQUEST", "an integer"),
    (
        "/v2/rerank",
        b'{"model": "rerank-v3.5", "query": "q", "documents": ["a"]}',
        404,
        "UNKNOWN_MODEL",
        "'rerank-v3.5' is not configured",
    ),
    (
        "/v2/rerank",
        json.dumps({"query": "q", "documents": ["d"] * 1001}).encode(),
        413,
        "LIMIT_EXCEEDED",
        "documents: more than 1000 items",
    ),
    (
        "/v2/rerank",
        json.dumps({"query": "word " * 1000, "documents": ["d"]}).encode(),
        400,
        "INVALID_REQUEST",
        "the query is",
    ),
    (
        "/v1/rerank",
        b'{"query": "q", "documents": ["a"], "return_documents": "yes"}',
        400,
        "INVALID_REQUEST",
        "true or false",
    ),
    ("/rerank", b"{not json", 422, "INVALID_REQUEST", "not valid JSON"),
    ("/rerank", b'{"query": "q", "texts": [1]}', 422, "INVALID_REQUEST", "texts[0]: must be a string"),
    (
        "/rerank",
        json.dumps({"query": "q", "texts": ["x" * (4 * 1024 * 1024 + 1)]}).encode(),
        413,
        "LIMIT_EXCEEDED",
        "characters exceed the maximum",
    ),
    ("/v1/embeddings", b"{not json", 400, "INVALID_REQUEST", "not valid JSON"),
    ("/v1/embeddings", b'{"input": "a"}', 400, "INVALID_REQUEST", "model: required"),
    ("/v1/embeddings", b'{"model": "bge-small-en-v1.5"}', 400, "INVALID_REQUEST", "input: required"),
    (
        "/v1/embeddings",
        b'{"model": "bge-small-en-v1.5", "input": [[1, 2]]}',
        400,
        "INVALID_REQUEST",
        "token arrays are not supported",
    ),
    (
        "/v1/embeddings",
        b'{"model": "bge-small-en-v1.5", "input": ["a", ""]}',
        400,
        "INVALID_REQUEST",
        "input[1]: must not be empty",
    ),
    (
        "/v1/embeddings",
        b'{"model": "bge-small-en-v1.5", "input": "a", "dimensions": 256}',
        400,
        "INVALID_REQUEST",
        "produces 384 dimensions, not 256",
    ),
    (
        "/v1/embeddings",
        b'{"model": "bge-small-en-v1.5", "input": "a", "encoding_format": "int8"}',
        400,
        "INVALID_REQUEST",
        "encoding_format",
    ),
    ("/v1/embeddings", b'{"model": "text-embedding-3-small", "input": "a"}', 404, "UNKNOWN_MODEL", "not configured"),
    ("/v1/embeddings", b'{"model": "ms-marco-MiniLM-L-12-v2", "input": "a"}', 404, "UNKNOWN_MODEL", ""),
    (
        "/v1/embeddings",
        json.dumps({"model": BI, "input": ["a"] * 1001}).encode(),
        413,
        "LIMIT_EXCEEDED",
        "input: more than 1000 items",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "reason", "message"), REFUSALS, ids=[f"{r[0]}-{r[2]}-{r[4][:30]}" for r in REFUSALS]
)
def test_refusals(client: httpx.Client, path: str, body: bytes, status: int, reason: str, message: str) -> None:
    assert_refused(client.post(path, content=body), status, reason, message)


def test_refusals_through_the_sdks(served: Sidecar) -> None:
    co = cohere.ClientV2(api_key="unused", base_url=served.http_url)
    with pytest.raises(cohere.errors.NotFoundError) as missing:
        co.rerank(model="rerank-v3.5", query="q", documents=["a"])
    assert missing.value.body["reason"] == "UNKNOWN_MODEL"
    with pytest.raises(cohere.errors.BadRequestError):
        co.rerank(model=CROSS, query=" ", documents=["a"])
    client = openai.OpenAI(api_key="unused", base_url=f"{served.http_url}/v1", max_retries=0)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="text-embedding-3-small", input="a")
    assert unknown.value.code == "UNKNOWN_MODEL"
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=BI, input="a", dimensions=8)
    assert refused.value.param == "dimensions"


def test_unknown_paths_and_methods(client: httpx.Client) -> None:
    missing = client.get("/v1/chat/completions")
    assert missing.status_code == 404 and "POST /v2/rerank" in missing.json()["error"]["message"]
    wrong = client.get("/v2/rerank")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"


def test_hostile_bodies_never_get_a_500(client: httpx.Client, served: Sidecar) -> None:
    values = [None, True, -1, 2**70, 1e308, "", "x", [], {}, [None], [{}], {"text": 5}, ["\u0000"], "NaN"]
    fields = [
        "model",
        "query",
        "documents",
        "texts",
        "input",
        "top_n",
        "return_documents",
        "raw_scores",
        "max_tokens_per_doc",
        "encoding_format",
        "dimensions",
        "return_text",
    ]
    base = {"model": BI, "query": "q", "documents": ["a"], "texts": ["a"], "input": ["a"]}
    for path in ("/v2/rerank", "/v1/rerank", "/rerank", "/v1/embeddings"):
        for field in fields:
            for value in values:
                response = client.post(path, json={**base, field: value})
                assert response.status_code < 500, (path, field, value, response.text)
                response.json()
    assert "Traceback" not in served.log()
    assert client.get("/health").status_code == 200


def test_requests_are_counted_and_logged_as_grpc_calls_are(client: httpx.Client, served: Sidecar) -> None:
    client.post("/v2/rerank", json={"query": "q", "documents": ["a"]})
    client.post("/v2/rerank", content=b"{")
    client.get("/no/such/path")
    assert served.metric("ragsidecar_requests_total", method="/v2/rerank", code="200") >= 1
    assert served.metric("ragsidecar_requests_total", method="/v2/rerank", code="400") >= 1
    assert served.metric("ragsidecar_requests_total", method="unmatched", code="404") >= 1
    assert 'ragsidecar_request_seconds_count{method="/v2/rerank"}' in served.metrics()
    deadline = time.monotonic() + 30
    while not any("method=/v2/rerank code=400" in line for line in served.output) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("method=/v2/rerank code=400 duration_ms=" in line for line in served.output)


# --- Token, TLS and the loopback rule ---


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar with a token and TLS on both listeners."""
    config = http_config()
    config["tls"] = {"cert_file": str(TLS / "localhost.crt"), "key_file": str(TLS / "localhost.key")}
    server = Sidecar(tmp_path_factory.mktemp("guarded-http"), config, env={"RAGSIDECAR_TOKEN": TOKEN})
    try:
        server.start(wait_serving=False)
        with https(server) as http:
            wait_serving(http)
        yield server
    finally:
        server.stop()


def https(server: Sidecar) -> httpx.Client:
    return httpx.Client(
        base_url=server.http_url, verify=ssl.create_default_context(cafile=TLS / "localhost.crt"), timeout=60
    )


def wait_serving(http: httpx.Client, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while http.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "the sidecar never became SERVING"
        time.sleep(0.1)


@pytest.mark.parametrize("credentials", [None, "Bearer wrong", TOKEN, f"Basic {TOKEN}"])
def test_the_token_is_required_but_for_health(guarded: Sidecar, credentials: str | None) -> None:
    headers = {"authorization": credentials} if credentials else {}
    with https(guarded) as http:
        for path, body in (
            ("/v2/rerank", {"query": "q", "documents": ["a"]}),
            ("/rerank", {"query": "q", "texts": ["a"]}),
            ("/v1/embeddings", {"model": BI, "input": "a"}),
        ):
            response = http.post(path, json=body, headers=headers)
            assert "s3cret" not in json.dumps(assert_refused(response, 401, "UNAUTHENTICATED"))
            assert response.headers["www-authenticate"] == "Bearer"
        assert http.get("/v1/models", headers=headers).status_code == 401
        assert http.get("/health").status_code == 200


def test_the_sdks_send_the_token_over_tls(guarded: Sidecar) -> None:
    verify = ssl.create_default_context(cafile=TLS / "localhost.crt")
    co = cohere.ClientV2(api_key=TOKEN, base_url=guarded.http_url, httpx_client=httpx.Client(verify=verify))
    assert guarded.http_url.startswith("https://")
    assert [
        r.index
        for r in co.rerank(
            model=CROSS, query="capital of France", documents=["Berlin, Germany", "Paris, France"]
        ).results
    ] == [1, 0]
    client = openai.OpenAI(
        api_key=TOKEN, base_url=f"{guarded.http_url}/v1", http_client=openai.DefaultHttpxClient(verify=verify)
    )
    assert len(client.embeddings.create(model=BI, input=["a"]).data[0].embedding) == 384
    with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS listener
        httpx.get(guarded.http_url.replace("https://", "http://") + "/health", timeout=10)
    assert TOKEN not in guarded.log()


def test_http_beyond_loopback_needs_a_token_or_tls(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAGSIDECAR_")}
    refused = subprocess.run(
        [sys.executable, "-m", "ragsidecar", "serve", "--config", str(DEFAULT_CONFIG), "--http-port", str(free_port())],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**environ, "RAGSIDECAR_HTTP_HOST": "0.0.0.0"},
        timeout=120,
    )
    assert refused.returncode == 2
    assert "http.host: '0.0.0.0' is reachable beyond this machine" in refused.stderr


def test_the_http_stack_loads_only_when_it_serves() -> None:
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, ragsidecar.app, ragsidecar.cli; print(sorted({'starlette', 'uvicorn'} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert imported.stdout.strip() == "[]", imported.stderr


# --- Warming up, a full queue, an oversized body, a caller who hangs up, shutdown ---


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sidecar, list[httpx.Response]]]:
    """A sidecar with one worker, a 30-pair queue and 1 MiB bodies; with the answers it gave while its models were
    still loading (asked at once, whichever test runs first)."""
    # The packaged models: their load and inference are slow enough to call into and to queue behind.
    config = http_config(packaged=True, workers=1, max_queued_pairs=30, max_batch_tokens=1024)
    config["server"]["max_message_bytes"] = 1 << 20
    server = Sidecar(tmp_path_factory.mktemp("small-http"), config)
    try:
        server.start(wait_serving=False)
        with httpx.Client(base_url=server.http_url, timeout=60) as http:
            # The embedder loads last: for seconds after the listener starts it is not ready.
            warming = [http.post("/v1/embeddings", json={"model": BI, "input": "a"}), http.get("/health")]
            wait_serving(http)
        yield server, warming
    finally:
        server.stop()


def test_warming_up_is_503_with_retry_after(small: tuple[Sidecar, list[httpx.Response]]) -> None:
    _, (embeddings, health) = small
    assert_refused(embeddings, 503, "WARMING_UP", "is warming up")
    assert embeddings.headers["retry-after"] == "1"
    assert embeddings.json()["error"]["type"] == "server_error"
    assert health.status_code == 503 and health.json() == {"status": "NOT_SERVING"}


def test_a_full_queue_is_429_with_retry_after(small: tuple[Sidecar, list[httpx.Response]]) -> None:
    server, _ = small
    co = cohere.ClientV2(api_key="unused", base_url=server.http_url, max_retries=0)
    with pytest.raises(cohere.errors.TooManyRequestsError) as caught:
        co.rerank(model=CROSS, query="q", documents=[f"doc {i}" for i in range(31)])
    assert caught.value.headers["retry-after"] == "1" and caught.value.body["reason"] == "QUEUE_FULL"
    client = openai.OpenAI(api_key="unused", base_url=f"{server.http_url}/v1", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.embeddings.create(model=BI, input=[f"text {i}" for i in range(31)])


def test_a_body_over_the_limit_is_413(small: tuple[Sidecar, list[httpx.Response]]) -> None:
    server, _ = small
    body = json.dumps({"query": "q", "documents": ["x" * (2 << 20)]}).encode()
    with httpx.Client(base_url=server.http_url, timeout=60) as http:
        assert_refused(http.post("/v2/rerank", content=body), 413, "LIMIT_EXCEEDED", "server.max_message_bytes")
        chunked = http.post("/v2/rerank", content=iter([body[: 1 << 19]] * 4))  # no Content-Length
        assert_refused(chunked, 413, "LIMIT_EXCEEDED", "server.max_message_bytes")
        assert http.post("/v2/rerank", json={"query": "q", "documents": ["a"]}).status_code == 200


def test_a_caller_who_hangs_up_leaves_no_work_behind(small: tuple[Sidecar, list[httpx.Response]]) -> None:
    server, _ = small

    def counts() -> tuple[float, float]:
        return (
            server.metric("ragsidecar_inferred_inputs_total", model=CROSS),
            server.metric("ragsidecar_skipped_inputs_total", model=CROSS, reason="cancelled"),
        )

    inferred, skipped = counts()
    body = json.dumps({"query": "gone", "documents": [f"gone {i} {LONG_TEXT}" for i in range(25)]}).encode()
    host, port = server.http_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as caller:
        caller.sendall(
            b"POST /v2/rerank HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        while counts()[0] == inferred:  # its first pairs are running: hang up
            time.sleep(0.01)
    deadline = time.monotonic() + 60
    while sum(counts()) - inferred - skipped < 25:  # every pair either ran before the hang-up or was skipped
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    assert counts()[1] > skipped
    while not any("method=/v2/rerank code=499" in line for line in server.output):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_sigterm_drains_the_http_request_in_flight(make_sidecar) -> None:
    config = http_config(workers=1, max_batch_tokens=1024)
    config["server"]["shutdown_grace_s"] = 120.0  # a loaded machine must not turn the drain into a cancellation
    server = make_sidecar(config).start()
    outcome: dict = {}

    def call() -> None:
        documents = [f"{i} {LONG_TEXT}" for i in range(10)]
        outcome["response"] = httpx.post(
            f"{server.http_url}/v2/rerank", json={"query": "q", "documents": documents}, timeout=150
        )

    caller = threading.Thread(target=call)
    caller.start()
    while server.metric("ragsidecar_inferred_inputs_total", model=CROSS) < 2:
        time.sleep(0.02)
    server.signal(signal.SIGTERM)
    caller.join(150)
    assert outcome["response"].status_code == 200 and len(outcome["response"].json()["results"]) == 10
    assert server.process.wait(30) == 0
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.http_url}/health", timeout=5)


# --- The examples of docs/http.md ---


def curl_examples() -> list[str]:
    page = (REPO / "docs" / "http.md").read_text()
    return [block for block in re.findall(r"```sh\n(.*?)```", page, re.S) if block.startswith("curl ")]


def test_every_endpoint_has_a_curl_example() -> None:
    examples = "\n".join(curl_examples())
    for endpoint in ("/v2/rerank", "/v1/rerank", "/rerank", "/v1/embeddings", "/v1/models", "/health"):
        assert re.search(rf"8080{re.escape(endpoint)}\s", examples), endpoint


@pytest.mark.parametrize("example", curl_examples(), ids=lambda e: e.split()[1])
def test_the_documented_curl_examples_run(served: Sidecar, example: str) -> None:
    command = example.replace("http://127.0.0.1:8080", served.http_url)
    shell = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; {command}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RAGSIDECAR_TOKEN": ""},
    )
    assert shell.returncode == 0, shell.stderr
    answer = json.loads(shell.stdout)
    assert answer and "error" not in answer and "message" not in answer, answer
