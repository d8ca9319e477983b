"""The transport edge through the real server: undecodable requests, bearer credentials, status sizes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import struct_pb2
from google.protobuf.internal import encoder
from grpc_health.v1 import health_pb2
from sidecar import Sidecar, default_config, error_details, status_wire_bytes

from ragsidecar.v1 import chat_knowledge_pb2, common_pb2, reranker_pb2, retrieval_pb2, retrieval_pb2_grpc

SERVICES = [
    file.services_by_name[name]
    for file, name in (
        (reranker_pb2.DESCRIPTOR, "RerankerService"),
        (retrieval_pb2.DESCRIPTOR, "RetrievalService"),
        (chat_knowledge_pb2.DESCRIPTOR, "ChatKnowledgeService"),
    )
]
SIDECAR_METHODS = [f"/{service.full_name}/{method.name}" for service in SERVICES for method in service.methods]
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
PRINCIPAL = common_pb2.Principal(id="agent-host")
SCOPE = common_pb2.Scope(tenant="acme", session="s1")
# What a client will take in response headers: grpc's default limit on metadata.
CLIENT_METADATA_LIMIT = 8 * 1024


def varint(value: int) -> bytes:
    return encoder._VarintBytes(value)


def length_delimited(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def groups_nested(depth: int) -> bytes:
    """An unknown group field nested `depth` deep: any message type parses it, up to the decoder's depth."""
    return varint(1000 << 3 | 3) * depth + varint(1000 << 3 | 4) * depth


def values_nested(depth: int) -> bytes:
    """An EnforceRequest whose one param's Value nests lists `depth` deep."""
    value = struct_pb2.Value(number_value=1).SerializeToString()
    for _ in range(depth):
        value = length_delimited(6, length_delimited(1, value))
    return length_delimited(6, length_delimited(1, b"p") + length_delimited(2, value))


UNDECODABLE = {
    "corrupt wire bytes": b"\xff\xff\xff\xff",
    "truncated field": b"\x12\x05ab",
    # Field 2 is a string in every request here but ListModels (which keeps it as an unknown field).
    "invalid UTF-8": b"\x12\x02\xc3\x28",
    "nesting deeper than the decoder allows": groups_nested(150),
}


def raw_unary(channel: grpc.Channel, method: str, payload: bytes, metadata=()) -> grpc.RpcError:
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as caught:
        call(payload, timeout=30, metadata=metadata)
    return caught.value


def log_lines_of(server: Sidecar, before: int, methods: list[str]) -> dict[str, list[str]]:
    """Each method's log lines since line `before`, once each has one: the server writes its line after the
    client has the status, and a thread reads the log, so the lines can come a little later."""
    deadline = time.monotonic() + 30
    while True:
        lines = {m: [line for line in server.output[before:] if f"method={m} " in line] for m in methods}
        if all(lines.values()) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def assert_invalid_request(err: grpc.RpcError) -> None:
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    info, _ = error_details(err)
    assert info is not None and info.reason == "INVALID_REQUEST"
    assert "could not be decoded" in err.details()


@pytest.mark.parametrize("kind", sorted(UNDECODABLE))
def test_undecodable_request_is_invalid_argument_on_every_method(sidecar: Sidecar, kind: str) -> None:
    payload = UNDECODABLE[kind]
    channel = sidecar.channel()
    methods = [
        m
        for m in SIDECAR_METHODS
        # ListModelsRequest has no field 2: there those bytes are a valid unknown field.
        if not (kind == "invalid UTF-8" and m.endswith("/ListModels"))
    ]
    before = len(sidecar.output)
    for method in methods:
        assert_invalid_request(raw_unary(channel, method, payload))
    assert sidecar.health() == health_pb2.HealthCheckResponse.SERVING
    for method, lines in log_lines_of(sidecar, before, methods).items():
        assert len(lines) == 1 and "code=INVALID_ARGUMENT" in lines[0], (method, lines)
    assert "Traceback" not in sidecar.log()


def test_a_refused_call_sends_no_message_before_its_status(sidecar: Sidecar) -> None:
    """Read as a stream, a refused unary call yields nothing before its status: a client that takes the first
    message as the answer (an async observer completing on its first message) must not see it succeed."""
    channel = sidecar.channel()
    refused = {  # a domain error, and an error of the interceptors in front of the servicers
        "/ragsidecar.v1.RerankerService/Rerank": reranker_pb2.RerankRequest(
            model="no-such-model", query="q", documents=[reranker_pb2.RerankDocument(text="d")]
        ).SerializeToString(),
        "/ragsidecar.v1.RetrievalService/Search": UNDECODABLE["corrupt wire bytes"],
    }
    for method, payload in refused.items():
        stream = channel.unary_stream(method, request_serializer=None, response_deserializer=None)
        received = []
        with pytest.raises(grpc.RpcError) as caught:
            for message in stream(payload, timeout=30):
                received.append(message)
        assert caught.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), method
        assert received == [], method


def test_value_nested_too_deep_is_invalid_argument(sidecar: Sidecar) -> None:
    method = "/ragsidecar.v1.RetrievalService/Enforce"
    retrieval_pb2.EnforceRequest.FromString(values_nested(20))  # the same shape, shallower, decodes
    assert_invalid_request(raw_unary(sidecar.channel(), method, values_nested(200)))
    assert "Traceback" not in sidecar.log()


def test_health_and_reflection_refuse_undecodable_requests(sidecar: Sidecar) -> None:
    channel = sidecar.channel()
    before = len(sidecar.output)
    assert_invalid_request(raw_unary(channel, HEALTH_CHECK, b"\x0a\x02\xc3\x28"))
    watch = channel.unary_stream(HEALTH_WATCH, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as caught:
        list(watch(b"\xff\xff\xff", timeout=30))
    assert_invalid_request(caught.value)
    reflection = channel.stream_stream(REFLECTION, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as caught:
        list(reflection(iter([b"\xff\xff\xff"]), timeout=30))
    assert_invalid_request(caught.value)
    for method, lines in log_lines_of(sidecar, before, [HEALTH_CHECK, HEALTH_WATCH, REFLECTION]).items():
        assert len(lines) == 1 and "code=INVALID_ARGUMENT" in lines[0], (method, lines)
    assert "Traceback" not in sidecar.log()
    assert sidecar.health() == health_pb2.HealthCheckResponse.SERVING


TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    config = default_config()
    config["inference"]["cache_bytes"] = 0
    server = Sidecar(tmp_path_factory.mktemp("guarded"), config, env={"RAGSIDECAR_TOKEN": TOKEN})
    try:
        yield server.start()
    finally:
        server.stop()


LIST_MODELS = "/ragsidecar.v1.RerankerService/ListModels"


@pytest.mark.parametrize("credentials", [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"bEaReR  {TOKEN}"])
def test_bearer_scheme_is_case_insensitive(guarded: Sidecar, credentials: str) -> None:
    stub = guarded.reranker()
    response = stub.ListModels(reranker_pb2.ListModelsRequest(), metadata=(("authorization", credentials),), timeout=10)
    assert response.models


@pytest.mark.parametrize(
    "metadata, why",
    [
        ((), "missing bearer token"),
        ((("authorization", f"Basic {TOKEN}"),), "not a bearer token"),
        ((("authorization", TOKEN),), "not a bearer token"),
        ((("authorization", f"Bearer {TOKEN}x"),), "wrong bearer token"),
        ((("authorization", f"Bearer {TOKEN[:-1]}"),), "wrong bearer token"),
        ((("authorization", f"Bearer {TOKEN}"), ("authorization", f"Bearer {TOKEN}")), "more than one"),
        ((("authorization", f"Bearer {TOKEN}"), ("authorization", "Bearer other")), "more than one"),
    ],
)
def test_refused_credentials_are_unauthenticated(guarded: Sidecar, metadata, why: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        guarded.reranker().ListModels(reranker_pb2.ListModelsRequest(), metadata=metadata, timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    info, _ = error_details(caught.value)
    assert info is not None and info.reason == "UNAUTHENTICATED"
    assert why in caught.value.details()


def test_undecodable_request_without_credentials_is_unauthenticated(guarded: Sidecar) -> None:
    """An unauthenticated caller learns nothing about its bytes: they are not even decoded."""
    channel = guarded.channel()
    for payload in UNDECODABLE.values():
        err = raw_unary(channel, "/ragsidecar.v1.RerankerService/Rerank", payload)
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    err = raw_unary(
        channel,
        "/ragsidecar.v1.RerankerService/Rerank",
        UNDECODABLE["corrupt wire bytes"],
        metadata=(("authorization", f"bearer {TOKEN}"),),
    )
    assert_invalid_request(err)
    assert TOKEN not in guarded.log() and "Traceback" not in guarded.log()


def assert_fits(err: grpc.RpcError, code: grpc.StatusCode) -> None:
    assert err.code() == code, (err.code(), err.details())
    assert status_wire_bytes(err) < CLIENT_METADATA_LIMIT
    info, _ = error_details(err)
    assert info is not None  # the real status arrived, with its details


def assert_violations_capped(err: grpc.RpcError, at_least: int) -> None:
    """The first violations, then one saying how many more; ErrorInfo counts the ones left out."""
    info, violations = error_details(err)
    assert 1 < len(violations) <= 21
    omitted = int(info.metadata["omitted_violations"])
    assert violations[-1] == ("", f"{omitted} more violations not shown")
    assert omitted + len(violations) - 1 >= at_least


def test_ten_thousand_unknown_names_get_a_status_that_fits(sidecar: Sidecar) -> None:
    names = [f"unknown-knowledge-{i:05d}-" + "n" * 40 for i in range(10_000)]
    request = retrieval_pb2.RequireLoadedRequest(
        principal=PRINCIPAL, scope=SCOPE, target=retrieval_pb2.Target(name="t"), names=names
    )
    with pytest.raises(grpc.RpcError) as caught:
        retrieval_stub(sidecar).RequireLoaded(request, timeout=60)
    assert_fits(caught.value, grpc.StatusCode.INVALID_ARGUMENT)
    assert_violations_capped(caught.value, 10_000)


def test_hundreds_of_long_violations_get_a_status_that_fits(sidecar: Sidecar) -> None:
    documents = [retrieval_pb2.MemoryDocument(id=f"{i}-" + "é" * 300, text=" ") for i in range(900)]
    request = retrieval_pb2.UpsertDocumentsRequest(
        principal=PRINCIPAL, scope=SCOPE, knowledge="notes", documents=documents
    )
    with pytest.raises(grpc.RpcError) as caught:
        retrieval_stub(sidecar).UpsertDocuments(request, timeout=60)
    assert_fits(caught.value, grpc.StatusCode.INVALID_ARGUMENT)
    _, violations = error_details(caught.value)
    assert all(len(f.encode()) <= 200 and len(d.encode()) <= 200 for f, d in violations)
    assert_violations_capped(caught.value, 900)


def test_long_path_gets_a_status_that_fits(sidecar: Sidecar) -> None:
    path = "/" + "p" * 9000 + "é" * 3000
    entry = retrieval_pb2.KnowledgeEntry(
        name="long", type=retrieval_pb2.KNOWLEDGE_TYPE_FILE, use=retrieval_pb2.KNOWLEDGE_USE_SEARCH, path=path
    )
    request = retrieval_pb2.RequireReadyRequest(
        principal=PRINCIPAL, scope=SCOPE, target=retrieval_pb2.Target(name="t", knowledge=[entry] * 30)
    )
    with pytest.raises(grpc.RpcError) as caught:
        retrieval_stub(sidecar).RequireReady(request, timeout=60)
    assert caught.value.code() not in (
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ), caught.value.details()
    assert_fits(caught.value, caught.value.code())


def test_long_model_name_gets_a_status_that_fits(sidecar: Sidecar) -> None:
    request = reranker_pb2.RerankRequest(
        model="m" * 9000 + "\u202e" * 3000, query="q", documents=[reranker_pb2.RerankDocument(text="d")]
    )
    with pytest.raises(grpc.RpcError) as caught:
        sidecar.reranker().Rerank(request, timeout=30)
    assert_fits(caught.value, grpc.StatusCode.NOT_FOUND)


def retrieval_stub(server: Sidecar) -> retrieval_pb2_grpc.RetrievalServiceStub:
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel())
