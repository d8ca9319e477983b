"""The foundation through the real server: health, reflection, auth, shutdown, config errors, metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from sidecar import REPO, Sidecar, default_config, error_details, to_toml

from ragsidecar.v1 import reranker_pb2

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
RERANKER = "ragsidecar.v1.RerankerService"


def rerank_request(documents: int = 3, words: int = 20) -> reranker_pb2.RerankRequest:
    text = " ".join(["retrieval augmented generation with cross encoders"] * (words // 6 + 1))
    return reranker_pb2.RerankRequest(
        query="what is a cross encoder?",
        documents=[reranker_pb2.RerankDocument(id=f"d{i}", text=f"{i} {text}") for i in range(documents)],
    )


def test_health_is_not_serving_until_models_are_warm(make_sidecar) -> None:
    server = make_sidecar().start(wait_serving=False)
    watch = health_pb2_grpc.HealthStub(server.channel()).Watch(
        health_pb2.HealthCheckRequest(service=RERANKER), timeout=60
    )
    seen = []
    for response in watch:
        seen.append(response.status)
        if response.status == SERVING:
            watch.cancel()
            break
    assert seen[0] == NOT_SERVING and seen[-1] == SERVING
    for service in (
        "",
        RERANKER,
        "ragsidecar.v1.RetrievalService",
        "ragsidecar.v1.ChatKnowledgeService",
        f"{RERANKER}/ms-marco-MiniLM-L-12-v2",
        f"{RERANKER}/bge-small-en-v1.5",
    ):
        assert server.health(service) == SERVING, service


def test_reflection_lists_the_three_services(sidecar: Sidecar) -> None:
    database = ProtoReflectionDescriptorDatabase(sidecar.channel())
    services = set(database.get_services())
    assert {
        RERANKER,
        "ragsidecar.v1.RetrievalService",
        "ragsidecar.v1.ChatKnowledgeService",
        "grpc.health.v1.Health",
    } <= services
    rerank = database.FindFileContainingSymbol("ragsidecar.v1.RerankerService")
    assert rerank.package == "ragsidecar.v1"


def test_bearer_token_is_required_everywhere_but_health(make_sidecar) -> None:
    server = make_sidecar(env={"RAGSIDECAR_TOKEN": "s3cret-token"}).start()
    stub = server.reranker()
    request = rerank_request()
    for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", "s3cret-token"),)):
        with pytest.raises(grpc.RpcError) as caught:
            stub.Rerank(request, metadata=metadata, timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        info, _ = error_details(caught.value)
        assert info is not None and info.reason == "UNAUTHENTICATED"
    ok = stub.Rerank(request, metadata=(("authorization", "Bearer s3cret-token"),), timeout=30)
    assert len(ok.results) == 3
    assert server.health() == SERVING  # health needs no token
    database = ProtoReflectionDescriptorDatabase(server.channel())
    with pytest.raises(grpc.RpcError):
        database.get_services()  # reflection is a service like the others
    assert "s3cret-token" not in server.log()


def test_unix_socket_serves_beside_tcp(make_sidecar) -> None:
    server = make_sidecar(unix_socket=True).start()
    assert server.unix_address.startswith("unix:")
    response = server.reranker(server.channel(server.unix_address)).Rerank(rerank_request(), timeout=30)
    assert [r.id for r in response.results] and response.model == "ms-marco-MiniLM-L-12-v2"


def test_sigterm_drains_the_call_in_flight(make_sidecar) -> None:
    config = default_config()
    config["inference"].update(workers=1, cache_bytes=0)
    # A grace no machine runs out of: the call drains however busy the machine is (10 s did not, at load 16).
    config["server"]["shutdown_grace_s"] = 600.0
    server = make_sidecar(config).start()
    stub = server.reranker()
    big = rerank_request(documents=40, words=300)
    stub.Rerank(rerank_request(), timeout=30)
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["response"] = stub.Rerank(big, timeout=120)
        except grpc.RpcError as err:
            outcome["error"] = err

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 30
    while server.metric("ragsidecar_inferred_inputs_total", model="ms-marco-MiniLM-L-12-v2") < 10:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.signal(signal.SIGTERM)
    caller.join(60)
    assert "error" not in outcome, outcome.get("error")
    assert len(outcome["response"].results) == 40
    assert server.process.wait(30) == 0
    with pytest.raises(grpc.RpcError):
        stub.Rerank(rerank_request(), timeout=5)


def test_oversized_message_is_resource_exhausted(make_sidecar) -> None:
    config = default_config()
    config["server"]["max_message_bytes"] = 1 << 20
    server = make_sidecar(config).start()
    huge = reranker_pb2.RerankRequest(query="q", documents=[reranker_pb2.RerankDocument(text="x" * (2 << 20))])
    with pytest.raises(grpc.RpcError) as caught:
        server.reranker().Rerank(huge, timeout=30)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(server.reranker().Rerank(rerank_request(), timeout=30).results) == 3


def test_metrics_count_requests_by_method_and_code(sidecar: Sidecar) -> None:
    stub = sidecar.reranker()
    stub.ListModels(reranker_pb2.ListModelsRequest(), timeout=10)
    with pytest.raises(grpc.RpcError):
        stub.Rerank(reranker_pb2.RerankRequest(query=""), timeout=10)
    text = sidecar.metrics()
    assert 'ragsidecar_requests_total{code="OK",method="/ragsidecar.v1.RerankerService/ListModels"}' in text
    assert 'code="INVALID_ARGUMENT",method="/ragsidecar.v1.RerankerService/Rerank"' in text
    assert "ragsidecar_request_seconds_bucket" in text and "ragsidecar_queue_depth" in text
    assert "method=/ragsidecar.v1.RerankerService/ListModels code=OK" in sidecar.log()


def run_with_config(tmp_path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    environ = {k: v for k, v in os.environ.items() if k != "RAGSIDECAR_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "ragsidecar", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=environ,
    )


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c["server"].update(prot=1), "server.prot: unknown key"),
        (lambda c: c["inference"].update(workers="two"), "inference.workers: expected int"),
        (lambda c: c["models"][0].update(path="nowhere"), "models[0].path"),
        (lambda c: c["models"][1].update(kind="sparse"), "models[1].kind: 'sparse' is not one of"),
        (lambda c: c["models"].append(dict(c["models"][0], default=False)), "configured twice"),
        (lambda c: c["server"].update(host="0.0.0.0"), "server.host: '0.0.0.0' is reachable beyond this machine"),
    ],
)
def test_bad_config_refuses_to_start_and_names_the_key(tmp_path, mutate, expected) -> None:
    config = default_config()
    mutate(config)
    done = run_with_config(tmp_path, to_toml(config))
    assert done.returncode == 2
    assert expected in done.stderr


def test_config_that_is_not_toml_refuses_to_start(tmp_path) -> None:
    done = run_with_config(tmp_path, "[server\nport = 1")
    assert done.returncode == 2 and "not valid TOML" in done.stderr
