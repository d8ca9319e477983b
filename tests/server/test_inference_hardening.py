"""Hostile sizes, callers that leave, batching costs and worker failures (issue 10, #6 and the queue review).

Through the real server where the behaviour shows in statuses or metrics; the queue's worker
supervision and timers are exercised on the real queue and model in-process, where a crash cannot be
provoked from outside.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import signal
import time
import weakref
from pathlib import Path

import grpc
import numpy as np
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument
from prometheus_client import REGISTRY
from rerank_helpers import docs, rerank_load
from sidecar import MODELS, Sidecar, default_config, error_details

from ragsidecar.inference.backend import OnnxBackend
from ragsidecar.inference.batching import BatchQueue
from ragsidecar.inference.tokenization import ModelInput, TextEncoder
from ragsidecar.reranking import MAX_DOCUMENT_CHARS, MAX_DOCUMENTS_CHARS, MAX_QUERY_CHARS
from ragsidecar.v1 import reranker_pb2

CROSS = "ms-marco-MiniLM-L-12-v2"
WINDOW = reranker_pb2.LONG_DOCUMENT_STRATEGY_WINDOW


def refused(server: Sidecar, request: reranker_pb2.RerankRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        server.reranker().Rerank(request, timeout=120)
    return caught.value


def wait_for(condition, what: str, server: Sidecar, limit_s: float = 60) -> None:
    """Polls until the condition holds (a cap against hanging, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}:\n{server.log()[-3000:]}"
        time.sleep(0.05)


@pytest.mark.parametrize(
    "fields, violated",
    [
        (dict(query="q" * (40 * 1024 * 1024), documents=docs("d")), "query"),
        (dict(query="q " * (MAX_QUERY_CHARS // 2 + 1), documents=docs("d")), "query"),
        (dict(query="q", documents=docs("fine", "x" * (MAX_DOCUMENT_CHARS + 1))), "documents[1].text"),
        (
            dict(
                query="q",
                documents=docs(
                    *["word " * (MAX_DOCUMENT_CHARS // 5)] * (MAX_DOCUMENTS_CHARS // MAX_DOCUMENT_CHARS + 1)
                ),
            ),
            "documents",
        ),
    ],
)
def test_oversized_requests_are_refused_by_size_before_tokenizing(sidecar: Sidecar, fields, violated) -> None:
    """LIMIT_EXCEEDED (not the tokenizer's 'query too long') shows the refusal came from the size check."""
    before = sidecar.metric("ragsidecar_inferred_inputs_total")
    err = refused(sidecar, reranker_pb2.RerankRequest(**fields))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    info, violations = error_details(err)
    assert info.reason == "LIMIT_EXCEEDED"
    assert [f for f, _ in violations] == [violated]
    assert sidecar.metric("ragsidecar_inferred_inputs_total") == before
    assert (
        len(
            sidecar.reranker()
            .Rerank(reranker_pb2.RerankRequest(query="still serving?", documents=docs("yes")), timeout=60)
            .results
        )
        == 1
    )


def test_texts_at_the_limits_are_scored(sidecar: Sidecar) -> None:
    # One word of 16,384 characters is one unknown token: within every limit and the model's window.
    response = sidecar.reranker().Rerank(
        reranker_pb2.RerankRequest(query="a" * MAX_QUERY_CHARS, documents=docs("b" * MAX_DOCUMENT_CHARS, "short")),
        timeout=120,
    )
    assert sorted(r.index for r in response.results) == [0, 1]


def test_a_long_document_scores_as_its_head_does(sidecar: Sidecar) -> None:
    """Only the head a window reaches is tokenized: the score is the one of any longer prefix."""
    query = "Which enzyme converts angiotensin I to angiotensin II?"
    answer = "Angiotensin-converting enzyme (ACE) converts angiotensin I into angiotensin II. "
    body = "".join(
        f"Paragraph {i} describes unrelated  weather\tpatterns over the northern sea.\n" for i in range(40000)
    )
    whole = answer * 3 + body  # about 3 MiB
    head = whole[:60_000]  # far more than four 512-token windows
    for strategy in (WINDOW, reranker_pb2.LONG_DOCUMENT_STRATEGY_TRUNCATE):
        response = sidecar.reranker().Rerank(
            reranker_pb2.RerankRequest(query=query, documents=docs(whole, head), long_document_strategy=strategy),
            timeout=120,
        )
        by_index = {r.index: r for r in response.results}
        assert by_index[0].raw_score == by_index[1].raw_score and by_index[0].best_window == by_index[1].best_window
        assert response.usage.truncated_documents == 2


def test_a_caller_that_leaves_stops_tokenization_and_runs_nothing(make_sidecar) -> None:
    config = default_config()
    config["inference"].update(cache_bytes=0, max_documents_per_request=1600)
    server = make_sidecar(config).start()
    stub = server.reranker()
    paragraph = "Reranking long documents costs tokenization before any pair reaches the model. "
    heavy = reranker_pb2.RerankRequest(
        query="what does reranking cost?",
        long_document_strategy=WINDOW,
        documents=docs(*[f"{i} {paragraph * 250}" for i in range(1600)]),
    )
    before = server.metric("ragsidecar_inferred_inputs_total", model=CROSS)
    tokenizing = functools.partial(server.metric, "ragsidecar_tokenizations_running", model=CROSS)
    stopped = functools.partial(server.metric, "ragsidecar_stopped_work_total", model=CROSS)
    pending = stub.Rerank.future(heavy, timeout=300)
    wait_for(lambda: tokenizing() == 1, "the call was never tokenized", server)
    assert pending.cancel()
    wait_for(lambda: tokenizing() == 0, "the tokenization of a cancelled call never stopped", server)
    assert server.metric("ragsidecar_stopped_work_total", model=CROSS, reason="cancelled") == 1
    late = stub.Rerank.future(heavy, timeout=2)
    assert late.exception(timeout=300).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(
        lambda: tokenizing() == 0 and stopped() == 2,
        "the tokenization of a call past its deadline never stopped",
        server,
    )
    assert server.metric("ragsidecar_inferred_inputs_total", model=CROSS) == before
    assert len(stub.Rerank(reranker_pb2.RerankRequest(query="q", documents=docs("d", "e")), timeout=60).results) == 2


def test_padded_batches_are_charged_rows_times_their_widest_row(make_sidecar) -> None:
    """max_batch_tokens 1024: a 512-token pair and 40 short ones fit by real tokens (~750), but padded to
    512 only two rows fit, so the scheduler must split them into two batches."""
    config = default_config()
    config["inference"].update(workers=1, max_batch_tokens=1024, cache_bytes=0, batch_mode="padded")
    server = make_sidecar(config).start()
    batches = functools.partial(server.metric, "ragsidecar_batch_inputs_count", model=CROSS)
    small = functools.partial(server.metric, "ragsidecar_batch_inputs_bucket", model=CROSS, le="2.0")
    before, small_before = batches(), small()
    response = server.reranker().Rerank(
        reranker_pb2.RerankRequest(query="q", documents=docs("word " * 2000, *[f"doc {i}" for i in range(40)])),
        timeout=60,
    )
    assert len(response.results) == 41 and response.usage.truncated_documents == 1
    assert batches() - before == 2 and small() - small_before == 1


def failures(model: str) -> float:
    return REGISTRY.get_sample_value("ragsidecar_inference_failures_total", {"model": model}) or 0.0


def real_inputs(encoder: TextEncoder, texts: list[str]) -> list[ModelInput]:
    return [encoder.single(e)[0] for e in encoder.encode(texts)]


@pytest.fixture(scope="module")
def bi_encoder() -> tuple[TextEncoder, OnnxBackend]:
    folder = MODELS / "bge-small-en-v1.5"
    return TextEncoder(folder / "tokenizer.json", 512), OnnxBackend(folder / "model.onnx", 1, 1)


def test_a_failing_worker_fails_its_requests_and_keeps_serving(bi_encoder) -> None:
    encoder, backend = bi_encoder

    async def scenario() -> None:
        queue = BatchQueue("supervised", backend, workers=1, max_batch_tokens=4096, max_queued_inputs=100)
        try:
            good = real_inputs(encoder, ["a good input", "another one"])
            before = failures("supervised")
            unsized = ModelInput(np.int64(7), np.int64(0))  # len() fails while the worker picks a batch
            with pytest.raises(TypeError):
                await queue.submit([unsized])
            out_of_vocabulary = ModelInput(np.array([10**9], dtype=np.int64), np.zeros(1, dtype=np.int64))
            with pytest.raises(InvalidArgument):  # onnxruntime refuses the run
                await queue.submit([out_of_vocabulary])
            assert failures("supervised") - before == 2
            result = await asyncio.wait_for(queue.submit(good), 60)
            assert len(result.outputs) == 2 and queue.depth == 0
        finally:
            await queue.close()
        with pytest.raises(Exception) as closed:
            await queue.submit(good)
        assert getattr(closed.value, "reason", "") == "MODEL_NOT_READY"

    asyncio.run(scenario())


def test_a_finished_job_is_not_kept_alive_by_its_deadline_timer(bi_encoder) -> None:
    encoder, backend = bi_encoder

    async def scenario() -> bool:
        queue = BatchQueue("timers", backend, workers=1, max_batch_tokens=4096, max_queued_inputs=100)
        try:
            inputs = real_inputs(encoder, ["an input whose job finishes long before its deadline"])
            watched = weakref.ref(inputs[0])
            loop = asyncio.get_running_loop()
            await queue.submit(inputs, deadline=loop.time() + 3600)
            del inputs
            gc.collect()
            return watched() is None  # checked while the loop, and any timer it holds, still lives
        finally:
            await queue.close()

    assert asyncio.run(scenario())


def test_an_unloaded_model_releases_its_session(tmp_path: Path) -> None:
    """A reload retires the replaced model; once closed, nothing holds its onnxruntime session."""
    from sidecar import to_toml

    from ragsidecar.config_loading import load_config
    from ragsidecar.inference.registry import ModelRegistry

    config = default_config()
    path = tmp_path / "ragsidecar.toml"
    path.write_text(to_toml(config))
    first = load_config(path)
    config["models"][0]["max_length"] = 384
    path.write_text(to_toml(config))
    second = load_config(path)

    async def scenario() -> bool:
        registry = ModelRegistry(first)
        await registry.start()
        try:
            watched = weakref.ref(registry.get(CROSS).backend._session)
            assert await registry.reload(second)
            for _ in range(600):
                if watched() is None:
                    return True
                await asyncio.sleep(0.05)
            return False
        finally:
            await registry.close()

    assert asyncio.run(scenario())


def test_replaced_models_are_unloaded_after_their_last_request(make_sidecar) -> None:
    """Hot swaps under load: each replaced model closes (session released) once its requests are done."""
    config = default_config()
    config["inference"]["cache_bytes"] = 0
    config["server"]["config_poll_s"] = 0.0  # SIGHUP alone reloads
    server = make_sidecar(config).start()
    loaded = functools.partial(server.metric, "ragsidecar_loaded_model_instances")

    def reloaded(generation: int) -> bool:
        return server.reranker().ListModels(reranker_pb2.ListModelsRequest(), timeout=30).generation >= generation

    assert loaded() == 2
    with rerank_load(server, clients=3, documents=16) as outcomes:
        for generation, max_length in enumerate((384, 512, 256), start=1):
            server.config["models"][0]["max_length"] = max_length
            server.write_config()
            server.signal(1)  # SIGHUP
            wait_for(functools.partial(reloaded, generation), "the reload never finished", server)
    wait_for(lambda: loaded() == 2, "replaced models were never unloaded", server)
    assert outcomes and set(outcomes) == {"ok"}, {o: outcomes.count(o) for o in set(outcomes)}


def test_memory_of_refused_40_mib_requests_is_given_back(make_sidecar) -> None:
    """A refused request's memory is freed when it is answered (an exception raised to abort the call kept it in a
    reference cycle: six of these requests held about 800 MiB until a full garbage collection came), and the heap
    pages it took go back to the system (glibc keeps them resident otherwise). 40 MiB: the largest the 48 MiB
    message cap lets through to the size checks."""
    server = make_sidecar().start()
    stub = server.reranker(server.channel(**{"grpc.max_send_message_length": 128 << 20}))
    one_huge = reranker_pb2.RerankRequest(query="q", documents=[reranker_pb2.RerankDocument(text="x" * (40 << 20))])
    many = reranker_pb2.RerankRequest(query="q", documents=[reranker_pb2.RerankDocument(text="word " * 8_000)] * 1000)
    before = server.rss_mib()
    for request in (one_huge, many) * 3:
        with pytest.raises(grpc.RpcError) as caught:
            stub.Rerank(request, timeout=120)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    wait_for(lambda: server.rss_mib() - before < 100, "the requests' memory stayed resident", server)
    assert stub.Rerank(reranker_pb2.RerankRequest(query="q", documents=docs("a", "b")), timeout=60).results


@pytest.mark.parametrize("when", ["while loading models", "while serving"])
def test_sigterm_stops_cleanly_without_error_lines(make_sidecar, when: str) -> None:
    """A normal stop logs no ERROR (alerting reads those as failures): stopped while the models load, the load is
    abandoned and what had loaded is closed, instead of inference workers being cancelled at the loop's teardown."""
    server = make_sidecar().start(wait_serving=when == "while serving")
    if when == "while serving":
        assert (
            server.reranker()
            .Rerank(reranker_pb2.RerankRequest(query="q", documents=docs("a", "b")), timeout=60)
            .results
        )
    else:
        wait_for(lambda: "loading model" in server.log(), "no model started loading", server)
    server.signal(signal.SIGTERM)
    assert server.process and server.process.wait(60) == 0
    time.sleep(0.5)  # the reader thread takes the last lines
    assert not [line for line in server.output if " ERROR " in line or "Traceback" in line], server.log()
