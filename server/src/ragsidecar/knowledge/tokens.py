"""Token counts and cuts with the embedder's tokenizer: the one estimate of a host model's count."""

from __future__ import annotations

from ragsidecar.inference.registry import ModelRegistry


class Tokens:
    def __init__(self, registry: ModelRegistry, embedder: str) -> None:
        self._registry = registry
        self._embedder = embedder

    def _offsets(self, text: str) -> list[tuple[int, int]]:
        tokenizer = self._registry.embedder(self._embedder).encoder.tokenizer
        return tokenizer.encode(text, add_special_tokens=False).offsets

    def count(self, text: str) -> int:
        return len(self._offsets(text))

    def cut(self, text: str, max_tokens: int) -> str:
        """The text's first `max_tokens` tokens (the whole text when it fits)."""
        offsets = self._offsets(text)
        return text if len(offsets) <= max_tokens else text[: offsets[max_tokens - 1][1]]
