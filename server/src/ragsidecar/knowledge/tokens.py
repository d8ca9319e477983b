"""Token counts and cuts with the embedder's tokenizer: the one estimate of a host model's count.

Tokenizing costs time in proportion to the text, so callers run it off the event loop, and a text
that is measured once (a DIRECT source, a SEQUENTIAL unit) carries its measure to where it is cut.
The tokenizer's batch call is used even for one text: it releases the GIL while it works (the single
`encode` holds it throughout, which would stall the event loop from a worker thread all the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Encoding

from ragsidecar.inference.registry import ModelRegistry


@dataclass(frozen=True)
class Measured:
    """A text, its token count, and the encoding that maps its tokens to characters (for cuts)."""

    text: str
    tokens: int
    encoding: Encoding | None = None

    def first(self, max_tokens: int) -> Measured:
        """The text's first `max_tokens` tokens (itself when it fits)."""
        if max_tokens >= self.tokens:
            return self
        if max_tokens <= 0 or self.encoding is None:
            return Measured("", 0)
        # One token's offsets, not the whole offset list: converting that is as slow as the text is long.
        end = self.encoding.token_to_chars(max_tokens - 1)[1]
        return Measured(self.text[:end], max_tokens, self.encoding)


class Tokens:
    def __init__(self, registry: ModelRegistry, embedder: str) -> None:
        self._registry = registry
        self._embedder = embedder

    def measure(self, text: str) -> Measured:
        tokenizer = self._registry.embedder(self._embedder).encoder.tokenizer
        encoding = tokenizer.encode_batch([text], add_special_tokens=False)[0]
        return Measured(text, len(encoding), encoding)

    def count(self, text: str) -> int:
        return self.measure(text).tokens
