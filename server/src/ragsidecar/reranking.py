"""Reranking, the domain side of the host's Reranker SPI: validate, score (cache first), rank.

Results only ever reference documents of the request, each at most once (the SPI's invariant
holds by construction: results are built from request indices); top_n applies after scoring.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ragsidecar import errors, metrics, tracing
from ragsidecar.cache import ByteLRU
from ragsidecar.errors import Violation
from ragsidecar.inference.models import BiEncoder, LoadedModel, PairScore, QueryTooLong
from ragsidecar.inference.registry import ModelRegistry

log = logging.getLogger(__name__)

LIMIT_EXCEEDED = "LIMIT_EXCEEDED"

# Size limits of one request (documented in reranker.proto), checked on character counts, which cost
# nothing to read, before any text is tokenized: oversized work is refused before it is paid for.
# A query is never cut, and none this long fits a model's window; 1,000 documents of 32 Ki characters
# stay within the documents' total.
MAX_QUERY_CHARS = 16 * 1024
MAX_DOCUMENT_CHARS = 4 * 1024 * 1024
MAX_DOCUMENTS_CHARS = 32 * 1024 * 1024


@dataclass(frozen=True)
class Candidate:
    id: str
    text: str
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RerankQuery:
    model: str
    query: str
    documents: list[Candidate]
    top_n: int | None = None
    max_document_tokens: int | None = None
    # None: the model's configured default; True: score overlapping windows; False: truncate.
    window: bool | None = None
    min_relevance_score: float | None = None


@dataclass(frozen=True)
class Ranked:
    index: int
    candidate: Candidate
    relevance_score: float
    raw_score: float
    best_window: int


@dataclass
class RerankOutcome:
    model: str
    results: list[Ranked]
    pairs: int = 0
    # Tokens scored now (the work done), and those of every pair including those answered from the cache (what
    # the request holds: the usage an HTTP caller reads).
    tokens: int = 0
    input_tokens: int = 0
    cached_pairs: int = 0
    truncated_documents: int = 0
    tokenization_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0
    total_s: float = 0.0


class Reranker:
    def __init__(self, registry: ModelRegistry, max_documents: int, cache_bytes: int) -> None:
        self._registry = registry
        self._max_documents = max_documents
        self._cache: ByteLRU[tuple, PairScore] = ByteLRU(cache_bytes)

    async def rerank(self, request: RerankQuery, deadline: float | None) -> RerankOutcome:
        started = time.perf_counter()
        self._validate(request)
        with (
            self._registry.get(request.model).in_use() as model,
            tracing.span("rerank", model=model.id, documents=len(request.documents)) as span,
        ):
            outcome = await self._rerank(model, request, deadline, started)
            span.set(
                pairs=outcome.pairs,
                cached_pairs=outcome.cached_pairs,
                tokens=outcome.tokens,
                results=len(outcome.results),
            )
            return outcome

    async def _rerank(
        self, model: LoadedModel, request: RerankQuery, deadline: float | None, started: float
    ) -> RerankOutcome:
        window = model.spec.long_document_strategy == "window" if request.window is None else request.window
        cap = request.max_document_tokens
        # Hashing megabytes of text is work proportional to the request: off the event loop.
        digests = await asyncio.to_thread(_digests, [request.query, *(c.text for c in request.documents)])
        keys = [(model.id, model.fingerprint, window, cap, digests[0], d) for d in digests[1:]]
        scores: list[PairScore | None] = [self._cache.get(k) for k in keys]
        misses = [i for i, s in enumerate(scores) if s is None]
        outcome = RerankOutcome(model.id, [], pairs=len(keys), cached_pairs=len(keys) - len(misses))
        metrics.CACHE_HITS.labels(model.id).inc(outcome.cached_pairs)
        if misses:
            try:
                batch = await model.score(
                    request.query, [request.documents[i].text for i in misses], cap, window, deadline
                )
            except QueryTooLong as err:
                raise errors.invalid([Violation("query", str(err))]) from None
            for i, score in zip(misses, batch.scores, strict=True):
                scores[i] = score
                self._cache.put(keys[i], score)
            outcome.tokenization_s, outcome.queue_s, outcome.inference_s = (
                batch.tokenization_s,
                batch.queue_s,
                batch.inference_s,
            )
            outcome.tokens = sum(s.tokens for s in batch.scores)
        relevance = _cosine_relevance if isinstance(model, BiEncoder) else _sigmoid
        ranked = [
            Ranked(i, c, _f32(relevance(s.raw)), _f32(s.raw), s.best_window)
            for i, (c, s) in enumerate(zip(request.documents, scores, strict=True))
            if s is not None
        ]
        outcome.truncated_documents = sum(1 for s in scores if s is not None and s.truncated)
        outcome.input_tokens = sum(s.tokens for s in scores if s is not None)
        ranked.sort(key=lambda r: (-r.raw_score, r.index))
        if request.min_relevance_score is not None:
            ranked = [r for r in ranked if r.relevance_score >= request.min_relevance_score]
        outcome.results = ranked if request.top_n is None else ranked[: request.top_n]
        if not outcome.results and request.top_n != 0:
            log.warning("rerank with model %s: %d documents in, none out", model.id, len(request.documents))
        outcome.total_s = time.perf_counter() - started
        return outcome

    def _validate(self, request: RerankQuery) -> None:
        self._check_limits(request)
        problems = []
        if not request.query.strip():
            problems.append(Violation("query", "must not be empty or blank"))
        if not request.documents:
            problems.append(Violation("documents", "at least one document is required"))
        seen: dict[str, int] = {}
        for i, candidate in enumerate(request.documents):
            if candidate.id and candidate.id in seen:
                problems.append(
                    Violation(
                        f"documents[{i}].id", f"duplicate id {candidate.id!r} (also documents[{seen[candidate.id]}])"
                    )
                )
            seen.setdefault(candidate.id, i)
        if request.top_n is not None and request.top_n < 0:
            problems.append(Violation("top_n", f"must not be negative, got {request.top_n}"))
        if request.max_document_tokens is not None and request.max_document_tokens < 1:
            problems.append(Violation("max_document_tokens", "must be at least 1 when set"))
        if request.min_relevance_score is not None and not 0.0 <= request.min_relevance_score <= 1.0:
            problems.append(Violation("min_relevance_score", "must be within 0..1"))
        if problems:
            raise errors.invalid(problems)

    def _check_limits(self, request: RerankQuery) -> None:
        """Refuses requests over a size limit (LIMIT_EXCEEDED) in time linear in the document count only."""
        problems = []
        if len(request.documents) > self._max_documents:
            problems.append(
                Violation(
                    "documents",
                    f"{len(request.documents)} documents exceed the maximum of {self._max_documents} per request",
                    LIMIT_EXCEEDED,
                )
            )
        if len(request.query) > MAX_QUERY_CHARS:
            problems.append(
                Violation(
                    "query", f"{len(request.query)} characters exceed the maximum of {MAX_QUERY_CHARS}", LIMIT_EXCEEDED
                )
            )
        total = 0
        for i, candidate in enumerate(request.documents):
            if len(candidate.text) > MAX_DOCUMENT_CHARS:
                problems.append(
                    Violation(
                        f"documents[{i}].text",
                        f"{len(candidate.text)} characters exceed the maximum of {MAX_DOCUMENT_CHARS}",
                        LIMIT_EXCEEDED,
                    )
                )
            total += len(candidate.id) + len(candidate.text) + sum(map(len, candidate.metadata.keys()))
            total += sum(map(len, candidate.metadata.values()))
        if total > MAX_DOCUMENTS_CHARS:
            problems.append(
                Violation(
                    "documents",
                    f"the documents hold {total} characters of ids, texts "
                    f"and metadata, over the maximum of {MAX_DOCUMENTS_CHARS}",
                    LIMIT_EXCEEDED,
                )
            )
        if problems:
            raise errors.invalid(problems, LIMIT_EXCEEDED)


def _digests(texts: list[str]) -> list[bytes]:
    """Result-cache key parts of the texts."""
    return [hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest() for text in texts]


def _f32(value: float) -> float:
    """Scores travel as float32: thresholds compare against exactly what the caller sees."""
    return float(np.float32(value))


def _sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit)) if logit >= 0 else math.exp(logit) / (1.0 + math.exp(logit))


def _cosine_relevance(cosine: float) -> float:
    return (cosine + 1.0) / 2.0
