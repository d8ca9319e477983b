"""MEMORY partitions searched round-robin through the real server with a resident bound smaller than they need:
what a Search of a partition the LRU evicted costs against a steady Search of a resident one.

One server (packaged models, default settings but retrieval.memory_cache_bytes, --cache-mib), --partitions MEMORY
partitions (one tenant each) of --chunks short documents each, upserted --batch documents a call. A document is
one sentence of the IR collections (a chunk each, about 40 tokens); --distinct sentences are embedded, and each
partition draws its documents from them at an offset of its own (partition p's n-th document is sentence
(p * 1777 + n) mod --distinct), so the partitions differ while most of their vectors come from the embedding
cache: embedding 100k sentences would take most of an hour on 2 shared cores, and what a search of an evicted
partition costs does not depend on which texts it holds. Once every partition's snapshot is written
(ragsidecar_index_snapshots_pending 0), steps, side by side:

  round-robin   partition 0, 1, ..., n-1, 0, ... searched in turn, --rounds times over: with the bound too small
                for all of them, each Search finds its partition evicted since its last turn and opens it again
                from its snapshot (ragsidecar_index_loads_total{how="snapshot"} counts them);
  resident      right after each round-robin Search, the same partition searched again (resident now): the
                steady Search of a resident partition, at the same moments of the shared machine.

Every Search: a SciFact claim (a new one each call, so neither the query's embedding nor anything else is
cached), top_k 10, the default retrieval settings; the client's wall time of the RPC. Printed: p50 and p95 of
each and their ratios, the snapshot opens, the resident indexes' bytes by the LRU's estimate, the server's private
resident memory and its mapped file pages.

    .venv/bin/python bench/evictions.py [--partitions 20] [--chunks 5000] [--cache-mib 64] [--rounds 5]
                                        [--distinct 10000]
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import ir_collections

from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from retrieval_helpers import PRINCIPAL, entry, target  # noqa: E402 - importable once tests/ is on sys.path
from sidecar import Sidecar, default_config  # noqa: E402 - importable once tests/ is on sys.path

COLLECTIONS = ("scifact", "npl", "lisa", "cranfield", "med")
KNOWLEDGE = "notes"
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Sentences shorter than this are joined with the next (headings, numbers), so each document reads as a note.
MIN_CHARS = 60
# Partition p's documents start at sentence p * OFFSET (mod --distinct).
OFFSET = 1777


def sentences() -> Iterator[str]:
    """The collections' documents split into sentences of at least MIN_CHARS, in a fixed order."""
    for name in COLLECTIONS:
        corpus = ir_collections.corpus(name)
        for doc_id in sorted(corpus):
            pending = ""
            for sentence in SENTENCE_END.split(corpus[doc_id]):
                pending = f"{pending} {sentence}".strip()
                if len(pending) >= MIN_CHARS:
                    yield pending
                    pending = ""


def scope(partition: int) -> common_pb2.Scope:
    return common_pb2.Scope(tenant=f"tenant{partition:03}", session="s1")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--distinct", type=int, default=10000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as work:
        config = default_config(packaged=True)
        config["paths"]["data_dir"] = str(Path(work) / "data")
        config["retrieval"]["memory_cache_bytes"] = args.cache_mib << 20
        config["inference"]["cache_bytes"] = 0
        server = Sidecar(Path(work), config).start()
        try:
            bench = Bench(server)
            bench.fill(args.partitions, args.chunks, args.batch, args.distinct)
            bench.round_robin(args.partitions, args.rounds)
        finally:
            server.stop()


class Bench:
    def __init__(self, server: Sidecar) -> None:
        self.server = server
        self.stub = retrieval_pb2_grpc.RetrievalServiceStub(server.channel())
        claims = ir_collections.queries("scifact")
        self.queries = itertools.cycle([claims[i] for i in sorted(claims)])

    def search(self, partition: int) -> float:
        request = pb.SearchRequest(
            principal=PRINCIPAL,
            scope=scope(partition),
            target=target([entry(KNOWLEDGE, "MEMORY", "SEARCH")]),
            query=next(self.queries),
            top_k=10,
        )
        started = time.perf_counter()
        response = self.stub.Search(request, timeout=600)
        elapsed = time.perf_counter() - started
        if not response.hits:
            raise SystemExit(f"partition {partition}: no hits")
        return elapsed

    def fill(self, partitions: int, chunks: int, batch: int, distinct: int) -> None:
        texts = list(itertools.islice(sentences(), distinct))
        started = time.perf_counter()
        for partition in range(partitions):
            for first in range(0, chunks, batch):
                documents = [
                    pb.MemoryDocument(id=f"note{n:06}", text=texts[(partition * OFFSET + n) % len(texts)])
                    for n in range(first, min(chunks, first + batch))
                ]
                request = pb.UpsertDocumentsRequest(
                    principal=PRINCIPAL, scope=scope(partition), knowledge=KNOWLEDGE, documents=documents
                )
                self.stub.UpsertDocuments(request, timeout=1800)
            self.search(partition)  # builds its index; its snapshot is then due (store.snapshot_after_changes)
            print(
                f"partition {partition}: {chunks} documents upserted, indexed ({time.perf_counter() - started:.0f} s)"
            )
        while self.server.metric("ragsidecar_index_snapshots_pending") > 0:
            time.sleep(0.5)
        written = self.server.metric("ragsidecar_index_snapshots_total", how="written")
        print(f"{written:.0f} snapshots written; loaded in {time.perf_counter() - started:.0f} s")

    def memory(self) -> str:
        """The server's resident memory: private (RssAnon) and file pages mapped (RssFile: the snapshots' graphs and
        rows, page cache)."""
        assert self.server.process
        status = Path(f"/proc/{self.server.process.pid}/status").read_text().splitlines()
        kib = {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith(("RssAnon", "RssFile"))}
        return f"{kib['RssAnon'] >> 10} MiB private, {kib['RssFile'] >> 10} MiB of mapped files"

    def round_robin(self, partitions: int, rounds: int) -> None:
        for partition in range(partitions):  # warm: each partition opened once since its snapshot
            self.search(partition)
        opens = self.server.metric("ragsidecar_index_loads_total", how="snapshot")
        builds = self.server.metric("ragsidecar_index_loads_total", how="built")
        evicted: list[float] = []
        resident: list[float] = []
        for _ in range(rounds):
            for partition in range(partitions):
                evicted.append(self.search(partition))
                resident.append(self.search(partition))
        opens = self.server.metric("ragsidecar_index_loads_total", how="snapshot") - opens
        builds = self.server.metric("ragsidecar_index_loads_total", how="built") - builds
        held = self.server.metric("ragsidecar_cache_bytes", cache="memory_indexes")
        searches = len(evicted)
        e50, e95 = percentile(evicted, 0.5) * 1000, percentile(evicted, 0.95) * 1000
        r50, r95 = percentile(resident, 0.5) * 1000, percentile(resident, 0.95) * 1000
        print(
            f"{partitions} partitions round-robin, {rounds} rounds ({searches} Searches each way; "
            f"{opens:.0f} snapshot opens, {builds:.0f} builds; resident indexes {held / 2**20:.1f} MiB by the LRU's "
            f"estimate; server RSS {self.memory()})"
        )
        print("| Search | p50 ms | p95 ms | mean ms |")
        print("|---|---|---|---|")
        print(f"| round-robin | {e50:.1f} | {e95:.1f} | {statistics.mean(evicted) * 1000:.1f} |")
        print(f"| resident | {r50:.1f} | {r95:.1f} | {statistics.mean(resident) * 1000:.1f} |")
        print(
            f"round-robin / resident: p50 {e50 / r50:.2f}x, p95 {e95 / r50:.2f}x of the resident p50 "
            f"({e95 / r95:.2f}x of its p95)"
        )


if __name__ == "__main__":
    main()
