"""Conversation turns in MEMORY, through the real server: a turn written with a `time` after another turn of its
session is found by a question about what that turn said (knowledge/conversation.py), in the BM25 list too, and a
search not grouped by document returns each turn once. The conversation is tests/data/conversation/boiler.json,
written for these tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from retrieval_helpers import PRINCIPAL, retrieval_config
from sidecar import Sidecar

from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

CONVERSATION = Path(__file__).resolve().parents[1] / "data" / "conversation" / "boiler.json"
MEMORY = pb.KnowledgeEntry(name="chat", type=pb.KNOWLEDGE_TYPE_MEMORY, use=pb.KNOWLEDGE_USE_SEARCH)
ANSWER = "S1:4"  # "Gina: Yes, the pressure valve had rusted through, ..." (after Jon's question on the boiler)
QUESTION = "What was wrong with the old boiler in the basement?"


def turns(with_time: bool) -> list[pb.MemoryDocument]:
    """The conversation as a host writes it: id S<session>:<turn>, "Speaker: text", the speaker and, when
    `with_time`, the session's time as metadata."""
    sessions = json.loads(CONVERSATION.read_text(encoding="utf-8"))["sessions"]
    return [
        pb.MemoryDocument(
            id=f"S{s}:{t}",
            text=f"{speaker}: {text}",
            metadata={"speaker": speaker, **({"time": session["time"]} if with_time else {})},
        )
        for s, session in enumerate(sessions, start=1)
        for t, (speaker, text) in enumerate(session["turns"], start=1)
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Sidecar:
    config = retrieval_config(tmp_path_factory.mktemp("knowledge"), tmp_path_factory.mktemp("data"))
    sidecar = Sidecar(tmp_path_factory.mktemp("conversation"), config).start()
    stub = retrieval_pb2_grpc.RetrievalServiceStub(sidecar.channel())
    for tenant, with_time in (("turns", True), ("notes", False)):
        for document in turns(with_time):  # a turn at a time, as a chat host writes them
            stub.UpsertDocuments(
                pb.UpsertDocumentsRequest(
                    principal=PRINCIPAL, scope=common_pb2.Scope(tenant=tenant), knowledge="chat", documents=[document]
                ),
                timeout=120,
            )
    yield sidecar
    sidecar.stop()


def search(server: Sidecar, tenant: str, query: str, mode: int, top_k: int = 3) -> list[pb.RetrievedChunk]:
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=common_pb2.Scope(tenant=tenant),
        target=pb.Target(name="com.acme.Companion", knowledge=[MEMORY]),
        query=query,
        top_k=top_k,
        search=pb.SearchOptions(retrieval_mode=mode),  # type: ignore[arg-type]
    )
    return list(retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).Search(request, timeout=120).hits)


def ids(hits: list[pb.RetrievedChunk]) -> list[str]:
    return [h.provenance.document_id for h in hits]


def test_a_question_about_the_previous_turn_reaches_the_turn_that_answers_it(server: Sidecar) -> None:
    # The answer shares no word with the question; the turn before it (Jon's) holds them.
    assert ANSWER in ids(search(server, "turns", QUESTION, pb.RETRIEVAL_MODE_LEXICAL, top_k=2))
    assert ANSWER in ids(search(server, "turns", QUESTION, pb.RETRIEVAL_MODE_HYBRID, top_k=2))
    # The same documents without a time are notes, each its text alone: BM25 cannot find the answer.
    assert ANSWER not in ids(search(server, "notes", QUESTION, pb.RETRIEVAL_MODE_LEXICAL, top_k=10))


def test_a_turn_is_returned_once_whichever_of_its_units_matched(server: Sidecar) -> None:
    hits = search(server, "turns", "Jon's cello teacher and the concert", pb.RETRIEVAL_MODE_HYBRID, top_k=10)
    assert len(hits) == 10 and len(set(ids(hits))) == 10
    spans = {(h.provenance.document_id, h.provenance.char_start, h.provenance.char_end) for h in hits}
    assert len(spans) == 10


def test_a_turn_after_a_session_gap_is_not_indexed_with_the_last_one(server: Sidecar) -> None:
    # "S2:1" opens the second session, 18 days after "S1:7" (the cello scales): no context joins them.
    hits = search(server, "turns", "practise scales for half an hour", pb.RETRIEVAL_MODE_LEXICAL, top_k=10)
    assert "S1:7" in ids(hits) and "S2:1" not in ids(hits)


def test_a_hit_shows_the_turns_own_text_whichever_unit_matched(server: Sidecar) -> None:
    written = {d.id: d.text for d in turns(with_time=True)}
    for mode in (pb.RETRIEVAL_MODE_LEXICAL, pb.RETRIEVAL_MODE_HYBRID):
        hits = search(server, "turns", QUESTION, mode, top_k=10)
        assert ANSWER in ids(hits)  # through the unit that holds the turn before it
        assert all(h.text == written[h.provenance.document_id] for h in hits)


def test_a_hybrid_search_ranks_a_turn_with_its_neighbours_and_nothing_else(server: Sidecar) -> None:
    # The best fused turns lift their neighbours: a hit's score is its fused score plus a share of a neighbour's.
    hits = search(server, "turns", QUESTION, pb.RETRIEVAL_MODE_HYBRID, top_k=10)
    assert any(h.score > h.scores.fused + 1e-6 for h in hits)
    assert all(h.score >= h.scores.fused - 1e-6 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    # Notes (no time) have no neighbours, and a single list is its own order.
    for tenant, mode in (("notes", pb.RETRIEVAL_MODE_HYBRID), ("turns", pb.RETRIEVAL_MODE_LEXICAL)):
        assert all(abs(h.score - h.scores.fused) < 1e-6 for h in search(server, tenant, QUESTION, mode, top_k=10))
