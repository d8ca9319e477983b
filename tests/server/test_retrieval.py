"""RetrievalService through the real server: real files, real embedder and reranker."""

from __future__ import annotations

import functools
import signal
import threading
import time

import grpc
from retrieval_helpers import PRINCIPAL, SCOPE, entry, llm, params, raised, scifact_queries, stub, target
from sidecar import Sidecar, default_config, error_details

from ragsidecar.v1 import common_pb2
from ragsidecar.v1 import retrieval_pb2 as pb

SCIENCE = entry("science", "FILE", "SEARCH", "science/abstracts.jsonl")
GUIDE = entry("guide", "DIRECTORY", "SEARCH", "guide")
PERSONA = entry("persona", "FILE", "DIRECT", "persona.md")
STEPS = entry("steps", "FILE", "SEQUENTIAL", "steps.jsonl")


def enforce(server: Sidecar, entries, knowledge: list[str], scope=SCOPE, **fields) -> pb.EnforceResponse:
    request = pb.EnforceRequest(
        principal=PRINCIPAL,
        scope=scope,
        target=target(entries, {"answer": knowledge}),
        action="answer",
        llm=fields.pop("llm", llm()),
        **fields,
    )
    return stub(server).Enforce(request, timeout=120)


def test_validate_configuration_reports_every_problem_at_once(retrieval_sidecar: Sidecar) -> None:
    good = pb.ValidateConfigurationRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        llm=llm(),
        target=target([SCIENCE, PERSONA, STEPS], {"answer": ["science", "persona"]}),
    )
    assert stub(retrieval_sidecar).ValidateConfiguration(good, timeout=60).valid
    bad_entries = [
        entry("nofile", "FILE", "SEARCH"),  # no path
        entry("escape", "FILE", "SEARCH", "../../etc/passwd"),  # outside the roots
        entry("contradiction", "FILE", "SEARCH", "guide/shipping.txt", min_score=1.5),
        entry("zero", "FILE", "SEARCH", "guide/shipping.txt", top_k=0),
        entry("blank", "INLINE", "DIRECT"),
        entry(
            "ghost-model",
            "FILE",
            "SEARCH",
            "guide/shipping.txt",
            search=pb.SearchOptions(rerank=True, reranker_model="no-such-reranker"),
        ),
        entry("huge", "FILE", "DIRECT", "science/abstracts.jsonl", max_tokens=50),
    ]
    request = pb.ValidateConfigurationRequest(
        principal=PRINCIPAL, scope=SCOPE, llm=llm(), target=target(bad_entries, {"answer": ["nofile", "missing-name"]})
    )
    response = stub(retrieval_sidecar).ValidateConfiguration(request, timeout=60)
    assert not response.valid
    found = {(v.field, common_pb2.ErrorReason.Name(v.reason)) for v in response.violations}
    assert {
        ("target.knowledge[0].path", "ERROR_REASON_INVALID_CONFIGURATION"),
        ("target.knowledge[1].path", "ERROR_REASON_PATH_OUTSIDE_ROOTS"),
        ("target.knowledge[2].min_score", "ERROR_REASON_INVALID_CONFIGURATION"),
        ("target.knowledge[3].top_k", "ERROR_REASON_INVALID_CONFIGURATION"),
        ("target.knowledge[4].inline_text", "ERROR_REASON_INVALID_CONFIGURATION"),
        ("target.knowledge[5].search.reranker_model", "ERROR_REASON_UNKNOWN_MODEL"),
        ("target.knowledge[6].max_tokens", "ERROR_REASON_DIRECT_BUDGET_EXCEEDED"),
        ("target.actions[0].knowledge[1]", "ERROR_REASON_UNKNOWN_KNOWLEDGE"),
    } <= found
    # paths_per_run: a FILE entry without a path is the host's to locate per run
    per_run = pb.ValidateConfigurationRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        llm=llm(),
        paths_per_run=True,
        target=target([entry("nofile", "FILE", "DIRECT")]),
    )
    assert stub(retrieval_sidecar).ValidateConfiguration(per_run, timeout=60).valid


def test_direct_budget_defaults_to_a_share_of_the_model_window(retrieval_sidecar: Sidecar) -> None:
    science_direct = entry("science", "FILE", "DIRECT", "science/abstracts.jsonl")
    for model_llm, reason in (
        (llm(window=None, model="unknown-llm"), "ERROR_REASON_UNKNOWN_MODEL_WINDOW"),
        (llm(window=4000), "ERROR_REASON_DIRECT_BUDGET_EXCEEDED"),
    ):
        request = pb.ValidateConfigurationRequest(
            principal=PRINCIPAL, scope=SCOPE, llm=model_llm, target=target([science_direct])
        )
        reasons = {
            common_pb2.ErrorReason.Name(v.reason)
            for v in stub(retrieval_sidecar).ValidateConfiguration(request, timeout=60).violations
        }
        assert reason in reasons
    known = pb.ValidateConfigurationRequest(
        principal=PRINCIPAL, scope=SCOPE, llm=llm(window=None, model="gpt-4o"), target=target([PERSONA])
    )
    assert stub(retrieval_sidecar).ValidateConfiguration(known, timeout=60).valid
    err = raised(lambda: enforce(retrieval_sidecar, [science_direct], ["science"], llm=llm(window=4000)))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    info, _ = error_details(err)
    assert info.reason == "DIRECT_BUDGET_EXCEEDED" and info.metadata["sources"] == "science"


def test_enforce_gives_direct_knowledge_whole(retrieval_sidecar: Sidecar) -> None:
    response = enforce(retrieval_sidecar, [PERSONA, SCIENCE], ["persona"], params=params(question="hi"))
    assert response.retrieved_context.startswith("### Knowledge: persona (DIRECT)")
    assert "You are Ada, a support agent for Acme Kitchen." in response.retrieved_context
    assert response.document_count == 1 and not response.truncated


def test_enforce_search_finds_the_relevant_scifact_abstract(packaged_retrieval_sidecar: Sidecar) -> None:
    cases = scifact_queries(8)
    first = 0
    for claim, relevant in cases:
        response = enforce(packaged_retrieval_sidecar, [SCIENCE], ["science"], params=params(limit=3, question=claim))
        assert response.query == claim
        top = response.blocks[0].chunks[0]
        first += top.provenance.document_id == relevant
        assert top.scores.dense > 0 and top.scores.fused > 0 and top.provenance.line_start > 0
    assert first >= 6, f"relevant abstract first for {first} of {len(cases)} claims"
    context = response.retrieved_context
    assert context.startswith("### Knowledge: science (SEARCH)") and "science/abstracts.jsonl:" in context


def test_enforce_search_with_rerank(retrieval_sidecar: Sidecar) -> None:
    reranked = entry(
        "science",
        "FILE",
        "SEARCH",
        "science/abstracts.jsonl",
        top_k=3,
        search=pb.SearchOptions(rerank=True, candidates=10),
    )
    claim, relevant = scifact_queries(3)[2]
    response = enforce(retrieval_sidecar, [reranked], ["science"], params=params(question=claim))
    chunks = response.blocks[0].chunks
    assert len(chunks) == 3 and chunks[0].provenance.document_id == relevant
    assert all(c.HasField("score") and c.scores.HasField("rerank") and 0 < c.scores.rerank <= 1 for c in chunks)
    assert [c.score for c in chunks] == sorted((c.score for c in chunks), reverse=True)


def test_query_parameter_and_benign_empty_cases(retrieval_sidecar: Sidecar) -> None:
    claim, relevant = scifact_queries(2)[1]
    request = pb.EnforceRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        action="answer",
        llm=llm(),
        target=target([SCIENCE], {"answer": ["science"]}, {"answer": "claim"}),
        params=params(topic="unrelated words here", claim=claim),
    )
    response = stub(retrieval_sidecar).Enforce(request, timeout=60)
    assert response.query == claim
    assert relevant in [c.provenance.document_id for c in response.blocks[0].chunks]
    assert enforce(retrieval_sidecar, [SCIENCE], ["science"], params=params(question="   ")).retrieved_context == ""
    assert enforce(retrieval_sidecar, [SCIENCE], ["science"], params=params(n=3)).retrieved_context == ""
    assert enforce(retrieval_sidecar, [SCIENCE], []).retrieved_context == ""
    missing = entry("later", "FILE", "SEARCH", "not-there.md", readiness=pb.KNOWLEDGE_READINESS_WHEN_CONFIGURED)
    assert enforce(retrieval_sidecar, [missing], ["later"], params=params(q="x")).retrieved_context == ""
    disabled = entry("off", "FILE", "DIRECT", "persona.md", enabled=False)
    assert enforce(retrieval_sidecar, [disabled], ["off"]).retrieved_context == ""


def test_missing_and_unreadable_sources_follow_on_failure(retrieval_sidecar: Sidecar, knowledge_root) -> None:
    (knowledge_root / "binary.txt").write_bytes(b"\x00\x01\x02\xff" * 100)
    must = entry("must", "FILE", "SEARCH", "not-there.md")
    err = raised(lambda: enforce(retrieval_sidecar, [must], ["must"], params=params(q="x")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and error_details(err)[0].reason == "KNOWLEDGE_NOT_READY"
    broken = entry("broken", "FILE", "SEARCH", "binary.txt")
    err = raised(lambda: enforce(retrieval_sidecar, [broken], ["broken"], params=params(q="x")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and error_details(err)[0].reason == "SOURCE_UNREADABLE"
    tolerant = entry("broken", "FILE", "SEARCH", "binary.txt", on_failure=pb.KNOWLEDGE_ON_FAILURE_CONTINUE)
    response = enforce(retrieval_sidecar, [tolerant, PERSONA], ["broken", "persona"], params=params(q="x"))
    assert [b.source for b in response.blocks] == ["persona"]


def test_sequential_gives_the_next_unit_per_scope(retrieval_sidecar: Sidecar) -> None:
    scope = common_pb2.Scope(tenant="seq-tenant", session="a")
    given = [enforce(retrieval_sidecar, [STEPS], ["steps"], scope=scope).retrieved_context for _ in range(5)]
    assert [f"Step {i}" in given[i - 1] for i in range(1, 5)] == [True] * 4
    assert given[4] == ""  # every unit given: nothing more
    other = common_pb2.Scope(tenant="seq-tenant", session="b")
    assert "Step 1:" in enforce(retrieval_sidecar, [STEPS], ["steps"], scope=other).retrieved_context


def test_context_is_cut_to_the_window_and_flagged(retrieval_sidecar: Sidecar) -> None:
    claim, _ = scifact_queries(1)[0]
    full = enforce(retrieval_sidecar, [PERSONA, SCIENCE], ["persona", "science"], params=params(q=claim))
    cut = enforce(
        retrieval_sidecar, [PERSONA, SCIENCE], ["persona", "science"], params=params(q=claim), max_context_tokens=120
    )
    assert not full.truncated and cut.truncated
    assert len(cut.retrieved_context) < len(full.retrieved_context)
    assert cut.retrieved_context.startswith("### Knowledge: persona (DIRECT)")
    assert cut.document_count < full.document_count


def test_require_loaded_loads_once_for_the_following_enforce(retrieval_sidecar: Sidecar) -> None:
    entries = [GUIDE, SCIENCE, PERSONA]
    request = pb.RequireLoadedRequest(
        principal=PRINCIPAL, scope=SCOPE, target=target(entries), names=["science", "guide"]
    )
    before = retrieval_sidecar.metric("ragsidecar_index_loads_total")
    counts = stub(retrieval_sidecar).RequireLoaded(request, timeout=120).counts
    assert [(c.name, c.count) for c in counts] == [("guide", 7), ("science", 240)]
    loads = retrieval_sidecar.metric("ragsidecar_index_loads_total")
    assert loads - before <= 2
    response = enforce(retrieval_sidecar, entries, ["guide"], params=params(q="how long does express shipping take"))
    assert "next business day" in response.blocks[0].chunks[0].text
    assert retrieval_sidecar.metric("ragsidecar_index_loads_total") == loads
    err = raised(
        lambda: stub(retrieval_sidecar).RequireLoaded(
            pb.RequireLoadedRequest(principal=PRINCIPAL, scope=SCOPE, target=target(entries), names=["persona"]),
            timeout=30,
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_require_ready_names_every_empty_source(retrieval_sidecar: Sidecar, knowledge_root) -> None:
    (knowledge_root / "empty.txt").write_text("")
    when = dict(readiness=pb.KNOWLEDGE_READINESS_WHEN_CONFIGURED)
    entries = [
        entry("zeta", "FILE", "SEARCH", "empty.txt", **when),
        entry("alpha", "MEMORY", "SEARCH", **when),
        entry("ok", "FILE", "SEARCH", "guide/shipping.txt", **when),
        entry("unconfigured", "FILE", "SEARCH", **when),
        PERSONA,
    ]
    request = pb.RequireReadyRequest(principal=PRINCIPAL, scope=SCOPE, target=target(entries))
    err = raised(lambda: stub(retrieval_sidecar).RequireReady(request, timeout=60))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    info, violations = error_details(err)
    assert info.reason == "KNOWLEDGE_NOT_READY" and info.metadata["sources"] == "alpha,zeta"
    ready = pb.RequireReadyRequest(principal=PRINCIPAL, scope=SCOPE, target=target(entries[2:]))
    assert [(c.name, c.count) for c in stub(retrieval_sidecar).RequireReady(ready, timeout=60).counts] == [("ok", 1)]


def test_prepare_chat_knowledge_measures_direct_entries(retrieval_sidecar: Sidecar) -> None:
    entries = [
        SCIENCE,
        PERSONA,
        entry("rules", "INLINE", "DIRECT", inline_text="Never share card numbers.", max_tokens=50),
    ]
    request = pb.PrepareChatKnowledgeRequest(
        principal=PRINCIPAL, scope=SCOPE, agent_id="ada", entries=entries, llm=llm(window=10000)
    )
    response = stub(retrieval_sidecar).PrepareChatKnowledge(request, timeout=60)
    assert [(b.source, b.position, b.shared_budget) for b in response.blocks] == [
        ("persona", 1, True),
        ("rules", 2, False),
    ]
    assert response.default_budget_tokens == 2500 and 0 < response.default_budget_used_tokens < 100
    assert response.blocks[1].budget_tokens == 50 and "card numbers" in response.blocks[1].text
    err = raised(
        lambda: stub(retrieval_sidecar).PrepareChatKnowledge(
            pb.PrepareChatKnowledgeRequest(principal=PRINCIPAL, scope=SCOPE, agent_id="ada", entries=entries),
            timeout=60,
        )
    )
    assert error_details(err)[0].reason == "UNKNOWN_MODEL_WINDOW"


def test_search_spans_sources_and_memory_is_isolated_by_tenant(retrieval_sidecar: Sidecar) -> None:
    notes = entry("notes", "MEMORY", "SEARCH")
    retrieval = stub(retrieval_sidecar)
    upsert = pb.UpsertDocumentsRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        knowledge="notes",
        documents=[
            pb.MemoryDocument(id="n1", text="The customer Bob prefers delivery on Saturdays."),
            pb.MemoryDocument(id="n2", text="The warehouse in Leeds closes at 6pm."),
        ],
    )
    assert retrieval.UpsertDocuments(upsert, timeout=60).inserted == 2
    again = retrieval.UpsertDocuments(upsert, timeout=60)
    assert (again.inserted, again.unchanged, again.document_count) == (0, 2, 2)
    search = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=target([notes, GUIDE]),
        query="when does Bob want his delivery?",
        top_k=2,
    )
    hits = retrieval.Search(search, timeout=60).hits
    assert hits[0].provenance.document_id == "n1" and {h.source for h in hits} == {"notes", "guide"}
    intruder = common_pb2.Scope(tenant="other-tenant", session="s1")
    search_other = pb.SearchRequest(principal=PRINCIPAL, scope=intruder, target=target([notes]), query="Bob delivery")
    assert retrieval.Search(search_other, timeout=60).hits == []
    deleted = retrieval.DeleteDocuments(
        pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge="notes", ids=["n1", "n1", "zz"]),
        timeout=60,
    )
    assert (deleted.deleted, deleted.not_found, deleted.document_count) == (1, 1, 1)
    hits = retrieval.Search(
        pb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=target([notes]), query="Bob delivery Saturdays"),
        timeout=60,
    ).hits
    assert [h.provenance.document_id for h in hits] == ["n2"]


def test_resolved_paths_replace_declared_paths_inside_the_roots(
    retrieval_sidecar: Sidecar, knowledge_root, tmp_path
) -> None:
    located = entry("notes", "FILE", "DIRECT")
    response = enforce(retrieval_sidecar, [located], ["notes"], resolved_paths={"notes": "guide/returns.md"})
    assert "within 30 days" in response.retrieved_context
    err = raised(lambda: enforce(retrieval_sidecar, [located], ["notes"], resolved_paths={"other": "persona.md"}))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and error_details(err)[0].reason == "UNKNOWN_KNOWLEDGE"
    outside = tmp_path / "secret.md"
    outside.write_text("top secret")
    (knowledge_root / "link.md").symlink_to(outside)
    for path in ("../secret.md", str(outside), "link.md", "guide/../../secret.md"):
        err = raised(
            functools.partial(enforce, retrieval_sidecar, [located], ["notes"], resolved_paths={"notes": path})
        )
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, path
        assert error_details(err)[0].reason == "PATH_OUTSIDE_ROOTS"


def test_requests_without_principal_are_refused_before_reading(retrieval_sidecar: Sidecar) -> None:
    request = pb.EnforceRequest(
        scope=SCOPE, target=target([PERSONA], {"answer": ["persona"]}), action="answer", llm=llm()
    )
    err = raised(lambda: stub(retrieval_sidecar).Enforce(request, timeout=30))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    err = raised(
        lambda: stub(retrieval_sidecar).Search(
            pb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=target([SCIENCE]), query="  "), timeout=30
        )
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


SEARCHERS_DURING_THE_RELOAD = 4


def test_searches_across_an_encoder_change_pair_query_and_index_of_one_model(make_sidecar) -> None:
    """Issue 10: a query is embedded by the model whose vectors the searched index holds. Searches keep going
    while a reload changes the embedder's pooling (same model id and files, other vectors): every answer has
    the dense scores of the old model or of the new one, never those of one model's query in the other's
    index; after the reload, those of a server started with the new setting."""
    config = default_config()
    notes = [
        pb.MemoryDocument(id=f"n{i}", text=f"Order {1000 + i}: the {item} shipped on day {i} and arrives soon.")
        for i, item in enumerate(["Blender X2", "kettle", "toaster", "mixer", "juicer", "grill"] * 4)
    ]
    search = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        query="Where is my blender order?",
        top_k=5,
        target=target([entry("orders", "MEMORY", "SEARCH")]),
    )

    def scores(server: Sidecar) -> list[tuple[str, float]]:
        return [(h.chunk_id, h.scores.dense) for h in stub(server).Search(search, timeout=60).hits]

    def started(config: dict) -> Sidecar:
        server = make_sidecar(config).start()
        stub(server).UpsertDocuments(
            pb.UpsertDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge="orders", documents=notes), timeout=60
        )
        return server

    server = started(config)
    before = scores(server)
    (embedder,) = [m for m in config["models"] if m["kind"] == "bi-encoder"]
    embedder["pooling"] = "cls" if embedder["pooling"] == "mean" else "mean"
    server.write_config(config)
    seen: list[list[tuple[str, float]]] = []
    done = threading.Event()

    def keep_searching() -> None:
        while not done.is_set():
            seen.append(scores(server))

    # Several searches in flight at once, so that the swap likely lands between some query's embedding and its load.
    searchers = [threading.Thread(target=keep_searching) for _ in range(SEARCHERS_DURING_THE_RELOAD)]
    for searcher in searchers:
        searcher.start()
    try:
        server.signal(signal.SIGHUP)
        deadline = time.monotonic() + 120
        while server.metric("ragsidecar_model_reloads_total", outcome="ok") == 0:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.005)
        searched_before_the_swap = len(seen)
        while len(seen) < searched_before_the_swap + 3 * SEARCHERS_DURING_THE_RELOAD:  # after the new model took over
            assert all(s.is_alive() for s in searchers)
            time.sleep(0.005)
    finally:
        done.set()
        for searcher in searchers:
            searcher.join()
    expected = scores(started(config))
    assert not same_scores(expected, before)
    assert same_scores(scores(server), expected)
    assert all(same_scores(s, before) or same_scores(s, expected) for s in seen)


def same_scores(found: list[tuple[str, float]], expected: list[tuple[str, float]]) -> bool:
    """Same hits with the same dense scores (up to the float noise of batching)."""
    return [c for c, _ in found] == [c for c, _ in expected] and all(
        abs(a - b) < 1e-4 for (_, a), (_, b) in zip(found, expected, strict=True)
    )
