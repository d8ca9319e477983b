"""Token-aware chunking: units -> chunks of at most max_tokens tokens of the embedder's tokenizer.

Each unit is tokenized once; chunks are cut on the tokenizer's own character offsets, so a chunk
never splits a token, holds the number of tokens it says it holds, and maps back to its place in
the unit (provenance). Ids are stable for the same source content: source, position, content hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import tokenizers

from ragsidecar.knowledge.sources.units import Provenance, Unit

# Texts longer than this are tokenized in segments: one huge string tokenizes super-linearly
# (10 MB took 10 s as one string, 4 s as 16 KB segments in parallel with encode_batch).
_SEGMENT_ABOVE = 65_536
_SEGMENT_CHARS = 16_384
# Short units are tokenized in batches of this many: parallel in the tokenizer, bounded memory.
_BATCH_UNITS = 256
# A chunk may end this much (fraction of the window) early to end at a sentence or line.
_BOUNDARY_TAIL = 0.2
_SENTENCE_ENDS = frozenset(".!?\u2026")
# Full-width enders are followed directly by the next sentence, no space.
_CJK_SENTENCE_ENDS = frozenset("\u3002\uff01\uff1f")
_CLOSERS = frozenset("\"')]}\u00bb\u201d\u2019")

Offsets = Sequence[tuple[int, int]]
WordIds = Sequence[int | None]


@dataclass(frozen=True)
class Chunk:
    id: str  # f"{source}:{position}:{content_hash[:12]}"
    source: str  # knowledge source name
    position: int  # 0-based order of the chunk within the source
    text: str
    # The unit's provenance narrowed to the chunk: char offsets, lines (when the unit has them).
    provenance: Provenance
    content_hash: str  # sha256 hex of text (key of the embedding cache)
    tokens: int  # tokens of text by the given tokenizer, no special tokens


def chunk_meta(chunk: Chunk) -> dict:
    """What a search hit reports of its chunk (every index and store keeps the same)."""
    provenance = chunk.provenance
    return {
        "position": chunk.position,
        "content_hash": chunk.content_hash,
        "file": provenance.file,
        "document_id": provenance.document_id,
        "line_start": provenance.line_start,
        "line_end": provenance.line_end,
        "page": provenance.page,
        "char_start": provenance.char_start,
        "char_end": provenance.char_end,
    }


def count_tokens(tokenizer: tokenizers.Tokenizer, text: str) -> int:
    """Tokens of text, no special tokens (the caller has disabled padding and truncation)."""
    offsets, _ = _encode_long(tokenizer, text)
    return len(offsets)


def chunk_units(
    source: str,
    units: list[Unit],
    tokenizer: tokenizers.Tokenizer,
    max_tokens: int,
    overlap_tokens: int,
    first_position: int = 0,
) -> list[Chunk]:
    """Splits units into chunks of at most max_tokens tokens, neighbours sharing overlap_tokens.

    Cuts fall on token boundaries (from the tokenizer's offsets), preferably between words, and a
    chunk ends at a sentence or line boundary when one lies in the last ~20% of its window. A unit
    that fits is one chunk, its text unchanged; a whitespace-only (or token-less) unit gives none.
    Positions run across all units, from `first_position` (a source updated file by file numbers the
    chunks of a changed file after those it already holds).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
    if not 0 <= overlap_tokens < max_tokens:
        raise ValueError(f"overlap_tokens must be in [0, max_tokens), not {overlap_tokens}")
    chunks: list[Chunk] = []
    for unit, offsets, word_ids in _encoded_units(tokenizer, units):
        if not offsets:
            continue
        if len(offsets) <= max_tokens:
            chunks.append(_make_chunk(source, first_position + len(chunks), unit.text, unit.provenance, len(offsets)))
            continue
        newlines = _NewlineCounter(unit.text)
        for start, end in _windows(unit.text, offsets, word_ids, max_tokens, overlap_tokens):
            chunks.append(_narrowed_chunk(source, first_position + len(chunks), unit, offsets, newlines, start, end))
    return chunks


# --------------------------------------------------------------------------------------------
# Tokenizing


def _encoded_units(tokenizer: tokenizers.Tokenizer, units: list[Unit]) -> Iterator[tuple[Unit, Offsets, WordIds]]:
    """Yields each non-blank unit with its token offsets and word ids, in order."""
    batch: list[Unit] = []
    for unit in units:
        if not unit.text.strip():
            continue
        if len(unit.text) > _SEGMENT_ABOVE:
            yield from _encode_batch(tokenizer, batch)
            batch = []
            yield (unit, *_encode_long(tokenizer, unit.text))
            continue
        batch.append(unit)
        if len(batch) >= _BATCH_UNITS:
            yield from _encode_batch(tokenizer, batch)
            batch = []
    yield from _encode_batch(tokenizer, batch)


def _encode_batch(tokenizer: tokenizers.Tokenizer, units: list[Unit]) -> Iterator[tuple[Unit, Offsets, WordIds]]:
    if not units:
        return
    encodings = tokenizer.encode_batch([u.text for u in units], add_special_tokens=False)
    for unit, encoding in zip(units, encodings, strict=True):
        yield unit, encoding.offsets, encoding.word_ids


def _encode_long(tokenizer: tokenizers.Tokenizer, text: str) -> tuple[Offsets, WordIds]:
    """Offsets and word ids of text, tokenized in whitespace-cut segments when it is long.

    Word ids are not rebased across segments: word starts are also detected by the whitespace gap
    that every segment cut leaves, so a repeated id across a cut does no harm.
    """
    if len(text) <= _SEGMENT_ABOVE:
        encoding = tokenizer.encode(text, add_special_tokens=False)
        return encoding.offsets, encoding.word_ids
    bounds = _segment_bounds(text)
    encodings = tokenizer.encode_batch([text[a:b] for a, b in bounds], add_special_tokens=False)
    offsets: list[tuple[int, int]] = []
    word_ids: list[int | None] = []
    for (base, _), encoding in zip(bounds, encodings, strict=True):
        offsets.extend([(s + base, e + base) for s, e in encoding.offsets])
        word_ids.extend(encoding.word_ids)
    return offsets, word_ids


def _segment_bounds(text: str) -> list[tuple[int, int]]:
    """Cuts text into ~_SEGMENT_CHARS pieces right after a newline (else a space), where
    tokenization does not depend on what comes before, so the pieces tokenize like the whole."""
    bounds = []
    start = 0
    while start < len(text):
        target = start + _SEGMENT_CHARS
        if target >= len(text):
            bounds.append((start, len(text)))
            break
        cut = _cut_after(text, target, target + _SEGMENT_CHARS)
        bounds.append((start, cut))
        start = cut
    return bounds


def _cut_after(text: str, lo: int, hi: int) -> int:
    for sep in ("\n", " "):
        found = text.find(sep, lo, hi)
        if found >= 0:
            return found + 1
    # No whitespace in a whole segment (base64, minified data): a hard cut is the only choice.
    return lo


# --------------------------------------------------------------------------------------------
# Windows


def _windows(
    text: str, offsets: Offsets, word_ids: WordIds, max_tokens: int, overlap: int
) -> Iterator[tuple[int, int]]:
    """Token index ranges [start, end) covering all tokens, each at most max_tokens long."""
    n = len(offsets)
    start = 0
    while True:
        end = min(start + max_tokens, n)
        if end < n:
            end = _choose_end(text, offsets, word_ids, start, end, max_tokens)
        yield start, end
        if end >= n:
            return
        start = _next_start(offsets, word_ids, start, end, overlap)


def _choose_end(text: str, offsets: Offsets, word_ids: WordIds, start: int, hard_end: int, max_tokens: int) -> int:
    """The exclusive end token of a window: the latest sentence or line boundary in the window's
    last ~20%, else the latest word boundary in its second half, else the full window."""
    tail_from = max(start + 1, hard_end - max(1, int(max_tokens * _BOUNDARY_TAIL)))
    for j in range(hard_end, tail_from - 1, -1):
        if _is_text_boundary(text, offsets, j):
            return j
    half = max(start + 1, hard_end - max_tokens // 2)
    for j in range(hard_end, half - 1, -1):
        if _is_word_start(offsets, word_ids, j):
            return j
    return hard_end


def _is_text_boundary(text: str, offsets: Offsets, j: int) -> bool:
    """Whether cutting before token j ends a line or a sentence."""
    prev_end = offsets[j - 1][1]
    gap = text[prev_end : offsets[j][0]]
    if "\n" in gap:
        return True
    last = text[prev_end - 1] if prev_end > 0 else ""
    if last in _CJK_SENTENCE_ENDS:
        return True
    if not gap or not gap.isspace():
        return False
    if last in _CLOSERS and prev_end > 1:
        last = text[prev_end - 2]
    return last in _SENTENCE_ENDS


def _is_word_start(offsets: Offsets, word_ids: WordIds, j: int) -> bool:
    # A gap before the token (whitespace) or a new pre-tokenizer word: cutting here cannot
    # change how either side tokenizes (WordPiece/BERT-style tokenizers).
    return offsets[j][0] > offsets[j - 1][1] or word_ids[j] != word_ids[j - 1]


def _next_start(offsets: Offsets, word_ids: WordIds, start: int, end: int, overlap: int) -> int:
    """The next window's first token: overlap tokens before end, moved back to a word start.

    Overlap is capped at half the window just made, so a window cut short at a boundary still
    advances by at least half of itself (no runaway number of chunks)."""
    overlap = min(overlap, (end - start) // 2)
    nxt = end - overlap
    if overlap == 0:
        return nxt
    # Moving back only adds overlap; a few words' worth of search is plenty.
    for k in range(nxt, max(start, nxt - 32), -1):
        if _is_word_start(offsets, word_ids, k):
            return k
    return nxt


# --------------------------------------------------------------------------------------------
# Chunks


def _make_chunk(source: str, position: int, text: str, provenance: Provenance, tokens: int) -> Chunk:
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Chunk(
        id=f"{source}:{position}:{digest[:12]}",
        source=source,
        position=position,
        text=text,
        provenance=provenance,
        content_hash=digest,
        tokens=tokens,
    )


def _narrowed_chunk(
    source: str,
    position: int,
    unit: Unit,
    offsets: Offsets,
    newlines: _NewlineCounter,
    start: int,
    end: int,
) -> Chunk:
    char_start, char_end = offsets[start][0], offsets[end - 1][1]
    text = unit.text[char_start:char_end]
    prov = unit.provenance
    base = prov.char_start
    narrowed = replace(prov, char_start=base + char_start, char_end=base + char_end)
    if prov.line_start is not None:
        narrowed = replace(
            narrowed,
            line_start=_clamp_line(prov, prov.line_start + newlines.before(char_start)),
            line_end=_clamp_line(prov, prov.line_start + newlines.before(max(char_start, char_end - 1))),
        )
    return _make_chunk(source, position, text, narrowed, end - start)


def _clamp_line(prov: Provenance, line: int) -> int:
    """Keeps a chunk's line inside its unit's line span: a record whose text was composed (title +
    body, CSV "col: value" lines) has newlines that the file does not."""
    return min(line, prov.line_end) if prov.line_end is not None else line


class _NewlineCounter:
    """Newlines before an offset, counted incrementally: chunk offsets move forward a window at a
    time, so counting from the start of a 10 MB unit for every chunk would be quadratic."""

    def __init__(self, text: str):
        self._text = text
        self._pos = 0
        self._count = 0

    def before(self, offset: int) -> int:
        if offset >= self._pos:
            self._count += self._text.count("\n", self._pos, offset)
        else:
            self._count -= self._text.count("\n", offset, self._pos)
        self._pos = offset
        return self._count
