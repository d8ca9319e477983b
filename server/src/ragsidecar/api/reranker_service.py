"""RerankerService: proto <-> reranking domain."""

from __future__ import annotations

import asyncio

import grpc

from ragsidecar.api.grpc_errors import deadline_of, translates_errors
from ragsidecar.errors import Violation, invalid
from ragsidecar.inference.registry import ModelRegistry, ModelState
from ragsidecar.reranking import Candidate, Reranker, RerankOutcome, RerankQuery
from ragsidecar.v1 import common_pb2, reranker_pb2, reranker_pb2_grpc

_KINDS = {"cross-encoder": reranker_pb2.MODEL_KIND_CROSS_ENCODER, "bi-encoder": reranker_pb2.MODEL_KIND_BI_ENCODER}
_STATES = {
    ModelState.LOADING: reranker_pb2.MODEL_STATE_LOADING,
    ModelState.READY: reranker_pb2.MODEL_STATE_READY,
    ModelState.FAILED: reranker_pb2.MODEL_STATE_FAILED,
}
_STRATEGIES = {
    "truncate": reranker_pb2.LONG_DOCUMENT_STRATEGY_TRUNCATE,
    "window": reranker_pb2.LONG_DOCUMENT_STRATEGY_WINDOW,
}
_WINDOW = {
    reranker_pb2.LONG_DOCUMENT_STRATEGY_UNSPECIFIED: None,
    reranker_pb2.LONG_DOCUMENT_STRATEGY_TRUNCATE: False,
    reranker_pb2.LONG_DOCUMENT_STRATEGY_WINDOW: True,
}


class RerankerService(reranker_pb2_grpc.RerankerServiceServicer):
    def __init__(self, registry: ModelRegistry, reranker: Reranker) -> None:
        self._registry = registry
        self._reranker = reranker

    @translates_errors
    async def ListModels(
        self, request: reranker_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> reranker_pb2.ListModelsResponse:
        models = [
            reranker_pb2.ModelInfo(
                id=s.spec.id,
                kind=_KINDS[s.spec.kind],
                max_input_tokens=s.spec.max_length,
                state=_STATES[s.state],
                error=s.error,
                is_default=s.is_default,
                long_document_strategy=_STRATEGIES[s.spec.long_document_strategy],
            )
            for s in self._registry.statuses()
        ]
        return reranker_pb2.ListModelsResponse(
            models=models, generation=self._registry.generation, last_reload_error=self._registry.last_reload_error
        )

    @translates_errors
    async def Rerank(
        self, request: reranker_pb2.RerankRequest, context: grpc.aio.ServicerContext
    ) -> reranker_pb2.RerankResponse:
        query = RerankQuery(
            model=request.model,
            query=request.query,
            documents=[Candidate(d.id, d.text, dict(d.metadata)) for d in request.documents],
            top_n=request.top_n if request.HasField("top_n") else None,
            max_document_tokens=request.max_document_tokens if request.HasField("max_document_tokens") else None,
            window=_window(request.long_document_strategy),
            min_relevance_score=request.min_relevance_score if request.HasField("min_relevance_score") else None,
        )
        outcome = await self._reranker.rerank(query, deadline_of(context, asyncio.get_running_loop().time()))
        return _response(outcome, request)


def _window(strategy: reranker_pb2.LongDocumentStrategy) -> bool | None:
    """The request's long-document strategy; a number the enum does not define is refused, as in retrieval."""
    if strategy not in _WINDOW:
        raise invalid(
            [Violation("long_document_strategy", f"unknown LongDocumentStrategy value {strategy}", "INVALID_REQUEST")]
        )
    return _WINDOW[strategy]


def _response(outcome: RerankOutcome, request: reranker_pb2.RerankRequest) -> reranker_pb2.RerankResponse:
    results = []
    for ranked in outcome.results:
        result = reranker_pb2.RerankResult(
            index=ranked.index,
            id=ranked.candidate.id,
            relevance_score=ranked.relevance_score,
            raw_score=ranked.raw_score,
            best_window=ranked.best_window,
        )
        if request.return_documents:
            result.document.CopyFrom(request.documents[ranked.index])
        results.append(result)
    return reranker_pb2.RerankResponse(
        results=results,
        model=outcome.model,
        usage=common_pb2.Usage(
            pairs=outcome.pairs,
            tokens=outcome.tokens,
            cached_pairs=outcome.cached_pairs,
            truncated_documents=outcome.truncated_documents,
        ),
        timing=common_pb2.Timing(
            tokenization_us=_us(outcome.tokenization_s),
            queue_us=_us(outcome.queue_s),
            inference_us=_us(outcome.inference_s),
            total_us=_us(outcome.total_s),
        ),
    )


def _us(seconds: float) -> int:
    return max(int(seconds * 1_000_000), 0)
