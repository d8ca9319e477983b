"""Generic HF `tokenizers` handling: any tokenizer.json, its padding/truncation presets reset.

Texts are encoded without special tokens and the model's own post-processor adds them, so BERT
([CLS] q [SEP] d [SEP]), RoBERTa and XLM-R (<s> q </s></s> d </s>) exports all work unchanged: the pair
template, its special tokens and its type ids come from tokenizer.json, never from this code.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from ragsidecar.inference.stopping import StopFlag

# A first guess of characters per token when only a text's head is tokenized (English averages about 4;
# a wrong guess costs one more, larger, try).
_CHARS_PER_TOKEN_GUESS = 8
# Texts are tokenized in slices of about this many characters; the caller's stop flag is checked between them.
SLICE_CHARS = 256 * 1024


@dataclass(frozen=True)
class ModelInput:
    """One model input sequence, unpadded."""

    ids: np.ndarray
    type_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class DocumentInputs:
    """The inputs one document became: one per window (one window when truncated)."""

    inputs: list[ModelInput]
    # True when part of the document was not scored (cut, or windows past the cap).
    truncated: bool


class TextEncoder:
    def __init__(self, tokenizer_file: Path, max_length: int) -> None:
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        # Packaged tokenizer.json files carry fixed padding/truncation presets (e.g. pad to 512):
        # padding is the batcher's job and truncation must never cut the query, so both go.
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.max_length = max_length
        self._pair_specials = self._tokenizer.num_special_tokens_to_add(is_pair=True)
        self._single_specials = self._tokenizer.num_special_tokens_to_add(is_pair=False)

    @property
    def pair_special_tokens(self) -> int:
        """Special tokens the tokenizer's post-processor adds around a (query, document) pair."""
        return self._pair_specials

    @property
    def tokenizer(self) -> Tokenizer:
        """The underlying tokenizer, padding and truncation off (for counting and chunking)."""
        return self._tokenizer

    def encode(self, texts: list[str], keep_tokens: int | None = None, stop: StopFlag | None = None) -> list[Encoding]:
        """Encodings of the texts, without special tokens.

        With keep_tokens, a long text is tokenized only as far as its first keep_tokens + 1 tokens need (the
        caller keeps at most keep_tokens, and the one more tells it the text was cut), so the work follows the
        model's window rather than the text's size. The head is cut at a space that ends a word, where every
        pre-tokenizer splits, so its tokens are exactly the first tokens of the whole text.
        """
        chars = None if keep_tokens is None else (keep_tokens + 1) * _CHARS_PER_TOKEN_GUESS
        heads = texts if chars is None else [_head(text, chars) for text in texts]
        encodings: list[Encoding] = []
        for start, end in _slices(heads, SLICE_CHARS):
            if stop is not None:
                stop.check()
            encodings += self._tokenizer.encode_batch(heads[start:end], add_special_tokens=False)
        if keep_tokens is not None and chars is not None:
            for i, (text, head) in enumerate(zip(texts, heads, strict=True)):
                if len(head) < len(text) and len(encodings[i].ids) <= keep_tokens:  # the guess fell short
                    encodings[i] = self._encode_head(text, keep_tokens, chars * 4, stop)
        return encodings

    def _encode_head(self, text: str, keep_tokens: int, chars: int, stop: StopFlag | None) -> Encoding:
        while True:
            if stop is not None:
                stop.check()
            head = _head(text, chars)
            # The batch call even for one text: it releases the GIL (the single `encode` holds it throughout).
            encoding = self._tokenizer.encode_batch([head], add_special_tokens=False)[0]
            if len(head) == len(text) or len(encoding.ids) > keep_tokens:
                return encoding
            chars *= 4

    @property
    def single_budget(self) -> int:
        """Most tokens of a text alone (bi-encoders): the window less the special tokens."""
        return self.max_length - self._single_specials

    def single(self, encoding: Encoding) -> tuple[ModelInput, bool]:
        """A text alone (bi-encoders), cut to the window; returns the input and whether it was cut."""
        encoding.truncate(self.single_budget)
        return _model_input(self._tokenizer.post_process(encoding)), bool(encoding.overflowing)

    def document_budget(self, query: Encoding, cap: int | None = None) -> int:
        """Tokens left for a document beside this query; <= 0 when the query alone fills the window."""
        budget = self.max_length - self._pair_specials - len(query.ids)
        return min(budget, cap) if cap else budget

    def pairs(self, query: Encoding, document: Encoding, budget: int, windows: int, overlap: int) -> DocumentInputs:
        """(query, document) inputs: the document cut to `budget` tokens, or split into at most
        `windows` overlapping windows of that size. The query is never cut."""
        total = len(document.ids)
        document.truncate(budget, stride=overlap if windows > 1 else 0)
        parts = [document, *document.overflowing][:windows]
        covered = len(parts) * budget - (len(parts) - 1) * (overlap if windows > 1 else 0)
        inputs = [_model_input(self._tokenizer.post_process(query, part)) for part in parts]
        return DocumentInputs(inputs, truncated=total > covered)


def _model_input(encoding: Encoding) -> ModelInput:
    return ModelInput(np.asarray(encoding.ids, dtype=np.int64), np.asarray(encoding.type_ids, dtype=np.int64))


def _head(text: str, chars: int) -> str:
    """The text cut near `chars` characters at the end of a word (before a space), or the whole text
    when it is short or has no space to cut at."""
    if len(text) <= chars:
        return text
    cut = text.rfind(" ", 0, chars)
    head = text[:cut].rstrip() if cut > 0 else ""
    return head or text


def _slices(texts: list[str], chars: int) -> Iterator[tuple[int, int]]:
    """(start, end) ranges of consecutive texts holding about `chars` characters each (at least one text)."""
    start, size = 0, 0
    for i, text in enumerate(texts):
        if i > start and size + len(text) > chars:
            yield start, i
            start, size = i, 0
        size += len(text)
    if start < len(texts):
        yield start, len(texts)
