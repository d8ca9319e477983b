"""RetrievalService: proto <-> the retrieval runtime."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
from google.protobuf import json_format, timestamp_pb2

from ragsidecar.api.filter_messages import (
    after_of,
    document_message,
    filter_of,
    instant_of,
    metadata_messages,
    page_token,
    typed_metadata_of,
)
from ragsidecar.api.grpc_errors import deadline_of, translates_errors
from ragsidecar.errors import ErrorKind, SidecarError, Violation, invalid
from ragsidecar.identifiers import id_problems
from ragsidecar.knowledge import filters
from ragsidecar.knowledge.declarations import (
    Action,
    Entry,
    Llm,
    RerankOrder,
    RetrievalMode,
    Scope,
    SourceType,
    Target,
    Use,
)
from ragsidecar.knowledge.runtime import Block, Hit, RetrievalRuntime, SearchSpec, StaleSource, Work
from ragsidecar.knowledge.storage import MemoryDocument
from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

_TYPES = {
    pb.KNOWLEDGE_TYPE_FILE: SourceType.FILE,
    pb.KNOWLEDGE_TYPE_DIRECTORY: SourceType.DIRECTORY,
    pb.KNOWLEDGE_TYPE_MEMORY: SourceType.MEMORY,
    pb.KNOWLEDGE_TYPE_INLINE: SourceType.INLINE,
}
_USES = {
    pb.KNOWLEDGE_USE_DIRECT: Use.DIRECT,
    pb.KNOWLEDGE_USE_SEARCH: Use.SEARCH,
    pb.KNOWLEDGE_USE_SEQUENTIAL: Use.SEQUENTIAL,
}
_USE_PROTO = {v: k for k, v in _USES.items()}
_MAX_GET_IDS = 1000
_DEFAULT_PAGE_SIZE = 100
_MAX_PAGE_SIZE = 1000
_RERANK_ORDERS = {
    pb.RERANK_ORDER_UNSPECIFIED: RerankOrder.FUSED,
    pb.RERANK_ORDER_FUSED: RerankOrder.FUSED,
    pb.RERANK_ORDER_RERANKER: RerankOrder.RERANKER,
}
_RETRIEVAL_MODES = {
    pb.RETRIEVAL_MODE_UNSPECIFIED: RetrievalMode.HYBRID,
    pb.RETRIEVAL_MODE_HYBRID: RetrievalMode.HYBRID,
    pb.RETRIEVAL_MODE_DENSE: RetrievalMode.DENSE,
    pb.RETRIEVAL_MODE_LEXICAL: RetrievalMode.LEXICAL,
}
# The enum fields of SearchOptions, by path, with their enum.
_SEARCH_ENUMS = (("rerank_order", pb.RerankOrder), ("retrieval_mode", pb.RetrievalMode))
# The enum fields of a KnowledgeEntry, by path, with their enum: a number the enum does not define is refused.
_ENTRY_ENUMS = (
    ("type", pb.KnowledgeType),
    ("use", pb.KnowledgeUse),
    ("readiness", pb.KnowledgeReadiness),
    ("on_failure", pb.KnowledgeOnFailure),
    *((f"search.{name}", enum) for name, enum in _SEARCH_ENUMS),
)


class RetrievalService(retrieval_pb2_grpc.RetrievalServiceServicer):
    def __init__(self, runtime: RetrievalRuntime) -> None:
        self._runtime = runtime

    @translates_errors
    async def ValidateConfiguration(
        self, request: pb.ValidateConfigurationRequest, context: grpc.aio.ServicerContext
    ) -> pb.ValidateConfigurationResponse:
        scope = caller(request)
        problems = await self._runtime.validate(
            _target(request.target),
            knowledge_entries(request.outer, "outer"),
            llm_of(request),
            {name: tuple(names.names) for name, names in request.action_knowledge.items()},
            request.paths_per_run,
            scope,
            declarations_only=request.declarations_only,
        )
        return pb.ValidateConfigurationResponse(
            valid=not problems,
            violations=[
                pb.Violation(
                    field=p.field,
                    reason=f"ERROR_REASON_{p.reason}",
                    description=p.description,
                )
                for p in problems
            ],
        )

    @translates_errors
    async def Enforce(self, request: pb.EnforceRequest, context: grpc.aio.ServicerContext) -> pb.EnforceResponse:
        scope = caller(request)
        if request.HasField("max_context_tokens") and request.max_context_tokens < 1:
            raise invalid([Violation("max_context_tokens", "must be at least 1 when set")])
        result = await self._runtime.enforce(
            _target(request.target),
            knowledge_entries(request.outer, "outer"),
            request.action,
            _params(request.params),
            dict(request.resolved_paths),
            llm_of(request),
            tuple(request.action_knowledge.names) if request.HasField("action_knowledge") else None,
            request.max_context_tokens if request.HasField("max_context_tokens") else None,
            scope,
            deadline_of(context, asyncio.get_running_loop().time()),
        )
        return pb.EnforceResponse(
            retrieved_context=result.context,
            document_count=result.document_count,
            stale_fallbacks=[stale_fallback(s) for s in result.stale],
            truncated=result.truncated,
            blocks=[_block(b) for b in result.blocks],
            query=result.query,
            usage=usage_of(result.work),
            timing=timing_of(result.work),
        )

    @translates_errors
    async def RequireLoaded(
        self, request: pb.RequireLoadedRequest, context: grpc.aio.ServicerContext
    ) -> pb.RequireLoadedResponse:
        scope = caller(request)
        counts = await self._runtime.require_loaded(
            _target(request.target),
            knowledge_entries(request.outer, "outer"),
            list(request.names),
            dict(request.resolved_paths),
            scope,
        )
        return pb.RequireLoadedResponse(counts=[pb.SourceCount(name=n, count=c) for n, c in counts])

    @translates_errors
    async def RequireReady(
        self, request: pb.RequireReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.RequireReadyResponse:
        scope = caller(request)
        counts = await self._runtime.require_ready(
            _target(request.target), knowledge_entries(request.outer, "outer"), dict(request.resolved_paths), scope
        )
        return pb.RequireReadyResponse(counts=[pb.SourceCount(name=n, count=c) for n, c in counts])

    @translates_errors
    async def PrepareChatKnowledge(
        self, request: pb.PrepareChatKnowledgeRequest, context: grpc.aio.ServicerContext
    ) -> pb.PrepareChatKnowledgeResponse:
        scope = caller(request)
        if problems := id_problems(request.agent_id, "agent_id"):
            raise invalid(problems)
        plan = await self._runtime.prepare_chat(knowledge_entries(request.entries, "entries"), llm_of(request), scope)
        return pb.PrepareChatKnowledgeResponse(
            blocks=[
                pb.DirectKnowledgeBlock(
                    source=m.entry.name,
                    position=m.position,
                    text=m.text,
                    tokens=m.tokens,
                    budget_tokens=m.budget,
                    shared_budget=m.shared,
                    document_count=m.documents,
                )
                for m in plan.blocks
            ],
            input_window_tokens=plan.window or 0,
            default_budget_tokens=plan.default_budget,
            default_budget_used_tokens=plan.default_used,
        )

    @translates_errors
    async def Search(self, request: pb.SearchRequest, context: grpc.aio.ServicerContext) -> pb.SearchResponse:
        scope = caller(request)
        if request.HasField("top_k") and request.top_k < 1:
            raise invalid([Violation("top_k", "must be at least 1 when set")])
        options = request.search if request.HasField("search") else None
        if problems := _enum_problems(request.search, _SEARCH_ENUMS, "search"):
            raise invalid(problems)
        spec = SearchSpec(
            top_k=request.top_k if request.HasField("top_k") else None,
            min_score=request.min_score if request.HasField("min_score") else None,
            rerank=options.rerank if options else None,
            reranker_model=options.reranker_model if options else None,
            candidates=options.candidates if options and options.HasField("candidates") else None,
            rerank_order=_RERANK_ORDERS[options.rerank_order] if options else None,
            rerank_depth=options.rerank_depth if options and options.HasField("rerank_depth") else None,
            group_by_document=options.group_by_document if options else None,
            retrieval_mode=_RETRIEVAL_MODES[options.retrieval_mode] if options else None,
        )
        keep = {name: filter_of(message, f"filters[{name!r}]") for name, message in sorted(request.filters.items())}
        hits, stale, work = await self._runtime.search(
            _target(request.target),
            knowledge_entries(request.outer, "outer"),
            list(request.knowledge),
            request.query,
            spec,
            dict(request.resolved_paths),
            scope,
            deadline_of(context, asyncio.get_running_loop().time()),
            rescan=request.rescan,
            keep=keep,
        )
        return pb.SearchResponse(
            hits=[_chunk(h) for h in hits],
            stale_fallbacks=[stale_fallback(s) for s in stale],
            usage=usage_of(work),
            timing=timing_of(work),
        )

    @translates_errors
    async def UpsertDocuments(
        self, request: pb.UpsertDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpsertDocumentsResponse:
        scope = caller(request)
        documents = memory_documents(
            request.documents, self._runtime.max_memory_documents, _knowledge_problems(request.knowledge)
        )
        outcome = await self._runtime.catalog.memory.upsert(scope, request.knowledge, documents)
        return pb.UpsertDocumentsResponse(
            inserted=outcome.inserted,
            replaced=outcome.replaced,
            unchanged=outcome.unchanged,
            document_count=outcome.count,
        )

    @translates_errors
    async def DeleteDocuments(
        self, request: pb.DeleteDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteDocumentsResponse:
        scope = caller(request)
        memory = self._runtime.catalog.memory
        if request.HasField("filter"):
            problems = _knowledge_problems(request.knowledge)
            if request.ids:
                problems.append(Violation("ids", "ids and filter cannot both be set", "INVALID_REQUEST"))
            if problems:
                raise invalid(problems)
            keep = filter_of(request.filter, "filter", filters.DOCUMENT_FIELDS)
            outcome = await memory.delete_matching(scope, request.knowledge, keep)
        else:
            problems = _knowledge_problems(request.knowledge)
            problems += _id_problems(list(request.ids), "ids", repeats_allowed=True)
            if problems:
                raise invalid(problems)
            outcome = await memory.delete(scope, request.knowledge, list(request.ids))
        return pb.DeleteDocumentsResponse(
            deleted=outcome.deleted, not_found=outcome.not_found, document_count=outcome.count
        )

    @translates_errors
    async def GetDocuments(
        self, request: pb.GetDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetDocumentsResponse:
        scope = caller(request)
        ids = list(request.ids)
        problems = _knowledge_problems(request.knowledge)
        if len(ids) > _MAX_GET_IDS:
            problems.append(Violation("ids", f"at most {_MAX_GET_IDS} ids per call, not {len(ids)}", "LIMIT_EXCEEDED"))
        else:
            problems += _id_problems(ids, "ids", repeats_allowed=True)
        if problems:
            raise invalid(problems)
        found = await self._runtime.catalog.memory.get(scope, request.knowledge, ids, time.time_ns())
        held = {d.id for d in found}
        return pb.GetDocumentsResponse(
            documents=[document_message(d) for d in found],
            not_found=[i for i in dict.fromkeys(ids) if i not in held],
        )

    @translates_errors
    async def ListDocuments(
        self, request: pb.ListDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDocumentsResponse:
        scope = caller(request)
        problems = _knowledge_problems(request.knowledge)
        if request.page_size > _MAX_PAGE_SIZE:
            problems.append(Violation("page_size", f"at most {_MAX_PAGE_SIZE}", "INVALID_REQUEST"))
        if problems:
            raise invalid(problems)
        keep = (
            filter_of(request.filter, "filter", filters.DOCUMENT_FIELDS)
            if request.HasField("filter")
            else filters.KEEP_ALL
        )
        after = after_of(request.page_token, request.knowledge, keep)
        page = await self._runtime.catalog.memory.page(
            scope, request.knowledge, keep, after, request.page_size or _DEFAULT_PAGE_SIZE, time.time_ns()
        )
        return pb.ListDocumentsResponse(
            documents=[document_message(d) for d in page.documents],
            next_page_token="" if page.after is None else page_token(page.after, request.knowledge, keep),
        )


def require_principal(request: Any) -> None:
    """Checked first, before anything is read: a principal is required, and its id must be a valid id."""
    if not request.principal.id.strip():
        raise SidecarError(
            ErrorKind.PERMISSION_DENIED,
            "PERMISSION_DENIED",
            "the request carries no principal; knowledge is read only on behalf of a caller",
        )
    if problems := id_problems(request.principal.id, "principal.id"):
        raise invalid(problems)


def caller(request: Any) -> Scope:
    """Every request names its principal and tenant; ids with control characters or over
    identifiers.MAX_ID_CHARS are refused before anything is read or written."""
    require_principal(request)
    problems = id_problems(request.scope.tenant, "scope.tenant") + id_problems(
        request.scope.session, "scope.session", required=False
    )
    if problems:
        raise invalid(problems)
    return Scope(request.scope.tenant, request.scope.session)


def memory_documents(documents: Any, limit: int, problems: list[Violation]) -> list[MemoryDocument]:
    """The documents of a MEMORY write (an upsert, or an append to a chat binding), checked: at most the
    limit per call, ids valid and unique, text not blank (the store checks bytes). `problems` are the
    request's other ones."""
    if len(documents) > limit:
        raise invalid(
            [
                Violation(
                    "documents", f"{len(documents)} documents exceed the limit of {limit} per call", "LIMIT_EXCEEDED"
                )
            ],
            "LIMIT_EXCEEDED",
        )
    problems = problems + _id_problems([d.id for d in documents], "documents", repeats_allowed=False)
    problems += [
        Violation(f"documents[{i}].text", "must not be blank") for i, d in enumerate(documents) if not d.text.strip()
    ]
    typed = []
    for i, d in enumerate(documents):
        values, found = typed_metadata_of(d.typed_metadata, d.metadata, f"documents[{i}]")
        typed.append(values)
        problems += found
    if problems:
        raise invalid(problems)
    return [
        MemoryDocument(
            d.id, d.text, dict(d.metadata), t, instant_of(d.expires_at).nanos if d.HasField("expires_at") else None
        )
        for d, t in zip(documents, typed, strict=True)
    ]


def _knowledge_problems(knowledge: str) -> list[Violation]:
    return id_problems(knowledge, "knowledge")


def _id_problems(ids: list[str], field: str, repeats_allowed: bool) -> list[Violation]:
    problems = [] if ids else [Violation(field, "at least one is required")]
    seen: set[str] = set()
    for i, doc_id in enumerate(ids):
        where = f"{field}[{i}]" + ("" if field == "ids" else ".id")
        if found := id_problems(doc_id, where):
            problems += found
        elif doc_id in seen and not repeats_allowed:
            problems.append(Violation(where, f"duplicate id {doc_id!r}"))
        seen.add(doc_id)
    return problems


def _target(target: pb.Target) -> Target:
    if not target.name.strip():
        raise invalid([Violation("target.name", "required")])
    actions = tuple(
        Action(a.name, tuple(a.knowledge), a.query_parameter if a.HasField("query_parameter") else None)
        for a in target.actions
    )
    return Target(target.name, knowledge_entries(target.knowledge, "target.knowledge"), actions)


def knowledge_entries(messages: Any, where: str) -> tuple[Entry, ...]:
    """The entries, after refusing any enum number their enums do not define (a newer or corrupt client)."""
    problems = [p for i, e in enumerate(messages) for p in _enum_problems(e, _ENTRY_ENUMS, f"{where}[{i}]")]
    if problems:
        raise invalid(problems)
    return tuple(_entry(e, f"{where}[{i}]") for i, e in enumerate(messages))


def _enum_problems(message: Any, fields: tuple[tuple[str, Any], ...], where: str) -> list[Violation]:
    """A violation for each enum field (by dotted path) holding a number its enum does not define."""
    problems = []
    for path, enum in fields:
        number = message
        for name in path.split("."):
            number = getattr(number, name)
        if number not in enum.values():
            problems.append(Violation(f"{where}.{path}", f"{number} is not a value of {enum.DESCRIPTOR.name}"))
    return problems


def _params(params: Any) -> list[tuple[str, Any]]:
    """The action's parameters as (name, JSON value): names required and unique, numbers finite."""
    problems, seen, values = [], set(), []
    for i, param in enumerate(params):
        if not param.name.strip():
            problems.append(Violation(f"params[{i}].name", "required"))
        elif param.name in seen:
            problems.append(Violation(f"params[{i}].name", f"parameter {param.name!r} is given twice"))
        seen.add(param.name)
        try:
            values.append((param.name, json_format.MessageToDict(param.value)))
        except ValueError:  # NaN and infinities have no JSON form
            problems.append(Violation(f"params[{i}].value", "holds a NaN or infinite number"))
    if problems:
        raise invalid(problems)
    return values


def _entry(entry: pb.KnowledgeEntry, origin: str) -> Entry:
    search = entry.search
    return Entry(
        name=entry.name,
        type=_TYPES.get(entry.type),
        use=_USES.get(entry.use),
        path=entry.path,
        inline_text=entry.inline_text,
        top_k=entry.top_k if entry.HasField("top_k") else None,
        min_score=entry.min_score if entry.HasField("min_score") else None,
        max_tokens=entry.max_tokens if entry.HasField("max_tokens") else None,
        when_configured=entry.readiness == pb.KNOWLEDGE_READINESS_WHEN_CONFIGURED,
        enabled=entry.enabled if entry.HasField("enabled") else True,
        continue_on_failure=entry.on_failure == pb.KNOWLEDGE_ON_FAILURE_CONTINUE,
        rerank=search.rerank,
        reranker_model=search.reranker_model,
        candidates=search.candidates if search.HasField("candidates") else None,
        rerank_order=_RERANK_ORDERS[search.rerank_order],
        rerank_depth=search.rerank_depth if search.HasField("rerank_depth") else None,
        group_by_document=search.group_by_document,
        retrieval_mode=_RETRIEVAL_MODES[search.retrieval_mode],
        origin=origin,
    )


def llm_of(request: Any) -> Llm | None:
    if not request.HasField("llm"):
        return None
    llm = request.llm
    if llm.HasField("input_window_tokens") and llm.input_window_tokens < 1:
        raise invalid([Violation("llm.input_window_tokens", "must be at least 1 when set")])
    return Llm(llm.model, llm.input_window_tokens if llm.HasField("input_window_tokens") else None)


def usage_of(work: Work) -> common_pb2.Usage:
    return common_pb2.Usage(pairs=work.pairs, tokens=work.tokens, cached_pairs=work.cached_pairs)


def timing_of(work: Work) -> common_pb2.Timing:
    return common_pb2.Timing(
        queue_us=int(work.queue_s * 1e6), inference_us=int(work.inference_s * 1e6), total_us=int(work.total_s * 1e6)
    )


def stale_fallback(stale: StaleSource) -> pb.StaleFallback:
    built = timestamp_pb2.Timestamp()
    built.FromDatetime(stale.built_at)
    return pb.StaleFallback(source=stale.source, reason=stale.reason, last_good_built_at=built)


def _block(block: Block) -> pb.ContextBlock:
    return pb.ContextBlock(
        source=block.source,
        use=_USE_PROTO[block.use],
        chunks=[_chunk(h) for h in block.hits],
        tokens=block.tokens,
        truncated=block.truncated,
    )


def _chunk(hit: Hit) -> pb.RetrievedChunk:
    p = hit.provenance
    provenance = pb.Provenance(
        source=hit.source,
        file=p.get("file") or "",
        document_id=p.get("document_id") or "",
        char_start=p.get("char_start") or 0,
        char_end=p.get("char_end") or 0,
    )
    for key in ("line_start", "line_end", "page"):
        if p.get(key):
            setattr(provenance, key, p[key])
    metadata = {k: v for k, v in filters.from_json(p.get("fields") or {}).items() if not k.startswith("$")}
    chunk = pb.RetrievedChunk(
        chunk_id=hit.chunk_id,
        source=hit.source,
        text=hit.text,
        provenance=provenance,
        metadata=metadata_messages(metadata),
    )
    if hit.score is not None:
        chunk.score = hit.score
        chunk.scores.CopyFrom(pb.HitScores(dense=hit.dense or 0.0, fused=hit.fused or 0.0))
        if hit.bm25 is not None:
            chunk.scores.bm25 = hit.bm25
        if hit.rerank is not None:
            chunk.scores.rerank = hit.rerank
    return chunk
