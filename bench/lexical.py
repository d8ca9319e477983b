"""Lexical engines side by side, to choose the BM25 behind the incremental index: quality (BM25 alone, nDCG@10 and
Recall@100 on the BEIR sets) and latency (one document added until a search sees it; a search) at 1k, 10k and
100k documents. Prints the tables and writes bench/results/lexical.md.

Engines:
  bm25s         What the index held before: bm25s ("lucene", k1 1.5, b 0.75) over knowledge/lexical.py's
                analysis, immutable: an add rebuilds it from every text, analysis included, as HybridIndex.build did.
  incremental   knowledge/lexical.py's Lexical: texts added and removed by slot, scores equal to bm25s built on
                the live texts. Merges due after the bulk load run before the timed adds (the index runs them in
                the background); the timed adds include the merges add() runs itself.
  tantivy       tantivy (Rust: segments, deletes, background merges), in memory, one indexing thread, its
                "en_stem" analyzer (simple tokenizer, lowercase, tokens over 40 bytes dropped, Snowball English; no
                stopwords); BM25 with k1 1.2, b 0.75 and document lengths kept in one byte. A query is the
                disjunction of its analysed terms (a repeated term counts each time). An add is add_document,
                commit and reload, after which a search sees it.
  tantivy-ours  tantivy with knowledge/lexical.py's analysis rebuilt as a tantivy analyzer (bm25s's token
                pattern, lowercase, bm25s's English stopwords, Snowball English): what its scoring alone changes.

Quality: each set's documents as "title text" and judged test queries (bench/beir.py's read_collection), the top
100 of each query, bench/beir.py's nDCG@10 and Recall@100; "delta" is against bm25s.
Latency: documents are SciFact's abstracts ("title text"), repeated past its 5183 as bench/store.py derives
copies (copy c >= 1: "<text> (variant c)"). Per size every engine is loaded, then --queries SciFact claims are
searched for their top 100, twice, and --adds new documents added one at a time (p50, p95), engine after engine
in turn so that the shared machine's load falls on each alike; "search / bm25s" is the median over searches of
the ratio to bm25s's search of the same query in the same round. bm25s's add, a rebuild, is timed --rebuilds
times up to 10k documents, and above that is its bulk load (the same rebuild, one text short). A last row times
knowledge/lexical.py's analysis of each added text alone, which bm25s and the incremental index run on every text
they index. "bytes": the index's resident estimate (tantivy's own memory is not measured).

    .venv/bin/python bench/lexical.py [--sets scifact,cranfield,med,npl,lisa] [--sizes 1000,10000,100000]
                                      [--queries 100] [--adds 100] [--rebuilds 3]
"""

from __future__ import annotations

import argparse
import sys
import time

import bm25s
import numpy as np
import tantivy
from beir import RESULTS, evaluate, read_collection
from bm25s.stopwords import STOPWORDS_EN

from ragsidecar.knowledge.lexical import K1, B, Lexical, terms

LANGUAGE = "english"
DEPTH = 100
SETS = ("scifact", "cranfield", "med", "npl", "lisa")
SEARCH_ROUNDS = 2  # each query searched this many times per engine
REBUILT_UP_TO = 10_000  # above, bm25s's add is its bulk load: a minute or more each on two shared cores


class Rebuilt:
    """bm25s as knowledge/lexical.py held it before: built once on all texts, searched as its `top` did."""

    name = "bm25s"

    def load(self, texts: list[str]) -> None:
        self._texts = list(texts)
        self._model = bm25s.BM25(k1=K1, b=B)
        self._model.index(terms(self._texts, LANGUAGE), show_progress=False)

    def add(self, slot: int, text: str) -> None:
        assert slot == len(self._texts)
        self.load([*self._texts, text])

    def top(self, query: str, count: int) -> list[int]:
        ids = self._model.get_tokens_ids(terms([query], LANGUAGE)[0])
        if not ids:
            return []
        scores = self._model.get_scores_from_ids(ids)
        count = min(count, len(scores))
        best = np.argpartition(-scores, count - 1)[:count]
        best = best[scores[best] > 0]
        return best[np.lexsort((best, -scores[best]))].tolist()

    def nbytes(self) -> int:
        return sum(self._model.scores[k].nbytes for k in ("data", "indices", "indptr"))


class Incremental:
    name = "incremental"

    def load(self, texts: list[str]) -> None:
        self._index = Lexical(LANGUAGE)
        self._index.add(range(len(texts)), texts)
        while self._index.merge():
            pass

    def add(self, slot: int, text: str) -> None:
        self._index.add([slot], [text])

    def top(self, query: str, count: int) -> list[int]:
        return [slot for slot, _ in self._index.top(query, count)]

    def nbytes(self) -> int:
        return self._index.nbytes()


def en_stem() -> tantivy.TextAnalyzer:
    """tantivy's built-in "en_stem" analyzer, rebuilt to analyse queries as it analyses documents."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def ours() -> tantivy.TextAnalyzer:
    """knowledge/lexical.py's English analysis (bm25s.tokenize's pattern and stopwords, Snowball English)."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(r"\b\w\w+\b"))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.custom_stopword(list(STOPWORDS_EN)))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


class Tantivy:
    def __init__(self, analysis: str) -> None:
        self.name = "tantivy" if analysis == "en_stem" else "tantivy-ours"
        self._analysis = analysis
        self._analyzer = en_stem() if analysis == "en_stem" else ours()

    def load(self, texts: list[str]) -> None:
        builder = tantivy.SchemaBuilder()
        builder.add_unsigned_field("slot", indexed=True, fast=True)
        builder.add_text_field("body", tokenizer_name=self._analysis, index_option="freq")  # BM25 needs no positions
        self._schema = builder.build()
        self._index = tantivy.Index(self._schema)
        if self._analysis != "en_stem":
            self._index.register_tokenizer(self._analysis, self._analyzer)
        self._writer = self._index.writer(heap_size=64_000_000, num_threads=1)
        for slot, text in enumerate(texts):
            self._writer.add_document(tantivy.Document.from_dict({"slot": slot, "body": text}, self._schema))
        self._commit()

    def _commit(self) -> None:
        self._writer.commit()
        self._index.reload()
        self._searcher = self._index.searcher()

    def add(self, slot: int, text: str) -> None:
        self._writer.add_document(tantivy.Document.from_dict({"slot": slot, "body": text}, self._schema))
        self._commit()

    def top(self, query: str, count: int) -> list[int]:
        words = self._analyzer.analyze(query)
        if not words:
            return []
        should = [
            (tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "body", w, index_option="freq"))
            for w in words
        ]
        hits = self._searcher.search(tantivy.Query.boolean_query(should), count, count=False).hits
        return self._searcher.fast_field_values("slot", [address for _, address in hits]) if hits else []

    def nbytes(self) -> None:
        return None


def engines() -> list:
    return [Rebuilt(), Incremental(), Tantivy("en_stem"), Tantivy("ours")]


# ---- quality -----------------------------------------------------------------------------------------------


def quality(sets: list[str], out) -> None:
    out("## Quality: BM25 alone, top 100\n")
    out("| set | engine | nDCG@10 | delta | R@100 | delta | load s |")
    out("|---|---|---|---|---|---|---|")
    for name in sets:
        data = read_collection(name)
        reference = None
        for engine in engines():
            started = time.perf_counter()
            engine.load(data.doc_texts)
            loaded = time.perf_counter() - started
            run = {q: [data.doc_ids[i] for i in engine.top(text, DEPTH)] for q, text in data.queries.items()}
            ndcg, recall = evaluate(run, data.qrels)
            reference = reference or (ndcg, recall)
            out(
                f"| {name} | {engine.name} | {ndcg:.4f} | {ndcg - reference[0]:+.4f} | {recall:.4f} | "
                f"{recall - reference[1]:+.4f} | {loaded:.1f} |"
            )


# ---- latency -----------------------------------------------------------------------------------------------


def documents(count: int, base: list[str]) -> list[str]:
    """`count` documents: the base texts, then copies as bench/store.py derives them."""
    return [
        base[i % len(base)] if i < len(base) else f"{base[i % len(base)]} (variant {i // len(base)})"
        for i in range(count)
    ]


def percentiles(seconds: list[float]) -> str:
    ms = np.array(seconds) * 1000
    return f"{np.percentile(ms, 50):.2f} | {np.percentile(ms, 95):.2f}"


def timed(call, *args) -> float:
    started = time.perf_counter()
    call(*args)
    return time.perf_counter() - started


def latency(sizes: list[int], query_count: int, adds: int, rebuilds: int, out) -> None:
    scifact = read_collection("scifact")
    queries = list(scifact.queries.values())[:query_count]
    out("\n## Latency (ms): one-document add until a search sees it, and search (top 100)\n")
    out(
        "| documents | engine | add p50 | add p95 | adds | search p50 | search p95 | search / bm25s | bulk load s "
        "| bytes |"
    )
    out("|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        texts = documents(size + adds, scifact.doc_texts)
        everyone = engines()
        loaded = {e.name: timed(e.load, texts[:size]) for e in everyone}
        searches: dict[str, list[float]] = {e.name: [] for e in everyone}
        for _ in range(SEARCH_ROUNDS):
            for query in queries:
                for engine in everyone:
                    searches[engine.name].append(timed(engine.top, query, DEPTH))
        added: dict[str, list[float]] = {e.name: [] for e in everyone}
        incremental = [e for e in everyone if not isinstance(e, Rebuilt)]
        for slot in range(size, size + adds):
            for engine in incremental:
                added[engine.name].append(timed(engine.add, slot, texts[slot]))
        analysis = [timed(terms, [texts[slot]], LANGUAGE) for slot in range(size, size + adds)]
        for engine in everyone:
            if isinstance(engine, Rebuilt):
                added[engine.name] = (
                    [loaded[engine.name]]
                    if size > REBUILT_UP_TO
                    else [timed(engine.add, slot, texts[slot]) for slot in range(size, size + rebuilds)]
                )
            nbytes = engine.nbytes()
            # Each search beside bm25s's of the same query in the same round: the median ratio.
            ratio = np.median(np.array(searches[engine.name]) / np.array(searches[Rebuilt.name]))
            out(
                f"| {size:,} | {engine.name} | {percentiles(added[engine.name])} | {len(added[engine.name])} | "
                f"{percentiles(searches[engine.name])} | {ratio:.2f} | {loaded[engine.name]:.1f} | "
                f"{'-' if nbytes is None else f'{nbytes / 1e6:.0f} MB'} |"
            )
        out(f"| {size:,} | (the analysis of an added text alone) | {percentiles(analysis)} | {adds} | | | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--adds", type=int, default=100)
    parser.add_argument("--rebuilds", type=int, default=3)
    args = parser.parse_args()
    lines: list[str] = []

    def out(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    started = time.perf_counter()
    quality([s for s in args.sets.split(",") if s], out)
    latency([int(s) for s in args.sizes.split(",") if s], args.queries, args.adds, args.rebuilds, out)
    out(f"\nWhole run: {time.perf_counter() - started:.0f} s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lexical.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
