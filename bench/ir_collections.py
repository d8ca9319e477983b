"""Readers for the full IR collections the benchmarks measure (BEIR layout).

The collections are not part of the repository (tests use the small subsets in tests/data). They are read
from $RAGSIDECAR_IR_DATA, or from ../shared/data/ir beside the checkout when that variable is unset; each
collection is a folder holding corpus.jsonl.gz, queries.jsonl and qrels/test.tsv.
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
import os
from pathlib import Path

IR_ROOT = Path(os.environ.get("RAGSIDECAR_IR_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "ir"))


def folder(name: str) -> Path:
    """The collection's folder; exits with what to set when it is missing."""
    found = IR_ROOT / name
    if not (found / "corpus.jsonl.gz").is_file():
        raise SystemExit(
            f"benchmark data missing: {found / 'corpus.jsonl.gz'} does not exist.\n"
            f"Set RAGSIDECAR_IR_DATA to a folder holding {name}/corpus.jsonl.gz, {name}/queries.jsonl and "
            f"{name}/qrels/test.tsv (BEIR layout), e.g. RAGSIDECAR_IR_DATA=/data/beir make bench."
        )
    return found


@functools.cache
def corpus(name: str) -> dict[str, str]:
    """Document id -> "title text"."""
    with gzip.open(folder(name) / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return {r["_id"]: " ".join(filter(None, (r.get("title", ""), r["text"]))) for r in rows}


@functools.cache
def queries(name: str) -> dict[str, str]:
    with (folder(name) / "queries.jsonl").open(encoding="utf-8") as f:
        return {r["_id"]: r["text"] for r in map(json.loads, f)}


@functools.cache
def qrels(name: str, split: str = "test") -> dict[str, dict[str, int]]:
    """Query id -> {document id: relevance}."""
    judged: dict[str, dict[str, int]] = {}
    with (folder(name) / "qrels" / f"{split}.tsv").open(encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            judged.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    return judged
