"""Embedding texts with a configured bi-encoder (the HTTP API's embeddings): validate, then embed.

Limits are the reranker's, checked on character counts before anything is tokenized; a text longer than the
model's window is cut to it, as knowledge chunks are (the outcome says how many were).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ragsidecar import errors
from ragsidecar.errors import Violation
from ragsidecar.inference.registry import ModelRegistry
from ragsidecar.reranking import LIMIT_EXCEEDED, MAX_DOCUMENT_CHARS, MAX_DOCUMENTS_CHARS


@dataclass(frozen=True)
class EmbedQuery:
    # A configured bi-encoder's id (required: an embedding is only comparable with others of its model).
    model: str
    texts: list[str]
    # The vector width the caller expects; refused unless the model produces exactly that.
    dimensions: int | None = None


@dataclass(frozen=True)
class EmbedOutcome:
    model: str
    # One unit float32 row per text, in request order.
    vectors: np.ndarray
    tokens: int
    truncated_texts: int


class Embedder:
    def __init__(self, registry: ModelRegistry, max_texts: int) -> None:
        self._registry = registry
        self._max_texts = max_texts

    async def embed(self, request: EmbedQuery, deadline: float | None) -> EmbedOutcome:
        self._validate(request)
        with self._registry.embedder(request.model).in_use() as model:
            if request.dimensions is not None and request.dimensions != model.dimensions:
                raise errors.invalid(
                    [
                        Violation(
                            "dimensions",
                            f"model {model.id!r} produces {model.dimensions} dimensions, not {request.dimensions}",
                        )
                    ]
                )
            embedded = await model.embed(request.texts, deadline)
        return EmbedOutcome(model.id, embedded.vectors, sum(embedded.tokens), sum(embedded.truncated))

    def _validate(self, request: EmbedQuery) -> None:
        limits = []
        if len(request.texts) > self._max_texts:
            limits.append(
                Violation(
                    "input",
                    f"{len(request.texts)} texts exceed the maximum of {self._max_texts} per request",
                    LIMIT_EXCEEDED,
                )
            )
        limits += [
            Violation(
                f"input[{i}]", f"{len(text)} characters exceed the maximum of {MAX_DOCUMENT_CHARS}", LIMIT_EXCEEDED
            )
            for i, text in enumerate(request.texts)
            if len(text) > MAX_DOCUMENT_CHARS
        ]
        total = sum(map(len, request.texts))
        if total > MAX_DOCUMENTS_CHARS:
            limits.append(
                Violation(
                    "input",
                    f"the texts hold {total} characters, over the maximum of {MAX_DOCUMENTS_CHARS}",
                    LIMIT_EXCEEDED,
                )
            )
        if limits:
            raise errors.invalid(limits, LIMIT_EXCEEDED)
        problems = []
        if not request.model:
            problems.append(Violation("model", "required: the id of a configured bi-encoder"))
        if not request.texts:
            problems.append(Violation("input", "at least one text is required"))
        problems += [Violation(f"input[{i}]", "must not be empty") for i, text in enumerate(request.texts) if not text]
        if request.dimensions is not None and request.dimensions < 1:
            problems.append(Violation("dimensions", f"must be at least 1, got {request.dimensions}"))
        if problems:
            raise errors.invalid(problems)
