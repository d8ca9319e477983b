"""Generic HF `tokenizers` handling: any tokenizer.json, its padding/truncation presets reset.

Texts are encoded without special tokens and the model's own post-processor adds them, so BERT
([CLS] q [SEP] d [SEP]) and RoBERTa-style (<s> q </s></s> d </s>) exports both work unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer


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
    def tokenizer(self) -> Tokenizer:
        """The underlying tokenizer, padding and truncation off (for counting and chunking)."""
        return self._tokenizer

    def encode(self, texts: list[str]) -> list[Encoding]:
        return self._tokenizer.encode_batch(texts, add_special_tokens=False)

    def single(self, encoding: Encoding) -> tuple[ModelInput, bool]:
        """A text alone (bi-encoders), cut to the window; returns the input and whether it was cut."""
        encoding.truncate(self.max_length - self._single_specials)
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
