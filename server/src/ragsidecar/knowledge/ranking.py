"""SEARCH: hybrid retrieval of one source, optionally reranked by a cross-encoder."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from ragsidecar import tracing
from ragsidecar.config import Config, RetrievalConfig
from ragsidecar.knowledge import conversation, filters
from ragsidecar.knowledge.catalog import LoadedSource
from ragsidecar.knowledge.declarations import Entry, RerankOrder, RetrievalMode, SourceType
from ragsidecar.knowledge.fusion import FusionSettings, combine_reranked
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk
from ragsidecar.knowledge.results import Hit, Work, document_of
from ragsidecar.reranking import Candidate, Reranker, RerankQuery

# Sources of documents the host writes: their searches fuse by [retrieval] memory_fusion and memory_dense_weight
# (a hybrid one ranks conversation turns with their neighbours, memory_neighbour_weight), and their documents may
# expire.
WRITTEN = frozenset({SourceType.MEMORY, SourceType.BINDING})


def fusion_settings(retrieval: RetrievalConfig) -> FusionSettings:
    """How a hybrid search fuses its lists and weighs feedback, as [retrieval] says: the one place those keys
    become FusionSettings (the benches measure through it too)."""
    return FusionSettings(
        retrieval.fusion,
        retrieval.dense_weight,
        spread_gain=retrieval.dense_spread_gain,
        feedback_documents=retrieval.feedback_documents,
        feedback_weight=retrieval.feedback_weight,
    )


@dataclass(frozen=True)
class SearchSpec:
    """Per-call overrides of Search."""

    top_k: int | None = None
    min_score: float | None = None
    rerank: bool | None = None
    reranker_model: str | None = None
    candidates: int | None = None
    rerank_order: RerankOrder | None = None
    rerank_depth: int | None = None
    group_by_document: bool | None = None
    retrieval_mode: RetrievalMode | None = None

    def applied_to(self, entry: Entry) -> Entry:
        # Every field is an Entry field of the same name: each one set replaces the entry's.
        changes = {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}
        return replace(entry, **changes)


@dataclass
class Query:
    """A query's text and its embeddings, by the fingerprint of the model that made each: a source is searched
    with the vector of the model its own vectors came from. Embedded once per model, shared by every source of
    a call (and by every owner of a chat turn)."""

    text: str
    vectors: dict[str, np.ndarray] = field(default_factory=dict)


class Ranker:
    def __init__(self, config: Config, reranker: Reranker) -> None:
        self._config = config
        self._reranker = reranker
        retrieval = config.retrieval
        self._fusion = fusion_settings(retrieval)
        # The documents a host writes (MEMORY, chat bindings): short turns and notes, whose dense list is weaker
        # against BM25 than on documents (bench/memory.py).
        self._written_fusion = replace(
            self._fusion, method=retrieval.memory_fusion, dense_weight=retrieval.memory_dense_weight
        )

    async def search(
        self,
        entry: Entry,
        source: LoadedSource,
        query: str,
        query_vector: np.ndarray,
        work: Work,
        deadline: float | None,
    ) -> list[Hit]:
        """The entry's top k hits in the source (reranked when the entry asks), its model work added to `work`."""
        if len(source.index) == 0:
            return []
        depth = self._rerank_depth(entry)
        with tracing.span(
            "retrieve", source=entry.name, mode=entry.retrieval_mode.name, candidates=max(entry.k, depth)
        ) as span:
            hits = await asyncio.to_thread(
                self._retrieved, entry, source.index, query_vector, query, max(entry.k, depth)
            )
            span.set(hits=len(hits))
        for rerank in self._passes(entry, depth):
            outcome = await self._reranker.rerank(
                RerankQuery(
                    entry.reranker_model,
                    query,
                    [Candidate(h.chunk_id, h.text) for h in hits[: rerank.depth]],
                    max_document_tokens=rerank.document_tokens,
                ),
                deadline,
            )
            hits = self._combined(entry, hits, [(r.index, r.relevance_score) for r in outcome.results])
            work.pairs += outcome.pairs
            work.tokens += outcome.tokens
            work.cached_pairs += outcome.cached_pairs
            work.queue_s += outcome.queue_s
            work.inference_s += outcome.inference_s
        if entry.min_score is not None:
            hits = [h for h in hits if _meets(h, entry)]
        return hits[: entry.k]

    def _passes(self, entry: Entry, depth: int) -> list[RerankPass]:
        """The entry's rerank passes: under the FUSED order as configured, else (the reranker's own order, as the
        host's Reranker SPI ranks) one pass over whole documents."""
        if not entry.rerank:
            return []
        if entry.rerank_order is RerankOrder.RERANKER:
            return [RerankPass(depth, None)]
        retrieval = self._config.retrieval
        return rerank_passes(depth, retrieval.rerank_document_tokens, retrieval.rerank_head_candidates)

    def _combined(self, entry: Entry, hits: list[Hit], reranked: list[tuple[int, float]]) -> list[Hit]:
        """The hits reordered by the reranker's (position, relevance) pairs as the entry and config say."""
        if entry.rerank_order is RerankOrder.RERANKER:
            return _reranker_order(hits, reranked)
        # The score becomes the combined one (a later pass combines with it: before any pass it is the fused
        # score); the relevance of the latest pass that scored a hit stays in `rerank`.
        relevance = dict(reranked)
        retrieval = self._config.retrieval
        scores = [h.score if h.score is not None else 0.0 for h in hits]
        order = combine_reranked(scores, relevance, retrieval.rerank_fusion, retrieval.rerank_weight)
        return [replace(hits[i], score=score, rerank=relevance.get(i, hits[i].rerank)) for i, score in order]

    def _rerank_depth(self, entry: Entry) -> int:
        """Hits reranked: rerank_depth when set, else the candidates, else
        retrieval.rerank_candidates: whatever top k is under the FUSED order (the reranked head, so the first
        hits, are the same for every top k), at least top k under the reranker's own order (which drops the rest)."""
        if not entry.rerank:
            return 0
        if entry.rerank_depth is not None:
            return entry.rerank_depth
        if entry.candidates is not None:
            return entry.candidates
        if entry.rerank_order is RerankOrder.FUSED:
            return self._config.retrieval.rerank_candidates
        return max(entry.k, self._config.retrieval.rerank_candidates)

    def _retrieved(
        self, entry: Entry, index: HybridIndex, query_vector: np.ndarray, query: str, count: int
    ) -> list[Hit]:
        """The best `count` hits in retrieval order: chunks, or with group_by_document each document's best
        chunk, searching wider until `count` documents are found or every chunk has been seen (runs off the loop)."""
        mode = entry.retrieval_mode
        dense, lexical = mode is not RetrievalMode.LEXICAL, mode is not RetrievalMode.DENSE
        retrieval = self._config.retrieval
        # A hybrid search of written documents ranks them with their conversation neighbours over the whole head.
        neighbours = entry.type in WRITTEN and dense and lexical and retrieval.memory_neighbour_weight > 0
        width = count
        while True:
            found = index.search(
                query_vector,
                query,
                max(width, retrieval.fusion_candidates) if neighbours else width,
                retrieval.fusion_candidates,
                use_dense=dense,
                use_lexical=lexical,
                fusion=self._written_fusion if entry.type in WRITTEN else self._fusion,
                keep=entry.keep,
                hide=filters.expired_at(time.time_ns()) if entry.type in WRITTEN else None,
            )
            hits = [
                Hit(h.chunk.id, entry.name, self._text(entry, h.chunk), h.chunk.meta, h.fused, h.dense, h.bm25, h.fused)
                for h in found
            ]
            if neighbours:
                hits = _by_neighbours(hits, [h.chunk.text for h in found], retrieval.memory_neighbour_weight)
            best = _best_per_document(hits) if entry.group_by_document else _best_per_passage(hits)
            if len(best) == len(hits) and not entry.group_by_document:
                return hits[:count]
            if len(best) >= count or width >= len(index):
                return best[:count]
            width *= 2

    @staticmethod
    def _text(entry: Entry, chunk: IndexedChunk) -> str:
        """What a hit shows of the chunk: a written document's own text (a conversation turn indexed with the turn
        before it shows the turn alone), a file source's chunk as it is."""
        if entry.type not in WRITTEN:
            return chunk.text
        return conversation.own_text(chunk.text, chunk.meta.get("char_start") or 0, chunk.meta.get("char_end") or 0)


@dataclass(frozen=True)
class RerankPass:
    """One rerank pass: the current top `depth` hits scored with each document cut to its first
    `document_tokens` tokens (None: as much as the model's window holds)."""

    depth: int
    document_tokens: int | None


def rerank_passes(depth: int, document_tokens: int, head_candidates: int) -> list[RerankPass]:
    """The passes of a FUSED rerank of `depth` hits: the top `depth` with each document cut to its first
    `document_tokens` tokens (0: uncut), then, when documents were cut and 0 < head_candidates < depth, the new
    top head_candidates uncut (a cascade: the cut pass reorders the pool, the whole documents decide the head).
    A pass costs about its tokens: 20 abstracts cut to 64 tokens cost about 0.6x of 10 whole ones, and scored
    within 0.002 nDCG@10 of them over five collections (bench/rerank_cascade.py, docs/retrieval.md)."""
    first = RerankPass(depth, document_tokens or None)
    if document_tokens and 0 < head_candidates < depth:
        return [first, RerankPass(head_candidates, None)]
    return [first]


def _meets(hit: Hit, entry: Entry) -> bool:
    """Whether the hit reaches the entry's min_score: its relevance when the entry reranks (a hit past the
    rerank depth has none, so it does not), else its cosine."""
    score = hit.rerank if entry.rerank else hit.dense
    return score is not None and entry.min_score is not None and score >= entry.min_score


def _by_neighbours(hits: list[Hit], chunk_texts: list[str], weight: float) -> list[Hit]:
    """Written documents' hits (of chunks of these texts) reordered by their fused scores plus what their documents'
    conversation neighbours add (conversation.with_neighbours), each scored so; ties keep the fused order."""
    added = conversation.with_neighbours(
        [
            conversation.Scored(document_of(h)[1], text, h.text, h.fused or 0.0)
            for h, text in zip(hits, chunk_texts, strict=True)
        ],
        weight,
    )
    scored = [replace(h, score=(h.fused or 0.0) + added.get(document_of(h)[1], 0.0)) for h in hits]
    return [h for _, h in sorted(enumerate(scored), key=lambda item: (-(item[1].score or 0.0), item[0]))]


def _best_per_passage(hits: list[Hit]) -> list[Hit]:
    """Each passage's first (best) chunk, in the hits' order: chunks of one document covering the same characters
    are one passage (a conversation turn is indexed alone and with the turn before it, knowledge/conversation.py)."""
    seen: set[tuple[tuple[str, str], Any, Any]] = set()
    best = []
    for hit in hits:
        passage = (document_of(hit), hit.provenance.get("char_start"), hit.provenance.get("char_end"))
        if passage not in seen:
            seen.add(passage)
            best.append(hit)
    return best


def _best_per_document(hits: list[Hit]) -> list[Hit]:
    """Each document's first (best) chunk, in the hits' order."""
    seen: set[tuple[str, str]] = set()
    best = []
    for hit in hits:
        if document_of(hit) not in seen:
            seen.add(document_of(hit))
            best.append(hit)
    return best


def _reranker_order(hits: list[Hit], reranked: list[tuple[int, float]]) -> list[Hit]:
    """The reranker's own order (the host's Reranker SPI): descending relevance, which is also the score."""
    order = sorted(reranked, key=lambda r: -r[1])
    return [replace(hits[i], score=relevance, rerank=relevance) for i, relevance in order]
