"""Readers for the IR fixtures vendored in tests/data (BEIR layout; see tests/data/README.md).

Tests read only these small subsets, never a full collection: benchmarks have their own reader
(bench/ir_collections.py).
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
from pathlib import Path

IR_ROOT = Path(__file__).resolve().parent / "data"


@functools.cache
def corpus(name: str) -> dict[str, str]:
    """Document id -> "title. text"."""
    with gzip.open(IR_ROOT / name / "corpus.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    return {r["_id"]: " ".join(filter(None, (r.get("title", ""), r["text"]))) for r in rows}


@functools.cache
def queries(name: str) -> dict[str, str]:
    with (IR_ROOT / name / "queries.jsonl").open() as f:
        return {r["_id"]: r["text"] for r in map(json.loads, f)}


@functools.cache
def qrels(name: str, split: str = "test") -> dict[str, dict[str, int]]:
    """Query id -> {document id: relevance}."""
    judged: dict[str, dict[str, int]] = {}
    with (IR_ROOT / name / "qrels" / f"{split}.tsv").open() as f:
        for row in csv.DictReader(f, delimiter="\t"):
            judged.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    return judged
