"""The host contracts (RetrievalSpi, the bridge's dispatch rules) through the real server: where the sidecar
must answer as the host's in-process runtime does, and the limits it documents (docs/host-contracts.md)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2
from retrieval_helpers import (
    PRINCIPAL,
    SCOPE,
    build_knowledge,
    entry,
    llm,
    params,
    raised,
    retrieval_config,
    scifact_queries,
    stub,
    target,
)
from sidecar import Sidecar, error_details

from ragsidecar.identifiers import MAX_ID_CHARS
from ragsidecar.v1 import common_pb2
from ragsidecar.v1 import retrieval_pb2 as pb

# A file at the top of the knowledge root: read only if an entry without a location were taken for the root.
ROOT_ONLY = "The vault code is 0451; only a whole-root read would find this."
PERSONA = entry("persona", "FILE", "DIRECT", "persona.md")
SCIENCE = entry("science", "FILE", "SEARCH", "science/abstracts.jsonl")
STEPS = entry("steps", "FILE", "SEQUENTIAL", "steps.jsonl")
WHEN_CONFIGURED = dict(readiness=pb.KNOWLEDGE_READINESS_WHEN_CONFIGURED)
MAX_CURSORS = 3


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("contracts-knowledge")
    build_knowledge(root)
    (root / "vault.md").write_text(ROOT_ONLY + "\n")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, root: Path) -> Iterator[Sidecar]:
    config = retrieval_config(root, tmp_path_factory.mktemp("contracts-data"))
    config["retrieval"]["max_sequential_cursors"] = MAX_CURSORS
    sidecar = Sidecar(tmp_path_factory.mktemp("contracts"), config)
    try:
        yield sidecar.start()
    finally:
        sidecar.stop()


def enforce_request(entries, knowledge: list[str], scope=SCOPE, **fields) -> pb.EnforceRequest:
    return pb.EnforceRequest(
        principal=PRINCIPAL,
        scope=scope,
        target=target(entries, {"answer": knowledge}),
        action="answer",
        llm=fields.pop("llm", llm()),
        **fields,
    )


def enforce(server: Sidecar, entries, knowledge: list[str], **fields) -> pb.EnforceResponse:
    return stub(server).Enforce(enforce_request(entries, knowledge, **fields), timeout=120)


def refused(call, code: grpc.StatusCode, reason: str) -> grpc.RpcError:
    err = raised(call)
    assert (err.code(), error_details(err)[0].reason) == (code, reason), err.details()
    return err


def test_an_entry_without_location_never_reads_the_knowledge_root(server: Sidecar) -> None:
    """Issue 15 items 1 and 2: no path is nothing to read; MUST_LOAD fails, WHEN_CONFIGURED is a benign empty."""
    unlocated = [
        entry("all", "DIRECTORY", "SEARCH"),
        entry("all", "DIRECTORY", "SEQUENTIAL"),
        entry("all", "FILE", "DIRECT"),
        entry("all", "DIRECTORY", "DIRECT"),
    ]
    for must_load in unlocated:
        err = refused(
            functools.partial(enforce, server, [must_load], ["all"], params=params(q="vault code")),
            grpc.StatusCode.FAILED_PRECONDITION,
            "KNOWLEDGE_NOT_READY",
        )
        assert error_details(err)[0].metadata["sources"] == "all"
        when = pb.KnowledgeEntry()
        when.CopyFrom(must_load)
        when.readiness = pb.KNOWLEDGE_READINESS_WHEN_CONFIGURED
        assert enforce(server, [when], ["all"], params=params(q="vault code")).retrieved_context == ""
        tolerant = pb.KnowledgeEntry()
        tolerant.CopyFrom(must_load)
        tolerant.on_failure = pb.KNOWLEDGE_ON_FAILURE_CONTINUE
        response = enforce(server, [tolerant, PERSONA], ["all", "persona"], params=params(q="vault code"))
        assert [b.source for b in response.blocks] == ["persona"] and ROOT_ONLY not in response.retrieved_context
    search = pb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=target([unlocated[0]]), query="vault code")
    refused(lambda: stub(server).Search(search, timeout=60), grpc.StatusCode.FAILED_PRECONDITION, "KNOWLEDGE_NOT_READY")
    search.target.knowledge[0].readiness = pb.KNOWLEDGE_READINESS_WHEN_CONFIGURED
    assert list(stub(server).Search(search, timeout=60).hits) == []
    # Located per call, the same entry reads exactly what it is given.
    located = enforce(server, [unlocated[0]], ["all"], params=params(q="vault code"), resolved_paths={"all": "guide"})
    assert located.blocks and ROOT_ONLY not in located.retrieved_context


def test_blank_or_unpickable_query_gives_no_retrieved_text(server: Sidecar) -> None:
    """Issue 15 item 3: the bridge's silent skip; an action with no SEARCH knowledge needs no query."""
    scope = common_pb2.Scope(tenant="contracts", session="blank-query")
    knowledge = [PERSONA, SCIENCE, STEPS]
    names = ["persona", "science", "steps"]
    for blank in (params(question="   "), params(limit=3), []):
        skipped = enforce(server, knowledge, names, scope=scope, params=blank)
        assert (skipped.retrieved_context, list(skipped.blocks), skipped.query) == ("", [], "")
    claim, _ = scifact_queries(1)[0]
    given = enforce(server, knowledge, names, scope=scope, params=params(question=claim))
    assert [b.source for b in given.blocks] == names
    assert "Step 1:" in given.retrieved_context  # the skipped dispatches moved no cursor
    # Configuration errors still surface before the skip.
    bad = entry("science", "FILE", "SEARCH", "science/abstracts.jsonl", top_k=0)
    refused(
        lambda: enforce(server, [bad], ["science"], params=params(limit=3)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_CONFIGURATION",
    )
    direct_only = enforce(server, [PERSONA], ["persona"], params=params(limit=3))
    assert direct_only.retrieved_context.startswith("### Knowledge: persona (DIRECT)")


def test_validate_configuration_checks_declarations_without_failing(
    server: Sidecar, root: Path, tmp_path: Path
) -> None:
    """Issue 15 item 5: a declaration-only form; problems are violations, never a status."""
    unsized = entry("science", "FILE", "DIRECT", "science/abstracts.jsonl")
    request = pb.ValidateConfigurationRequest(principal=PRINCIPAL, scope=SCOPE, target=target([unsized]))
    reasons = [common_pb2.ErrorReason.Name(v.reason) for v in stub(server).ValidateConfiguration(request).violations]
    assert reasons == ["ERROR_REASON_UNKNOWN_MODEL_WINDOW"]
    request.declarations_only = True
    assert stub(server).ValidateConfiguration(request, timeout=60).valid
    outside = tmp_path / "secret.md"
    outside.write_text("top secret")
    (root / "guide-with-link").mkdir()
    (root / "guide-with-link" / "inside.md").write_text("Inside the roots.")
    (root / "guide-with-link" / "escape.md").symlink_to(outside)
    linked = entry("linked", "DIRECTORY", "DIRECT", "guide-with-link", max_tokens=1000)
    actions = [pb.Action(name="answer"), pb.Action(name="answer"), pb.Action(name=" ")]
    request = pb.ValidateConfigurationRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        llm=llm(),
        target=pb.Target(name="com.acme.SupportRole", knowledge=[linked], actions=actions),
    )
    found = {
        (v.field, common_pb2.ErrorReason.Name(v.reason))
        for v in stub(server).ValidateConfiguration(request, timeout=60).violations
    }
    assert found == {
        ("target.knowledge[0].path", "ERROR_REASON_PATH_OUTSIDE_ROOTS"),
        ("target.actions[1].name", "ERROR_REASON_INVALID_CONFIGURATION"),
        ("target.actions[2].name", "ERROR_REASON_INVALID_CONFIGURATION"),
    }
    repeated = enforce_request([PERSONA], ["persona"], params=params(q="a") + params(q="b"))
    refused(lambda: stub(server).Enforce(repeated, timeout=60), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")


def test_rerank_order_is_fused_by_default_and_the_reranker_order_on_request(server: Sidecar) -> None:
    """Issue 15 item 7: RERANK_ORDER_RERANKER gives the Reranker SPI's order, cut to top_k."""
    claim, _ = scifact_queries(3)[2]

    def hits(top_k: int, order: int) -> list[pb.RetrievedChunk]:
        options = pb.SearchOptions(rerank=True, candidates=10, rerank_order=order)
        source = entry("science", "FILE", "SEARCH", "science/abstracts.jsonl", top_k=top_k, search=options)
        return list(enforce(server, [source], ["science"], params=params(q=claim)).blocks[0].chunks)

    every = hits(10, pb.RERANK_ORDER_RERANKER)
    relevance = [c.scores.rerank for c in every]
    assert relevance == sorted(relevance, reverse=True) and [c.score for c in every] == relevance
    assert [c.chunk_id for c in hits(3, pb.RERANK_ORDER_RERANKER)] == [c.chunk_id for c in every[:3]]
    fused = hits(3, pb.RERANK_ORDER_UNSPECIFIED)
    assert [c.chunk_id for c in fused] == [c.chunk_id for c in hits(3, pb.RERANK_ORDER_FUSED)]
    assert all(c.score != c.scores.rerank for c in fused)
    search = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=target([SCIENCE]),
        query=claim,
        top_k=3,
        search=pb.SearchOptions(rerank=True, candidates=10, rerank_order=pb.RERANK_ORDER_RERANKER),
    )
    assert [h.chunk_id for h in stub(server).Search(search, timeout=60).hits] == [c.chunk_id for c in every[:3]]


def test_budget_errors_name_the_entries_never_the_model(server: Sidecar) -> None:
    """Issue 15 item 9: ErrorInfo.metadata["sources"] lists knowledge names."""
    rules = entry("rules", "INLINE", "DIRECT", inline_text="Never share card numbers.")
    request = pb.PrepareChatKnowledgeRequest(
        principal=PRINCIPAL, scope=SCOPE, agent_id="ada", entries=[PERSONA, rules], llm=pb.Llm(model="mystery-model")
    )
    err = refused(
        lambda: stub(server).PrepareChatKnowledge(request, timeout=60),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UNKNOWN_MODEL_WINDOW",
    )
    assert error_details(err)[0].metadata["sources"] == "persona,rules"
    err = refused(
        lambda: enforce(server, [PERSONA, rules], ["persona", "rules"], llm=pb.Llm(model="mystery-model")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UNKNOWN_MODEL_WINDOW",
    )
    assert error_details(err)[0].metadata["sources"] == "persona,rules"


def test_zero_limits_unknown_enums_and_non_finite_params_are_refused(server: Sidecar) -> None:
    """Issue 10 item 9 and item 4: what the proto says must be at least 1, or be a defined value, is checked."""
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    refused(lambda: enforce(server, [PERSONA], ["persona"], max_context_tokens=0), invalid, "INVALID_REQUEST")
    refused(
        lambda: enforce(server, [PERSONA], ["persona"], llm=pb.Llm(model="m", input_window_tokens=0)),
        invalid,
        "INVALID_REQUEST",
    )
    prepare = pb.PrepareChatKnowledgeRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        agent_id="ada",
        entries=[PERSONA],
        llm=pb.Llm(model="m", input_window_tokens=0),
    )
    refused(lambda: stub(server).PrepareChatKnowledge(prepare, timeout=60), invalid, "INVALID_REQUEST")
    for field, value in (("type", 9), ("use", 9), ("readiness", 7), ("on_failure", 5)):
        strange = pb.KnowledgeEntry()
        strange.CopyFrom(PERSONA)
        setattr(strange, field, value)
        err = refused(functools.partial(enforce, server, [strange], ["persona"]), invalid, "INVALID_REQUEST")
        assert error_details(err)[1][0][0] == f"target.knowledge[0].{field}"
        validate = pb.ValidateConfigurationRequest(principal=PRINCIPAL, scope=SCOPE, target=target([strange]))
        refused(functools.partial(stub(server).ValidateConfiguration, validate, timeout=60), invalid, "INVALID_REQUEST")
    reorder = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=target([SCIENCE]),
        query="x",
        search=pb.SearchOptions(rerank=True, rerank_order=4),
    )
    refused(lambda: stub(server).Search(reorder, timeout=60), invalid, "INVALID_REQUEST")
    for number in (float("nan"), float("inf"), float("-inf")):
        value = struct_pb2.Value(list_value=struct_pb2.ListValue(values=[struct_pb2.Value(number_value=number)]))
        odd = enforce_request([PERSONA], ["persona"], params=[pb.Param(name="n", value=value)])
        err = refused(functools.partial(stub(server).Enforce, odd, timeout=60), invalid, "INVALID_REQUEST")
        assert error_details(err)[1][0][0] == "params[0].value"


def test_prepare_chat_knowledge_refuses_a_path_outside_the_roots(server: Sidecar) -> None:
    """Issue 10 item 9: as everywhere else, PERMISSION_DENIED with reason PATH_OUTSIDE_ROOTS."""
    for path in ("../outside.md", "/etc/hostname"):
        request = pb.PrepareChatKnowledgeRequest(
            principal=PRINCIPAL,
            scope=SCOPE,
            agent_id="ada",
            llm=llm(),
            entries=[entry("escape", "FILE", "DIRECT", path)],
        )
        refused(
            functools.partial(stub(server).PrepareChatKnowledge, request, timeout=60),
            grpc.StatusCode.PERMISSION_DENIED,
            "PATH_OUTSIDE_ROOTS",
        )


# Knowledge and action names that identifiers.id_problems refuses: a control character, one over the length cap.
BAD_NAMES = ("sci\x07ence", "n" * (MAX_ID_CHARS + 1))


def test_knowledge_and_action_names_are_checked_as_ids_before_anything_is_read(server: Sidecar) -> None:
    """Issue 10 item 1: entry names (target and outer) and action names key caches, cursors and files."""
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    for bad in BAD_NAMES:
        named = entry(bad, "FILE", "SEARCH", "science/abstracts.jsonl")
        validate = pb.ValidateConfigurationRequest(
            principal=PRINCIPAL,
            scope=SCOPE,
            llm=llm(),
            outer=[entry(bad, "INLINE", "DIRECT", inline_text="x")],
            target=pb.Target(
                name="t", knowledge=[named, PERSONA], actions=[pb.Action(name=bad, knowledge=["persona"])]
            ),
        )
        found = {
            (v.field, common_pb2.ErrorReason.Name(v.reason))
            for v in stub(server).ValidateConfiguration(validate, timeout=60).violations
        }
        assert {
            ("outer[0].name", "ERROR_REASON_INVALID_CONFIGURATION"),
            ("target.actions[0].name", "ERROR_REASON_INVALID_CONFIGURATION"),
        } <= found, found
        builds = server.metric("ragsidecar_index_loads_total", how="built")
        # A path outside the roots would be PERMISSION_DENIED: the names are refused before any path is looked at.
        calls = {
            "Enforce": functools.partial(
                stub(server).Enforce,
                enforce_request([named], [bad], params=params(q="heart"), resolved_paths={bad: "/etc/hostname"}),
                timeout=60,
            ),
            "Search": functools.partial(
                stub(server).Search,
                pb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=target([named]), query="heart"),
                timeout=60,
            ),
            "RequireLoaded": functools.partial(
                stub(server).RequireLoaded,
                pb.RequireLoadedRequest(
                    principal=PRINCIPAL, scope=SCOPE, target=target([SCIENCE]), outer=[named], names=[bad]
                ),
                timeout=60,
            ),
            "RequireReady": functools.partial(
                stub(server).RequireReady,
                pb.RequireReadyRequest(principal=PRINCIPAL, scope=SCOPE, target=target([named])),
                timeout=60,
            ),
            "PrepareChatKnowledge": functools.partial(
                stub(server).PrepareChatKnowledge,
                pb.PrepareChatKnowledgeRequest(
                    principal=PRINCIPAL,
                    scope=SCOPE,
                    agent_id="ada",
                    llm=llm(),
                    entries=[entry(bad, "FILE", "DIRECT", "persona.md")],
                ),
                timeout=60,
            ),
            "Enforce, action name": functools.partial(
                stub(server).Enforce,
                pb.EnforceRequest(
                    principal=PRINCIPAL,
                    scope=SCOPE,
                    llm=llm(),
                    action=bad,
                    target=target([PERSONA], {bad: ["persona"]}),
                ),
                timeout=60,
            ),
        }
        for rpc, call in calls.items():
            err = refused(call, invalid, "INVALID_CONFIGURATION")
            assert any(field.endswith("name") for field, _ in error_details(err)[1]), (rpc, err.details())
        assert server.metric("ragsidecar_index_loads_total", how="built") == builds


def test_validation_keeps_the_reason_of_each_path_problem(server: Sidecar, root: Path) -> None:
    """Issue 10 item 4: a NUL is an invalid request and a symlink loop is unreadable, not "outside the roots"."""
    (root / "loop-a").symlink_to(root / "loop-b")
    (root / "loop-b").symlink_to(root / "loop-a")
    entries = [
        entry("nul", "FILE", "DIRECT", "persona\x00.md", max_tokens=100),
        entry("loop", "DIRECTORY", "DIRECT", "loop-a", max_tokens=100),
        entry("escape", "FILE", "DIRECT", "../outside.md", max_tokens=100),
    ]
    request = pb.ValidateConfigurationRequest(principal=PRINCIPAL, scope=SCOPE, llm=llm(), target=target(entries))
    found = {
        (v.field, common_pb2.ErrorReason.Name(v.reason))
        for v in stub(server).ValidateConfiguration(request, timeout=60).violations
    }
    assert found == {
        ("target.knowledge[0].path", "ERROR_REASON_INVALID_REQUEST"),
        ("target.knowledge[1].path", "ERROR_REASON_SOURCE_UNREADABLE"),
        ("target.knowledge[2].path", "ERROR_REASON_PATH_OUTSIDE_ROOTS"),
    }


def test_sequential_cursors_are_bounded_and_counted(server: Sidecar) -> None:
    """Issue 10: the least recently used cursor is forgotten past retrieval.max_sequential_cursors."""

    def step(session: str) -> str:
        scope = common_pb2.Scope(tenant="cursor-tenant", session=session)
        return enforce(server, [STEPS], ["steps"], scope=scope).retrieved_context

    assert "Step 1:" in step("first") and "Step 2:" in step("first")
    for session in range(MAX_CURSORS):
        assert "Step 1:" in step(f"other-{session}")
    assert server.metric("ragsidecar_sequential_cursors") == MAX_CURSORS
    assert "Step 1:" in step("first")  # forgotten: starts again, as after a restart


def test_continue_drops_a_source_whose_rerank_fails(make_sidecar, root: Path, tmp_path: Path) -> None:
    """Issue 15 item 10: a full reranker queue is a retrieval failure: CONTINUE degrades, FAIL surfaces."""
    config = retrieval_config(root, tmp_path / "data")
    config["inference"]["max_queued_pairs"] = 4  # every call below embeds at most 4 inputs; the rerank needs 8
    server = make_sidecar(config).start()
    notes = entry("notes", "MEMORY", "SEARCH", top_k=2, search=pb.SearchOptions(rerank=True, candidates=8))
    for batch in range(2):
        documents = [
            pb.MemoryDocument(id=f"d{batch}{i}", text=f"Delivery note {batch}{i}: parcels leave at {i} pm.")
            for i in range(4)
        ]
        stub(server).UpsertDocuments(
            pb.UpsertDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge="notes", documents=documents),
            timeout=60,
        )
        search = pb.SearchRequest(
            principal=PRINCIPAL,
            scope=SCOPE,
            target=target([notes]),
            query="parcels",
            search=pb.SearchOptions(rerank=False),
        )
        assert stub(server).Search(search, timeout=60).hits  # indexes the new documents, 4 at a time
    refused(
        lambda: enforce(server, [notes], ["notes"], params=params(q="when do parcels leave?")),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "QUEUE_FULL",
    )
    notes.on_failure = pb.KNOWLEDGE_ON_FAILURE_CONTINUE
    response = enforce(server, [notes, PERSONA], ["notes", "persona"], params=params(q="when do parcels leave?"))
    assert [b.source for b in response.blocks] == ["persona"]
