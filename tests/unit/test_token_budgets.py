"""Token budgets with the packaged tokenizers: a head encoding keeps the first tokens, and what a batch is charged."""

from __future__ import annotations

import pytest
from sidecar import MODELS

from ragsidecar.inference.batching import charged_tokens
from ragsidecar.inference.tokenization import TextEncoder


@pytest.mark.parametrize("model", ["ms-marco-MiniLM-L-12-v2", "bge-small-en-v1.5", "all-MiniLM-L6-v2"])
def test_head_encoding_gives_the_first_tokens_of_the_whole_text(model: str) -> None:
    encoder = TextEncoder(MODELS / model / "tokenizer.json", 512)
    texts = [
        "The quick brown fox jumps over the lazy dog. " * 400,
        "spaces   and\ttabs\nand\r\nnew lines,  " * 300,
        "\u4e2d\u6587\u6ca1\u6709\u7a7a\u683c" * 2000,  # no space to cut at: tokenized whole
        "x" * 50_000 + " tail",
        "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m \U0001f600 it's don't " * 500,
        "short text",
    ]
    for keep in (10, 500, 2000):
        heads = encoder.encode(texts, keep_tokens=keep)
        wholes = encoder.encode(texts)
        for text, head, whole in zip(texts, heads, wholes, strict=True):
            assert head.ids == whole.ids[: len(head.ids)], (model, keep, text[:40])
            assert len(head.ids) > keep or head.ids == whole.ids, (model, keep, text[:40])


def test_charged_tokens() -> None:
    assert charged_tokens(rows=3, widest=100, real_tokens=120, padded=True) == 300
    assert charged_tokens(rows=3, widest=100, real_tokens=120, padded=False) == 120
