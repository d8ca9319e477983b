"""OpenTelemetry tracing through the real server, exported to a real OTLP/gRPC receiver on loopback."""

from __future__ import annotations

import json
import re
import shlex
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_receiver import WAIT_S, Receiver, start
from retrieval_helpers import PRINCIPAL, SCOPE, entry, retrieval_config, target
from sidecar import REPO, Sidecar, free_port

from ragsidecar.tracing import wanted
from ragsidecar.v1 import reranker_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

# The host's span: what a traced host sends in its W3C traceparent.
HOST_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HOST_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{HOST_TRACE}-{HOST_SPAN}-01"
DOCS = REPO / "docs" / "tracing.md"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    servicer = Receiver()
    server = start(servicer)
    try:
        yield servicer
    finally:
        server.stop(None)


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", path.read_text(), re.MULTILINE | re.DOTALL)


def tracing_env(port: int) -> dict[str, str]:
    """The variables of docs/tracing.md's command line (they alone turn tracing on), the endpoint the receiver's;
    short batch delays make the spans arrive quickly."""
    (command,) = blocks(DOCS, "bash")
    words = shlex.split(command)
    env = dict(word.split("=", 1) for word in words if "=" in word)
    assert words[len(env) :] == ["ragsidecar", "serve"], "the sidecar is started as documented"
    return {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def traced_sidecar(
    tmp_path_factory: pytest.TempPathFactory, knowledge_root: Path, receiver: Receiver
) -> Iterator[Sidecar]:
    config = retrieval_config(knowledge_root, tmp_path_factory.mktemp("traced-data"))
    config["inference"]["cache_bytes"] = 0
    config["http"] = {"port": free_port()}
    server = Sidecar(tmp_path_factory.mktemp("traced"), config, env=tracing_env(receiver.port))
    try:
        yield server.start()
    finally:
        server.stop()


def named(spans: list[trace_pb2.Span], name: str) -> list[trace_pb2.Span]:
    return [s for s in spans if s.name == name]


def attributes(span: trace_pb2.Span) -> dict[str, object]:
    values = {}
    for attribute in span.attributes:
        kind = attribute.value.WhichOneof("value")
        values[attribute.key] = getattr(attribute.value, kind) if kind else None
    return values


def beneath(spans: list[trace_pb2.Span], top: trace_pb2.Span, span: trace_pb2.Span) -> bool:
    """Whether `span` descends from `top` within the trace."""
    by_id = {s.span_id: s for s in spans}
    parent = span.parent_span_id
    while parent and parent in by_id:
        if parent == top.span_id:
            return True
        parent = by_id[parent].parent_span_id
    return False


def rpc_span_of(spans: list[trace_pb2.Span], method: str) -> trace_pb2.Span:
    (rpc,) = named(spans, method)
    assert rpc.kind == trace_pb2.Span.SPAN_KIND_SERVER
    return rpc


def has_all(*names: str) -> Callable[[list[trace_pb2.Span]], bool]:
    return lambda spans: all(named(spans, n) for n in names)


def rerank_stages_under_rpc(spans: list[trace_pb2.Span], method: str, parent_span: str) -> trace_pb2.Span:
    """Asserts the RPC span continues the caller's span and the rerank stages lie beneath it; returns it."""
    rpc = rpc_span_of(spans, method)
    assert rpc.parent_span_id.hex() == parent_span
    for stage in ("rerank", "tokenize", "queue wait", "inference batch"):
        assert named(spans, stage), f"no {stage!r} span in {[s.name for s in spans]}"
        assert all(beneath(spans, rpc, s) for s in named(spans, stage)), stage
    return rpc


def test_a_call_continues_the_callers_trace_with_its_stage_spans(traced_sidecar: Sidecar, receiver: Receiver) -> None:
    request = reranker_pb2.RerankRequest(
        query="how do cells divide",
        documents=[
            reranker_pb2.RerankDocument(id="a", text="Mitosis is how a cell divides into two identical cells."),
            reranker_pb2.RerankDocument(id="b", text="The stock market closed higher today."),
        ],
    )
    traced_sidecar.reranker().Rerank(request, timeout=30, metadata=[("traceparent", TRACEPARENT)])
    method = "ragsidecar.v1.RerankerService/Rerank"
    spans = receiver.trace(HOST_TRACE, has_all(method, "rerank", "tokenize", "queue wait", "inference batch"))
    rpc = rerank_stages_under_rpc(spans, method, HOST_SPAN)
    assert attributes(rpc)["rpc.grpc.status_code"] == "OK"
    (rerank,) = named(spans, "rerank")
    assert {
        "ragsidecar.model": "ms-marco-MiniLM-L-12-v2",
        "ragsidecar.pairs": 2,
        "ragsidecar.cached_pairs": 0,
    }.items() <= attributes(rerank).items()
    (tokenize,) = named(spans, "tokenize")
    assert attributes(tokenize)["ragsidecar.tokens"] > 10
    batch = named(spans, "inference batch")[0]
    assert attributes(batch)["ragsidecar.inputs"] >= 1 and attributes(batch)["ragsidecar.tokens"] > 0
    services = {service for service, s in receiver.spans if s.trace_id.hex() == HOST_TRACE}
    assert services == {"ragsidecar"}


def test_search_spans_index_build_retrieval_stages_and_reranking(traced_sidecar: Sidecar, receiver: Receiver) -> None:
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    guide = entry("guide", "DIRECTORY", "SEARCH", "guide", top_k=3, search=pb.SearchOptions(rerank=True, candidates=5))
    search = pb.SearchRequest(
        principal=PRINCIPAL, scope=SCOPE, target=target([guide]), query="how long does express shipping take"
    )
    retrieval = retrieval_pb2_grpc.RetrievalServiceStub(traced_sidecar.channel())
    assert retrieval.Search(search, timeout=120, metadata=[("traceparent", f"00-{trace_id}-{parent}-01")]).hits
    method = "ragsidecar.v1.RetrievalService/Search"
    stages = ("index build", "retrieve", "dense search", "lexical search", "fusion", "rerank", "inference batch")
    spans = receiver.trace(trace_id, has_all(method, *stages))
    rpc = rpc_span_of(spans, method)
    assert rpc.parent_span_id.hex() == parent
    for stage in stages:
        assert named(spans, stage) and all(beneath(spans, rpc, s) for s in named(spans, stage)), stage
    assert attributes(named(spans, "index build")[0])["ragsidecar.chunks"] > 0
    assert attributes(named(spans, "retrieve")[0])["ragsidecar.hits"] > 0


def test_an_http_api_request_continues_the_callers_trace(traced_sidecar: Sidecar, receiver: Receiver) -> None:
    trace_id, parent = "3d1e5f7a9b0c2d4e6f8a0b1c3d5e7f9a", "c1d2e3f4a5b6c7d8"
    body = json.dumps({"query": "how do cells divide", "documents": ["Mitosis divides a cell.", "Stocks rose."]})
    request = urllib.request.Request(
        f"{traced_sidecar.http_url}/v2/rerank",
        body.encode(),
        method="POST",
        headers={"content-type": "application/json", "traceparent": f"00-{trace_id}-{parent}-01"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    spans = receiver.trace(trace_id, has_all("POST /v2/rerank", "rerank", "inference batch"))
    (http,) = named(spans, "POST /v2/rerank")
    assert http.parent_span_id.hex() == parent and attributes(http)["http.response.status_code"] == 200
    assert all(beneath(spans, http, s) for s in named(spans, "rerank") + named(spans, "inference batch"))


def logged_with(server: Sidecar, trace_id: str) -> list[dict]:
    """The JSON log lines of a trace (the output is read on a thread: waits for them to be read)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        lines = [json.loads(line) for line in list(server.output) if line.startswith("{")]
        found = [line for line in lines if line.get("trace_id") == trace_id]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_json_log_lines_carry_the_calls_trace_and_span_ids(traced_sidecar: Sidecar) -> None:
    trace_id = "5b8efff798038103d269b633813fc60c"
    request = reranker_pb2.RerankRequest(query="q", documents=[reranker_pb2.RerankDocument(text="a document")])
    traced_sidecar.reranker().Rerank(request, timeout=30, metadata=[("traceparent", f"00-{trace_id}-{HOST_SPAN}-01")])
    access = logged_with(traced_sidecar, trace_id)
    assert access and access[-1]["logger"] == "ragsidecar.requests"
    assert "method=/ragsidecar.v1.RerankerService/Rerank code=OK" in access[-1]["message"]
    assert len(access[-1]["span_id"]) == 16 and access[-1]["span_id"] != HOST_SPAN


def test_the_documented_client_snippets_are_the_ones_the_client_suites_check() -> None:
    """docs/tracing.md's Java and TypeScript snippets are the clients' README blocks, which their README tests
    compile (Java) and run against a sidecar (TypeScript); the end-to-end tracing tests of each client use the same
    interceptors (TracingTest.java, test/tracing.test.ts)."""
    for language, readme in (("java", "clients/java/README.md"), ("ts", "clients/typescript/README.md")):
        (snippet,) = blocks(DOCS, language)
        assert snippet in blocks(REPO / readme, language), f"docs/tracing.md's {language} block differs from {readme}'s"


def test_the_variables_that_turn_tracing_on() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    assert wanted(endpoint) and wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"})
    assert wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted({}) and not wanted({"OTEL_SERVICE_NAME": "ragsidecar"})
    assert not wanted({**endpoint, "OTEL_TRACES_EXPORTER": "none"})
    assert not wanted({**endpoint, "OTEL_SDK_DISABLED": "true"})
