"""Token counts and cuts with the embedder's tokenizer: the one estimate of a host model's count.

Tokenizing costs time in proportion to the text, so callers run it off the event loop, and a text
that is measured once (a DIRECT source, a SEQUENTIAL unit) carries its measure to where it is cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragsidecar.inference.registry import ModelRegistry


@dataclass(frozen=True)
class Measured:
    """A text with the end offset (in characters) of each of its tokens."""

    text: str
    ends: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return len(self.ends)

    def first(self, max_tokens: int) -> Measured:
        """The text's first `max_tokens` tokens (itself when it fits)."""
        if max_tokens >= self.tokens:
            return self
        if max_tokens <= 0:
            return Measured("", ())
        return Measured(self.text[: self.ends[max_tokens - 1]], self.ends[:max_tokens])


class Tokens:
    def __init__(self, registry: ModelRegistry, embedder: str) -> None:
        self._registry = registry
        self._embedder = embedder

    def measure(self, text: str) -> Measured:
        tokenizer = self._registry.embedder(self._embedder).encoder.tokenizer
        return Measured(text, tuple(end for _, end in tokenizer.encode(text, add_special_tokens=False).offsets))

    def count(self, text: str) -> int:
        return self.measure(text).tokens

    def cut(self, text: str, max_tokens: int) -> str:
        """The text's first `max_tokens` tokens (the whole text when it fits)."""
        return self.measure(text).first(max_tokens).text
