"""A DIRECTORY source of 1,000 files: what editing one file costs the next Search, against a full rebuild.

The folder holds one SciFact abstract per .txt file (the first --files abstracts by id). Through the real
server, on loopback:

1. first load: RequireLoaded on the cold server (every chunk embedded, the index built and saved);
2. search: the p50 of a Search with nothing changed (what a search costs on its own);
3. edit: one file rewritten with another abstract (beyond the folder's), then the next Search timed, which
   updates the index file by file (re-reads, re-chunks and re-embeds the edited file only); p50 over --edits;
4. rebuild: the same kind of edit, then a Search of the same folder under a new source name, which builds the
   index whole as an edit did before sources were updated file by file (every file read and chunked, only the
   edited file's chunks embedded: the embedding cache holds the others); p50 over --edits.

It prints the figures and the ratio rebuild / edit (also with the plain search's cost taken off both).

    .venv/bin/python bench/directory.py [--files 1000] [--edits 7]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
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
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=7)
    args = parser.parse_args()
    corpus = ir_collections.corpus("scifact")
    texts = [corpus[i] for i in sorted(corpus)]
    folder_texts, replacements = texts[: args.files], iter(texts[args.files :])

    with tempfile.TemporaryDirectory() as work:
        root = Path(work) / "knowledge"
        write_folder(root / "science", folder_texts)
        config = default_config()
        config["paths"].update(knowledge_roots=[str(root)], data_dir=str(Path(work) / "data"))
        config["inference"]["cache_bytes"] = 0
        server = Sidecar(Path(work), config).start()
        try:
            run(server, root / "science", args, replacements)
        finally:
            server.stop()


def run(server: Sidecar, folder: Path, args: argparse.Namespace, replacements) -> None:
    stub = retrieval_pb2_grpc.RetrievalServiceStub(server.channel())

    def search(name: str = "science") -> None:
        source = entry(name, "DIRECTORY", "SEARCH", "science")
        stub.Search(
            pb.SearchRequest(principal=PRINCIPAL, scope=SCOPE, target=target([source]), query=QUERY, top_k=5),
            timeout=600,
        )

    def edit(n: int) -> None:
        (folder / f"abstract{n:04}.txt").write_text(next(replacements), encoding="utf-8")

    science = entry("science", "DIRECTORY", "SEARCH", "science")
    load = pb.RequireLoadedRequest(principal=PRINCIPAL, scope=SCOPE, target=target([science]), names=["science"])
    first = timed(lambda: stub.RequireLoaded(load, timeout=1800))
    chunks = server.metric("ragsidecar_embedded_chunks_total")
    print(f"{args.files} files, {chunks:.0f} chunks: first load {first:.1f} s (every chunk embedded)")

    plain = statistics.median(timed(search) for _ in range(args.edits))
    edits, rebuilds, embedded = [], [], 0.0
    for n in range(args.edits):
        edit(n)
        before = server.metric("ragsidecar_embedded_chunks_total")
        edits.append(timed(search))
        embedded += server.metric("ragsidecar_embedded_chunks_total") - before
        edit(args.files - 1 - n)
        rebuilds.append(timed(functools.partial(search, f"science-rebuild-{n}")))
        search()  # untimed: the source searched in step 3 takes this edit in, so each edit there is one file
    updated = server.metric("ragsidecar_index_loads_total", how="updated")
    built = server.metric("ragsidecar_index_loads_total", how="built")
    assert (updated, built) == (2 * args.edits, 1 + args.edits), (updated, built)
    edit_p50, rebuild_p50 = statistics.median(edits), statistics.median(rebuilds)
    print(f"search, nothing changed: p50 {plain * 1000:.0f} ms")
    print(
        f"edit one file, next search (updated file by file): p50 {edit_p50 * 1000:.0f} ms "
        f"(min {min(edits) * 1000:.0f}, max {max(edits) * 1000:.0f}; {args.edits} edits, "
        f"{embedded / args.edits:.1f} chunks embedded per edit)"
    )
    print(
        f"edit one file, next search (rebuilt whole): p50 {rebuild_p50 * 1000:.0f} ms "
        f"(min {min(rebuilds) * 1000:.0f}, max {max(rebuilds) * 1000:.0f})"
    )
    print(
        f"rebuild / edit: {rebuild_p50 / edit_p50:.1f}x; less the plain search: "
        f"{(rebuild_p50 - plain) / max(edit_p50 - plain, 1e-9):.1f}x; first load / edit: {first / edit_p50:.0f}x"
    )


if __name__ == "__main__":
    main()
