"""A snapshot's load, side by side on the same files: under its manifest of xxh3_128 checksums (as snapshots are
written now) and under the manifest of sha256 digests an earlier version wrote; with the verification alone and the
BM25 side's load (knowledge/lexical.py) alone beside them, as saved now (each segment's dead postings in its meta)
and as an earlier version saved it (they are then counted from every posting); and the first filtered search after
the load (`keep` on a metadata field), with the field index the snapshot saves (knowledge/field_columns.py) and
without it, as an earlier version saved snapshots (the field index then built from every chunk's record).

One index of CHUNKS chunks (SciFact texts, each with its number appended so none repeats; bench/index.py's
clustered 384-d vectors, as bench/restart.py --vectors synthetic; each chunk's fields its "$id", "$created" and a
"user" of 50) is built and saved once, its folder copied with a sha256 manifest and without the field index; then
each round loads each, alternated, and the table gives medians and their ratio.

    .venv/bin/python bench/snapshot_load.py [--chunks 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from beir import read_collection
from index import clustered

from ragsidecar.knowledge import filters, index_files
from ragsidecar.knowledge.index import HybridIndex, IndexedChunk
from ragsidecar.knowledge.lexical import Lexical

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
BATCH = 5000
LANGUAGE = "english"
USERS = 50
KEEP = filters.Compare("user", filters.Op.EQUAL, "u7")
FIELD_FILES = (index_files.FIELDS, index_files.FIELD_MEMBERS, index_files.FIELD_VALUES)


def fields(i: int) -> dict[str, object]:
    return filters.to_json({filters.ID: f"c{i}", filters.CREATED: filters.Instant(i * 10**9), "user": f"u{i % USERS}"})


def built(folder: Path, chunks: int) -> None:
    texts = read_collection("scifact").doc_texts
    vectors, _ = clustered(chunks, 1)
    index = HybridIndex(vectors.shape[1], 2, lexical_language=LANGUAGE)
    for start in range(0, chunks, BATCH):
        batch = range(start, min(start + BATCH, chunks))
        index.add(
            [IndexedChunk(f"c{i}", f"{texts[i % len(texts)]} {i}", {"fields": fields(i)}) for i in batch],
            vectors[batch.start : batch.stop],
        )
    index.save(folder, "bench")


def with_sha256_manifest(folder: Path, copy: Path) -> None:
    """`folder` copied, its manifest rewritten as an earlier version wrote it: no "checksum", each file's sha256."""
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    del manifest["checksum"]
    for name, entry in manifest["files"].items():
        del entry["xxh3_128"]
        with open(copy / name, "rb") as f:
            entry["sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def without_dead_postings(folder: Path, copy: Path) -> None:
    """The BM25 folder copied, its meta as an earlier version wrote it: no dead postings per segment."""
    shutil.copytree(folder, copy)
    meta = json.loads((copy / "lexical.json").read_text(encoding="utf-8"))
    del meta["dead"]
    (copy / "lexical.json").write_text(json.dumps(meta), encoding="utf-8")


def without_field_index(folder: Path, copy: Path) -> None:
    """`folder` copied as an earlier version wrote it: no field index."""
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    for name in FIELD_FILES:
        (copy / name).unlink()
        del manifest["files"][name]
    (copy / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def opened_then_filtered(folder: Path, query: np.ndarray) -> tuple[float, float]:
    """Milliseconds of the load, then of the first search that keeps one user's chunks."""
    started = time.perf_counter()
    index = HybridIndex.load(folder)
    loaded = time.perf_counter()
    hits = index.search(query, "cell", 10, candidates=100, keep=KEEP)
    assert hits and all(h.chunk.meta["fields"]["user"] == "u7" for h in hits)
    return (loaded - started) * 1000, (time.perf_counter() - loaded) * 1000


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-load-") as temp:
        fast, legacy = Path(temp) / "xxh3_128", Path(temp) / "sha256"
        built(fast, args.chunks)
        with_sha256_manifest(fast, legacy)
        counted = Path(temp) / "bm25-counted"
        without_dead_postings(fast / "bm25", counted)
        unfielded = Path(temp) / "no-field-index"
        without_field_index(fast, unfielded)
        query = clustered(1, 1)[1][0]
        ms: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, folder in (("without field index", unfielded), ("with field index", fast)):
                load_ms, search_ms = opened_then_filtered(folder, query)
                ms.setdefault(f"load, {name}", []).append(load_ms)
                ms.setdefault(f"first filtered search, {name}", []).append(search_ms)
            for name, folder in (("sha256", legacy), ("xxh3_128", fast)):
                ms.setdefault(f"verify, {name}", []).append(timed(lambda f=folder: index_files.verified_manifest(f)))
                ms.setdefault(f"load, {name}", []).append(timed(lambda f=folder: HybridIndex.load(f)))
            ms.setdefault("BM25 load", []).append(timed(lambda: Lexical.load(fast / "bm25", LANGUAGE)))
            ms.setdefault("BM25 load, dead postings counted", []).append(timed(lambda: Lexical.load(counted, LANGUAGE)))
        size = sum(p.stat().st_size for p in fast.rglob("*") if p.is_file()) / 1e6
    medians = {name: statistics.median(values) for name, values in ms.items()}
    filtered = (
        medians["first filtered search, with field index"] / medians["first filtered search, without field index"]
    )
    lines = [
        f"# Snapshot load, {args.chunks:,} chunks ({size:.0f} MB of files), median of {args.rounds} rounds",
        "",
        f"`.venv/bin/python bench/snapshot_load.py --chunks {args.chunks} --rounds {args.rounds}`",
        "",
        "| what | ms |",
        "|---|---|",
        *(f"| {name} | {value:.0f} |" for name, value in medians.items()),
        "",
        f"xxh3_128 over sha256: verification {medians['verify, xxh3_128'] / medians['verify, sha256']:.2f}x, "
        f"whole load {medians['load, xxh3_128'] / medians['load, sha256']:.2f}x; BM25 load with its dead postings "
        f"saved over counted {medians['BM25 load'] / medians['BM25 load, dead postings counted']:.2f}x; the first "
        f"filtered search with the field index saved over without {filtered:.3f}x.",
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "snapshot_load.md").write_text(table)


if __name__ == "__main__":
    main()
