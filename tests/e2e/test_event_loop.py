"""The event loop stays free: while the heaviest request each RPC accepts runs, health checks keep answering.

An ordering check, not a timed one. The heavy call goes out as a future; health checks (grpc.health.v1 Check,
as a liveness probe sends them, on their own connection) go out one after another until it returns. A blocked
loop answers no health check until it is free again, so the server's CPU time is read at every health answer:
the work done between two answers is work during which the loop answered nothing. The test asserts that no
such stretch covers more than a quarter of the heavy call's whole work (beyond what gRPC itself does on the
loop), so health was answered all along the call and well before its end, whatever the speed of the machine.

"Heaviest accepted" means just under the documented caps (documents per request, entries, characters, the
message size); the data is generated here, seeded.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from retrieval_helpers import PRINCIPAL, SCOPE, entry, llm, params, target
from sidecar import Sidecar, default_config

from ragsidecar.v1 import chat_knowledge_pb2 as cpb
from ragsidecar.v1 import chat_knowledge_pb2_grpc, reranker_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

pytestmark = pytest.mark.slow  # each test sends calls sized to keep the server busy for seconds

# A stretch of server work without any health answer may cover at most this share of the heavy call's work.
MOST_WORK_WITHOUT_HEALTH = 0.25
# Stretches this short are gRPC's own work on the loop (it decodes a 64 MiB request in a few hundredths of a
# second) and the granularity of the CPU clock (10 ms); they never starve a probe.
TRANSPORT_ALLOWANCE_S = 0.1
# A pause between health checks, so that answering them is not a noticeable share of the server's work.
PROBE_PAUSE_S = 0.02
# Caps the server documents: [inference] max_documents_per_request, [retrieval] max_memory_documents_per_request.
RERANK_DOCUMENTS = 1000
# About 29 MB of document text in all, under Rerank's 32 Mi characters per request (reranker.proto). The query
# stays short: a long one is refused once it leaves no room in the model's window, and is tokenized only once.
RERANK_DOCUMENT_WORDS, RERANK_SCORED_TOKENS = 4000, 16
UPSERT_DOCUMENTS = 1000
# One short chunk each: a write chunks and embeds what it adds, so the largest call's cost is its embedding (the
# 16 MiB of [retrieval] max_memory_bytes_per_request would be many minutes of it on two cores).
UPSERT_DOCUMENT_WORDS = 50
# Big enough that indexing is real work, small enough for a test: "a few hundred documents".
INDEXED_DOCUMENTS = 300
# The largest input window a host model has (2M tokens); a quarter of it is the shared DIRECT budget.
LARGEST_WINDOW = 2_000_000
VALIDATED_ENTRIES = 1000
# GroundTurn's caps (chat_knowledge.proto): messages per turn, characters of one message, sidecar markers in a
# system message, activity entries, redaction roots and their characters in all.
MAX_MESSAGES, MAX_MESSAGE_CHARS, MAX_MARKERS = 2000, 1_000_000, 20_000
MAX_ACTIVITY_ENTRIES, MAX_REDACTION_ROOTS, MAX_ROOTS_CHARS = 10_000, 2048, 131_072
# Within the 64 MiB message cap: a few system messages full of markers, and the rest of the turn's messages.
MARKED_SYSTEM_MESSAGES, CHATTER_WORDS, ENTRY_WORDS = 40, 300, 150

WORDS = (
    "retrieval index vector token budget model query answer source document kettle blender warranty "
    "shipping tenant session owner binding context evidence fence marker window rerank chunk sidecar "
    "protein cell gene therapy cohort trial dose risk outcome signal pathway membrane receptor"
).split()


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


@dataclass
class Probe:
    """What the health checks saw while the heavy call ran."""

    answered_while_pending: int
    # Server CPU seconds of the heavy call, and of its longest stretch without a health answer.
    work_s: float
    longest_unanswered_s: float


def server_cpu_s(server: Sidecar) -> float:
    assert server.process
    times = psutil.Process(server.process.pid).cpu_times()
    return times.user + times.system


def own_connection(server: Sidecar) -> grpc.Channel:
    """A channel on its own TCP connection, as a separate client (a kubelet probe) would have."""
    return server.channel(
        **{
            "grpc.use_local_subchannel_pool": 1,
            "grpc.max_send_message_length": 64 * 1024 * 1024,
            "grpc.max_receive_message_length": 64 * 1024 * 1024,
        }
    )


def probe_health_during(server: Sidecar, start: Callable[[grpc.Channel], grpc.Future]) -> tuple[object, Probe]:
    """Starts the heavy call, checks health until it returns; its response and what the checks saw."""
    health = health_pb2_grpc.HealthStub(own_connection(server))
    heavy_channel = own_connection(server)
    marks = [server_cpu_s(server)]
    future = start(heavy_channel)
    answered = 0
    while not future.done():
        time.sleep(PROBE_PAUSE_S)
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=300).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        if not future.done():
            answered += 1
            marks.append(server_cpu_s(server))
    marks.append(server_cpu_s(server))
    response = future.result()  # a refused heavy request fails the test here, with its status
    stretches = [later - earlier for earlier, later in itertools.pairwise(marks)]
    return response, Probe(answered, marks[-1] - marks[0], max(stretches))


def assert_loop_stayed_free(probe: Probe) -> None:
    assert probe.answered_while_pending > 0, f"no health check answered while the heavy call ran: {probe}"
    allowed = max(MOST_WORK_WITHOUT_HEALTH * probe.work_s, TRANSPORT_ALLOWANCE_S)
    assert probe.longest_unanswered_s <= allowed, (
        f"health went unanswered for {probe.longest_unanswered_s:.2f}s of the call's {probe.work_s:.2f}s of "
        f"server CPU ({probe.answered_while_pending} answers while it ran)"
    )


def write_corpus(path: Path, documents: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(documents):
            f.write(json.dumps({"id": f"d{i}", "text": f"Document {i}. " + prose(rng, 120)}) + "\n")


@pytest.fixture(scope="module")
def knowledge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("loop-knowledge")
    for name, seed in (("fresh", 1), ("built", 2)):
        write_corpus(root / f"{name}.jsonl", INDEXED_DOCUMENTS, seed)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, knowledge: Path) -> Iterator[Sidecar]:
    config = default_config(packaged=True)  # the packaged models: calls heavy enough to measure the loop against
    config["inference"]["cache_bytes"] = 0
    config["paths"]["knowledge_roots"] = [str(knowledge)]
    config["paths"]["data_dir"] = str(tmp_path_factory.mktemp("loop-data"))
    sidecar = Sidecar(tmp_path_factory.mktemp("loop"), config)
    try:
        yield sidecar.start()
    finally:
        sidecar.stop()


def retrieval(channel: grpc.Channel) -> retrieval_pb2_grpc.RetrievalServiceStub:
    return retrieval_pb2_grpc.RetrievalServiceStub(channel)


def chat(channel: grpc.Channel) -> chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub:
    return chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub(channel)


def near_budget_text(rng: random.Random) -> str:
    """DIRECT text just under the shared budget of the largest window (a word is about one token)."""
    budget_tokens = LARGEST_WINDOW // 4
    return prose(rng, int(budget_tokens * 0.8))


def test_rerank_of_the_largest_batch(server: Sidecar) -> None:
    rng = random.Random(10)
    documents = [
        reranker_pb2.RerankDocument(id=f"d{i}", text=prose(rng, RERANK_DOCUMENT_WORDS)) for i in range(RERANK_DOCUMENTS)
    ]
    # Long texts, but each scored on its first tokens only: the request is large, its inference moderate.
    request = reranker_pb2.RerankRequest(
        query=prose(rng, 10), documents=documents, top_n=3, max_document_tokens=RERANK_SCORED_TOKENS
    )
    response, probe = probe_health_during(server, lambda c: server.reranker(c).Rerank.future(request, timeout=600))
    assert len(response.results) == 3
    assert_loop_stayed_free(probe)


def test_search_building_a_fresh_index(server: Sidecar) -> None:
    fresh = entry("fresh", "FILE", "SEARCH", "fresh.jsonl")
    request = pb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=target([fresh]), query="gene therapy trial")
    response, probe = probe_health_during(server, lambda c: retrieval(c).Search.future(request, timeout=600))
    assert response.hits
    assert_loop_stayed_free(probe)


def test_enforce_with_direct_knowledge_near_the_budget(server: Sidecar) -> None:
    built = entry("built", "FILE", "SEARCH", "built.jsonl")
    loaded = pb.RequireLoadedRequest(principal=PRINCIPAL, scope=SCOPE, target=target([built]), names=["built"])
    retrieval(server.channel()).RequireLoaded(loaded, timeout=600)
    manual = entry("manual", "INLINE", "DIRECT", inline_text=near_budget_text(random.Random(11)))
    request = pb.EnforceRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        action="answer",
        target=target([manual, built], {"answer": ["manual", "built"]}),
        params=params(question="which cohort had the lowest risk?"),
        llm=llm(window=LARGEST_WINDOW),
    )
    response, probe = probe_health_during(server, lambda c: retrieval(c).Enforce.future(request, timeout=600))
    assert response.document_count > 0
    assert_loop_stayed_free(probe)


def test_upsert_of_the_largest_batch(server: Sidecar) -> None:
    rng = random.Random(12)
    documents = [pb.MemoryDocument(id=f"m{i}", text=prose(rng, UPSERT_DOCUMENT_WORDS)) for i in range(UPSERT_DOCUMENTS)]
    request = pb.UpsertDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge="notes", documents=documents)
    response, probe = probe_health_during(server, lambda c: retrieval(c).UpsertDocuments.future(request, timeout=600))
    assert response.inserted == UPSERT_DOCUMENTS
    assert_loop_stayed_free(probe)


def test_prepare_chat_knowledge_with_large_direct_sources(server: Sidecar) -> None:
    rng = random.Random(13)
    shared = entry("manual", "INLINE", "DIRECT", inline_text=near_budget_text(rng))
    own_text = near_budget_text(rng)
    own = entry("handbook", "INLINE", "DIRECT", inline_text=own_text, max_tokens=2 * len(own_text.split()))
    request = pb.PrepareChatKnowledgeRequest(
        principal=PRINCIPAL, scope=SCOPE, agent_id="ada", entries=[shared, own], llm=llm(window=LARGEST_WINDOW)
    )
    response, probe = probe_health_during(
        server, lambda c: retrieval(c).PrepareChatKnowledge.future(request, timeout=600)
    )
    assert [b.source for b in response.blocks] == ["manual", "handbook"]
    assert_loop_stayed_free(probe)


def test_validate_configuration_with_many_entries(server: Sidecar) -> None:
    rng = random.Random(14)
    entries = [
        entry(f"rule-{i}", "INLINE", "DIRECT", inline_text=prose(rng, 400), max_tokens=2000)
        for i in range(VALIDATED_ENTRIES)
    ]
    request = pb.ValidateConfigurationRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        llm=llm(window=LARGEST_WINDOW),
        target=target(entries, {"answer": [e.name for e in entries]}),
    )
    response, probe = probe_health_during(
        server, lambda c: retrieval(c).ValidateConfiguration.future(request, timeout=600)
    )
    assert response.valid, response.violations[:3]
    assert_loop_stayed_free(probe)


def turn(conversation: list[cpb.ChatMessage], knowledge=(), **fields) -> cpb.GroundTurnRequest:
    owner = cpb.ChatOwner(owner_id="ada", knowledge=list(knowledge), state_text="## Current State\n- tick: 9")
    return cpb.GroundTurnRequest(principal=PRINCIPAL, conversation=conversation, owners=[owner], **fields)


def short_conversation() -> list[cpb.ChatMessage]:
    return [
        cpb.ChatMessage(role="system", content="You are Ada."),
        cpb.ChatMessage(role="user", content="What happened in the last run?"),
    ]


def test_ground_turn_of_the_largest_conversation(server: Sidecar) -> None:
    rng = random.Random(15)
    marker = "<!-- ragsidecar:state -->\nleft open\n"
    marked = "You are Ada." + marker * (MAX_MARKERS - 1)
    assert len(marked) < MAX_MESSAGE_CHARS
    chatter = [
        cpb.ChatMessage(role=("user", "assistant")[i % 2], content=prose(rng, CHATTER_WORDS))
        for i in range(MAX_MESSAGES - MARKED_SYSTEM_MESSAGES - 1)
    ]
    conversation = [
        *(cpb.ChatMessage(role="system", content=marked) for _ in range(MARKED_SYSTEM_MESSAGES)),
        *chatter,
        cpb.ChatMessage(role="user", content="What happened in the last run?"),
    ]
    request = turn(conversation, request_section="Answer briefly.")
    response, probe = probe_health_during(server, lambda c: chat(c).GroundTurn.future(request, timeout=600))
    given, returned = len(conversation), len(response.conversation)  # counts, not the megabytes, if it fails
    assert returned == given and "Answer briefly." in response.conversation[MARKED_SYSTEM_MESSAGES - 1].content
    assert_loop_stayed_free(probe)


def test_ground_turn_rendering_the_largest_activity_record(server: Sidecar) -> None:
    rng = random.Random(16)
    root_chars = MAX_ROOTS_CHARS // MAX_REDACTION_ROOTS
    roots = [
        cpb.RedactionRoot(path=f"/runs/{i:05d}/".ljust(root_chars - 1, "w"), replacement="<run>")
        for i in range(MAX_REDACTION_ROOTS)
    ]
    entries = [
        cpb.ActivityEntry(
            tick=i,
            kind=cpb.ACTIVITY_KIND_ACTED,
            type="bend",
            text=f"{roots[i % MAX_REDACTION_ROOTS].path}/plank.txt " + prose(rng, ENTRY_WORDS),
        )
        for i in range(MAX_ACTIVITY_ENTRIES)
    ]
    activity = cpb.ActivityRecord(
        entries=entries,
        redaction_roots=roots,
        max_entries=MAX_ACTIVITY_ENTRIES,
        max_total_chars=2**32 - 1,
        max_entry_chars=2**32 - 1,
    )
    request = turn(short_conversation(), activity=activity)
    response, probe = probe_health_during(server, lambda c: chat(c).GroundTurn.future(request, timeout=600))
    redacted = response.conversation[0].content.count("<run>")
    assert redacted >= MAX_ACTIVITY_ENTRIES
    assert_loop_stayed_free(probe)


def test_ground_turn_giving_direct_knowledge_near_the_budget(server: Sidecar) -> None:
    manual = entry("manual", "INLINE", "DIRECT", inline_text=near_budget_text(random.Random(17)))
    request = turn(
        short_conversation(), [manual], llm=llm(window=LARGEST_WINDOW), context=cpb.ChatRetrievalContext(scope=SCOPE)
    )
    response, probe = probe_health_during(server, lambda c: chat(c).GroundTurn.future(request, timeout=600))
    assert response.grounding == cpb.TURN_GROUNDING_GROUNDED
    assert_loop_stayed_free(probe)
