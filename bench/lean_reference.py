"""Lean indexes against the index before them, side by side in one process: one MEMORY partition's snapshot
loaded by this checkout's knowledge/index.py and by REFERENCE_COMMIT's (the last commit before lean indexes,
loaded from git under another module name; everything else it imports is this checkout's), then the same
queries searched on both, query by query in alternating order, so both meet the same moments of a shared
machine.

The partition is made as bench/restart.py makes it (SciFact abstracts with clustered synthetic vectors, one chunk
per document, the embedded store's bulk load, its background snapshot). Per size: each index's load of the
snapshot (`HybridIndex.load`: the files' checks and the in-memory structures), whether both return the same hits
(ids and texts) for every query, and the steady search p50 (k 10, retrieval.fusion_candidates, the configured
fusion), with the ratio after / before: over the queries repeated (the hits' records come from
index.HIT_RECORD_CACHE_BYTES's cache once read), and over query vectors never searched before (each a query's
vector plus a little noise: other hits, those whose records the cache does not hold read from the file).

    .venv/bin/python bench/lean_reference.py [--sizes 10000,100000] [--queries 50] [--rounds 600]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np
from restart import Opener, first_search, snapshot_written, synthetic_base
from store import LOAD_BATCH, REPO, SCOPE, SEED, SOURCE, Corpus, Queries, Searching, Vectors, derive

from ragsidecar.config_loading import load_config
from ragsidecar.knowledge.index import HybridIndex

REFERENCE_COMMIT = "6f30905"


def reference_module(commit: str, folder: Path) -> ModuleType:
    """knowledge/index.py as `commit` has it, imported as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{commit}:server/src/ragsidecar/knowledge/index.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = folder / "reference_index.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("reference_index", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def snapshot_of(size: int, data: Path, base: Corpus, searching: Searching, queries: Queries) -> Path:
    """The snapshot folder of a partition of `size` chunks, bulk-loaded into an embedded store under `data`."""
    corpus = derive(base, size, np.random.default_rng(SEED))
    vectors = Vectors(searching.analysis)
    vectors.add(corpus)
    opener = Opener("embedded", data, vectors, searching)
    store = await opener.open()
    for start in range(0, size, LOAD_BATCH):
        await store.upsert(SCOPE, SOURCE, corpus.slice(start, start + LOAD_BATCH).documents())
    started = time.perf_counter()
    await first_search(store, searching, queries)
    snapshot_written(data, started)
    await opener.close()
    (manifest,) = (m for m in (data / "snapshots").glob("*/*/manifest.json") if not m.parent.name.startswith("."))
    return manifest.parent


def compare(size: int, folder: Path, reference: ModuleType, searching: Searching, queries: Queries, rounds: int) -> str:
    started = time.perf_counter()
    before = reference.HybridIndex.load(folder)
    load_before = time.perf_counter() - started
    started = time.perf_counter()
    after = HybridIndex.load(folder)
    load_after = time.perf_counter() - started

    def search(index, n: int, vector: np.ndarray | None = None) -> list:
        i = n % len(queries.texts)
        query = queries.vectors[i] if vector is None else vector
        return index.search(query, queries.texts[i], 10, searching.candidates, fusion=searching.fusion)

    same = all(
        [(h.chunk.id, h.chunk.text, h.chunk.meta) for h in search(before, n)]
        == [(h.chunk.id, h.chunk.text, h.chunk.meta) for h in search(after, n)]
        for n in range(len(queries.texts))
    )
    rng = np.random.default_rng(SEED)
    cells = []
    for fresh in (False, True):
        times: dict[str, list[float]] = {"before": [], "after": []}
        for n in range(rounds):
            vector = None
            if fresh:  # a query vector never searched before: other hits, whose records are read anew
                vector = queries.vectors[n % len(queries.texts)] + rng.standard_normal(queries.vectors.shape[1]) * 0.02
            pair = (("before", before), ("after", after))
            for name, index in pair if n % 2 else pair[::-1]:
                started = time.perf_counter()
                search(index, n, vector)
                times[name].append((time.perf_counter() - started) * 1000)
        p50_before, p50_after = (float(np.percentile(times[name], 50)) for name in ("before", "after"))
        cells.append(f"{p50_before:.3f} | {p50_after:.3f} | {p50_after / p50_before:.2f}")
    return f"| {size:,} | {load_before:.2f} | {load_after:.2f} | {'yes' if same else 'NO'} | {' | '.join(cells)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=600, help="searches per index")
    args = parser.parse_args()
    config = load_config(REPO / "config" / "ragsidecar.toml", environ={})
    searching = Searching.of(config)
    base, queries = synthetic_base(args.queries)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-lean-") as temp:
        reference = reference_module(REFERENCE_COMMIT, Path(temp))
        for size in (int(s) for s in args.sizes.split(",")):
            folder = asyncio.run(snapshot_of(size, Path(temp) / f"data-{size}", base, searching, queries))
            rows.append(compare(size, folder, reference, searching, queries, args.rounds))
            print(rows[-1], flush=True)
    print(
        f"\n`.venv/bin/python bench/lean_reference.py --sizes {args.sizes} --queries {args.queries} "
        f"--rounds {args.rounds}` (before: {REFERENCE_COMMIT})\n\n"
        "| chunks | load s before | load s after | same hits | steady p50 ms before | after | after / before "
        "| new queries p50 ms before | after | after / before |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


if __name__ == "__main__":
    main()
