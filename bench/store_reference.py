"""bench/store.py's reference row: a MEMORY partition as 0.2.0 served it, run by 0.2.0's own code.

Before the incremental indexes, a MEMORY partition was searched through an immutable HybridIndex (usearch HNSW
and a bm25s BM25 index) rebuilt from scratch after every change. bench/store.py extracts `server/src` of that
commit (store.REFERENCE_COMMIT) with `git archive` and runs this file in a process of its own with that tree
first on PYTHONPATH, so `ragsidecar` here is the old package; this file imports nothing of the bench's.

    python bench/store_reference.py FOLDER

FOLDER holds job.json (settings, texts, ids, query texts, the partition sizes to time a rebuild at),
vectors.npy and queries.npy. The worker times the rebuilds and the build of the whole partition, then prints
one JSON line (those times, the process's RSS after the build, its package's path) and serves searches, so
that bench/store.py can alternate them with its own store's query by query: each line read on standard input,
`hybrid N` or `dense N`, is answered by a JSON line with the search of query N timed in this process (ms) and
its top-k document ids. End of input ends it.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import numpy as np
import psutil


def main(folder: Path) -> None:
    import ragsidecar
    from ragsidecar.knowledge.fusion import FusionSettings
    from ragsidecar.knowledge.index import HybridIndex, IndexedChunk

    job = json.loads((folder / "job.json").read_text(encoding="utf-8"))
    vectors, queries = np.load(folder / "vectors.npy"), np.load(folder / "queries.npy")
    chunks = [IndexedChunk(i, t, {"document_id": i}) for i, t in zip(job["ids"], job["texts"], strict=True)]
    fusion = FusionSettings(job["fusion"], job["dense_weight"])

    def build(count: int) -> HybridIndex:
        return HybridIndex.build(
            chunks[:count],
            vectors[:count],
            threads=job["threads"],
            dtype=job["dtype"],
            lexical_language=job["analysis"],
        )

    def timed(work) -> tuple[float, object]:
        started = time.perf_counter()
        out = work()
        return (time.perf_counter() - started) * 1000, out

    rebuild_ms = [timed(lambda count=count: build(count))[0] for count in job["rebuilds"]]
    before = psutil.Process().memory_info().rss
    build_ms, index = timed(lambda: build(len(chunks)))
    after = psutil.Process().memory_info().rss
    answer(
        {
            "package": ragsidecar.__file__,
            "rebuild_ms": rebuild_ms,
            "build_s": build_ms / 1000,
            "rss_mib": after / 2**20,
            "rss_growth_mib": (after - before) / 2**20,
        }
    )
    for line in sys.stdin:
        kind, number = line.split()
        use_lexical = kind == "hybrid"
        query = int(number)
        search = functools.partial(
            index.search,
            queries[query],
            job["queries"][query] if use_lexical else "",
            job["k"],
            job["candidates"],
            use_lexical=use_lexical,
            fusion=fusion,
        )
        ms, hits = timed(search)
        answer({"ms": ms, "ids": [hit.chunk.meta["document_id"] for hit in hits]})


def answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
