"""Retrieval quality on real IR collections (BEIR layout), through the product's own code, and the choice of the
retrieval defaults by leave-one-set-out cross-validation.

Collections: SciFact, Cranfield, MED, NPL and LISA (bench/ir_collections.py finds them: $RAGSIDECAR_IR_DATA, else
a folder beside the checkout). Metrics: nDCG@10 (graded gains, log2 discount) and Recall@100 (rel > 0), mean
over the judged test queries with at least one relevant document.

By default (stages cv, table, speed, curve) the first stage comes from lists through the sidecar (Listed): each
query's dense and lexical list, 1,000 documents deep, fetched once through the Search RPC (retrieval_mode
DENSE / LEXICAL, group_by_document) and cached in bench/results/lists-*.json; every fusion is then computed
in-process over them with knowledge/fusion.py as HybridIndex.search does, so the grid costs no model time.

  cv     leave-one-set-out over every set given, fusion method, dense_weight (and adaptive's spread gain),
         pseudo-relevance feedback and fusion depth, then the rerank combination (on --rpc-rerank-queries queries
         per set), as described below; each fold printed, beside the pick it makes without feedback. The grid:
         rrf; weighted_rrf, convex, minmax and zscore at dense_weight 0.1..0.9; adaptive at dense_weight
         0.5..0.8 by 0.025 x spread gain 10..50 by 10, all without feedback; and adaptive at dense_weight 0.6,
         0.625, 0.65 x gain 20, 30, 40 x feedback_documents 1..4 x feedback_weight 0.3..0.6 by 0.1. The
         feedback uses one vector per document (bge-small, "title text", cached as in --in-process).
  table  every set through the Search RPC (--rpc-sets; others in-process, marked): the reference BM25 (bm25s,
         k1 0.9, b 0.4), the sidecar's lexical and dense lists, the default, the default with rerank; the
         done-when checks; the share of queries whose top 10 at top_k 10 equals the head at top_k 100.
  speed  p50 of Search with rerank at top_k 10 (a second sidecar, inference cache off), per curve point and for
         the default.

With --in-process, the 0.2.0 bench: one vector per document embedded in-process (Prepared) and the stages below.

Stages (--stages, comma-separated; default all of them; they run in this order, rpc before curve so the curve
shows the latencies; the done-when checks of the default pipeline always print):

  explore   In-process, per set, with the product's functions: one HybridIndex per lexical language
            (knowledge/index.py, its BM25 side knowledge/lexical.py) gives the dense top 100 and the BM25 top 100
            of every query; knowledge/fusion.py's fuse() combines them. Rows: BM25 unstemmed ("none") and
            stemmed ("english"), dense, and hybrid for each fusion tried: rrf (equal weights), weighted_rrf and
            convex (theoretical min-max scaled scores) at dense_weight 0.1..0.9, for each language.
  cv        Leave-one-set-out cross-validation, stage by stage. Each fold (one set held out) picks the lexical
            language, fusion method, dense_weight, spread gain and feedback on its training sets (best mean
            nDCG@10, rerank off); the folds' picks are agreed into one first stage (per setting the value most
            folds picked, a weight or gain the median of the folds that picked that method; feedback on if most
            of those picked it, its documents and weight the most common of them). On that first stage each
            fold picks the rerank combination (knowledge/fusion.py's combine_reranked: rrf, or interpolate with
            rerank_weight 0.05..0.9; the reranker's own order is a candidate too) and the rerank depth (10 or
            20) on its training sets at the configured max_length, agreed the same way. Every pick is reported
            on the set it did not see, beside the pick the fold makes without feedback. Rerank runs score the
            top `depth` hits with ms-marco-MiniLM-L-12-v2 through the sidecar's Rerank RPC; raw scores are
            cached on disk per (set, max_length, query id, document id), so every depth and combination reuses
            them.
  curve     The default pipeline at rerank depth 0/10/20/50 (at the configured max_length) and at max_length
            128/256/512 (at the configured depth): nDCG@10 and R@100 from the cached scores of each max_length
            (--curve-queries limits each set to that many queries, spread evenly), beside the p50 latency of
            the Search RPC measured in the rpc stage (top_k 10, one caller, --latency-queries queries per
            set, result cache off). Each max_length is a [[models]] entry of its own (id "<reranker>-L<n>",
            max_length n) in the bench's sidecar, so one sidecar serves all three.
  rpc       The default pipeline as a host runs it: each set is written as a .jsonl file of its BEIR records
            (_id, title, text) in a knowledge root under bench/results/knowledge and searched through the
            sidecar's Search RPC (FILE source, group_by_document=true, top_k 100; rerank off for every query,
            then rerank on at the configured depth for every query or --rpc-rerank-queries of them). The
            sidecar reads, chunks, embeds and indexes the file itself (the index persists under
            bench/results/sidecar-data, so a second run skips that). Beside it, the same pipeline in-process
            on the same chunks (knowledge/sources/files.py's read_units, knowledge/chunking.py's chunk_units,
            HybridIndex over the chunks, each document ranked by its best chunk as group_by_document does,
            the reranker scoring that chunk), with the share of queries whose top 10 is identical. Sets:
            --rpc-sets.
  chunking  One vector per document (what explore and cv measure) against the product's chunks
            (retrieval.chunk_tokens / chunk_overlap_tokens; e.g. --set retrieval.chunk_tokens=510 for one chunk
            per abstract), for dense, BM25 and the default pipeline with rerank off and on.

The configuration measured as "default" is config/ragsidecar.toml's [retrieval] section (plus --set overrides),
both in-process and in the sidecar. Embeddings: bge-small-en-v1.5 in-process with the product's model code (the
same BiEncoder the sidecar uses), "title text" per document cut at 512 tokens, queries with
retrieval.query_prefix; document and query vectors are cached under bench/results/ keyed by set and model file.
Nothing in bench/results/ is committed; the report is written to bench/results/beir.md.

    .venv/bin/python bench/beir.py [--sets scifact,cranfield,med] [--stages explore,cv,rpc,curve,chunking]
                                   [--rpc-sets cranfield,med,scifact] [--rpc-rerank-queries 60]
                                   [--latency-queries 5] [--curve-queries 30] [--clients 2]
                                   [--set retrieval.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import csv
import dataclasses
import fcntl
import gzip
import hashlib
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import bm25s
import grpc
import ir_collections
import msgspec
import numpy as np

from ragsidecar.config_loading import load_config
from ragsidecar.inference.models import load_model
from ragsidecar.knowledge import lexical
from ragsidecar.knowledge.chunking import chunk_units
from ragsidecar.knowledge.fusion import FUSIONS, FusionSettings, alternate, combine_reranked, fed_back, fuse
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk
from ragsidecar.knowledge.ranking import fusion_settings
from ragsidecar.knowledge.sources.files import read_units
from ragsidecar.v1 import common_pb2, reranker_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from sidecar import Sidecar, default_config  # noqa: E402 - importable once tests/ is on sys.path

RESULTS = REPO / "bench" / "results"
KNOWLEDGE = RESULTS / "knowledge"
RERANKER = "ms-marco-MiniLM-L-12-v2"
DEPTH = 100  # Recall@100 needs 100 results per run
FUSION_DEPTHS = (100,)  # fusion_candidates the cross-validation tries (one depth: the machine's time)
QUALITY_CACHE_BYTES = 1 << 30
LIST_DEPTH = 1000  # documents per dense and lexical list fetched through Search (fusion_candidates up to this)
EMBED_BATCH = 64  # texts per BiEncoder.embed call
CACHE_FORMAT = "v1-title-space-text"
LANGUAGES = ("none", "english")
WEIGHTS = tuple(round(0.1 * i, 1) for i in range(1, 10))
# "adaptive": dense_weight at the typical spread, and dense_spread_gain (0: "minmax")
ADAPTIVE_WEIGHTS = tuple(round(0.5 + 0.025 * i, 3) for i in range(13))  # 0.5 .. 0.8
SPREAD_GAINS = (10.0, 20.0, 30.0, 40.0, 50.0)
# Pseudo-relevance feedback, tried on "adaptive" around its pick without feedback (the grid's time):
# dense_weight x gain x feedback_documents x feedback_weight
FEEDBACK_DENSE_WEIGHTS = (0.6, 0.625, 0.65)
FEEDBACK_GAINS = (20.0, 30.0, 40.0)
FEEDBACK_DOCUMENTS = (1, 2, 3, 4)
FEEDBACK_WEIGHTS = (0.3, 0.4, 0.5, 0.6)
RERANK_WEIGHTS = (0.05, 0.1, 0.15, *WEIGHTS[1:])
CV_DEPTHS = (10, 20)  # rerank depths the cross-validation picks from (scores cached to depth 20 suffice)
RERANK_DEPTHS = (0, 10, 20, 50)
MAX_LENGTHS = (128, 256, 512)
TARGET_SCIFACT = 0.72
SLACK = 0.005  # the default pipeline may be this much below max(BM25, dense)

BASELINES = {
    "scifact": "BEIR BM25 0.665, BM25 + CE top-100 0.688; Anserini BM25 0.679 (R@100 0.925)",
    "cranfield": "bm25s (k1 0.9, b 0.4, stemmed) 0.352",
    "med": "bm25s 0.671",
}


# ---- data ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Collection:
    name: str
    rows: list[dict[str, str]]  # BEIR corpus records
    doc_ids: list[str]
    doc_texts: list[str]  # "title text"
    queries: dict[str, str]  # judged test queries only
    qrels: dict[str, dict[str, int]]


def read_collection(name: str) -> Collection:
    folder = ir_collections.folder(name)
    with gzip.open(folder / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    ids = [r["_id"] for r in rows]
    texts = [" ".join(filter(None, ((r.get("title") or "").strip(), (r.get("text") or "").strip()))) for r in rows]
    qrels: dict[str, dict[str, int]] = {}
    with (folder / "qrels" / "test.tsv").open(encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    with (folder / "queries.jsonl").open(encoding="utf-8") as f:
        all_queries = {r["_id"]: r["text"] for r in map(json.loads, f)}
    scored = [q for q in sorted(qrels, key=_natural) if q in all_queries and any(r > 0 for r in qrels[q].values())]
    return Collection(name, rows, ids, texts, {q: all_queries[q] for q in scored}, qrels)


def _natural(key: str):
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


# ---- metrics ---------------------------------------------------------------------------------------------


def ndcg_at(ranking: list[str], judged: dict[str, int], k: int = 10) -> float:
    dcg = sum(judged.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k]))
    ideal = sorted((r for r in judged.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranking: list[str], judged: dict[str, int], k: int = 100) -> float:
    relevant = {d for d, r in judged.items() if r > 0}
    return len(relevant.intersection(ranking[:k])) / len(relevant)


Run = dict[str, list[str]]  # query id -> ranked document ids


def evaluate(run: Run, qrels: dict[str, dict[str, int]]) -> tuple[float, float]:
    """Mean nDCG@10 and Recall@100 over the run's queries (all judged with a relevant document)."""
    return (
        statistics.fmean(ndcg_at(run[q], qrels[q]) for q in run),
        statistics.fmean(recall_at(run[q], qrels[q]) for q in run),
    )


# ---- the product's embedder, in-process -------------------------------------------------------------------


class Embedder:
    """bge-small-en-v1.5 as the sidecar loads it (load_model + BiEncoder.embed), on its own event loop."""

    def __init__(self, config) -> None:
        self.config = config
        self.spec = next(m for m in config.models if m.id == config.retrieval.embedder)
        self.folder = config.model_dir(self.spec)
        inference = msgspec.structs.replace(config.inference, workers=2, intra_op_threads=1, inter_op_threads=1)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.model = self._run(load_model(self.spec, self.folder, inference))
        self.key = self._cache_key()

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit vectors, EMBED_BATCH texts a call with two calls in flight (both inference workers busy)."""

        async def all_batches() -> list:
            gate = asyncio.Semaphore(2)

            async def one(batch: list[str]):
                async with gate:
                    return await self.model.embed(batch)

            return await asyncio.gather(*(one(texts[i : i + EMBED_BATCH]) for i in range(0, len(texts), EMBED_BATCH)))

        return np.concatenate([r[0] for r in self._run(all_batches())])

    def cached(self, name: str, texts: list[str]) -> np.ndarray:
        """`embed(texts)`, from bench/results/<name>-<model key>.npy when a run already embedded them."""
        path = RESULTS / f"{name}-{self.key}.npy"
        if path.is_file():
            vectors = np.load(path)
            if vectors.shape[0] == len(texts):
                return vectors
        started = time.perf_counter()
        vectors = self.embed(texts)
        RESULTS.mkdir(parents=True, exist_ok=True)
        np.save(path, vectors)
        print(f"  embedded {len(texts)} texts for {name} in {time.perf_counter() - started:.0f} s", flush=True)
        return vectors

    def _cache_key(self) -> str:
        model_file = self.folder / "model.onnx"
        digest = hashlib.sha256()
        with open(model_file, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        return (
            f"{self.spec.id}-{digest.hexdigest()[:12]}-{model_file.stat().st_size}-"
            f"L{self.spec.max_length}-{self.spec.pooling}-{CACHE_FORMAT}"
        )

    def close(self) -> None:
        self._run(self.model.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


# ---- pipeline settings -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FirstStage:
    """What ranks before the reranker: one list ("bm25", "dense") or both fused ("hybrid")."""

    kind: str
    language: str = "none"
    fusion: FusionSettings = FusionSettings()
    candidates: int = 50  # retrieval.fusion_candidates: depth of each list fused

    def label(self) -> str:
        if self.kind == "dense":
            return "dense"
        if self.kind == "bm25":
            return f"BM25 {'unstemmed' if self.language == 'none' else self.language}"
        f = self.fusion
        weight = "" if f.method == "rrf" else f" w={f.dense_weight:g}"
        gain = f" gain={f.spread_gain:g}" if f.method == "adaptive" else ""
        feedback = f" fb{f.feedback_documents}x{f.feedback_weight:g}" if f.feedback else ""
        return f"hybrid {self.language} {f.method}{weight}{gain}{feedback} c{self.candidates}"


@dataclasses.dataclass(frozen=True)
class Rerank:
    """How the reranked head is combined with the retrieval order ("reranker": the reranker's order alone)."""

    combination: str  # "rrf" | "interpolate" | "reranker"
    weight: float = 0.5
    depth: int = 20
    max_length: int = 512

    def label(self) -> str:
        weight = f" w={self.weight:g}" if self.combination == "interpolate" else ""
        return f"rerank {self.combination}{weight} depth {self.depth} L{self.max_length}"


@dataclasses.dataclass(frozen=True)
class Pipeline:
    first: FirstStage
    rerank: Rerank | None = None

    def label(self) -> str:
        return self.first.label() + (f" + {self.rerank.label()}" if self.rerank else "")


def configured(config) -> Pipeline:
    """The pipeline a config describes: its [retrieval] section, rerank on at the default depth, with the
    reranker's configured max_length."""
    retrieval = config.retrieval
    first = FirstStage("hybrid", retrieval.lexical_language, fusion_settings(retrieval), retrieval.fusion_candidates)
    max_length = next(m.max_length for m in config.models if m.id == RERANKER)
    rerank = Rerank(retrieval.rerank_fusion, retrieval.rerank_weight, retrieval.rerank_candidates, max_length)
    return Pipeline(first, rerank)


# ---- one collection, in-process --------------------------------------------------------------------------


class FirstStages:
    """A collection's first stages, each ranked once per query (`_ranked`) and kept."""

    def __init__(self, data: Collection) -> None:
        self.data = data
        self._first: dict[FirstStage, dict[str, list[tuple[str, float]]]] = {}

    def doc_of(self, key: str) -> str:
        """The document a ranked key stands for (a key is a document id unless a view ranks chunks)."""
        return key

    def first_stage(self, stage: FirstStage) -> dict[str, list[tuple[str, float]]]:
        """Query -> the top 100 (key, score), best first, as HybridIndex.search orders them."""
        if stage not in self._first:
            self._first[stage] = {q: self._ranked(stage, q) for q in self.data.queries}
        return self._first[stage]

    def _ranked(self, stage: FirstStage, q: str) -> list[tuple[str, float]]:
        raise NotImplementedError


def with_feedback_of(
    fused: dict[str, float], fusion: FusionSettings, vectors: np.ndarray, position: dict[str, int]
) -> dict[str, float]:
    """`fused` with pseudo-relevance feedback as HybridIndex.search applies it (fusion.fed_back; ties: document
    id), the likeness of a document its vector's dot product with the feedback's sum. `vectors`: one per
    document, at `position[document id]`."""

    def similarity(best: list[str], keys: list[str]) -> list[float]:
        centroid = vectors[[position[d] for d in best]].sum(axis=0)
        return (vectors[[position[d] for d in keys]] @ centroid).tolist()

    return fed_back(fused, fusion, lambda d: d, similarity)


class Prepared(FirstStages):
    """A collection's first-stage lists, one vector per document ("title text", as BEIR evaluates), from the
    product's HybridIndex (one per lexical language)."""

    view = "one vector per document"

    def __init__(self, data: Collection, embedder: Embedder, config) -> None:
        super().__init__(data)
        started = time.perf_counter()
        self.vectors = embedder.cached(data.name, data.doc_texts)
        prefix = config.retrieval.query_prefix
        query_ids = list(data.queries)
        query_vectors = embedder.cached(f"{data.name}-queries", [prefix + data.queries[q] for q in query_ids])
        self.query_vectors = dict(zip(query_ids, query_vectors, strict=True))
        chunks = [IndexedChunk(i, t, {}) for i, t in zip(data.doc_ids, data.doc_texts, strict=True)]
        self.indexes = {
            lang: HybridIndex.build(
                chunks,
                self.vectors,
                threads=config.retrieval.index_threads,
                dtype=config.retrieval.index_dtype,
                lexical_language=lang,
            )
            for lang in LANGUAGES
        }
        any_index = self.indexes[LANGUAGES[0]]
        self.dense = {
            q: [
                (h.chunk.id, h.dense)
                for h in any_index.search(self.query_vectors[q], text, DEPTH, DEPTH, use_lexical=False)
            ]
            for q, text in data.queries.items()
        }
        self.lexical = {
            lang: {
                q: [
                    (h.chunk.id, h.bm25)
                    for h in index.search(self.query_vectors[q], text, DEPTH, DEPTH, use_dense=False)
                ]
                for q, text in data.queries.items()
            }
            for lang, index in self.indexes.items()
        }
        self.position = {d: i for i, d in enumerate(data.doc_ids)}
        self.texts = dict(zip(data.doc_ids, data.doc_texts, strict=True))  # what the reranker scores, by ranked key
        print(
            f"  [{data.name}] {len(data.doc_ids)} docs, {len(data.queries)} queries, lists in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )

    def _ranked(self, stage: FirstStage, q: str) -> list[tuple[str, float]]:
        if stage.kind == "dense":
            return self.dense[q]
        if stage.kind == "bm25":
            return self.lexical[stage.language][q]
        dense, lexical = self.dense[q], self.lexical[stage.language][q]
        fused = with_feedback_of(fuse(dense, lexical, stage.fusion), stage.fusion, self.vectors, self.position)
        cosines = dict(dense)
        for d in fused:
            if d not in cosines:
                cosines[d] = float(self.vectors[self.position[d]] @ self.query_vectors[q])
        order = sorted(fused, key=lambda d: (-fused[d], -cosines[d], d))[:DEPTH]
        return [(d, fused[d]) for d in order]


class Listed(FirstStages):
    """A collection's first-stage lists as the sidecar gives them: the dense and the lexical list of every query,
    each LIST_DEPTH documents deep, through the Search RPC (FILE .jsonl, group_by_document, retrieval_mode DENSE
    or LEXICAL: each document's best chunk, with its cosine or BM25 score), fetched once and cached in
    bench/results/lists-*.json. A hybrid first stage fuses them as HybridIndex.search does: knowledge/fusion.py's
    fuse() over each list's top `candidates` (with feedback from one vector per document, the embedder's, when
    the fusion has it), then past that head both deeper lists alternately. (SciFact's cut abstracts are fused
    and fed back per document here and per chunk in the sidecar: the rpc stage measures the difference.)"""

    view = "lists through Search"

    def __init__(self, data: Collection, sidecar: BenchSidecar, config, embedder: Embedder) -> None:
        super().__init__(data)
        self.lists = {mode: self._fetched(sidecar, config, mode) for mode in ("dense", "lexical")}
        self.vectors = embedder.cached(data.name, data.doc_texts)  # the feedback's
        self.position = {d: i for i, d in enumerate(data.doc_ids)}
        self.texts = {
            r["_id"]: "\n".join(filter(None, ((r.get("title") or "").strip(), (r.get("text") or "").strip())))
            for r in data.rows
        }  # what the reranker scores: the record's text as the sidecar reads it

    def _fetched(self, sidecar: BenchSidecar, config, mode: str) -> dict[str, list[tuple[str, float]]]:
        analysis = f"{config.retrieval.lexical_language}-k{lexical.K1:g}-b{lexical.B:g}"
        path = (
            RESULTS / f"lists-{self.data.name}-{mode}-{analysis if mode == 'lexical' else config.retrieval.embedder}-"
            f"{LIST_DEPTH}.json"
        )
        if path.is_file():
            return {q: [tuple(hit) for hit in hits] for q, hits in json.loads(path.read_text()).items()}
        write_knowledge(self.data)  # a fresh checkout has no knowledge root yet
        stub = retrieval_pb2_grpc.RetrievalServiceStub(sidecar.get().channel())
        started = time.perf_counter()
        retrieval_mode = pb.RETRIEVAL_MODE_DENSE if mode == "dense" else pb.RETRIEVAL_MODE_LEXICAL
        lists = {}
        for q, text in self.data.queries.items():
            hits = search(stub, self.data, text, LIST_DEPTH, retrieval_mode=retrieval_mode).hits
            lists[q] = [(h.provenance.document_id, h.scores.dense if mode == "dense" else h.scores.bm25) for h in hits]
        path.write_text(json.dumps(lists))
        print(f"  [{self.data.name}] {mode} lists through Search in {time.perf_counter() - started:.0f} s", flush=True)
        return lists

    def _ranked(self, stage: FirstStage, q: str) -> list[tuple[str, float]]:
        dense, lexical = self.lists["dense"][q], self.lists["lexical"][q]
        if stage.kind != "hybrid":
            return (dense if stage.kind == "dense" else lexical)[:DEPTH]
        head_dense, head_lexical = dense[: stage.candidates], lexical[: stage.candidates]
        fused = with_feedback_of(
            fuse(head_dense, head_lexical, stage.fusion), stage.fusion, self.vectors, self.position
        )
        cosines = dict(dense)
        order = sorted(fused, key=lambda d: (-fused[d], -cosines.get(d, -1.0), d))[:DEPTH]
        if len(order) < DEPTH:
            floor = min(fused.values(), default=0.0)
            beyond = alternate([d for d, _ in dense[:DEPTH]], [d for d, _ in lexical[:DEPTH]])
            order += [d for d in beyond if d not in fused][: DEPTH - len(order)]
            fused = {**dict.fromkeys(order, floor), **fused}
        return [(d, fused[d]) for d in order]


class Chunked(FirstStages):
    """A collection as the sidecar indexes it: the .jsonl file of its records read by knowledge/sources/,
    chunked by knowledge/chunking.py (retrieval.chunk_tokens, chunk_overlap_tokens), one HybridIndex per
    lexical language over the chunks; each document ranked by its best chunk, searching wider until 100
    documents are found (as group_by_document does in knowledge/ranking.py). A ranked key is the document id
    when the document is one chunk, else the chunk id; the reranker scores that chunk's text."""

    view = "chunked as the sidecar does"

    def __init__(self, prepared: Prepared, embedder: Embedder, config) -> None:
        retrieval = config.retrieval
        super().__init__(prepared.data)
        self.query_vectors = prepared.query_vectors
        started = time.perf_counter()
        units = read_units(KNOWLEDGE / write_knowledge(self.data), KNOWLEDGE, retrieval.max_file_bytes)
        chunks = chunk_units(
            self.data.name,
            units,
            embedder.model.encoder.tokenizer,
            retrieval.chunk_tokens,
            retrieval.chunk_overlap_tokens,
        )
        per_document = collections.Counter(c.provenance.document_id for c in chunks)
        keys = [c.provenance.document_id if per_document[c.provenance.document_id] == 1 else c.id for c in chunks]
        self.texts = {k: c.text for k, c in zip(keys, chunks, strict=True)}
        self.docs = {k: c.provenance.document_id for k, c in zip(keys, chunks, strict=True)}
        self.chunks, self.split = len(chunks), sum(1 for n in per_document.values() if n > 1)
        vectors = embedder.cached(
            f"{self.data.name}-chunks-{retrieval.chunk_tokens}-{retrieval.chunk_overlap_tokens}",
            [c.text for c in chunks],
        )
        indexed = [IndexedChunk(k, c.text, {}) for k, c in zip(keys, chunks, strict=True)]
        self.indexes = {
            lang: HybridIndex.build(
                indexed, vectors, threads=retrieval.index_threads, dtype=retrieval.index_dtype, lexical_language=lang
            )
            for lang in LANGUAGES
        }
        print(
            f"  [{self.data.name}] {self.chunks} chunks ({self.split} documents cut) in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )

    def doc_of(self, key: str) -> str:
        return self.docs[key]

    def _ranked(self, stage: FirstStage, q: str) -> list[tuple[str, float]]:
        """The best 100 documents' best chunks (key, fused score), best first."""
        text = self.data.queries[q]
        index = self.indexes[LANGUAGES[0] if stage.kind == "dense" else stage.language]
        options = (
            {"use_lexical": False}
            if stage.kind == "dense"
            else {"use_dense": False}
            if stage.kind == "bm25"
            else {"fusion": stage.fusion}
        )
        width = DEPTH
        while True:
            best: dict[str, tuple[str, float]] = {}
            for hit in index.search(self.query_vectors[q], text, width, width, **options):
                best.setdefault(self.docs[hit.chunk.id], (hit.chunk.id, hit.fused))
            if len(best) >= DEPTH or width >= len(index):
                return list(best.values())[:DEPTH]
            width *= 2


# ---- cross-encoder scores, cached on disk ----------------------------------------------------------------


def reranker_id(max_length: int) -> str:
    return f"{RERANKER}-L{max_length}"


class BenchSidecar:
    """One sidecar for the whole run, started on first use: Rerank for missing scores, Search for the rpc stage.
    Its config is config/ragsidecar.toml with the --set overrides, a knowledge root of the sets as .jsonl files,
    a persistent data dir, and one extra reranker entry per max_length. `cache_bytes`: the inference result
    cache (on for quality: the Search rerank pass reuses the scores the cross-validation asked for; off to time
    Search)."""

    def __init__(self, overrides: dict[str, Any], cache_bytes: int = 0) -> None:
        self.overrides = overrides
        self.cache_bytes = cache_bytes
        self.server: Sidecar | None = None

    def get(self) -> Sidecar:
        if self.server is None:
            config = default_config(packaged=True)
            config["inference"].update(workers=2, intra_op_threads=1, cache_bytes=self.cache_bytes)
            config["paths"]["knowledge_roots"] = [str(KNOWLEDGE)]
            config["paths"]["data_dir"] = str(RESULTS / "sidecar-data")
            config["retrieval"].update(self.overrides)
            base = next(m for m in config["models"] if m["id"] == RERANKER)
            # window_overlap must stay below half the window (only windowed scoring uses it; these truncate)
            config["models"] += [
                {
                    **base,
                    "id": reranker_id(n),
                    "max_length": n,
                    "default": False,
                    "window_overlap": min(base.get("window_overlap", 64), n // 4),
                }
                for n in MAX_LENGTHS
            ]
            self.workdir = tempfile.TemporaryDirectory(prefix="sidecar-", dir=RESULTS)
            started = time.perf_counter()
            self.server = Sidecar(Path(self.workdir.name), config).start(timeout=300)
            print(f"sidecar serving on {self.server.address} after {time.perf_counter() - started:.1f} s", flush=True)
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
            self.workdir.cleanup()


class Scores:
    """Raw cross-encoder logits per (set, max_length, query id, document id), in bench/results/ce-*.json."""

    def __init__(self, sidecar: BenchSidecar, clients: int, default_max_length: int) -> None:
        self.sidecar = sidecar
        self.clients = clients
        self.default_max_length = default_max_length
        self._tables: dict[tuple[str, int], dict[str, dict[str, float]]] = {}

    def _path(self, name: str, max_length: int) -> Path:
        return RESULTS / f"ce-{name}-{RERANKER}-L{max_length}-truncate.json"

    def table(self, name: str, max_length: int) -> dict[str, dict[str, float]]:
        key = (name, max_length)
        if key not in self._tables:
            path = self._path(name, max_length)
            self._tables[key] = json.loads(path.read_text()) if path.is_file() else {}
        return self._tables[key]

    def ensure(self, prepared: Prepared | Chunked, max_length: int, heads: dict[str, list[str]]) -> None:
        """Scores every (query, document) of `heads` not yet cached, through the Rerank RPC."""
        name = prepared.data.name
        table = self.table(name, max_length)
        missing = {q: [d for d in docs if d not in table.get(q, {})] for q, docs in heads.items()}
        missing = {q: docs for q, docs in missing.items() if docs}
        if not missing:
            return
        self._save(name, max_length)  # merges what other runs scored meanwhile
        missing = {q: [d for d in docs if d not in table.get(q, {})] for q, docs in missing.items()}
        missing = {q: docs for q, docs in missing.items() if docs}
        if not missing:
            return
        pairs = sum(map(len, missing.values()))
        print(f"  [{name}] scoring {pairs} pairs at max_length {max_length} ({len(missing)} queries)...", flush=True)
        stub = self.sidecar.get().reranker()
        started = time.perf_counter()

        def one(q: str) -> tuple[str, dict[str, float]]:
            documents = [reranker_pb2.RerankDocument(id=d, text=prepared.texts[d]) for d in missing[q]]
            # The default model at its own max_length: what Search reranks with, so a later Search reuses the score
            model = RERANKER if max_length == self.default_max_length else reranker_id(max_length)
            response = stub.Rerank(
                reranker_pb2.RerankRequest(model=model, query=prepared.data.queries[q], documents=documents),
                timeout=600,
            )
            return q, {r.id: r.raw_score for r in response.results}

        done = 0
        with concurrent.futures.ThreadPoolExecutor(self.clients) as pool:
            for q, scored in pool.map(one, list(missing)):
                table.setdefault(q, {}).update(scored)
                done += 1
                if done % 10 == 0:
                    self._save(name, max_length)
        self._save(name, max_length)
        spent = time.perf_counter() - started
        print(f"  [{name}] {pairs} pairs in {spent:.0f} s ({pairs / spent:.1f} pairs/s)", flush=True)

    def _save(self, name: str, max_length: int) -> None:
        """Merges this run's scores with the file's (another run may be scoring the same set) and replaces it."""
        path = self._path(name, max_length)
        table = self.table(name, max_length)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.is_file():
                for q, scored in json.loads(path.read_text()).items():
                    table.setdefault(q, {}).update({d: v for d, v in scored.items() if d not in table[q]})
            temp = path.with_suffix(f".tmp-{os.getpid()}")
            temp.write_text(json.dumps(table))
            os.replace(temp, path)


def sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit))


def reranked(first: list[tuple[str, float]], logits: dict[str, float], rerank: Rerank) -> list[str]:
    """The final order of one query: the head of `depth` hits combined with the reranker, then the rest."""
    head = first[: rerank.depth]
    relevance = {i: sigmoid(logits[d]) for i, (d, _) in enumerate(head)}
    if rerank.combination == "reranker":  # RerankOrder.RERANKER: the reranker's order, then the rest
        order = sorted(relevance, key=lambda i: -relevance[i]) + list(range(len(head), len(first)))
    else:  # the product's combination (knowledge/ranking.py ranks by it)
        order = [i for i, _ in combine_reranked([s for _, s in first], relevance, rerank.combination, rerank.weight)]
    return [first[i][0] for i in order]


def run_of(
    prepared: Prepared | Chunked, pipeline: Pipeline, scores: Scores, sample: tuple[str, ...] | None = None
) -> Run:
    """The pipeline's ranking per query (of `sample` only, when given)."""
    first = prepared.first_stage(pipeline.first)
    if sample is not None:
        first = {q: first[q] for q in sample}
    rerank = pipeline.rerank
    if rerank is None or rerank.depth == 0:
        return {q: [prepared.doc_of(k) for k, _ in hits] for q, hits in first.items()}
    scores.ensure(prepared, rerank.max_length, {q: [k for k, _ in hits[: rerank.depth]] for q, hits in first.items()})
    table = scores.table(prepared.data.name, rerank.max_length)
    return {q: [prepared.doc_of(k) for k in reranked(hits, table[q], rerank)] for q, hits in first.items()}


def spread(items: list, count: int | None) -> list:
    """`count` items spread evenly over the list (all of them when count is None or not smaller)."""
    if count is None or count >= len(items):
        return list(items)
    return [items[round(i * (len(items) - 1) / max(count - 1, 1))] for i in range(count)]


# ---- the stages ------------------------------------------------------------------------------------------


def hybrid_stages(languages: tuple[str, ...] = LANGUAGES, depths: tuple[int, ...] = (50,)) -> list[FirstStage]:
    """Every fusion of the grid: plain RRF, each weighted method at each dense_weight, and "adaptive" at each
    ADAPTIVE_WEIGHTS dense_weight and SPREAD_GAINS gain, all without feedback; then "adaptive" at each
    FEEDBACK_DENSE_WEIGHTS dense_weight and FEEDBACK_GAINS gain with each FEEDBACK_DOCUMENTS x FEEDBACK_WEIGHTS
    feedback; per language and fusion depth (fusion_candidates)."""
    stages = []
    for lang in languages:
        for depth in depths:
            stages.append(FirstStage("hybrid", lang, FusionSettings("rrf"), depth))
            for method in FUSIONS[1:]:
                if method != "adaptive":
                    stages += [FirstStage("hybrid", lang, FusionSettings(method, w), depth) for w in WEIGHTS]
            stages += [
                FirstStage("hybrid", lang, FusionSettings("adaptive", w, spread_gain=gain), depth)
                for w in ADAPTIVE_WEIGHTS
                for gain in SPREAD_GAINS
            ]
            stages += [
                FirstStage(
                    "hybrid",
                    lang,
                    FusionSettings("adaptive", w, spread_gain=gain, feedback_documents=m, feedback_weight=fw),
                    depth,
                )
                for w in FEEDBACK_DENSE_WEIGHTS
                for gain in FEEDBACK_GAINS
                for m in FEEDBACK_DOCUMENTS
                for fw in FEEDBACK_WEIGHTS
            ]
    return stages


def rerank_variants(depths: tuple[int, ...], max_length: int) -> list[Rerank]:
    return [
        variant
        for depth in depths
        for variant in [Rerank("rrf", 0.5, depth, max_length), Rerank("reranker", 0.5, depth, max_length)]
        + [Rerank("interpolate", w, depth, max_length) for w in RERANK_WEIGHTS]
    ]


class Bench:
    def __init__(
        self, prepared: list[Prepared] | list[Listed], scores: Scores, default: Pipeline, grid: list[FirstStage]
    ) -> None:
        self.prepared = prepared
        self.grid = grid  # the first stages explore and cv try
        self.rerank_queries: int | None = None  # per set, the queries the rerank cross-validation scores
        self.scores = scores
        self.default = default
        self.memo: dict[tuple[str, Pipeline], tuple[float, float]] = {}
        self.lines: list[str] = []

    def measure(
        self, p: Prepared | Chunked, pipeline: Pipeline, sample: tuple[str, ...] | None = None
    ) -> tuple[float, float]:
        key = (p.data.name, p.view, pipeline, sample)
        if key not in self.memo:
            self.memo[key] = evaluate(run_of(p, pipeline, self.scores, sample), p.data.qrels)
        return self.memo[key]

    def out(self, *lines: str) -> None:
        self.lines += lines
        for line in lines:
            print(line, flush=True)

    # explore ------------------------------------------------------------------------------------------
    def explore(self) -> None:
        names = [p.data.name for p in self.prepared]
        self.out(
            "",
            "## First stage per set (in-process, rerank off)",
            "",
            "| first stage | " + " | ".join(f"{n} nDCG@10 | {n} R@100" for n in names) + " |",
            "|---|" + "---|---|" * len(names),
        )
        stages = [FirstStage("bm25", lang) for lang in LANGUAGES] + [FirstStage("dense")] + self.grid
        for stage in stages:
            cells = [self.measure(p, Pipeline(stage)) for p in self.prepared]
            self.out(f"| {stage.label()} | " + " | ".join(f"{n:.3f} | {r:.3f}" for n, r in cells) + " |")
        self.out("", "Published BM25 baselines: " + "; ".join(f"{n}: {BASELINES[n]}" for n in names if n in BASELINES))

    # cv -----------------------------------------------------------------------------------------------
    def cross_validate(self) -> Pipeline:
        """Leave one set out, stage by stage: each fold picks the first stage on its training sets (all the
        others); the folds' picks are agreed into one first stage; on it, each fold picks the rerank combination
        on its training sets (on `rerank_sample`'s queries: cross-encoder time); those picks are agreed too.
        Every pick is reported on the set it did not see."""
        if len(self.prepared) < 3:
            raise SystemExit("cv needs three sets at least")
        max_length = self.default.rerank.max_length
        trains = [[p for p in self.prepared if p is not held] for held in self.prepared]

        def best(candidates, pipeline_of, train, sampled=False):
            return max(
                candidates,
                key=lambda c: statistics.fmean(
                    self.measure(p, pipeline_of(c), self.sample(p, sampled))[0] for p in train
                ),
            )

        firsts = [best(self.grid, Pipeline, train) for train in trains]
        plain = [s for s in self.grid if not s.fusion.feedback]
        firsts_plain = [best(plain, Pipeline, train) for train in trains]  # what feedback adds, per held-out set
        first = agree_first(firsts)
        print(f"  first stage agreed: {first.label()}", flush=True)
        variants = rerank_variants(CV_DEPTHS, max_length)
        reranks = [best(variants, lambda r: Pipeline(first, r), train, True) for train in trains]
        rerank = agree_rerank(reranks)
        self.out(
            "",
            f"## Leave-one-set-out cross-validation over {len(self.prepared)} sets (each pick made on the "
            "other sets by mean nDCG@10, reported on the held-out set; rerank depth "
            f"{' or '.join(map(str, CV_DEPTHS))}, max_length {max_length}, on the rerank sample)",
            "",
            "| held out | first stage picked | held out: its pick | picked without feedback | held out: that pick | "
            "held out: agreed | max(lexical, dense) | rerank picked (on the agreed first stage) | "
            "held out, sample: off | + picked rerank |",
            "|---|---|---|---|---|---|---|---|---|---|",
        )
        for held, fold_first, fold_plain, fold_rerank in zip(self.prepared, firsts, firsts_plain, reranks, strict=True):
            sample = self.sample(held, True)
            self.out(
                f"| {held.data.name} | {fold_first.label()} | {self.measure(held, Pipeline(fold_first))[0]:.3f} | "
                f"{fold_plain.label()} | {self.measure(held, Pipeline(fold_plain))[0]:.3f} | "
                f"{self.measure(held, Pipeline(first))[0]:.3f} | {self.strongest_single(held):.3f} | "
                f"{fold_rerank.label()} | {self.measure(held, Pipeline(first), sample)[0]:.3f} | "
                f"{self.measure(held, Pipeline(first, fold_rerank), sample)[0]:.3f} |"
            )
        chosen = Pipeline(first, rerank)
        self.out(
            "",
            "Agreed (per setting the value most folds picked; a weight is the median of the folds that picked "
            f"that method; feedback on or off, and its documents and weight, as most of those folds picked): "
            f"**{chosen.label()}**",
        )
        self.out(
            "",
            "Rerank combinations on the agreed first stage (nDCG@10 on the rerank sample):",
            "",
            "| rerank | " + " | ".join(p.data.name for p in self.prepared) + " | mean |",
            "|---|" + "---|" * (len(self.prepared) + 1),
        )
        for variant in [None, *rerank_variants(CV_DEPTHS, max_length)]:
            cells = [self.measure(p, Pipeline(first, variant), self.sample(p, True))[0] for p in self.prepared]
            self.out(
                f"| {variant.label() if variant else 'off'} | "
                + " | ".join(f"{c:.3f}" for c in cells)
                + f" | {statistics.fmean(cells):.3f} |"
            )
        return chosen

    def sample(self, p: Prepared | Listed, sampled: bool) -> tuple[str, ...] | None:
        """The rerank sample's queries of the set (None: all of them)."""
        return tuple(spread(list(p.data.queries), self.rerank_queries)) if sampled and self.rerank_queries else None

    def strongest_single(self, p: Prepared) -> float:
        return max(
            self.measure(p, Pipeline(s))[0]
            for s in [FirstStage("bm25", lang) for lang in LANGUAGES] + [FirstStage("dense")]
        )

    # curve and verdict ----------------------------------------------------------------------------------
    def curve(self, pipeline: Pipeline, latencies: dict[tuple[str, int, int], float], count: int | None) -> None:
        """Each curve point on a sample of `count` queries per set (all when None), and on every query where
        the cross-validation already scored it (depth up to 20 at the configured max_length)."""
        base = pipeline.rerank
        self.out(
            "",
            f"## Speed against quality: {pipeline.first.label()} + rerank {base.combination}"
            f"{f' w={base.weight:g}' if base.combination == 'interpolate' else ''}",
            "",
            "| set | depth | max_length | nDCG@10 all queries | nDCG@10 sample | R@100 sample | "
            "queries in sample | Search p50 ms (top_k 10) |",
            "|---|---|---|---|---|---|---|---|",
        )
        for p in self.prepared:
            sample = tuple(spread(list(p.data.queries), count))
            for depth, max_length in latency_points(base):
                rerank = dataclasses.replace(base, depth=depth, max_length=max_length) if depth else None
                measured = Pipeline(pipeline.first, rerank)
                ndcg, recall = self.measure(p, measured, sample)
                scored = depth <= max(CV_DEPTHS) and (depth == 0 or max_length == base.max_length)
                everything = f"{self.measure(p, measured)[0]:.3f}" if scored else "-"
                latency = latencies.get((p.data.name, depth, max_length))
                self.out(
                    f"| {p.data.name} | {depth} | {max_length if depth else '-'} | {everything} | {ndcg:.3f} | "
                    f"{recall:.3f} | {len(sample)} | "
                    f"{f'{latency:.0f}' if latency is not None else 'not measured'} |"
                )

    def verdict(self, pipeline: Pipeline) -> None:
        """The summary against the old default (unstemmed BM25, plain RRF, reranker order RRF-fused at depth
        20), and the issue's done-when checks."""
        names = [p.data.name for p in self.prepared]
        before = Pipeline(FirstStage("hybrid", "none", FusionSettings("rrf")), Rerank("rrf", 0.5, 20, 512))
        rows = [
            ("BM25 unstemmed", Pipeline(FirstStage("bm25", "none"))),
            ("BM25 english (stemmed)", Pipeline(FirstStage("bm25", "english"))),
            ("dense", Pipeline(FirstStage("dense"))),
            (f"before: {before.first.label()}, rerank off", Pipeline(before.first)),
            (f"before: + {before.rerank.label()} (the old default)", before),
            (f"default: {pipeline.first.label()}, rerank off", Pipeline(pipeline.first)),
            (f"default: + {pipeline.rerank.label()}", pipeline),
        ]
        self.out(
            "",
            "## Summary (nDCG@10 / R@100, in-process, one vector per document)",
            "",
            "| pipeline | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        )
        for label, measured in rows:
            cells = ("{:.3f} / {:.3f}".format(*self.measure(p, measured)) for p in self.prepared)
            self.out(f"| {label} | " + " | ".join(cells) + " |")
        self.out(
            "",
            f"## Done-when checks for the default pipeline: {pipeline.label()}",
            "",
            "| set | max(BM25, dense) | default rerank off | default rerank on | on >= max(BM25, dense) - 0.005 | "
            "on >= off |",
            "|---|---|---|---|---|---|",
        )
        notes = []
        for p in self.prepared:
            strongest = self.strongest_single(p)
            off, on = self.measure(p, Pipeline(pipeline.first))[0], self.measure(p, pipeline)[0]
            self.out(
                f"| {p.data.name} | {strongest:.4f} | {off:.4f} | {on:.4f} | "
                f"{'PASS' if on >= strongest - SLACK else 'FAIL'} | {'PASS' if on >= off else 'FAIL'} |"
            )
            if p.data.name == "scifact":
                notes.append(
                    f"SciFact hybrid + rerank {on:.4f}: {'PASS' if on >= TARGET_SCIFACT else 'FAIL'} "
                    f"(target >= {TARGET_SCIFACT})"
                )
        self.out("", *notes)


def _common(values):
    return collections.Counter(values).most_common(1)[0][0]


def agree_first(picks: list[FirstStage]) -> FirstStage:
    """The folds' first stages as one: the most common language and method; the median dense_weight and
    spread_gain and the most common fusion depth of the folds that picked that method; feedback if most of
    those folds picked it, with the most common feedback_documents and feedback_weight of those that did."""
    method = _common(f.fusion.method for f in picks)
    chosen = [f for f in picks if f.fusion.method == method]
    weight = 0.5 if method == "rrf" else statistics.median(f.fusion.dense_weight for f in chosen)  # rrf: no weight
    gain = statistics.median(f.fusion.spread_gain for f in chosen)
    fed_back = [f.fusion for f in chosen if f.fusion.feedback] if _common(f.fusion.feedback for f in chosen) else []
    feedback = (
        {
            "feedback_documents": _common(f.feedback_documents for f in fed_back),
            "feedback_weight": _common(f.feedback_weight for f in fed_back),
        }
        if fed_back
        else {}
    )
    return FirstStage(
        "hybrid",
        _common(f.language for f in picks),
        FusionSettings(method, weight, spread_gain=gain, **feedback),
        _common(f.candidates for f in chosen),
    )


def agree_rerank(picks: list[Rerank]) -> Rerank:
    """The folds' rerank combinations as one: the most common; the median weight and the most common depth of
    the folds that picked it."""
    combination = _common(r.combination for r in picks)
    chosen = [r for r in picks if r.combination == combination]
    return dataclasses.replace(
        picks[0],
        combination=combination,
        weight=statistics.median(r.weight for r in chosen),
        depth=_common(r.depth for r in chosen),
    )


# ---- through the sidecar ---------------------------------------------------------------------------------

PRINCIPAL = common_pb2.Principal(id="bench")
SCOPE = common_pb2.Scope(tenant="bench", session="beir")


def write_knowledge(data: Collection) -> str:
    """The set as one .jsonl file of BEIR records in the bench's knowledge root; its path relative to it."""
    KNOWLEDGE.mkdir(parents=True, exist_ok=True)
    path = KNOWLEDGE / f"{data.name}.jsonl"
    content = "".join(
        json.dumps({"_id": r["_id"], "title": r.get("title") or "", "text": r.get("text") or ""}, ensure_ascii=False)
        + "\n"
        for r in data.rows
    )
    if not path.is_file() or path.read_text(encoding="utf-8") != content:
        path.write_text(content, encoding="utf-8")
    return path.name


def search(stub, data: Collection, query: str, top_k: int, **options) -> pb.SearchResponse:
    entry = pb.KnowledgeEntry(
        name=data.name, type=pb.KNOWLEDGE_TYPE_FILE, use=pb.KNOWLEDGE_USE_SEARCH, path=f"{data.name}.jsonl"
    )
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=pb.Target(name="bench.Beir", knowledge=[entry]),
        query=query,
        top_k=top_k,
        search=pb.SearchOptions(group_by_document=True, **options),
    )
    return stub.Search(request, timeout=3600)


def through_rpc(
    bench: Bench,
    sidecar: BenchSidecar,
    chunked: dict[str, Chunked],
    pipeline: Pipeline,
    rerank_queries: int | None,
    latency_queries: int,
    latencies: dict[tuple[str, int, int], float],
) -> None:
    """The default pipeline through Search, beside the same pipeline in-process on the same chunks."""
    rerank = pipeline.rerank
    bench.out(
        "",
        f"## The default pipeline through the Search RPC (FILE .jsonl, group_by_document, top_k {DEPTH}, "
        f"rerank_depth {rerank.depth}) and in-process on the same chunks",
        "",
        "| set | rerank | queries | nDCG@10 RPC | nDCG@10 in-process | R@100 RPC | R@100 in-process | "
        "same top 10 | Search p50 ms (top_k 100) |",
        "|---|---|---|---|---|---|---|---|---|",
    )
    for name, view in chunked.items():
        stub = retrieval_pb2_grpc.RetrievalServiceStub(sidecar.get().channel())
        started = time.perf_counter()
        search(stub, view.data, "warm-up", 1)
        print(f"  [{name}] the sidecar loaded the source in {time.perf_counter() - started:.0f} s", flush=True)
        off: Run = {}  # the run without rerank (first), which a reranked sample is compared with on its queries
        for on in (False, True) if rerank_queries != 0 else (False,):
            options = {"rerank": True, "rerank_depth": rerank.depth} if on else {}
            sample = tuple(spread(list(view.data.queries), rerank_queries if on else None))
            run, times = {}, []
            for q in sample:
                started = time.perf_counter()
                hits = search(stub, view.data, view.data.queries[q], DEPTH, **options).hits
                times.append(time.perf_counter() - started)
                run[q] = [h.provenance.document_id for h in hits]
            if on and len(sample) < len(view.data.queries):  # rerank off on the same queries, to compare
                compare_rpc(bench, view, "off", {q: off[q] for q in sample}, Pipeline(pipeline.first), "-")
            compare_rpc(
                bench,
                view,
                "on" if on else "off",
                run,
                Pipeline(pipeline.first, rerank if on else None),
                f"{1000 * statistics.median(times):.0f}",
            )
            if not on:
                off = run
        if latency_queries > 0:
            measure_latency(stub, view.data, rerank, latency_queries, latencies)


def compare_rpc(bench: Bench, view: Chunked, label: str, run: Run, pipeline: Pipeline, latency: str) -> None:
    local = run_of(view, pipeline, bench.scores, tuple(run))
    same = statistics.fmean(run[q][:10] == local[q][:10] for q in run)
    (n_rpc, r_rpc), (n_local, r_local) = evaluate(run, view.data.qrels), evaluate(local, view.data.qrels)
    bench.out(
        f"| {view.data.name} | {label} | {len(run)} | {n_rpc:.3f} | {n_local:.3f} | {r_rpc:.3f} | "
        f"{r_local:.3f} | {same:.0%} | {latency} |"
    )


def latency_points(base: Rerank) -> list[tuple[int, int]]:
    """(rerank depth, max_length) of the speed/quality curve: each depth at the configured max_length, each
    max_length at the configured depth (depth 0: rerank off)."""
    return [(d, base.max_length) for d in RERANK_DEPTHS] + [
        (base.depth, n) for n in MAX_LENGTHS if n != base.max_length
    ]


def measure_latency(
    stub, data: Collection, base: Rerank, count: int, latencies: dict[tuple[str, int, int], float]
) -> None:
    """p50 of Search (top_k 10, one caller) per curve point, over `count` queries spread evenly over the set.
    The result cache is off, so every rerank scores its pairs."""
    chosen = spread(list(data.queries.values()), count)
    for depth, max_length in latency_points(base):
        options = {"rerank": True, "rerank_depth": depth, "reranker_model": reranker_id(max_length)} if depth else {}
        times = []
        for text in chosen:
            started = time.perf_counter()
            try:
                search(stub, data, text, 10, **options)
            except grpc.RpcError as err:  # a long query (LISA's) leaves no room for a document at a short max_length
                if err.code() is not grpc.StatusCode.INVALID_ARGUMENT:
                    raise
                continue
            times.append(time.perf_counter() - started)
        if not times:
            print(f"  [{data.name}] Search depth {depth} L{max_length}: no query fits", flush=True)
            continue
        latencies[(data.name, depth, max_length)] = 1000 * statistics.median(times)
        print(
            f"  [{data.name}] Search depth {depth} L{max_length}: p50 "
            f"{latencies[(data.name, depth, max_length)]:.0f} ms",
            flush=True,
        )


def reference_bm25(data: Collection) -> Run:
    """The reference the issue measured against: bm25s built afresh ("lucene", k1 0.9, b 0.4) over "title text",
    Snowball English stems, English stopwords (the analysis of knowledge/lexical.py's "english")."""
    index = bm25s.BM25(k1=0.9, b=0.4)
    index.index(lexical.terms(data.doc_texts, "english"), show_progress=False)
    run = {}
    for q, query_terms in zip(data.queries, lexical.terms(list(data.queries.values()), "english"), strict=True):
        scores = index.get_scores(query_terms)
        run[q] = [data.doc_ids[i] for i in np.argsort(-scores, kind="stable")[:DEPTH]]
    return run


def quality_table(
    bench: Bench, sidecar: BenchSidecar, pipeline: Pipeline, rerank_queries: int | None, rpc_sets: list[str]
) -> None:
    """Every set through the Search RPC (FILE .jsonl, group_by_document, top_k 100): the sidecar's lexical and
    dense lists alone (retrieval_mode), the default, and the default with rerank (the configured depth), beside
    the reference BM25; then the issue's done-when checks. Also per set: the share of queries whose top 10
    equals the in-process fusion of the same lists, and whose top 10 at top_k 10 equals the first 10 at top_k 100.
    A set outside `rpc_sets` gets the default and its rerank in-process from its lists (marked "in-process")."""
    stub = retrieval_pb2_grpc.RetrievalServiceStub(sidecar.get().channel())
    columns = ["BM25 reference", "lexical", "dense", "default", "default + rerank"]
    bench.out(
        "",
        f"## Through the Search RPC: nDCG@10 / R@100 (default: {pipeline.first.label()}; rerank: "
        f"{pipeline.rerank.label()})",
        "",
        "| set | " + " | ".join(columns) + " | same top 10 as in-process | top_k 10 = head of top_k 100 |",
        "|---|" + "---|" * (len(columns) + 2),
    )
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for view in bench.prepared:
        data = view.data
        sample = tuple(spread(list(data.queries), rerank_queries))
        runs: dict[str, Run] = {
            "BM25 reference": reference_bm25(data),
            "lexical": run_of(view, Pipeline(FirstStage("bm25")), bench.scores),
            "dense": run_of(view, Pipeline(FirstStage("dense")), bench.scores),
        }
        local = run_of(view, Pipeline(pipeline.first), bench.scores)
        if data.name in rpc_sets:
            runs["default"] = {
                q: [h.provenance.document_id for h in search(stub, data, text, DEPTH).hits]
                for q, text in data.queries.items()
            }
            heads = {
                q: [h.provenance.document_id for h in search(stub, data, data.queries[q], 10).hits]
                for q in data.queries
            }
            runs["default + rerank"] = {
                q: [h.provenance.document_id for h in search(stub, data, data.queries[q], DEPTH, rerank=True).hits]
                for q in sample
            }
        else:
            runs["default"], heads = local, {q: local[q][:10] for q in data.queries}
            runs["default + rerank"] = run_of(view, pipeline, bench.scores, sample)
        table[data.name] = {c: evaluate(run, data.qrels) for c, run in runs.items()}
        if len(sample) < len(data.queries):  # rerank off on the same queries, to compare
            table[data.name]["default, rerank sample"] = evaluate({q: runs["default"][q] for q in sample}, data.qrels)
        same = statistics.fmean(runs["default"][q][:10] == local[q][:10] for q in data.queries)
        stable = statistics.fmean(heads[q] == runs["default"][q][:10] for q in data.queries)
        where = "" if data.name in rpc_sets else " (in-process)"
        bench.out(
            f"| {data.name}{where} | "
            + " | ".join("{:.3f} / {:.3f}".format(*table[data.name][c]) for c in columns)
            + f" | {same:.0%} | {stable:.0%} |"
        )
    means = {c: statistics.fmean(t[c][0] for t in table.values()) for c in columns}
    bench.out(
        "| mean nDCG@10 | " + " | ".join(f"{means[c]:.3f}" for c in columns) + " | | |",
        "",
        "Done-when checks (nDCG@10):",
        "",
        "| set | default >= max(lexical, dense) - 0.005 | rerank >= no rerank |",
        "|---|---|---|",
    )
    for name, t in table.items():
        floor = max(t["lexical"][0], t["dense"][0]) - SLACK
        off = t.get("default, rerank sample", t["default"])[0]
        bench.out(
            f"| {name} | {t['default'][0]:.3f} vs {floor:.3f}: {'PASS' if t['default'][0] >= floor else 'FAIL'} | "
            f"{t['default + rerank'][0]:.3f} vs {off:.3f}: {'PASS' if t['default + rerank'][0] >= off else 'FAIL'} |"
        )
    gain = means["default + rerank"] - statistics.fmean(
        t.get("default, rerank sample", t["default"])[0] for t in table.values()
    )
    bench.out(
        "",
        f"Mean: default {means['default']:.3f} vs BM25 reference {means['BM25 reference']:.3f} + 0.02: "
        f"{'PASS' if means['default'] >= means['BM25 reference'] + 0.02 else 'FAIL'}; rerank gain "
        f"{gain:+.3f} (>= +0.01: {'PASS' if gain >= 0.01 else 'FAIL'})",
    )


def speed(
    bench: Bench,
    overrides: dict[str, Any],
    pipeline: Pipeline,
    count: int,
    latencies: dict[tuple[str, int, int], float],
    rpc_sets: list[str],
) -> None:
    """p50 of Search with rerank at top_k 10 (one caller, `count` queries per set, a sidecar with the inference
    cache off, so every rerank scores its pairs), per curve point; the default's over every set's queries."""
    sidecar = BenchSidecar(overrides)
    try:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(sidecar.get().channel())
        default_times = []
        for view in [v for v in bench.prepared if v.data.name in rpc_sets]:
            search(stub, view.data, "warm-up", 1)
            measure_latency(stub, view.data, pipeline.rerank, count, latencies)
            for text in spread(list(view.data.queries.values()), count):
                started = time.perf_counter()
                search(stub, view.data, text, 10, rerank=True)
                default_times.append(time.perf_counter() - started)
    finally:
        sidecar.stop()
    p50 = 1000 * statistics.median(default_times)
    bench.out(
        "",
        f"Speed: Search with the default rerank ({pipeline.rerank.label()}) at top_k 10, p50 over "
        f"{len(default_times)} queries of {', '.join(rpc_sets)}: {p50:.0f} ms "
        f"(<= 300 ms: {'PASS' if p50 <= 300 else 'FAIL'}; {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f})",
    )


# ---- chunking --------------------------------------------------------------------------------------------


def chunking(bench: Bench, chunked: dict[str, Chunked], config, pipeline: Pipeline, rerank_queries: int | None) -> None:
    """Each document ranked by its best chunk (the product's chunking) against one vector per document; the
    rerank row on the rpc stage's sample of queries (a split document's chunks are new pairs to score)."""
    retrieval = config.retrieval
    bench.out(
        "",
        f"## Chunking: one vector per document vs the product's chunks ({retrieval.chunk_tokens} tokens, "
        f"overlap {retrieval.chunk_overlap_tokens}), each document ranked by its best chunk",
        "",
        "| set | documents | chunks | documents cut | pipeline | queries | nDCG@10 one per doc | "
        "nDCG@10 chunked | R@100 one per doc | R@100 chunked |",
        "|---|---|---|---|---|---|---|---|---|---|",
    )
    for p in bench.prepared:
        view = chunked.get(p.data.name)
        if view is None:
            continue
        rows = [
            (Pipeline(FirstStage("dense")), None),
            (Pipeline(FirstStage("bm25", pipeline.first.language)), None),
            (Pipeline(pipeline.first), None),
            *(
                [(pipeline, tuple(spread(list(p.data.queries), rerank_queries)) if rerank_queries else None)]
                if rerank_queries != 0
                else []
            ),
        ]
        for measured, sample in rows:
            (n_doc, r_doc), (n_chunk, r_chunk) = (
                bench.measure(p, measured, sample),
                bench.measure(view, measured, sample),
            )
            bench.out(
                f"| {p.data.name} | {len(p.data.doc_ids)} | {view.chunks} | {view.split} | {measured.label()} | "
                f"{len(sample) if sample else len(p.data.queries)} | {n_doc:.3f} | {n_chunk:.3f} | {r_doc:.3f} | "
                f"{r_chunk:.3f} |"
            )


# ---- main ------------------------------------------------------------------------------------------------


def parse_overrides(items: list[str]) -> dict[str, Any]:
    overrides = {}
    for item in items:
        key, _, value = item.partition("=")
        if not key.startswith("retrieval.") or not value:
            raise SystemExit(f"--set takes retrieval.KEY=VALUE, got {item!r}")
        overrides[key.removeprefix("retrieval.")] = tomllib.loads(f"v = {value}")["v"]
    return overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="scifact,cranfield,med,npl,lisa")
    parser.add_argument(
        "--stages",
        default="cv,table,speed,curve",
        help="explore, cv, table, speed, curve (from the lists through Search); rpc, chunking (with --in-process)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="first-stage lists from one vector per document in-process (the 0.2.0 bench) "
        "instead of through the Search RPC",
    )
    parser.add_argument(
        "--rpc-sets",
        default="scifact,cranfield,med,npl,lisa",
        help="sets searched through the Search RPC (table, rpc, speed)",
    )
    parser.add_argument("--latency-queries", type=int, default=5, help="queries per point of the latency curve")
    parser.add_argument(
        "--rpc-rerank-queries",
        type=int,
        default=None,
        help="queries (spread evenly) of the rerank-on pass through Search (default: all) and of "
        "the chunking stage's rerank row (0: skip both)",
    )
    parser.add_argument(
        "--curve-queries",
        type=int,
        default=30,
        help="queries per set (spread evenly) of the speed/quality curve (a number above the set's queries: all)",
    )
    parser.add_argument("--clients", type=int, default=2, help="concurrent Rerank callers filling the score cache")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="retrieval.KEY=VALUE",
        help="override a [retrieval] setting of config/ragsidecar.toml (in-process and sidecar)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still stops its sidecar
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    stages = {s.strip() for s in args.stages.split(",") if s.strip()}
    overrides = parse_overrides(args.set)
    RESULTS.mkdir(parents=True, exist_ok=True)
    config = load_config(REPO / "config" / "ragsidecar.toml", environ={})
    config = msgspec.structs.replace(config, retrieval=msgspec.structs.replace(config.retrieval, **overrides))
    overall, load_start = time.perf_counter(), os.getloadavg()[0]
    default = configured(config)
    print(f"default pipeline (config/ragsidecar.toml{' + --set' if overrides else ''}): {default.label()}", flush=True)

    embedder = Embedder(config)  # the in-process lists' vectors, or the feedback's on the lists through Search
    sidecar = BenchSidecar(overrides, cache_bytes=0 if args.in_process else QUALITY_CACHE_BYTES)
    latencies: dict[tuple[str, int, int], float] = {}
    try:
        if args.in_process:
            views: list[Prepared] | list[Listed] = [Prepared(read_collection(name), embedder, config) for name in sets]
            grid = hybrid_stages()
        else:
            views = [Listed(read_collection(name), sidecar, config, embedder) for name in sets]
            grid = hybrid_stages((config.retrieval.lexical_language,), FUSION_DEPTHS)
        bench = Bench(views, Scores(sidecar, args.clients, default.rerank.max_length), default, grid)
        bench.rerank_queries = args.rpc_rerank_queries
        bench.out(
            f"# Retrieval quality on BEIR-style collections ({os.cpu_count()} cores)",
            "",
            f"Default pipeline measured: **{default.label()}**",
        )
        if "explore" in stages:
            bench.explore()
        if "cv" in stages:
            bench.cross_validate()
        if not args.in_process:
            if "table" in stages:
                quality_table(
                    bench,
                    sidecar,
                    default,
                    args.rpc_rerank_queries,
                    [name.strip() for name in args.rpc_sets.split(",")],
                )
            sidecar.stop()
            if "speed" in stages:
                speed(
                    bench,
                    overrides,
                    default,
                    args.latency_queries,
                    latencies,
                    [name.strip() for name in args.rpc_sets.split(",")],
                )
            if "curve" in stages:
                bench.curve(default, latencies, args.curve_queries)
        else:
            in_process(bench, sidecar, embedder, config, default, stages, args, latencies)
    finally:
        sidecar.stop()
        embedder.close()
    bench.out(
        "",
        f"Total {time.perf_counter() - overall:.0f} s; 1-min load average {load_start:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end (the machine is shared).",
    )
    (RESULTS / "beir.md").write_text("\n".join(bench.lines) + "\n")


def in_process(
    bench: Bench,
    sidecar: BenchSidecar,
    embedder: Embedder,
    config,
    default: Pipeline,
    stages: set[str],
    args: argparse.Namespace,
    latencies: dict[tuple[str, int, int], float],
) -> None:
    """The 0.2.0 bench's stages on one vector per document: rpc, curve, the verdict, chunking."""
    sets = [p.data.name for p in bench.prepared]
    rpc_sets = [name.strip() for name in args.rpc_sets.split(",") if name.strip() in sets]
    chunk_sets = sorted(
        set(rpc_sets if "rpc" in stages else []) | (set(sets) if "chunking" in stages else set()), key=sets.index
    )
    chunked = {name: Chunked(p, embedder, config) for p in bench.prepared for name in chunk_sets if p.data.name == name}
    if "rpc" in stages:
        through_rpc(
            bench,
            sidecar,
            {n: chunked[n] for n in rpc_sets},
            default,
            args.rpc_rerank_queries,
            args.latency_queries,
            latencies,
        )
    if "curve" in stages:
        bench.curve(default, latencies, args.curve_queries)
    bench.verdict(default)
    if "chunking" in stages:
        chunking(bench, chunked, config, default, args.rpc_rerank_queries)


if __name__ == "__main__":
    main()
