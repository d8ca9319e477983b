"""knowledge/chunking.py: token-aware chunks, on a word-level tokenizer built here (no model files)."""

from __future__ import annotations

import hashlib
import itertools
import re

import pytest
import tokenizers
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from ragsidecar.knowledge.chunking import chunk_meta, chunk_units, count_tokens
from ragsidecar.knowledge.sources.units import Provenance, Unit

SENTENCES = [f"Sentence {i} tells of the harbour and its kayak ." for i in range(12)]


def word_tokenizer() -> tokenizers.Tokenizer:
    """One token per word or punctuation mark: token counts are easy to see."""
    tokenizer = tokenizers.Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    return tokenizer


def unit(text: str, file: str = "notes.txt") -> Unit:
    return Unit(text, Provenance(file=file, line_start=1, line_end=text.count("\n") + 1, char_end=len(text)))


def test_a_unit_that_fits_is_one_chunk_with_its_text_unchanged_and_a_stable_id() -> None:
    text = "The kayak is kept in shed B."
    (chunk,) = chunk_units("notes", [unit(text)], word_tokenizer(), max_tokens=16, overlap_tokens=2)
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert (chunk.text, chunk.tokens, chunk.position, chunk.content_hash) == (text, 8, 0, digest)
    assert chunk.id == f"notes:0:{digest[:12]}"
    assert chunk_units("notes", [unit(text)], word_tokenizer(), 16, 2)[0].id == chunk.id


def test_long_units_are_cut_on_tokens_within_the_window_and_map_back_to_their_text() -> None:
    text = "\n".join(SENTENCES)  # 12 lines of 10 tokens
    chunks = chunk_units("notes", [unit(text)], word_tokenizer(), max_tokens=25, overlap_tokens=5)
    assert len(chunks) > 1 and [c.position for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert chunk.tokens <= 25 and chunk.tokens == count_tokens(word_tokenizer(), chunk.text)
        assert text[chunk.provenance.char_start : chunk.provenance.char_end] == chunk.text
        lines = text[: chunk.provenance.char_start].count("\n") + 1
        assert chunk.provenance.line_start == lines and chunk.provenance.file == "notes.txt"
    assert chunks[0].text.endswith(".")  # a sentence end in the window's tail is where it ends
    covered = "".join(text[c.provenance.char_start : c.provenance.char_end] for c in chunks)
    assert set(re.findall(r"Sentence \d+", covered)) == {f"Sentence {i}" for i in range(12)}


def test_neighbours_share_the_overlap() -> None:
    text = " ".join(f"w{i}" for i in range(60))
    chunks = chunk_units("s", [unit(text)], word_tokenizer(), max_tokens=20, overlap_tokens=5)
    for before, after in itertools.pairwise(chunks):
        assert after.provenance.char_start < before.provenance.char_end
        assert before.text.split()[-5:] == after.text.split()[:5]


def test_positions_run_across_units_from_the_first_position_and_blank_units_give_none() -> None:
    units = [unit("first unit."), unit("  \n "), unit("second unit.")]
    chunks = chunk_units("s", units, word_tokenizer(), max_tokens=8, overlap_tokens=0, first_position=5)
    assert [(c.position, c.text) for c in chunks] == [(5, "first unit."), (6, "second unit.")]


def test_chunk_meta_is_what_a_hit_reports() -> None:
    (chunk,) = chunk_units("s", [unit("one line")], word_tokenizer(), max_tokens=8, overlap_tokens=0)
    assert chunk_meta(chunk) == {
        "position": 0,
        "content_hash": chunk.content_hash,
        "file": "notes.txt",
        "document_id": "",
        "line_start": 1,
        "line_end": 1,
        "page": None,
        "char_start": 0,
        "char_end": 8,
    }


@pytest.mark.parametrize(("max_tokens", "overlap"), [(0, 0), (8, 8), (8, -1)])
def test_impossible_windows_are_refused(max_tokens: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_units("s", [unit("text")], word_tokenizer(), max_tokens, overlap)
