"""RerankerService through the real server with the real models."""

from __future__ import annotations

import concurrent.futures
import functools
import random
import shutil
import time

import grpc
import ir_data
import pytest
from rerank_helpers import docs, rerank_load
from sidecar import MODELS, Sidecar, default_config, error_details

from ragsidecar.v1 import reranker_pb2

CROSS = "ms-marco-MiniLM-L-12-v2"
BI = "bge-small-en-v1.5"


def scifact_cases(count: int, negatives: int, seed: int = 7) -> list[tuple[str, str, list[str]]]:
    """(query, relevant document, random other documents) for judged SciFact test queries."""
    corpus, queries, judged = ir_data.corpus("scifact"), ir_data.queries("scifact"), ir_data.qrels("scifact")
    ids = sorted(corpus)
    rng = random.Random(seed)
    cases = []
    for query_id in sorted(judged)[:count]:
        relevant = next(iter(judged[query_id]))
        others = [corpus[d] for d in rng.sample(ids, negatives) if d not in judged[query_id]]
        cases.append((queries[query_id], corpus[relevant], others))
    return cases


def rerank(server: Sidecar, query: str, documents: list[reranker_pb2.RerankDocument], **fields):
    return server.reranker().Rerank(reranker_pb2.RerankRequest(query=query, documents=documents, **fields), timeout=60)


def raised(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_list_models_names_every_configured_model(sidecar: Sidecar) -> None:
    listed = sidecar.reranker().ListModels(reranker_pb2.ListModelsRequest(), timeout=10)
    by_id = {m.id: m for m in listed.models}
    assert list(by_id) == [CROSS, BI]
    assert by_id[CROSS].kind == reranker_pb2.MODEL_KIND_CROSS_ENCODER and by_id[CROSS].is_default
    assert by_id[BI].kind == reranker_pb2.MODEL_KIND_BI_ENCODER and not by_id[BI].is_default
    assert all(m.state == reranker_pb2.MODEL_STATE_READY and m.max_input_tokens == 512 for m in listed.models)
    assert listed.last_reload_error == ""


@pytest.mark.parametrize("model", [CROSS, BI])
def test_the_relevant_scifact_abstract_ranks_first(packaged_sidecar: Sidecar, model: str) -> None:
    cases = scifact_cases(count=8, negatives=7)
    first = 0
    for query, relevant, others in cases:
        texts = others[:4] + [relevant] + others[4:]
        response = rerank(packaged_sidecar, query, docs(*texts), model=model)
        assert response.model == model
        first += response.results[0].index == 4
    assert first >= 7, f"{model}: relevant abstract first for {first} of {len(cases)} queries"


def test_scores_are_sigmoid_of_logits_sorted_and_reference_request_documents_once(sidecar: Sidecar) -> None:
    query, relevant, others = scifact_cases(count=1, negatives=12)[0]
    documents = docs(relevant, *others)
    response = rerank(sidecar, query, documents, return_documents=True)
    indices = [r.index for r in response.results]
    assert sorted(indices) == list(range(len(documents)))
    scores = [r.raw_score for r in response.results]
    assert scores == sorted(scores, reverse=True)
    for result in response.results:
        assert result.id == documents[result.index].id
        assert result.document.text == documents[result.index].text
        assert result.relevance_score == pytest.approx(1 / (1 + 2.718281828459045**-result.raw_score), abs=1e-6)
    assert response.usage.pairs == len(documents) and response.usage.tokens > 0
    assert response.timing.inference_us > 0 and response.timing.total_us >= response.timing.inference_us


def test_top_n_applies_after_scoring(sidecar: Sidecar) -> None:
    query, relevant, others = scifact_cases(count=1, negatives=10)[0]
    documents = docs(*others, relevant)
    everything = rerank(sidecar, query, documents)
    best3 = rerank(sidecar, query, documents, top_n=3)
    assert [r.index for r in best3.results] == [r.index for r in everything.results[:3]]
    assert rerank(sidecar, query, documents, top_n=0).results == []
    assert len(rerank(sidecar, query, documents, top_n=100).results) == len(documents)
    threshold = everything.results[1].relevance_score
    assert len(rerank(sidecar, query, documents, min_relevance_score=threshold).results) == 2


@pytest.mark.parametrize("model", [CROSS, BI])
def test_a_pairs_score_does_not_depend_on_its_batch_mates(sidecar: Sidecar, model: str) -> None:
    """INT8 dynamic quantisation picks activation scales per batch: scores must still be identical."""
    cases = scifact_cases(count=6, negatives=15, seed=11)
    query, target, _ = cases[0]
    mates = [text for _, relevant, others in cases[1:] for text in (relevant, *others)]
    alone = rerank(sidecar, query, docs(target), model=model).results[0].raw_score

    def score_in(batch: list[str]) -> float:
        response = rerank(sidecar, query, docs(*batch), model=model)
        return next(r.raw_score for r in response.results if batch[r.index] == target)

    mixed = [score_in(mates[i : i + 7] + [target] + ["short", "x" * 3000]) for i in range(0, 28, 7)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        concurrent_scores = list(pool.map(score_in, [[target] + mates[i : i + 5] for i in range(0, 40, 5)]))
    for score in mixed + concurrent_scores:
        assert abs(score - alone) <= 1e-4, (alone, mixed, concurrent_scores)


def test_result_cache_answers_repeated_pairs(make_sidecar) -> None:
    server = make_sidecar().start()  # default config: cache on
    query, relevant, others = scifact_cases(count=1, negatives=6)[0]
    first = rerank(server, query, docs(relevant, *others))
    second = rerank(server, query, docs(*others, relevant))
    assert first.usage.cached_pairs == 0 and second.usage.cached_pairs == len(others) + 1
    assert second.usage.tokens == 0
    by_text = {
        server_text: r.raw_score for r, server_text in [(r, [relevant, *others][r.index]) for r in first.results]
    }
    for result in second.results:
        assert result.raw_score == by_text[[*others, relevant][result.index]]


def test_long_documents_never_lose_the_query_and_can_be_windowed(packaged_sidecar: Sidecar) -> None:
    # The packaged cross-encoder: how far the answer past the cut lifts the logit is the model's doing.
    query = "Which enzyme converts angiotensin I to angiotensin II?"
    filler = " ".join(f"Paragraph {i} describes unrelated weather patterns over the northern sea." for i in range(60))
    answer = "Angiotensin-converting enzyme (ACE) converts angiotensin I into angiotensin II."
    long_doc = filler + " " + answer
    truncated = rerank(
        packaged_sidecar, query, docs(long_doc), long_document_strategy=reranker_pb2.LONG_DOCUMENT_STRATEGY_TRUNCATE
    )
    windowed = rerank(
        packaged_sidecar, query, docs(long_doc), long_document_strategy=reranker_pb2.LONG_DOCUMENT_STRATEGY_WINDOW
    )
    assert truncated.usage.truncated_documents == 1
    assert windowed.results[0].best_window > 0
    assert windowed.results[0].raw_score > truncated.results[0].raw_score + 3
    # A tight per-document cap still keeps the whole query: the answer-bearing start scores high.
    capped = rerank(packaged_sidecar, query, docs(answer + " " + filler), max_document_tokens=24)
    assert capped.usage.truncated_documents == 1 and capped.results[0].relevance_score > 0.5


def test_unknown_model_is_not_found(sidecar: Sidecar) -> None:
    for model in ("no-such-model", CROSS.lower()):
        err = raised(functools.partial(rerank, sidecar, "q", docs("d"), model=model))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        info, _ = error_details(err)
        assert info.reason == "UNKNOWN_MODEL" and info.domain == "ragsidecar.dev" and info.metadata["model"] == model


@pytest.mark.parametrize(
    "request_fields, field",
    [
        (dict(query="", documents=docs("d")), "query"),
        (dict(query="   \n\t", documents=docs("d")), "query"),
        (dict(query="q", documents=[]), "documents"),
        (
            dict(
                query="q",
                documents=[
                    reranker_pb2.RerankDocument(id="a", text="x"),
                    reranker_pb2.RerankDocument(id="a", text="y"),
                ],
            ),
            "documents[1].id",
        ),
        (dict(query="q", documents=docs("d"), top_n=-1), "top_n"),
        (dict(query="q", documents=docs("d"), min_relevance_score=1.5), "min_relevance_score"),
        (dict(query="q " * 600, documents=docs("d")), "query"),
        (dict(query="q", documents=docs("d"), long_document_strategy=7), "long_document_strategy"),
    ],
)
def test_malformed_requests_are_invalid_argument_with_violations(sidecar: Sidecar, request_fields, field) -> None:
    err = raised(lambda: sidecar.reranker().Rerank(reranker_pb2.RerankRequest(**request_fields), timeout=30))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    info, violations = error_details(err)
    assert info.reason == "INVALID_REQUEST"
    assert field in [f for f, _ in violations]
    assert len(rerank(sidecar, "still serving?", docs("yes")).results) == 1


def test_too_many_documents_is_invalid_argument(make_sidecar) -> None:
    config = default_config()
    config["inference"]["max_documents_per_request"] = 5
    server = make_sidecar(config).start()
    err = raised(lambda: rerank(server, "q", docs(*["d"] * 6)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in error_details(err)[1]] == ["documents"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        " \n\t ",
        "a" * (1 << 20),
        "\u0000\ufffd\U0001f600 \u202e\u200b" * 50,
        "\ud7ff\ue000 " * 1000,
        "word " * 200_000,
    ],
)
def test_any_text_is_scored(sidecar: Sidecar, text: str) -> None:
    response = rerank(sidecar, "emoji and control characters", docs(text, "plain text"))
    assert sorted(r.index for r in response.results) == [0, 1]


def test_queue_full_is_resource_exhausted(make_sidecar) -> None:
    config = default_config(packaged=True)  # the packaged model's inference is slow enough to queue behind
    config["inference"].update(workers=1, max_queued_pairs=30, max_batch_tokens=512, cache_bytes=0)
    server = make_sidecar(config).start()
    err = raised(lambda: rerank(server, "q", docs(*[f"doc {i}" for i in range(31)])))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_details(err)[0].reason == "QUEUE_FULL"
    long_text = "a long document about reranking and retrieval " * 60
    pending = server.reranker().Rerank.future(
        reranker_pb2.RerankRequest(query="q", documents=docs(*[f"{i} {long_text}" for i in range(29)])), timeout=120
    )
    # Wait (not a fixed sleep: a busy machine may take longer to queue them) until more than 30 - 10 of its
    # pairs wait, one long pair inferred at a time, so 10 more do not fit.
    while server.metric("ragsidecar_queue_depth", model=CROSS) <= 20 and not pending.done():
        time.sleep(0.01)
    err = raised(lambda: rerank(server, "q", docs(*[f"other {i}" for i in range(10)])))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(pending.result().results) == 29


def test_deadlines_and_cancellation_drop_queued_work(make_sidecar) -> None:
    config = default_config(packaged=True)  # the packaged model's inference is slow enough to queue behind
    config["inference"].update(workers=1, max_batch_tokens=1024, cache_bytes=0)
    server = make_sidecar(config).start()
    stub = server.reranker()
    long_text = "a long document about reranking and retrieval " * 60
    before = server.metric("ragsidecar_inferred_inputs_total", model=CROSS)
    blocker = stub.Rerank.future(
        reranker_pb2.RerankRequest(query="q", documents=docs(*[f"{i} {long_text}" for i in range(30)])), timeout=120
    )
    while server.metric("ragsidecar_inferred_inputs_total", model=CROSS) == before:
        time.sleep(0.01)
    err = raised(
        lambda: stub.Rerank(
            reranker_pb2.RerankRequest(query="late", documents=docs(*[f"late {i} {long_text}" for i in range(20)])),
            timeout=0.3,
        )
    )
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    cancelled = stub.Rerank.future(
        reranker_pb2.RerankRequest(query="gone", documents=docs(*[f"gone {i} {long_text}" for i in range(15)])),
        timeout=120,
    )
    # Cancel once its 15 pairs wait in the queue: every pair that entered the queue is waiting, inferred,
    # skipped, or in the one batch running (two long pairs at most), so past the 30 + 20 before it, it has arrived.
    while entered_pairs(server) - before <= 50:
        time.sleep(0.01)
    assert cancelled.cancel()
    assert len(blocker.result().results) == 30
    deadline = time.monotonic() + 20
    while server.metric("ragsidecar_skipped_inputs_total", model=CROSS) < 35 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metric("ragsidecar_skipped_inputs_total", model=CROSS, reason="deadline") == 20
    assert server.metric("ragsidecar_skipped_inputs_total", model=CROSS, reason="cancelled") == 15
    assert server.metric("ragsidecar_inferred_inputs_total", model=CROSS) - before == 30


def entered_pairs(server: Sidecar) -> float:
    """The cross-encoder's pairs that entered its queue and are not in the batch running now, from one scrape (a
    pair inferred between two scrapes could count twice)."""
    names = tuple(
        f"{name}{{"
        for name in ("ragsidecar_queue_depth", "ragsidecar_inferred_inputs_total", "ragsidecar_skipped_inputs_total")
    )
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in server.metrics().splitlines()
        if line.startswith(names) and f'model="{CROSS}"' in line
    )


def calls_completed(outcomes: list[str], count: int) -> None:
    """Waits until the load has completed `count` more calls: on a busy machine that takes longer."""
    target, deadline = len(outcomes) + count, time.monotonic() + 60
    while len(outcomes) < target:
        assert time.monotonic() < deadline, f"the load completed {len(outcomes)} calls of {target}"
        time.sleep(0.01)


def swap_models(server: Sidecar, outcomes: list[str]) -> None:
    """Changes one model, removes one and adds one, then reloads with SIGHUP and waits for the new set, with calls
    completed on the old set before and on the new set after."""
    calls_completed(outcomes, 8)
    config = server.config
    config["models"][0]["max_length"] = 256  # changed: reloaded
    config["models"][2] = {
        "id": "ms-marco-short",
        "kind": "cross-encoder",
        "path": CROSS,
        "max_length": 160,
    }  # MiniLM removed, a second cross-encoder added
    server.write_config(config)
    server.signal(1)  # SIGHUP
    deadline = time.monotonic() + 60
    while server.reranker().ListModels(reranker_pb2.ListModelsRequest(), timeout=10).generation < 1:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    calls_completed(outcomes, 8)


def test_config_swap_under_load_fails_no_call(make_sidecar) -> None:
    config = default_config()
    config["models"].append(
        {
            "id": "all-MiniLM-L6-v2",
            "kind": "bi-encoder",
            "path": "all-MiniLM-L6-v2",
            "pooling": "mean",
            "max_length": 256,
        }
    )
    server = make_sidecar(config).start()
    with rerank_load(server, clients=4, documents=3) as outcomes:
        swap_models(server, outcomes)
    assert outcomes and set(outcomes) == {"ok"}, {o: outcomes.count(o) for o in set(outcomes)}
    listed = server.reranker().ListModels(reranker_pb2.ListModelsRequest(), timeout=10)
    assert [(m.id, m.max_input_tokens) for m in listed.models] == [(CROSS, 256), (BI, 512), ("ms-marco-short", 160)]
    gone = raised(lambda: rerank(server, "q", docs("d"), model="all-MiniLM-L6-v2"))
    assert gone.code() == grpc.StatusCode.NOT_FOUND
    response = rerank(
        server, "a cat sits on the mat", docs("stock markets fell", "a kitten on a rug"), model="ms-marco-short"
    )
    assert response.results[0].index == 1
    assert server.health("ragsidecar.v1.RerankerService/all-MiniLM-L6-v2") == 3  # SERVICE_UNKNOWN: no longer served


def test_config_file_watch_reloads_and_a_failed_reload_keeps_serving(make_sidecar, tmp_path) -> None:
    config = default_config()
    config["server"]["config_poll_s"] = 0.2
    server = make_sidecar(config).start()
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"this is not an onnx graph")
    shutil.copy(MODELS / CROSS / "tokenizer.json", broken / "tokenizer.json")
    config["models"].append({"id": "broken", "kind": "cross-encoder", "path": str(broken)})
    server.write_config(config)
    stub = server.reranker()
    deadline = time.monotonic() + 30
    while not (listed := stub.ListModels(reranker_pb2.ListModelsRequest(), timeout=10)).last_reload_error:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    assert listed.generation == 0
    states = {m.id: m.state for m in listed.models}
    assert states == {
        CROSS: reranker_pb2.MODEL_STATE_READY,
        BI: reranker_pb2.MODEL_STATE_READY,
        "broken": reranker_pb2.MODEL_STATE_FAILED,
    }
    assert server.health("ragsidecar.v1.RerankerService/broken") == 2  # NOT_SERVING
    assert server.health() == 1  # SERVING: the old set serves
    err = raised(lambda: rerank(server, "q", docs("d"), model="broken"))
    assert err.code() == grpc.StatusCode.UNAVAILABLE and error_details(err)[0].reason == "MODEL_NOT_READY"
    assert len(rerank(server, "q", docs("d", "e")).results) == 2
    config["models"].pop()
    config["models"][1]["pooling"] = "mean"
    server.write_config(config)
    while stub.ListModels(reranker_pb2.ListModelsRequest(), timeout=10).generation < 1:
        assert time.monotonic() < deadline + 30, server.log()
        time.sleep(0.1)
    listed = stub.ListModels(reranker_pb2.ListModelsRequest(), timeout=10)
    assert listed.last_reload_error == "" and [m.id for m in listed.models] == [CROSS, BI]
