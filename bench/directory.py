"""DIRECTORY sources through the real server, on loopback: what a steady Search costs as the folder grows, against a
MEMORY Search of the same documents; how soon an edited file is searched; what an edit costs the next Search.

Each folder holds one SciFact abstract per .txt file (the first --sizes abstracts by id); a MEMORY source of the same
size holds the same abstracts as documents, upserted in the same scope. Steps, in one server, side by side:

1. first load: RequireLoaded of each folder and MEMORY source (every chunk embedded once: the embedding cache holds
   each text's vectors for the other);
2. steady Search: p50 over --searches of each source, the calls of all sources interleaved, nothing changed; the
   ratio DIRECTORY / MEMORY per size, and the largest folder's p50 over the smallest's (a steady Search of a
   watched folder lists no file: it should not grow with the files);
3. edit to searchable: one file of the largest folder rewritten with an abstract from beyond the folders, then
   plain Searches (no rescan) until its text is the best hit: the time from the write to that Search's answer
   (the watcher's event, a scan, the file re-embedded and the index updated, the poll's own Search); p50 over
   --edits;
4. edit then rescan: the same kind of edit, then one Search with rescan set (the file re-read, re-chunked and
   re-embedded, the index updated file by file), against the same under a new source name (the index built whole,
   only the edited file's chunk embedded: the cache holds the others); p50 over --edits.

    .venv/bin/python bench/directory.py [--sizes 100 3000] [--searches 40] [--edits 7]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import ir_collections

from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from retrieval_helpers import PRINCIPAL, entry, target  # noqa: E402 - importable once tests/ is on sys.path
from sidecar import Sidecar, default_config  # noqa: E402 - importable once tests/ is on sys.path

SCOPE = common_pb2.Scope(tenant="bench", session="s1")
QUERY = "can zebrafish regrow heart tissue after injury?"
UPSERT_BATCH = 500


def write_folder(folder: Path, abstracts: list[str]) -> None:
    folder.mkdir(parents=True)
    for n, text in enumerate(abstracts):
        (folder / f"abstract{n:04}.txt").write_text(text, encoding="utf-8")


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 3000])
    parser.add_argument("--searches", type=int, default=40)
    parser.add_argument("--edits", type=int, default=7)
    args = parser.parse_args()
    corpus = ir_collections.corpus("scifact")
    texts = [corpus[i] for i in sorted(corpus)]
    largest = max(args.sizes)

    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / "knowledge"
        for size in args.sizes:
            write_folder(root / f"files{size}", texts[:size])
        config = default_config(packaged=True)
        config["paths"].update(knowledge_roots=[str(root)], data_dir=str(Path(work) / "data"))
        config["inference"]["cache_bytes"] = 0
        server = Sidecar(Path(work), config).start()
        try:
            bench = Bench(server, root)
            bench.first_loads(args.sizes, texts)
            bench.steady(args.sizes, args.searches)
            replacements = iter(texts[largest:])
            bench.edit_to_searchable(largest, args.edits, replacements)
            bench.edit_then_rescan(largest, args.edits, replacements)
        finally:
            server.stop()


class Bench:
    def __init__(self, server: Sidecar, root: Path) -> None:
        self.server = server
        self.root = root
        self.stub = retrieval_pb2_grpc.RetrievalServiceStub(server.channel())

    def search(self, source: pb.KnowledgeEntry, rescan: bool = False, query: str = QUERY) -> pb.SearchResponse:
        request = pb.SearchRequest(
            principal=PRINCIPAL, scope=SCOPE, target=target([source]), query=query, top_k=5, rescan=rescan
        )
        return self.stub.Search(request, timeout=600)

    def load(self, source: pb.KnowledgeEntry) -> None:
        request = pb.RequireLoadedRequest(
            principal=PRINCIPAL, scope=SCOPE, target=target([source]), names=[source.name]
        )
        self.stub.RequireLoaded(request, timeout=1800)

    def first_loads(self, sizes: list[int], texts: list[str]) -> None:
        for size in sizes:
            folder = timed(functools.partial(self.load, directory(size)))
            started = time.perf_counter()
            for first in range(0, size, UPSERT_BATCH):
                documents = [
                    pb.MemoryDocument(id=f"abstract{n:04}", text=texts[n])
                    for n in range(first, min(size, first + UPSERT_BATCH))
                ]
                self.stub.UpsertDocuments(
                    pb.UpsertDocumentsRequest(
                        principal=PRINCIPAL, scope=SCOPE, knowledge=f"memory{size}", documents=documents
                    ),
                    timeout=1800,
                )
            self.load(memory(size))
            print(
                f"{size} files: first load {folder:.1f} s; MEMORY upsert and load {time.perf_counter() - started:.1f} s"
            )

    def steady(self, sizes: list[int], searches: int) -> None:
        sources = [s for size in sizes for s in (directory(size), memory(size))]
        for source in sources:  # warm: each index resident, the query's embedding path taken once
            self.search(source)
        scans = self.server.metric("ragsidecar_source_scans_total")
        times: dict[str, list[float]] = {s.name: [] for s in sources}
        for _ in range(searches):
            for source in sources:
                times[source.name].append(timed(functools.partial(self.search, source)))
        scanned = self.server.metric("ragsidecar_source_scans_total") - scans
        p50 = {name: statistics.median(t) * 1000 for name, t in times.items()}
        print(f"steady Search p50 over {searches} each, interleaved ({scanned:.0f} scans of files during them):")
        print("| files | DIRECTORY ms | MEMORY ms | DIRECTORY / MEMORY |")
        print("|---|---|---|---|")
        for size in sizes:
            folder, held = p50[f"files{size}"], p50[f"memory{size}"]
            print(f"| {size} | {folder:.1f} | {held:.1f} | {folder / held:.2f}x |")
        small, large = min(sizes), max(sizes)
        print(
            f"DIRECTORY {large} / {small} files: {p50[f'files{large}'] / p50[f'files{small}']:.2f}x "
            f"(MEMORY: {p50[f'memory{large}'] / p50[f'memory{small}']:.2f}x)"
        )

    def edit_to_searchable(self, size: int, edits: int, replacements: Iterator[str]) -> None:
        source = directory(size)
        latencies, polls = [], 0
        for n in range(edits):
            text = next(replacements)
            path = self.root / f"files{size}" / f"abstract{n:04}.txt"
            written = time.perf_counter()
            path.write_text(text, encoding="utf-8")
            while True:
                polls += 1
                hits = self.search(source, query=text[:300]).hits
                if hits and hits[0].text[:100] == text[:100]:
                    break
                if time.perf_counter() - written > 60:
                    raise SystemExit(f"edit {n} not searched within 60 s")
            latencies.append(time.perf_counter() - written)
        print(
            f"edit to searchable, {size} files, plain Searches polled: "
            f"p50 {statistics.median(latencies) * 1000:.0f} ms "
            f"(min {min(latencies) * 1000:.0f}, max {max(latencies) * 1000:.0f}; {edits} edits, "
            f"{polls / edits:.1f} Searches per edit)"
        )

    def edit_then_rescan(self, size: int, edits: int, replacements: Iterator[str]) -> None:
        updates, rebuilds = [], []
        for n in range(edits):
            (self.root / f"files{size}" / f"abstract{size - 1 - n:04}.txt").write_text(next(replacements))
            updates.append(timed(lambda: self.search(directory(size), rescan=True)))
            (self.root / f"files{size}" / f"abstract{size - 1 - n:04}.txt").write_text(next(replacements))
            rebuilds.append(timed(functools.partial(self.search, directory(size, f"rebuild{n}"), rescan=True)))
            self.search(directory(size), rescan=True)  # untimed: takes this edit in, so each timed edit is one file
        update, rebuild = statistics.median(updates), statistics.median(rebuilds)
        print(
            f"edit one file, next Search with rescan, {size} files: updated file by file p50 {update * 1000:.0f} ms; "
            f"rebuilt whole p50 {rebuild * 1000:.0f} ms ({rebuild / update:.1f}x)"
        )


def directory(size: int, name: str = "") -> pb.KnowledgeEntry:
    return entry(name or f"files{size}", "DIRECTORY", "SEARCH", f"files{size}")


def memory(size: int) -> pb.KnowledgeEntry:
    return entry(f"memory{size}", "MEMORY", "SEARCH")


if __name__ == "__main__":
    main()
