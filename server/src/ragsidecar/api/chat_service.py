"""ChatKnowledgeService: proto <-> chat grounding and bindings."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
from google.protobuf import json_format

from ragsidecar.api.grpc_errors import deadline_of, translates_errors
from ragsidecar.api.retrieval_service import (
    caller,
    knowledge_entries,
    llm_of,
    memory_documents,
    require_principal,
    stale_fallback,
    timing_of,
    usage_of,
)
from ragsidecar.chat.activity import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_ENTRY_CHARS,
    DEFAULT_MAX_TOTAL_CHARS,
    Activity,
    ActivityEntry,
    ActivityKind,
)
from ragsidecar.chat.grounding import Grounder
from ragsidecar.chat.open_bindings import Bindings
from ragsidecar.chat.turn_rules import message_count_problems, scope_problems, shape_problems
from ragsidecar.chat.turns import Message, Owner, OwnerOutcome, RetrievalContext, Turn, TurnBinding, TurnResult
from ragsidecar.config import RetrievalConfig
from ragsidecar.errors import ErrorKind, SidecarError, Violation, invalid
from ragsidecar.identifiers import id_problems
from ragsidecar.knowledge.declarations import DEFAULT_TOP_K, Scope
from ragsidecar.knowledge.runtime import RetrievalRuntime
from ragsidecar.v1 import chat_knowledge_pb2 as pb
from ragsidecar.v1 import chat_knowledge_pb2_grpc, retrieval_pb2

T = TypeVar("T")
# The calls on one open binding.
_OnBinding = pb.AppendToBindingRequest | pb.InvalidateBindingRequest | pb.CloseBindingRequest
_KINDS = {
    pb.ACTIVITY_KIND_SENT: ActivityKind.SENT,
    pb.ACTIVITY_KIND_RECEIVED: ActivityKind.RECEIVED,
    pb.ACTIVITY_KIND_ACTED: ActivityKind.ACTED,
    pb.ACTIVITY_KIND_NOTED: ActivityKind.NOTED,
}


class ChatKnowledgeService(chat_knowledge_pb2_grpc.ChatKnowledgeServiceServicer):
    def __init__(self, runtime: RetrievalRuntime, config: RetrievalConfig) -> None:
        self._bindings = Bindings(runtime.catalog, config.max_open_bindings, config.binding_idle_seconds)
        self._grounder = Grounder(runtime, self._bindings)
        self._max_documents = runtime.max_memory_documents

    @translates_errors
    async def GroundTurn(
        self, request: pb.GroundTurnRequest, context: grpc.aio.ServicerContext
    ) -> pb.GroundTurnResponse:
        require_principal(request)
        if problems := message_count_problems(len(request.conversation)):  # before converting them
            raise invalid(problems)
        now = asyncio.get_running_loop().time()
        # Converting copies every text and extra: proportional to the request, so off the event loop.
        turn, problems = await asyncio.to_thread(_turn, request, now, deadline_of(context, now))
        if problems:  # what converting found, with the turn's other problems: every one at once
            raise invalid(problems + shape_problems(turn))
        result = await self._grounder.ground(turn)
        return await asyncio.to_thread(_response, result)

    @translates_errors
    async def OpenBinding(
        self, request: pb.OpenBindingRequest, context: grpc.aio.ServicerContext
    ) -> pb.OpenBindingResponse:
        scope = _scope(request)
        problems = id_problems(request.owner_id, "owner_id") + id_problems(request.source, "source")
        if request.HasField("top_k") and request.top_k < 1:
            problems.append(Violation("top_k", "must be at least 1 when set"))
        if problems:
            raise invalid(problems)
        top_k = request.top_k if request.HasField("top_k") else DEFAULT_TOP_K
        binding = await self._bindings.open(request.owner_id, scope, request.source, top_k, request.declared)
        return pb.OpenBindingResponse(binding_id=binding.id, binding_handle=binding.handle)

    @translates_errors
    async def AppendToBinding(
        self, request: pb.AppendToBindingRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendToBindingResponse:
        binding = await self._bindings.get(
            request.binding_id, request.owner_id, _binding_scope(request), request.binding_handle
        )
        outcome = await self._bindings.append(binding, memory_documents(request.documents, self._max_documents, []))
        return pb.AppendToBindingResponse(
            appended=outcome.inserted, replaced=outcome.replaced + outcome.unchanged, document_count=outcome.count
        )

    @translates_errors
    async def InvalidateBinding(
        self, request: pb.InvalidateBindingRequest, context: grpc.aio.ServicerContext
    ) -> pb.InvalidateBindingResponse:
        binding = await self._bindings.get(
            request.binding_id, request.owner_id, _binding_scope(request), request.binding_handle
        )
        return pb.InvalidateBindingResponse(document_count=await self._bindings.invalidate(binding, request.reset))

    @translates_errors
    async def CloseBinding(
        self, request: pb.CloseBindingRequest, context: grpc.aio.ServicerContext
    ) -> pb.CloseBindingResponse:
        scope = _binding_scope(request)
        was_open = await self._bindings.close(request.binding_id, request.owner_id, scope, request.binding_handle)
        return pb.CloseBindingResponse(was_open=was_open)


def _scope(request: pb.OpenBindingRequest | _OnBinding) -> Scope:
    """The request's scope, its ids checked (length, control characters)."""
    scope = caller(request)
    if problems := scope_problems(scope, "scope"):
        raise invalid(problems)
    return scope


def _binding_scope(request: _OnBinding) -> Scope:
    """The scope of a call on one binding, with its binding and owner ids checked."""
    scope = _scope(request)
    problems = id_problems(request.binding_id, "binding_id") + id_problems(request.owner_id, "owner_id")
    if problems:
        raise invalid(problems)
    return scope


def _turn(request: pb.GroundTurnRequest, now: float, call_deadline: float | None) -> tuple[Turn, list[Violation]]:
    """The domain turn, and the problems converting it found (the parts that had them are left out)."""
    problems: list[Violation] = []
    turn = Turn(
        conversation=tuple(_message(m, f"conversation[{i}]", problems) for i, m in enumerate(request.conversation)),
        owners=tuple(
            Owner(
                o.owner_id,
                _collected(functools.partial(knowledge_entries, o.knowledge, f"owners[{i}].knowledge"), problems) or (),
                o.state_text,
            )
            for i, o in enumerate(request.owners)
        ),
        bindings=tuple(TurnBinding(b.binding_id, b.owner_id, b.binding_handle) for b in request.bindings),
        context=_context(request.context, now, problems) if request.HasField("context") else None,
        request_section=request.request_section,
        activity=_activity(request.activity) if request.HasField("activity") else None,
        llm=_collected(lambda: llm_of(request), problems),
        call_deadline=call_deadline,
        scope=Scope(request.scope.tenant, request.scope.session) if request.HasField("scope") else None,
    )
    return turn, problems


def _collected(convert: Callable[[], T], problems: list[Violation]) -> T | None:
    """What `convert` gives; an INVALID_ARGUMENT it raises becomes `problems` (and None)."""
    try:
        return convert()
    except SidecarError as err:
        if err.kind is not ErrorKind.INVALID_ARGUMENT:
            raise
        problems += err.violations
        return None


def _response(result: TurnResult) -> pb.GroundTurnResponse:
    return pb.GroundTurnResponse(
        conversation=[_chat_message(m) for m in result.conversation],
        grounding=f"TURN_GROUNDING_{result.grounding.name}",
        detail=result.detail,
        owners=[_outcome(o) for o in result.owners],
        stale_fallbacks=[stale_fallback(s) for s in result.stale],
        usage=usage_of(result.work),
        timing=timing_of(result.work),
    )


def _message(message: pb.ChatMessage, at: str, problems: list[Violation]) -> Message:
    extra = None
    if message.HasField("extra"):
        try:
            extra = json_format.MessageToDict(message.extra)
        except ValueError:  # NaN or an infinity in a number_value: JSON has neither
            problems.append(Violation(f"{at}.extra", "numbers must be finite (JSON has no NaN or Infinity)"))
    return Message(
        message.role,
        message.content if message.HasField("content") else None,
        message.name,
        message.tool_call_id,
        extra,
    )


def _chat_message(message: Message) -> pb.ChatMessage:
    proto = pb.ChatMessage(
        role=message.role, content=message.content, name=message.name, tool_call_id=message.tool_call_id
    )
    if message.extra is not None:
        proto.extra.update(message.extra)
    return proto


def _context(context: pb.ChatRetrievalContext, now: float, problems: list[Violation]) -> RetrievalContext:
    """The context's wall-clock deadline becomes event-loop time, like the call's own."""
    deadline = None
    if context.HasField("deadline"):
        try:
            deadline = now + (context.deadline.ToNanoseconds() / 1e9 - time.time())
        except ValueError as err:  # outside years 1-9999, or nanos outside [0, 1e9)
            problems.append(Violation("context.deadline", f"not a valid Timestamp: {err}"))
    metadata = {
        name: getattr(context, name)
        for name in ("run_id", "agent_name", "simulation_state", "episode", "source_revision")
        if getattr(context, name)
    }
    return RetrievalContext(Scope(context.scope.tenant, context.scope.session), deadline, metadata)


def _activity(record: pb.ActivityRecord) -> Activity:
    def cap(name: str, default: int) -> int:
        return getattr(record, name) if record.HasField(name) else default

    return Activity(
        entries=tuple(
            ActivityEntry(e.tick, _KINDS.get(e.kind), e.peer, e.type, e.text, e.failed) for e in record.entries
        ),
        max_entries=cap("max_entries", DEFAULT_MAX_ENTRIES),
        max_total_chars=cap("max_total_chars", DEFAULT_MAX_TOTAL_CHARS),
        max_entry_chars=cap("max_entry_chars", DEFAULT_MAX_ENTRY_CHARS),
        redaction_roots=tuple((r.path, r.replacement) for r in record.redaction_roots),
    )


def _outcome(outcome: OwnerOutcome) -> pb.OwnerOutcome:
    return pb.OwnerOutcome(
        owner_id=outcome.owner_id,
        search=f"OWNER_SEARCH_{outcome.search.name}",
        document_count=outcome.document_count,
        detail=outcome.detail,
        searched_sources=outcome.searched_sources,
        fail_open_reason=f"FAIL_OPEN_REASON_{outcome.fail_open.name}"
        if outcome.fail_open
        else pb.FAIL_OPEN_REASON_UNSPECIFIED,
        direct_blocks=[
            retrieval_pb2.DirectKnowledgeBlock(
                source=m.entry.name,
                position=m.position,
                tokens=m.tokens,
                budget_tokens=m.budget,
                shared_budget=m.shared,
                document_count=m.documents,
            )
            for m in outcome.direct
        ],
    )
