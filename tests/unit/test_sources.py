"""knowledge/sources/: each file reader on a small fixture (tests/data/sources), with the provenance a search
hit reports, and the refusals. Pure functions over files; no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragsidecar.knowledge.sources.files import inline_units, provenance_path, read_units
from ragsidecar.knowledge.sources.units import LIMIT_EXCEEDED, SOURCE_UNREADABLE, Provenance, SourceError

ROOT = Path(__file__).resolve().parents[1] / "data" / "sources"


def read(name: str) -> list[tuple[str, Provenance]]:
    return [(unit.text, unit.provenance) for unit in read_units(ROOT / name, ROOT, 1 << 20)]


def test_markdown_is_one_unit_without_its_byte_order_mark_and_with_one_newline_convention() -> None:
    text = "# Harbour notes\n\nThe kayak is kept in shed B.\nKeys hang by the door.\n"
    assert read("notes.md") == [(text, Provenance(file="notes.md", line_start=1, line_end=4, char_end=len(text)))]


def test_a_whitespace_only_file_has_no_units() -> None:
    assert read("blank.txt") == []


def test_json_array_elements_are_records_with_their_ids_titles_and_lines() -> None:
    assert read("records.json") == [
        (
            "Kayak\nKept in shed B.",
            Provenance(file="records.json", document_id="k1", line_start=2, line_end=2, char_end=21),
        ),
        (
            "Paddles hang on the north wall.",
            Provenance(file="records.json", document_id="7", line_start=3, line_end=4, char_end=31),
        ),
        # A blank text field is no document; a record of another shape is indexed as its compact JSON.
        ('["no","text","field"]', Provenance(file="records.json", line_start=6, line_end=6, char_end=21)),
    ]


def test_jsonl_lines_are_records_and_an_id_must_be_a_scalar() -> None:
    assert read("records.jsonl") == [
        (
            "High tide at noon.",
            Provenance(file="records.jsonl", document_id="t1", line_start=1, line_end=1, char_end=18),
        ),
        (
            "An id that is not a scalar is no id.",
            Provenance(file="records.jsonl", line_start=3, line_end=3, char_end=36),
        ),
        ("a bare string record", Provenance(file="records.jsonl", line_start=4, line_end=4, char_end=20)),
    ]


def test_csv_rows_are_named_by_the_header_and_a_quoted_newline_spans_lines() -> None:
    assert read("table.csv") == [
        (
            "id: b1\nname: Kayak\nnotes: two\nlines",
            Provenance(file="table.csv", document_id="b1", line_start=2, line_end=3, char_end=35),
        ),
        ("id: b2", Provenance(file="table.csv", document_id="b2", line_start=4, line_end=4, char_end=6)),
        (
            "id: b3\nname: Canoe\nnotes: dry",
            Provenance(file="table.csv", document_id="b3", line_start=5, line_end=5, char_end=29),
        ),
    ]


def test_html_keeps_the_visible_text_one_block_per_line() -> None:
    text = "Harbour\nThe kayak is in shed B.\nMon 9-5\nkeep\nspacing"
    assert read("page.html") == [(text, Provenance(file="page.html", char_end=len(text)))]


def test_pdf_pages_are_units_numbered_as_in_the_file_and_blank_pages_are_skipped() -> None:
    first, third = (
        "Harbour opening hours\nThe kayak shed opens at dawn.\n",
        "Page three\nTide tables are posted weekly.\n",
    )
    assert read("harbour.pdf") == [
        (first, Provenance(file="harbour.pdf", page=1, char_end=len(first))),
        (third, Provenance(file="harbour.pdf", page=3, char_end=len(third))),
    ]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("broken.jsonl", "broken.jsonl: malformed JSON on line 1"),
        ("latin1.txt", "latin1.txt: not valid UTF-8 (byte 3)"),
    ],
)
def test_unreadable_files_are_refused_naming_the_file_as_its_provenance_does(name: str, message: str) -> None:
    with pytest.raises(SourceError) as refused:
        read(name)
    assert refused.value.reason == SOURCE_UNREADABLE and refused.value.message.startswith(message)


def test_refusals_for_size_binary_content_and_type(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("x" * 11)
    (tmp_path / "nul.txt").write_bytes(b"text\x00more")
    (tmp_path / "doc.docx").write_bytes(b"PK")
    cases = {
        "big.txt": (LIMIT_EXCEEDED, "big.txt: 11 bytes exceeds the limit of 10"),
        "nul.txt": (SOURCE_UNREADABLE, "nul.txt: binary content (NUL bytes)"),
        "doc.docx": (SOURCE_UNREADABLE, "doc.docx: unsupported file type '.docx'"),
    }
    for name, (reason, message) in cases.items():
        with pytest.raises(SourceError) as refused:
            read_units(tmp_path / name, tmp_path, 10)
        assert (refused.value.reason, refused.value.message[: len(message)]) == (reason, message)


def test_inline_text_is_one_unit_with_lines_counted_like_a_file() -> None:
    assert inline_units("one\r\ntwo") == [inline_units("one\ntwo")[0]]
    assert inline_units("one\ntwo")[0].provenance == Provenance(line_start=1, line_end=2, char_end=7)
    assert inline_units(" \n ") == []


def test_provenance_paths_are_relative_to_the_root_and_a_file_root_names_the_file(tmp_path: Path) -> None:
    assert provenance_path(ROOT / "notes.md", ROOT.parent) == "sources/notes.md"
    assert provenance_path(ROOT / "notes.md", ROOT / "notes.md") == "notes.md"
    assert provenance_path(tmp_path / "x.txt", ROOT) == (tmp_path / "x.txt").as_posix()
