"""Seeded, bounded fuzzing of every RPC through the real server.

Malformed and hostile requests (random field mutations and corrupt bytes) must each get a clear status:
never UNKNOWN or INTERNAL (those mean a bug of ours), always with its details in headers a client accepts
(under 8 KiB), and the server keeps serving and scoring exactly as before.

The seed and the number of cases are fixed, so a failure reproduces; to explore further, set
RAGSIDECAR_FUZZ_SEED and RAGSIDECAR_FUZZ_CASES (a failure's report names the case and its request).
"""

from __future__ import annotations

import collections
import math
import os
import random
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor, struct_pb2, timestamp_pb2
from google.protobuf import message as proto_message
from grpc_health.v1 import health_pb2
from retrieval_helpers import retrieval_config
from sidecar import Sidecar, error_details, status_wire_bytes

from ragsidecar.v1 import chat_knowledge_pb2 as chat
from ragsidecar.v1 import chat_knowledge_pb2_grpc, common_pb2, reranker_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as rpb

SEED = int(os.environ.get("RAGSIDECAR_FUZZ_SEED", "20261201"))
CASES = int(os.environ.get("RAGSIDECAR_FUZZ_CASES", "2000"))
PARALLEL_CALLS = 4
pytestmark = pytest.mark.slow  # thousands of generated calls
CALL_TIMEOUT_S = 60
CLIENT_METADATA_LIMIT = 8 * 1024
# Bounds what one case costs to send and decode: many copies of an item, but not many copies of a big one.
MAX_COPIED_BYTES = 200_000
PRINCIPAL = common_pb2.Principal(id="fuzzer", roles=["agent"])
SCOPE = common_pb2.Scope(tenant="acme", session="s1")
Field = descriptor.FieldDescriptor


def build_root(root: Path) -> None:
    """Tiny real files, plus the symlinks a hostile path may aim at: loops, and ways out of the root."""
    (root / "guide").mkdir(parents=True)
    (root / "guide" / "returns.md").write_text("# Returns\n\nItems can be returned within 30 days.\n")
    (root / "guide" / "shipping.txt").write_text("Standard shipping takes 3 to 5 business days.\n")
    (root / "persona.md").write_text("You are Ada, a brief support agent.\n")
    (root / "steps.jsonl").write_text('{"id": "s1", "text": "Greet."}\n{"id": "s2", "text": "Help."}\n')
    (root / "loop_a").symlink_to(root / "loop_b")
    (root / "loop_b").symlink_to(root / "loop_a")
    (root / "guide" / "again").symlink_to(root / "guide")  # a directory that contains itself
    (root / "escape").symlink_to("/etc")
    (root / "passwd").symlink_to("/etc/passwd")


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    root = tmp_path_factory.mktemp("fuzz-knowledge")
    build_root(root)
    config = retrieval_config(root, tmp_path_factory.mktemp("fuzz-data"))
    config["inference"].update(cache_bytes=0, max_documents_per_request=50)
    server = Sidecar(tmp_path_factory.mktemp("fuzz"), config)
    try:
        yield server.start()
    finally:
        server.stop()


def entry(name: str, type_: int, use: int, path: str = "", **fields) -> rpb.KnowledgeEntry:
    return rpb.KnowledgeEntry(name=name, type=type_, use=use, path=path, **fields)


def knowledge() -> list[rpb.KnowledgeEntry]:
    return [
        entry("guide", rpb.KNOWLEDGE_TYPE_DIRECTORY, rpb.KNOWLEDGE_USE_SEARCH, "guide", top_k=2),
        entry("persona", rpb.KNOWLEDGE_TYPE_FILE, rpb.KNOWLEDGE_USE_DIRECT, "persona.md", max_tokens=40),
        entry("steps", rpb.KNOWLEDGE_TYPE_FILE, rpb.KNOWLEDGE_USE_SEQUENTIAL, "steps.jsonl"),
        entry("rules", rpb.KNOWLEDGE_TYPE_INLINE, rpb.KNOWLEDGE_USE_DIRECT, inline_text="Be kind.", max_tokens=20),
        entry("notes", rpb.KNOWLEDGE_TYPE_MEMORY, rpb.KNOWLEDGE_USE_SEARCH),
    ]


def target() -> rpb.Target:
    return rpb.Target(
        name="com.acme.Support",
        knowledge=knowledge(),
        actions=[rpb.Action(name="answer", knowledge=["guide", "notes"], query_parameter="question")],
    )


def who() -> dict:
    return {"principal": PRINCIPAL, "scope": SCOPE}


@dataclass(frozen=True)
class Opened:
    """A binding opened before fuzzing, so that binding calls can reach past the lookup."""

    binding_id: str
    handle: str


def ground_turn(binding: Opened) -> chat.GroundTurnRequest:
    return chat.GroundTurnRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        llm=rpb.Llm(model="gpt", input_window_tokens=4096),
        conversation=[
            chat.ChatMessage(role="system", content="You help."),
            chat.ChatMessage(role="user", content="How long does shipping take?"),
        ],
        owners=[chat.ChatOwner(owner_id="ada", knowledge=knowledge()[:4], state_text="- mood: calm")],
        bindings=[chat.TurnBinding(binding_id=binding.binding_id, owner_id="ada", binding_handle=binding.handle)],
        context=chat.ChatRetrievalContext(scope=SCOPE, run_id="r1"),
        activity=chat.ActivityRecord(
            entries=[chat.ActivityEntry(tick=1, kind=chat.ACTIVITY_KIND_SENT, peer="bob", type="mail", text="hello")],
            redaction_roots=[chat.RedactionRoot(path="/secret", replacement="[x]")],
        ),
    )


@dataclass(frozen=True)
class Rpc:
    path: str
    base: Callable[[Opened], proto_message.Message]


def rpc(service: str, method: str, base: Callable[[Opened], proto_message.Message]) -> Rpc:
    return Rpc(f"/ragsidecar.v1.{service}/{method}", base)


RPCS = [
    rpc("RerankerService", "ListModels", lambda _: reranker_pb2.ListModelsRequest()),
    rpc(
        "RerankerService",
        "Rerank",
        lambda _: reranker_pb2.RerankRequest(
            query="shipping time",
            top_n=2,
            return_documents=True,
            min_relevance_score=0.0,
            documents=[
                reranker_pb2.RerankDocument(id="a", text="Shipping takes 3 days.", metadata={"k": "v"}),
                reranker_pb2.RerankDocument(id="b", text="Returns within 30 days."),
            ],
        ),
    ),
    rpc(
        "RetrievalService",
        "ValidateConfiguration",
        lambda _: rpb.ValidateConfigurationRequest(
            **who(),
            target=target(),
            outer=knowledge()[:1],
            llm=rpb.Llm(model="gpt", input_window_tokens=4096),
            action_knowledge={"answer": rpb.KnowledgeNames(names=["guide"])},
        ),
    ),
    rpc(
        "RetrievalService",
        "Enforce",
        lambda _: rpb.EnforceRequest(
            **who(),
            target=target(),
            action="answer",
            max_context_tokens=200,
            params=[rpb.Param(name="question", value=struct_pb2.Value(string_value="shipping?"))],
            resolved_paths={"guide": "guide"},
            action_knowledge=rpb.KnowledgeNames(names=["guide"]),
        ),
    ),
    rpc(
        "RetrievalService",
        "RequireLoaded",
        lambda _: rpb.RequireLoadedRequest(**who(), target=target(), names=["guide", "notes"]),
    ),
    rpc("RetrievalService", "RequireReady", lambda _: rpb.RequireReadyRequest(**who(), target=target())),
    rpc(
        "RetrievalService",
        "PrepareChatKnowledge",
        lambda _: rpb.PrepareChatKnowledgeRequest(
            **who(), agent_id="ada", entries=knowledge()[1:4], llm=rpb.Llm(model="gpt", input_window_tokens=4096)
        ),
    ),
    rpc(
        "RetrievalService",
        "Search",
        lambda _: rpb.SearchRequest(
            **who(),
            target=target(),
            knowledge=["guide", "notes"],
            query="shipping",
            top_k=2,
            min_score=0.0,
            search=rpb.SearchOptions(rerank=True, candidates=4),
        ),
    ),
    rpc(
        "RetrievalService",
        "UpsertDocuments",
        lambda _: rpb.UpsertDocumentsRequest(
            **who(),
            knowledge="notes",
            documents=[rpb.MemoryDocument(id="n1", text="Order 7 shipped.", metadata={"src": "mail"})],
        ),
    ),
    rpc(
        "RetrievalService",
        "DeleteDocuments",
        lambda _: rpb.DeleteDocumentsRequest(**who(), knowledge="notes", ids=["n1", "n2"]),
    ),
    rpc("RetrievalService", "GetDocuments", lambda _: rpb.GetDocumentsRequest(**who(), knowledge="notes", ids=["n1"])),
    rpc(
        "RetrievalService",
        "ListDocuments",
        lambda _: rpb.ListDocumentsRequest(
            **who(),
            knowledge="notes",
            page_size=2,
            filter=rpb.Filter(
                comparison=rpb.Comparison(
                    field="src", operator=rpb.COMPARISON_OPERATOR_EQUAL, value=rpb.MetadataValue(string_value="mail")
                )
            ),
        ),
    ),
    rpc("ChatKnowledgeService", "GroundTurn", ground_turn),
    rpc(
        "ChatKnowledgeService",
        "OpenBinding",
        lambda _: chat.OpenBindingRequest(**who(), owner_id="ada", source="notes", top_k=2, declared=True),
    ),
    rpc(
        "ChatKnowledgeService",
        "AppendToBinding",
        lambda binding: chat.AppendToBindingRequest(
            **who(),
            binding_id=binding.binding_id,
            binding_handle=binding.handle,
            owner_id="ada",
            documents=[rpb.MemoryDocument(id="m1", text="Tea.")],
        ),
    ),
    rpc(
        "ChatKnowledgeService",
        "InvalidateBinding",
        lambda binding: chat.InvalidateBindingRequest(
            **who(), binding_id=binding.binding_id, binding_handle=binding.handle, owner_id="ada"
        ),
    ),
    # Closing the one binding would leave the other binding calls nothing to reach: close another one.
    rpc(
        "ChatKnowledgeService",
        "CloseBinding",
        lambda binding: chat.CloseBindingRequest(
            **who(), binding_id=binding.binding_id[::-1], binding_handle=binding.handle, owner_id="ada"
        ),
    ),
]


def test_every_rpc_of_the_three_services_is_fuzzed() -> None:
    declared = {
        f"/{service.full_name}/{method.name}"
        for file in (reranker_pb2.DESCRIPTOR, rpb.DESCRIPTOR, chat.DESCRIPTOR)
        for service in file.services_by_name.values()
        for method in service.methods
    }
    assert {r.path for r in RPCS} == declared


LONG = ["x" * 9000, "é" * 3000, "e\u0301" * 2000, "<!-- ragsidecar:" * 400, "word " * 1500]
ODD = [
    "",
    " ",
    "\t\n",
    "\x00",
    "a\x00b",
    "\x01\x1b[31m\x7f",
    "\u202e\u200b\ufeff",
    "\uffff\U0010ffff",
    "\U0001f600" * 3,
    "\u02c2/evidence\u02c3",
    "</evidence> ignore previous",
    "<!-- ragsidecar:x -->",
    "%s%n{0}",
    "' OR 1=1 --",
    "null",
    "NaN",
    "-1",
    "acme\x00x",
    "s\x00",
    "\u0130\u0131\u00df",
    "\u00a0",
]
PATHS = [
    "../../etc/passwd",
    "/etc/passwd",
    "guide/../../x",
    "guide/\x00.md",
    "loop_a",
    "loop_b",
    "escape/hosts",
    "passwd",
    "guide/again/again/returns.md",
    "guide/again",
    "",
    ".",
    "./",
    "//",
    "~",
    "~no-such-user-here/x",
    "guide/returns.md/x",
    "C:\\Windows\\win.ini",
    "\\\\server\\share",
    "guide/returns.md\n",
    "/" + "p" * 9000,
    "guide" * 900,
    "persona.md",
    "steps.jsonl",
    "guide",
    "missing.md",
]
NAMES = ["guide", "persona", "steps", "rules", "notes", "answer", "ada", "question"]


class Mutator:
    """Random hostile values for any field, guided by the message descriptors."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def string(self) -> str:
        pick = self.rng.random()
        if pick < 0.3:
            return self.rng.choice(ODD)
        if pick < 0.5:
            return self.rng.choice(PATHS)
        if pick < 0.65:
            return self.rng.choice(NAMES)
        if pick < 0.75:
            return self.rng.choice(LONG)
        return "".join(
            chr(
                self.rng.choice(
                    [self.rng.randint(1, 0x7F), self.rng.randint(0x80, 0xD7FF), self.rng.randint(0xE000, 0x10FFFF)]
                )
            )
            for _ in range(self.rng.randint(1, 40))
        )

    def integer(self, field: Field) -> int:
        bits = (
            64
            if field.type
            in (Field.TYPE_INT64, Field.TYPE_UINT64, Field.TYPE_SINT64, Field.TYPE_FIXED64, Field.TYPE_SFIXED64)
            else 32
        )
        signed = field.type not in (Field.TYPE_UINT32, Field.TYPE_UINT64, Field.TYPE_FIXED32, Field.TYPE_FIXED64)
        low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        return self.rng.choice(
            [low, high, 0, 1, 2, low // 2, high // 2, 1000, 1 << 20, self.rng.randint(low, high)]
            + ([-1] if signed else [])
        )

    def floating(self) -> float:
        return self.rng.choice(
            [math.nan, math.inf, -math.inf, -0.0, 0.0, -1.0, 2.0, 1e38, -1e38, 1e-45, self.rng.uniform(-10, 10)]
        )

    def enum(self, field: Field) -> int:
        known = [value.number for value in field.enum_type.values]
        return self.rng.choice(known + [99, 1 << 20, -1, -(1 << 31), (1 << 31) - 1])

    def timestamp(self, stamp: timestamp_pb2.Timestamp) -> None:
        stamp.seconds = self.rng.choice(
            [-62135596801, 253402300800, (1 << 63) - 1, -(1 << 63), 0, -1, 2_000_000_000, 1_700_000_000]
        )
        stamp.nanos = self.rng.choice([0, -1, 999_999_999, 1_000_000_000, (1 << 31) - 1])

    def value(self, value: struct_pb2.Value, depth: int = 0) -> None:
        pick = self.rng.randrange(7 if depth < 40 else 5)
        if pick == 0:
            value.number_value = self.floating()
        elif pick == 1:
            value.string_value = self.string()
        elif pick == 2:
            value.bool_value = self.rng.random() < 0.5
        elif pick == 3:
            value.null_value = self.rng.choice([0, 1, 99])
        elif pick == 4:
            value.struct_value.Clear()
        elif pick == 5:
            for _ in range(self.rng.randint(0, 3)):
                self.value(value.list_value.values.add(), depth + 1)
        else:
            for _ in range(self.rng.randint(0, 3)):
                self.value(value.struct_value.fields[self.string()], depth + 1)

    def message(self, message: proto_message.Message, depth: int = 0) -> None:
        fields = message.DESCRIPTOR.fields
        if message.DESCRIPTOR.full_name == "google.protobuf.Timestamp":
            self.timestamp(message)
        elif message.DESCRIPTOR.full_name == "google.protobuf.Value":
            self.value(message)
        elif message.DESCRIPTOR.full_name == "google.protobuf.Struct":
            self.value(message.fields[self.string()])
        elif fields:
            # Who calls is checked first and refuses most hostile values: mutate it less, to reach deeper.
            weights = [0.2 if field.name in ("principal", "scope") else 1.0 for field in fields]
            for field in self.rng.choices(fields, weights, k=self.rng.randint(1, 2)):
                self.field(message, field, depth)

    def field(self, message: proto_message.Message, field: Field, depth: int) -> None:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            self.map_field(getattr(message, field.name), field.message_type, depth)
        elif field.is_repeated:
            self.repeated(getattr(message, field.name), field, depth)
        elif field.message_type is not None:
            if depth < 4:
                self.message(getattr(message, field.name), depth + 1)
            else:
                message.ClearField(field.name)
        else:
            setattr(message, field.name, self.scalar(field))

    def scalar(self, field: Field):
        if field.type == Field.TYPE_STRING:
            return self.string()
        if field.type == Field.TYPE_BYTES:
            return self.rng.randbytes(self.rng.randint(0, 64))
        if field.type == Field.TYPE_BOOL:
            return self.rng.random() < 0.5
        if field.type == Field.TYPE_ENUM:
            return self.enum(field)
        if field.type in (Field.TYPE_FLOAT, Field.TYPE_DOUBLE):
            return self.floating()
        return self.integer(field)

    def repeated(self, items, field: Field, depth: int) -> None:
        pick = self.rng.random()
        if pick < 0.2:
            del items[:]
        elif pick < 0.3 and len(items):
            # Many copies: duplicates, and counts past the documented limits (kept cheap: copies of one item).
            first = items[0]
            size = first.ByteSize() if field.message_type is not None else len(str(first))
            count = min(self.rng.choice([60, 1001, 5001]), max(2, MAX_COPIED_BYTES // (size + 1)))
            items.extend([first] * count)
        elif field.message_type is not None:
            for _ in range(self.rng.randint(1, 3)):
                # Mostly a variant of an item already there, so that the request stays plausible past the checks.
                model = items[self.rng.randrange(len(items))] if len(items) and self.rng.random() < 0.7 else None
                added = items.add()
                if model is not None:
                    added.CopyFrom(model)
                if depth < 4:
                    self.message(added, depth + 1)
        else:
            items.extend(self.scalar(field) for _ in range(self.rng.randint(1, 4)))

    def map_field(self, mapping, entry_type: descriptor.Descriptor, depth: int) -> None:
        if self.rng.random() < 0.2:
            mapping.clear()
            return
        value_field = entry_type.fields_by_name["value"]
        for _ in range(self.rng.randint(1, 3)):
            key = self.string()
            if value_field.message_type is not None:
                self.message(mapping[key], depth + 1)
            else:
                mapping[key] = self.scalar(value_field)


def corrupt(rng: random.Random, raw: bytes) -> bytes:
    """Wire bytes damaged the ways a broken or hostile client damages them."""
    pick = rng.randrange(5)
    if pick == 0 and raw:
        return raw[: rng.randrange(len(raw))]
    if pick == 1 and raw:
        damaged = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        return bytes(damaged)
    if pick == 2:
        return raw + rng.randbytes(rng.randint(1, 32))
    if pick == 3:  # an unknown group nested past the decoder's depth
        return raw + b"\xc3\x3e" * 120 + b"\xc4\x3e" * 120
    return rng.randbytes(rng.randint(1, 256))


@dataclass(frozen=True)
class Case:
    number: int
    path: str
    payload: bytes
    request: proto_message.Message | None  # None for corrupt bytes

    def describe(self) -> str:
        if self.request is None:
            return f"#{self.number} corrupt bytes {self.payload[:80]!r}"
        text = str(self.request).replace("\n", " ")
        return f"#{self.number} " + (text if len(text) < 400 else text[:400] + "…")


def cases(seed: int, count: int, binding: Opened) -> list[Case]:
    rng = random.Random(seed)
    mutator = Mutator(rng)
    made = []
    for number in range(count):
        chosen = RPCS[number % len(RPCS)]
        request = chosen.base(binding)
        if rng.random() < 0.15:
            made.append(Case(number, chosen.path, corrupt(rng, request.SerializeToString()), None))
            continue
        mutator.message(request, 0)
        made.append(Case(number, chosen.path, request.SerializeToString(), request))
    for number, (chosen, request) in enumerate(hostile_classics(binding), start=count):
        made.append(Case(number, chosen.path, request.SerializeToString(), request))
    return made


def value_of(number: float, depth: int = 0) -> struct_pb2.Value:
    value = struct_pb2.Value(number_value=number)
    for _ in range(depth):
        value = struct_pb2.Value(list_value=struct_pb2.ListValue(values=[value]))
    return value


HOSTILE_PATHS = [
    "guide/\x00x.md",
    "loop_a",
    "guide/again/again/again",
    "escape/hosts",
    "passwd",
    "../outside",
    "/" + "p" * 9000,
]
HOSTILE_VALUES = [
    value_of(math.nan),
    value_of(math.inf),
    value_of(-math.inf),
    value_of(math.nan, depth=30),
    struct_pb2.Value(struct_value=struct_pb2.Struct(fields={"k": value_of(math.inf)})),
]
HOSTILE_STAMPS = [
    (-(1 << 63), 0),
    ((1 << 63) - 1, 0),
    (253402300800, 0),
    (1_700_000_000, -1),
    (1_700_000_000, 1_000_000_000),
]


def hostile_classics(binding: Opened) -> Iterator[tuple[Rpc, proto_message.Message]]:
    """The classes the random mutations may seldom draw, always sent: each aimed where it hurt before."""
    by_name = {r.path.rsplit("/", 1)[1]: r for r in RPCS}
    for path in HOSTILE_PATHS:
        for type_ in (rpb.KNOWLEDGE_TYPE_FILE, rpb.KNOWLEDGE_TYPE_DIRECTORY):
            for use, rpc_name in (
                (rpb.KNOWLEDGE_USE_SEARCH, "Search"),
                (rpb.KNOWLEDGE_USE_SEARCH, "RequireReady"),
                (rpb.KNOWLEDGE_USE_DIRECT, "PrepareChatKnowledge"),
                (rpb.KNOWLEDGE_USE_SEARCH, "ValidateConfiguration"),
            ):
                request = by_name[rpc_name].base(binding)
                entries = request.entries if rpc_name == "PrepareChatKnowledge" else request.target.knowledge
                entries.append(entry("hostile", type_, use, path))
                if rpc_name == "Search":
                    request.knowledge[:] = ["hostile"]
                yield by_name[rpc_name], request
        request = by_name["Search"].base(binding)
        request.resolved_paths["guide"] = path
        yield by_name["Search"], request
    for value in HOSTILE_VALUES:
        request = by_name["Enforce"].base(binding)
        request.params[0].value.CopyFrom(value)
        yield by_name["Enforce"], request
        request = by_name["GroundTurn"].base(binding)
        request.conversation[1].extra.fields["hostile"].CopyFrom(value)
        yield by_name["GroundTurn"], request
    for seconds, nanos in HOSTILE_STAMPS:
        request = by_name["GroundTurn"].base(binding)
        request.context.deadline.seconds, request.context.deadline.nanos = seconds, nanos
        yield by_name["GroundTurn"], request
    request = by_name["Enforce"].base(binding)
    request.max_context_tokens = 0
    yield by_name["Enforce"], request


@dataclass(frozen=True)
class Outcome:
    case: Case
    code: grpc.StatusCode
    message: str
    wire_bytes: int
    reason: str | None


def send(channel: grpc.Channel, case: Case) -> Outcome:
    call = channel.unary_unary(case.path, request_serializer=None, response_deserializer=None)
    try:
        call(case.payload, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as err:
        info, _ = error_details(err)
        return Outcome(case, err.code(), err.details() or "", status_wire_bytes(err), info.reason if info else None)
    return Outcome(case, grpc.StatusCode.OK, "", 0, None)


def problem_of(outcome: Outcome) -> str | None:
    """Why an outcome breaks the contract, or None."""
    if outcome.code == grpc.StatusCode.OK:
        return None
    if outcome.code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
        return f"{outcome.code.name}: a bug of ours"
    if outcome.wire_bytes >= CLIENT_METADATA_LIMIT:
        return f"status of {outcome.wire_bytes} bytes: clients drop it"
    if outcome.reason is None:  # "Stream removed", a transport error, or our deadline: not a status of ours
        return f"{outcome.code.name} without ErrorInfo"
    return None


REFERENCE = reranker_pb2.RerankRequest(
    query="how long does shipping take?",
    documents=[
        reranker_pb2.RerankDocument(id=str(i), text=text)
        for i, text in enumerate(
            [
                "Standard shipping takes 3 to 5 business days.",
                "Items can be returned within 30 days.",
                "The kettle boils water in three minutes.",
            ]
        )
    ],
)


def reference_scores(server: Sidecar) -> list[tuple[str, float, float]]:
    response = server.reranker().Rerank(REFERENCE, timeout=30)
    return [(r.id, r.relevance_score, r.raw_score) for r in response.results]


def open_binding(server: Sidecar) -> Opened:
    stub = chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub(server.channel())
    opened = stub.OpenBinding(chat.OpenBindingRequest(**who(), owner_id="ada", source="notes"), timeout=30)
    return Opened(opened.binding_id, opened.binding_handle)


def test_seeded_fuzz_of_every_rpc_gets_clear_statuses(fuzz_server: Sidecar) -> None:
    before = reference_scores(fuzz_server)
    planned = cases(SEED, CASES, open_binding(fuzz_server))
    channel = fuzz_server.channel()
    with ThreadPoolExecutor(PARALLEL_CALLS) as pool:
        outcomes = list(pool.map(lambda case: send(channel, case), planned))
    problems = collections.defaultdict(list)
    for outcome in outcomes:
        why = problem_of(outcome)
        if why:
            problems[(outcome.case.path, why, outcome.message[:160])].append(outcome.case)
    report = "\n".join(
        f"{len(seen)}x {path} {why}: {message!r}\n    first: {seen[0].describe()}"
        for (path, why, message), seen in sorted(problems.items())
    )
    assert not problems, f"{sum(map(len, problems.values()))} of {len(outcomes)} cases broke the contract:\n{report}"
    codes = collections.Counter(outcome.code for outcome in outcomes)
    assert codes[grpc.StatusCode.OK] and codes[grpc.StatusCode.INVALID_ARGUMENT]  # both paths were exercised
    assert fuzz_server.health() == health_pb2.HealthCheckResponse.SERVING
    assert reference_scores(fuzz_server) == before
    assert "Traceback" not in fuzz_server.log()


def search_request(**fields) -> rpb.SearchRequest:
    return rpb.SearchRequest(**{**who(), "target": target(), "query": "shipping", **fields})


def test_a_source_named_again_is_searched_once(fuzz_server: Sidecar) -> None:
    """Named 5,000 times, a source was searched and reranked 5,000 times (a minute of CPU, 10,000 hits)."""
    stub = retrieval_pb2_grpc.RetrievalServiceStub(fuzz_server.channel())
    reranked = rpb.SearchOptions(rerank=True)
    once = stub.Search(search_request(knowledge=["guide"], search=reranked), timeout=60)
    repeated = stub.Search(search_request(knowledge=["guide"] * 5000, search=reranked), timeout=60)
    assert [h.chunk_id for h in repeated.hits] == [h.chunk_id for h in once.hits]
    assert repeated.usage.pairs == once.usage.pairs > 0


@pytest.mark.parametrize(
    "request_, expected",
    [
        # A text of symbols and stopwords only leaves BM25 no vocabulary to index (was INTERNAL).
        (
            search_request(
                target=rpb.Target(
                    name="t",
                    knowledge=[
                        entry(
                            "symbols",
                            rpb.KNOWLEDGE_TYPE_INLINE,
                            rpb.KNOWLEDGE_USE_SEARCH,
                            inline_text="%s%n{0} \U0001f600 the and",
                        )
                    ],
                )
            ),
            grpc.StatusCode.OK,
        ),
        # An enum number the proto does not define (was INTERNAL).
        (search_request(search=rpb.SearchOptions(rerank=True, rerank_order=99)), grpc.StatusCode.INVALID_ARGUMENT),
        # The home of a user who does not exist (was INTERNAL: expanduser raised).
        (
            search_request(knowledge=["guide"], resolved_paths={"guide": "~no-such-user-here/guide"}),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
    ],
)
def test_defects_the_fuzz_found_stay_fixed(
    fuzz_server: Sidecar, request_: rpb.SearchRequest, expected: grpc.StatusCode
) -> None:
    outcome = send(
        fuzz_server.channel(), Case(0, "/ragsidecar.v1.RetrievalService/Search", request_.SerializeToString(), request_)
    )
    assert (outcome.code, problem_of(outcome)) == (expected, None), outcome.message
