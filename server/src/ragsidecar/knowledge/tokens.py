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
    # False when only a start of the text was tokenized, because it alone passed the limit measured against:
    # tokens then counts that start (a lower bound), and the text is over its budget, never cut.
    whole: bool = True

    def counted(self) -> str:
        """The count as a message states it."""
        return str(self.tokens) if self.whole else f"at least {self.tokens}"

    def first(self, max_tokens: int) -> Measured:
        """The text's first `max_tokens` tokens (itself when it fits)."""
        if max_tokens >= self.tokens:
            return self
        if max_tokens <= 0 or self.encoding is None:
            return Measured("", 0)
        # One token's offsets, not the whole offset list: converting that is as slow as the text is long.
        offsets = self.encoding.token_to_chars(max_tokens - 1)
        assert offsets is not None, "every token has characters: the encoding holds no special tokens"
        return Measured(self.text[: offsets[1]], max_tokens, self.encoding)


class Tokens:
    def __init__(self, registry: ModelRegistry, embedder: str) -> None:
        self._registry = registry
        self._embedder = embedder

    def measure(self, text: str, limit: int | None = None) -> Measured:
        """The text's tokens. With a limit, a long text is tokenized in growing starts, each cut at whitespace,
        until one passes the limit or the start is the whole text: a budget check costs what the budget holds,
        not what the text does (8 MiB took seconds and hundreds of MiB of encoding to learn it was over)."""
        if limit is None:
            return self._whole(text)
        size = max(_FIRST_START_CHARS, _CHARS_PER_TOKEN * limit)
        while size < len(text):
            encoding = self._encoding(text[: _cut_at_whitespace(text, size)])
            if len(encoding) > limit:
                return Measured(text, len(encoding), encoding, whole=False)
            size *= 4
        return self._whole(text)

    def _whole(self, text: str) -> Measured:
        encoding = self._encoding(text)
        return Measured(text, len(encoding), encoding)

    def _encoding(self, text: str) -> Encoding:
        tokenizer = self._registry.embedder(self._embedder).encoder.tokenizer
        return tokenizer.encode_batch([text], add_special_tokens=False)[0]

    def count(self, text: str) -> int:
        return self.measure(text).tokens


# A measure against a limit first tokenizes the larger of these many characters and this many per token of the
# limit (well above the 4 or so of English text, so one start usually settles it).
_FIRST_START_CHARS = 65_536
_CHARS_PER_TOKEN = 8


def _cut_at_whitespace(text: str, size: int) -> int:
    """Where the text's first `size` characters end, moved back to a whitespace: tokenizers split words there, so
    the start's tokens are the first tokens of the whole text (a cut inside a word could give it more)."""
    cut = max(text.rfind(" ", 0, size), text.rfind("\n", 0, size))
    return cut if cut > 0 else size
