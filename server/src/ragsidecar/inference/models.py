"""Loaded models: a tokenizer, an onnxruntime backend and a batching queue behind one scoring API."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Self

import numpy as np
from tokenizers import Encoding

from ragsidecar import metrics, tracing
from ragsidecar.config import InferenceConfig, ModelConfig
from ragsidecar.inference.backend import OnnxBackend
from ragsidecar.inference.batching import BatchQueue
from ragsidecar.inference.heap import release_free_memory
from ragsidecar.inference.stopping import StopFlag, run_stoppable
from ragsidecar.inference.tokenization import DocumentInputs, ModelInput, TextEncoder

log = logging.getLogger(__name__)

_WARMUP_TEXTS = [
    "warm-up",
    "How do onnxruntime sessions warm up before they serve their first request?",
    " ".join(["A longer warm-up passage that makes the first runs allocate their larger buffers."] * 12),
]


@dataclass(frozen=True)
class PairScore:
    """A (query, document) pair's raw score: the logit, or the cosine for bi-encoders."""

    raw: float
    best_window: int
    truncated: bool
    tokens: int


@dataclass(frozen=True)
class ScoredBatch:
    scores: list[PairScore]
    tokenization_s: float
    queue_s: float
    inference_s: float


class Embedded(NamedTuple):
    """Texts embedded by a bi-encoder."""

    # One unit float32 row per text.
    vectors: np.ndarray
    # Whether each text was cut to the model's window.
    truncated: list[bool]
    queue_s: float
    inference_s: float
    # Tokens of each text's model input, special tokens included.
    tokens: list[int]


class QueryTooLong(ValueError):
    """The query leaves no room for a document in the model's window (queries are never cut)."""


class LoadedModel:
    """A configured model, loaded and (after warm_up) serving through its batching queue."""

    def __init__(
        self,
        spec: ModelConfig,
        inference: InferenceConfig,
        fingerprint: str,
        encoder: TextEncoder,
        backend: OnnxBackend,
    ) -> None:
        self.spec = spec
        self.inference = inference
        self.fingerprint = fingerprint
        self.encoder = encoder
        self.backend = backend
        self.queue = BatchQueue(
            spec.id, self.backend, inference.workers, inference.max_batch_tokens, inference.max_queued_pairs
        )
        self._users = 0
        self._retired = False
        self._closing: asyncio.Task | None = None
        self._closed = False
        metrics.LOADED_MODELS.inc()

    @property
    def id(self) -> str:
        return self.spec.id

    def same_as(self, spec: ModelConfig, folder: Path, inference: InferenceConfig) -> bool:
        """Whether a reload can keep this instance for that configuration."""
        return spec == self.spec and inference == self.inference and _fingerprint(folder) == self.fingerprint

    async def warm_up(self) -> None:
        """First runs allocate buffers and pick kernels; then measure whether padding is safe."""
        encodings = await asyncio.to_thread(self.encoder.encode, _WARMUP_TEXTS)
        samples = [self._warmup_input(encodings[0], e) for e in encodings]
        self._check_outputs(await self.queue.run_now(samples))
        mode = self.inference.batch_mode
        if mode == "auto":
            await asyncio.to_thread(self.backend.probe_batch_invariance, samples)
        else:
            self.backend.batch_invariant_padding = mode == "padded"

    def _warmup_input(self, first: Encoding, encoding: Encoding) -> ModelInput:
        raise NotImplementedError

    def _check_outputs(self, outputs: list[np.ndarray]) -> None:
        """Refuses, at warm-up, outputs this kind of model cannot use (a graph may leave their shape symbolic)."""

    async def score(
        self, query: str, documents: list[str], max_document_tokens: int | None, window: bool, deadline: float | None
    ) -> ScoredBatch:
        raise NotImplementedError

    @contextlib.contextmanager
    def in_use(self) -> Iterator[Self]:
        """Marks a request's use of the model: a model retired by a reload closes only after its last user."""
        self._users += 1
        try:
            yield self
        finally:
            self._users -= 1
            if self._retired and self._users == 0:
                self._close_soon()

    def retire(self) -> None:
        """A reload replaced this model: close it once no request uses it."""
        self._retired = True
        if self._users == 0:
            self._close_soon()

    def _close_soon(self) -> None:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self.close())

    async def close(self) -> None:
        """Stops the queue, drops the session and hands the freed memory back (reloads must not grow RSS)."""
        if self._closed:
            return
        self._closed = True
        await self.queue.close()
        self.backend.release()
        await asyncio.to_thread(release_free_memory)
        metrics.LOADED_MODELS.dec()


class CrossEncoder(LoadedModel):
    """ONNX sequence classification with one logit over the joint (query, document) input."""

    def _warmup_input(self, first: Encoding, encoding: Encoding) -> ModelInput:
        budget = self.encoder.document_budget(first)
        return self.encoder.pairs(first, encoding, budget, 1, 0).inputs[0]

    def _check_outputs(self, outputs: list[np.ndarray]) -> None:
        widths = {np.asarray(out).size for out in outputs}
        if not widths <= {1, 2}:
            raise ValueError(
                f"model {self.id!r}: a cross-encoder gives one or two logits per pair ([B], [B,1] or "
                f"[B,2]); this graph gives {max(widths)}"
            )

    async def score(
        self, query: str, documents: list[str], max_document_tokens: int | None, window: bool, deadline: float | None
    ) -> ScoredBatch:
        started = time.perf_counter()
        with tracing.span("tokenize", model=self.id, documents=len(documents)) as span:
            per_document = await run_stoppable(
                lambda stop: self._tokenize(query, documents, max_document_tokens, window, stop),
                deadline,
                self.id,
                f"model {self.id!r} tokenized the request",
            )
            flat = [one for doc in per_document for one in doc.inputs]
            span.set(pairs=len(flat), tokens=sum(map(len, flat)))
        tokenization_s = time.perf_counter() - started
        result = await self.queue.submit(flat, deadline)
        logits = iter(relevance_logit(out) for out in result.outputs)
        scores = []
        for doc in per_document:
            windows = [next(logits) for _ in doc.inputs]
            best = int(np.argmax(windows))
            scores.append(PairScore(windows[best], best, doc.truncated, sum(len(i) for i in doc.inputs)))
        return ScoredBatch(scores, tokenization_s, result.queue_s, result.inference_s)

    def _tokenize(
        self, query: str, documents: list[str], cap: int | None, window: bool, stop: StopFlag
    ) -> list[DocumentInputs]:
        """The pairs' model inputs; runs on a thread. The query first: one too long refuses the request
        before any document is tokenized; documents are tokenized only as far as their windows reach."""
        (query_encoding,) = self.encoder.encode([query], stop=stop)
        budget = self.encoder.document_budget(query_encoding, cap)
        if budget < 1:
            raise QueryTooLong(
                f"the query is {len(query_encoding.ids)} tokens; model {self.id!r} takes "
                f"{self.spec.max_length} tokens per pair, query and document together"
            )
        windows = self.spec.max_chunks_per_document if window else 1
        document_encodings = self.encoder.encode(documents, keep_tokens=windows * budget, stop=stop)
        overlap = min(self.spec.window_overlap, budget // 2)
        return [self.encoder.pairs(query_encoding, d, budget, windows, overlap) for d in document_encodings]


class BiEncoder(LoadedModel):
    """ONNX encoder: texts become normalised vectors (cls or mean pooling); pairs score by cosine."""

    def _warmup_input(self, first: Encoding, encoding: Encoding) -> ModelInput:
        return self.encoder.single(encoding)[0]

    @property
    def dimensions(self) -> int:
        return self.backend.output_width or 0

    async def embed(self, texts: list[str], deadline: float | None = None) -> Embedded:
        """Unit vectors for the texts, whether each was cut, the queue and inference seconds, and token counts."""
        keep = self.encoder.single_budget
        with tracing.span("tokenize", model=self.id, texts=len(texts)) as span:
            encodings = await run_stoppable(
                lambda stop: self.encoder.encode(texts, keep_tokens=keep, stop=stop),
                deadline,
                self.id,
                f"model {self.id!r} tokenized the texts",
            )
            inputs, truncated = zip(*[self.encoder.single(e) for e in encodings], strict=True)
            span.set(tokens=sum(map(len, inputs)))
        result = await self.queue.submit(list(inputs), deadline)
        vectors = np.stack([self._pool(out, one) for out, one in zip(result.outputs, inputs, strict=True)])
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return Embedded(
            vectors.astype(np.float32),
            list(truncated),
            result.queue_s,
            result.inference_s,
            [len(one) for one in inputs],
        )

    def _pool(self, output: np.ndarray, one: ModelInput) -> np.ndarray:
        if output.ndim == 1:  # the graph pools itself (a sentence-embedding export)
            return output
        return output[0] if self.spec.pooling == "cls" else output[: len(one)].mean(axis=0)

    async def score(
        self, query: str, documents: list[str], max_document_tokens: int | None, window: bool, deadline: float | None
    ) -> ScoredBatch:
        started = time.perf_counter()
        vectors, truncated, queue_s, inference_s, _ = await self.embed([query, *documents], deadline)
        cosines = vectors[1:] @ vectors[0]
        scores = [PairScore(float(c), 0, t, 0) for c, t in zip(cosines, truncated[1:], strict=True)]
        total = time.perf_counter() - started
        return ScoredBatch(scores, max(total - queue_s - inference_s, 0.0), queue_s, inference_s)


async def load_model(spec: ModelConfig, folder: Path, inference: InferenceConfig) -> LoadedModel:
    """Loads (off the event loop) and warms up a model; raises on any unusable file."""

    def read_files() -> tuple[str, TextEncoder, OnnxBackend]:
        if spec.hub:  # fetched on the first start; later starts find it through the lock beside the models
            from ragsidecar.hub_models import ensure_installed

            ensure_installed(spec.hub, folder)
        encoder = TextEncoder(folder / "tokenizer.json", spec.max_length)
        backend = OnnxBackend(folder / "model.onnx", inference.intra_op_threads, inference.inter_op_threads)
        if spec.kind == "cross-encoder":
            _check_cross_encoder(folder, encoder, backend)
        return _fingerprint(folder), encoder, backend

    kinds: dict[str, type[LoadedModel]] = {"cross-encoder": CrossEncoder, "bi-encoder": BiEncoder}
    model = kinds[spec.kind](spec, inference, *await asyncio.to_thread(read_files))
    try:
        await model.warm_up()
    except BaseException:
        await model.close()
        raise
    return model


def relevance_logit(output: np.ndarray) -> float:
    """A cross-encoder's relevance logit from its output row. Graphs shaped [B] or [B,1] give it directly.
    Two-class graphs ([B,2]: not relevant, relevant) give log p(relevant) - log p(not relevant), which is the
    difference of their two logits: the logit a one-output head would give (its sigmoid is p(relevant))."""
    row = np.asarray(output).reshape(-1)
    return float(row[0]) if row.size == 1 else float(row[1] - row[0])


def _check_cross_encoder(folder: Path, encoder: TextEncoder, backend: OnnxBackend) -> None:
    """Refuses exports a cross-encoder cannot score with, at load rather than as wrong scores later."""
    rank, width = backend.output_rank, backend.output_width
    if not (rank == 1 or rank == 2 and width in (1, 2, None)):
        raise ValueError(
            f"{folder / 'model.onnx'}: a cross-encoder's first output must be logits shaped [B], [B,1] "
            f"or [B,2]; this one has rank {rank}, last axis {width}"
        )
    if encoder.pair_special_tokens == 0:
        raise ValueError(
            f"{folder / 'tokenizer.json'} has no post-processor: a query and a document would be "
            "joined without the special tokens the model was trained with"
        )


def _fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in ("model.onnx", "tokenizer.json"):
        stat = (folder / name).stat()
        digest.update(f"{name}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}".encode())
    return digest.hexdigest()[:16]
