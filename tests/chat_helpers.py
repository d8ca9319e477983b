"""ChatKnowledgeService calls and conversations the chat tests share: bindings opened as a host would,
turns grounded, and what a grounded system message holds."""

from __future__ import annotations

import re
import time

import grpc
import pytest
from retrieval_helpers import PRINCIPAL
from sidecar import Sidecar

from ragsidecar.v1 import chat_knowledge_pb2 as pb
from ragsidecar.v1 import chat_knowledge_pb2_grpc, common_pb2
from ragsidecar.v1 import retrieval_pb2 as rpb

SYSTEM = "You are Ada, a support agent for Acme Kitchen."


FENCE_TAG = re.compile(r"<\s*/?\s*tnsai-memory\s*>", re.I)


def stub(server: Sidecar) -> chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub:
    return chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub(server.channel())


def raised(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def scope(tenant: str, session: str = "s1") -> common_pb2.Scope:
    return common_pb2.Scope(tenant=tenant, session=session)


def message(role: str, content: str | None = None, **fields) -> pb.ChatMessage:
    return pb.ChatMessage(role=role, content=content, **fields)


def conversation(user: str = "Where is my blender order?") -> list[pb.ChatMessage]:
    return [
        message("system", SYSTEM),
        message("user", "Hi"),
        message("assistant", "Hello! How can I help?"),
        message("user", user),
    ]


def owner(owner_id: str, knowledge=(), state: str = "") -> pb.ChatOwner:
    return pb.ChatOwner(owner_id=owner_id, knowledge=list(knowledge), state_text=state)


def context(at: common_pb2.Scope, deadline_s: float | None = None) -> pb.ChatRetrievalContext:
    ctx = pb.ChatRetrievalContext(scope=at, run_id="run-9", agent_name="narrator", episode="episode-4")
    if deadline_s is not None:
        ctx.deadline.FromNanoseconds(int((time.time() + deadline_s) * 1e9))
    return ctx


# The handle of every binding the tests opened, by id: what each owner holds privately, as a host would.
HANDLES: dict[str, str] = {}


def open_binding(
    server: Sidecar, at: common_pb2.Scope, owner_id: str, source: str, documents=(), declared: bool = True, **fields
) -> str:
    chat = stub(server)
    opened = chat.OpenBinding(
        pb.OpenBindingRequest(
            principal=PRINCIPAL, scope=at, owner_id=owner_id, source=source, declared=declared, **fields
        ),
        timeout=30,
    )
    binding, HANDLES[opened.binding_id] = opened.binding_id, opened.binding_handle
    if documents:
        append(server, at, binding, owner_id, documents)
    return binding


def append(server: Sidecar, at: common_pb2.Scope, binding: str, owner_id: str, documents) -> pb.AppendToBindingResponse:
    docs = [rpb.MemoryDocument(id=i, text=t) for i, t in documents]
    return stub(server).AppendToBinding(
        pb.AppendToBindingRequest(
            principal=PRINCIPAL,
            scope=at,
            binding_id=binding,
            owner_id=owner_id,
            documents=docs,
            binding_handle=HANDLES.get(binding, ""),
        ),
        timeout=30,
    )


def ground(server: Sidecar, messages=None, **fields) -> pb.GroundTurnResponse:
    request = pb.GroundTurnRequest(
        principal=PRINCIPAL, conversation=conversation() if messages is None else messages, **fields
    )
    return stub(server).GroundTurn(request, timeout=120)


def bound(binding: str, owner_id: str) -> pb.TurnBinding:
    return pb.TurnBinding(binding_id=binding, owner_id=owner_id, binding_handle=HANDLES.get(binding, ""))


def system_text(response: pb.GroundTurnResponse) -> str:
    return next(m.content for m in reversed(response.conversation) if m.role == "system")


def fenced(response: pb.GroundTurnResponse) -> str:
    text = system_text(response)
    return text[text.index("<tnsai-memory>") + len("<tnsai-memory>") : text.index("</tnsai-memory>")]


ORDERS = [
    ("o1", "Order 1001: the Blender X2 shipped on Monday and arrives Thursday."),
    ("o2", "Order 1002: the Kettle K1 is back-ordered until next month."),
    ("o3", "Refunds go back to the original payment method within 5 business days."),
]
