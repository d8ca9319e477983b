"""How a cross-encoder's time is best spent on the fused first stage: depth, document tokens per pair, and a
cascade (a cheap pass over a deep pool with each document cut to its first tokens, then the full pass on the
head), chosen by leave-one-set-out cross-validation over the five sets.

The first stage is bench/beir.py's: each query's dense and lexical lists as the sidecar gives them (cached in
bench/results/lists-*.json by `bench/beir.py`), fused in-process exactly as HybridIndex.search does with the
configured fusion. The cross-encoder is the product's (load_model, CrossEncoder.score, max_document_tokens for
the cut): each sampled query's top --depth documents are scored once per cut (--caps), its top --full-depth
whole (cap 0), plus whatever a cut pass lifts into a whole pass's head; raw logits are cached in
bench/results/cascade-*.json. Every plan is then computed offline as knowledge/ranking.py runs its passes, with
knowledge/fusion.py's combine_reranked. Each leave-one-set-out fold picks the best mean on the other sets among
the plans below rerank off on none of them.

--latency-queries N also times each plan's cross-encoder passes in-process (the server's inference settings,
plans interleaved query by query); --search D,T,H,W also times Search at top_k 10 through a sidecar configured
with that plan (a cut pass of D documents to T tokens, none when D is 0, then H whole, at rerank_weight W;
0,0,3,0.15 is the default) beside rerank off and 10 whole documents, interleaved.

    .venv/bin/python bench/rerank_cascade.py [--sets scifact,cranfield,med,npl,lisa] [--queries 40] [--depth 40]
                                             [--full-depth 20] [--caps 64,0] [--latency-queries 8]
                                             [--search 0,0,3,0.15] [--search-sets cranfield,med,lisa]

Writes bench/results/rerank_cascade.md (cap 0: the whole document, as far as the model's max_length holds).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import msgspec

from ragsidecar.inference.models import load_model
from ragsidecar.knowledge.fusion import combine_reranked

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import beir  # noqa: E402 - importable once bench/ is on sys.path

RESULTS = REPO / "bench" / "results"
WEIGHTS = (0.1, 0.15, 0.2, 0.3)
FULL_DEPTHS = (0, 3, 5, 10, 20)
CHEAP_DEPTHS = (0, 5, 10, 15, 20, 30, 40)


def score_all(sets: list[beir.Listed], samples: dict[str, list[str]], depths: dict[int, int], config) -> None:
    """Caches raw logits of every sampled query's top `depths[cap]` at each cap (0: uncut; seeded from the
    scores bench/beir.py cached at the configured max_length)."""
    spec = next(m for m in config.models if m.id == beir.RERANKER)
    inference = msgspec.structs.replace(config.inference, workers=2, intra_op_threads=1, inter_op_threads=1)
    loop = asyncio.new_event_loop()  # the model's batching queue lives on one loop
    model = None
    for listed in sets:
        first = listed.first_stage(beir.configured(config).first)
        for cap, depth in depths.items():
            path = cache_path(listed.data.name, cap, depth)
            table = json.loads(path.read_text()) if path.is_file() else {}
            if cap == 0:
                for q, scored in seeded(listed, first, depth, config, samples[listed.data.name]).items():
                    table[q] = scored | table.get(q, {})
            missing = {
                q: [d for d, _ in first[q][:depth] if d not in table.get(q, {})] for q in samples[listed.data.name]
            }
            missing = {q: docs for q, docs in missing.items() if docs}
            if missing and model is None:
                model = loop.run_until_complete(load_model(spec, config.model_dir(spec), inference))
            started = time.perf_counter()
            for q, docs in missing.items():
                batch = loop.run_until_complete(
                    model.score(listed.data.queries[q], [listed.texts[d] for d in docs], cap or None, False, None)
                )
                table.setdefault(q, {}).update({d: s.raw for d, s in zip(docs, batch.scores, strict=True)})
            path.write_text(json.dumps(table))
            pairs = sum(map(len, missing.values()))
            print(
                f"  [{listed.data.name}] cap {cap}: {pairs} pairs in {time.perf_counter() - started:.0f} s",
                flush=True,
            )


def complete_heads(sets, samples, firsts, tables, candidates, depth: int, full_depth: int, config) -> None:
    """Scores uncut the documents a cheap pass lifts into a full pass's head from below `full_depth`."""
    spec = next(m for m in config.models if m.id == beir.RERANKER)
    loop = asyncio.new_event_loop()
    model = None
    for listed in sets:
        name = listed.data.name
        full = tables[name][0]
        for q in samples[name]:
            first = firsts[name][q][:depth]
            logits = {cap: table[q] for cap, table in tables[name].items()}
            heads = {
                d
                for plan in candidates
                if plan.cheap_depth and plan.full_depth
                for d in ranking(first, logits, dataclasses.replace(plan, full_depth=0))[: plan.full_depth]
            }
            missing = sorted(heads - set(full[q]))
            if missing:
                if model is None:
                    model = loop.run_until_complete(load_model(spec, config.model_dir(spec), config.inference))
                batch = loop.run_until_complete(
                    model.score(listed.data.queries[q], [listed.texts[d] for d in missing], None, False, None)
                )
                full[q].update({d: s.raw for d, s in zip(missing, batch.scores, strict=True)})
        cache_path(name, 0, full_depth).write_text(json.dumps(full))
    if model is not None:
        loop.run_until_complete(model.close())


def seeded(listed: beir.Listed, first: dict, depth: int, config, sample: list[str]) -> dict[str, dict[str, float]]:
    """The sampled queries whose whole head bench/beir.py already scored uncut."""
    max_length = next(m.max_length for m in config.models if m.id == beir.RERANKER)
    path = beir.RESULTS / f"ce-{listed.data.name}-{beir.RERANKER}-L{max_length}-truncate.json"
    known = json.loads(path.read_text()) if path.is_file() else {}
    heads = {q: [d for d, _ in first[q][:depth]] for q in sample}
    return {q: {d: known[q][d] for d in head} for q, head in heads.items() if all(d in known.get(q, {}) for d in head)}


def cache_path(name: str, cap: int, depth: int) -> Path:
    return RESULTS / f"cascade-{name}-{beir.RERANKER}-cap{cap}-d{depth}.json"


@dataclasses.dataclass(frozen=True)
class CascadePlan:
    cheap_depth: int  # 0: no cheap pass
    cheap_tokens: int
    full_depth: int  # 0: no full pass
    weight: float

    def passes(self) -> list[tuple[int, int]]:
        """(depth, document-token cap; 0 uncut) of each pass, in order."""
        cheap = [(self.cheap_depth, self.cheap_tokens)] if self.cheap_depth else []
        return cheap + ([(self.full_depth, 0)] if self.full_depth else [])


def ranking(first: list[tuple[str, float]], logits: dict[int, dict[str, float]], plan: CascadePlan) -> list[str]:
    """One query's final order under the plan, from cached logits per cap: each pass interpolates its relevance
    into the order the pass before left (as knowledge/ranking.py does)."""
    hits = list(first)
    for depth, cap in plan.passes():
        relevance = {i: beir.sigmoid(logits[cap][d]) for i, (d, _) in enumerate(hits[:depth])}
        order = combine_reranked([s for _, s in hits], relevance, "interpolate", plan.weight)
        hits = [(hits[i][0], score) for i, score in order]
    return [d for d, _ in hits]


def plans(cheap_caps: list[int]) -> list[CascadePlan]:
    found = []
    for weight in WEIGHTS:
        for depth in FULL_DEPTHS[1:]:
            found.append(CascadePlan(0, 0, depth, weight))
        for cheap_depth, cap, full_depth in itertools.product(CHEAP_DEPTHS[1:], cheap_caps, FULL_DEPTHS):
            if full_depth < cheap_depth:
                found.append(CascadePlan(cheap_depth, cap, full_depth, weight))
    return found


def label(plan: CascadePlan) -> str:
    cheap = f"cheap {plan.cheap_depth}x{plan.cheap_tokens}" if plan.cheap_depth else "no cheap pass"
    full = f"full {plan.full_depth}" if plan.full_depth else "no full pass"
    return f"{cheap}, {full}, w {plan.weight:g}"


def rerank_seconds(model, loop, query: str, texts: list[str], plan: CascadePlan) -> float:
    """Wall time of the plan's passes for one query (each pass over the first-stage head: the same work as over
    the head the pass before leaves)."""
    started = time.perf_counter()
    for depth, cap in plan.passes():
        loop.run_until_complete(model.score(query, texts[:depth], cap or None, False, None))
    return time.perf_counter() - started


def time_plans(sets: list[beir.Listed], plans: list[CascadePlan], count: int, config) -> dict[CascadePlan, float]:
    """p50 (ms) of each plan's cross-encoder time, in-process with the server's inference settings, the plans
    interleaved query by query (a noisy machine slows them alike) over `count` queries per set."""
    spec = next(m for m in config.models if m.id == beir.RERANKER)
    loop = asyncio.new_event_loop()
    model = loop.run_until_complete(load_model(spec, config.model_dir(spec), config.inference))
    times: dict[CascadePlan, list[float]] = {plan: [] for plan in plans}
    for listed in sets:
        first = listed.first_stage(beir.configured(config).first)
        for n, q in enumerate(beir.spread(list(listed.data.queries), count)):
            texts = [listed.texts[d] for d, _ in first[q][:50]]
            for plan in plans[n % len(plans) :] + plans[: n % len(plans)]:
                times[plan].append(rerank_seconds(model, loop, listed.data.queries[q], texts, plan))
    loop.run_until_complete(model.close())
    return {plan: 1000 * statistics.median(t) for plan, t in times.items()}


def search_p50(sets: list[str], plan: CascadePlan, count: int) -> dict[str, float]:
    """p50 (ms) of Search at top_k 10 through a sidecar configured with `plan` (inference cache off), beside
    rerank off and beside 10 whole documents reranked (rerank_order RERANKER at depth 10: the work of 0.2.0's
    default rerank, which no cascade precedes), the three interleaved query by query."""
    sidecar = beir.BenchSidecar(
        {
            "rerank_candidates": plan.cheap_depth or plan.full_depth,
            "rerank_document_tokens": plan.cheap_tokens if plan.cheap_depth else 0,
            "rerank_head_candidates": plan.full_depth if plan.cheap_depth else 0,
            "rerank_weight": plan.weight,
        }
    )
    variants = {
        "off": {},
        "depth 10, whole": {"rerank": True, "rerank_depth": 10, "rerank_order": beir.pb.RERANK_ORDER_RERANKER},
        label(plan): {"rerank": True},
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        stub = beir.retrieval_pb2_grpc.RetrievalServiceStub(sidecar.get().channel())
        for name in sets:
            data = beir.read_collection(name)
            beir.search(stub, data, "warm-up", 1, rerank=True)
            for text in beir.spread(list(data.queries.values()), count):
                for variant, options in variants.items():
                    started = time.perf_counter()
                    beir.search(stub, data, text, 10, **options)
                    times[variant].append(time.perf_counter() - started)
    finally:
        sidecar.stop()
    return {variant: 1000 * statistics.median(t) for variant, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="scifact,cranfield,med,npl,lisa")
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--depth", type=int, default=40, help="documents scored by the cut passes")
    parser.add_argument("--full-depth", type=int, default=20, help="documents scored uncut")
    parser.add_argument("--caps", default="64,32,0,128")
    parser.add_argument("--latency-queries", type=int, default=0, help="per set, for the in-process timing")
    parser.add_argument("--search", default="", help="a plan cheap_depth,cheap_tokens,full_depth,weight to time")
    parser.add_argument("--search-sets", default="cranfield,med,lisa", help="sets whose index the bench built")
    args = parser.parse_args()
    config = beir.load_config(beir.REPO / "config" / "ragsidecar.toml")
    caps = [int(c) for c in args.caps.split(",")]
    embedder = beir.Embedder(config)  # the first stage's feedback: one cached vector per document
    sets = [beir.Listed(beir.read_collection(name), None, config, embedder) for name in args.sets.split(",")]
    embedder.close()
    samples = {s.data.name: beir.spread(list(s.data.queries), args.queries) for s in sets}
    depths = {cap: args.depth if cap else args.full_depth for cap in caps}
    score_all(sets, samples, depths, config)
    tables = {
        s.data.name: {cap: json.loads(cache_path(s.data.name, cap, depth).read_text()) for cap, depth in depths.items()}
        for s in sets
    }
    firsts = {s.data.name: s.first_stage(beir.configured(config).first) for s in sets}

    def quality(plan: CascadePlan | None, listed: beir.Listed) -> float:
        name = listed.data.name
        run = {}
        for q in samples[name]:
            first = firsts[name][q][: args.depth]
            if plan is None:
                run[q] = [d for d, _ in first]
            else:
                run[q] = ranking(first, {cap: tables[name][cap][q] for cap in caps}, plan)
        return beir.evaluate(run, listed.data.qrels)[0] if run else 0.0

    candidates = plans([c for c in caps if c])
    complete_heads(sets, samples, firsts, tables, candidates, args.depth, args.full_depth, config)
    off = {s.data.name: quality(None, s) for s in sets}
    grid = {plan: {s.data.name: quality(plan, s) for s in sets} for plan in candidates}
    names = [s.data.name for s in sets]
    lines = [f"# Rerank cascade ({args.queries} queries per set, top {args.depth} scored)", ""]
    lines += ["| plan | " + " | ".join(names) + " | mean | gain | worst set |", "|---" * (len(names) + 4) + "|"]
    base = statistics.fmean(off.values())
    lines.append("| off | " + " | ".join(f"{off[n]:.3f}" for n in names) + f" | {base:.3f} | | |")
    ranked_plans = sorted(candidates, key=lambda p: -statistics.fmean(grid[p].values()))
    # The best plans, then reference points: whole documents at each depth and weight, and the cut passes alone.
    reference = [CascadePlan(0, 0, d, w) for d in FULL_DEPTHS[1:] for w in WEIGHTS]
    reference += [CascadePlan(d, c, 0, w) for d in (20, 40) for c in caps if c for w in (0.1, 0.2)]
    for plan in list(dict.fromkeys(ranked_plans[:20] + [p for p in reference if p in grid])):
        row = grid[plan]
        mean = statistics.fmean(row.values())
        worst = min(row[n] - off[n] for n in names)
        lines.append(
            f"| {label(plan)} | "
            + " | ".join(f"{row[n]:.3f}" for n in names)
            + f" | {mean:.3f} | {mean - base:+.3f} | {worst:+.3f} |"
        )
    lines += [
        "",
        "## Leave one set out (each fold: the best mean on four sets among the plans below off on none of them)",
        "",
        "| held out | picked on the other four | off | picked | gain |",
    ]
    lines.append("|---|---|---|---|---|")
    for held in names:
        train = [n for n in names if n != held]
        # The bar on the training sets: the best mean among the plans below rerank off on none of them.
        safe = [p for p in candidates if all(grid[p][n] >= off[n] for n in train)] or candidates
        pick = max(safe, key=lambda p: (statistics.fmean(grid[p][n] for n in train), -p.full_depth))
        lines.append(
            f"| {held} | {label(pick)} | {off[held]:.3f} | {grid[pick][held]:.3f} | "
            f"{grid[pick][held] - off[held]:+.3f} |"
        )
    if args.latency_queries:
        baseline = CascadePlan(0, 0, 10, 0.1)
        singles = [CascadePlan(0, 0, d, 0.1) for d in (3, 5, 10, 20)]
        cut = [CascadePlan(d, c, 0, 0.1) for d, c in itertools.product((20, 40), [c for c in caps if c])]
        best = [p for p in ranked_plans if p.cheap_depth and p.full_depth][:4]
        curve = list(dict.fromkeys([baseline, *singles, *cut, *best]))
        timed = time_plans(sets, curve, args.latency_queries, config)
        lines += [
            "",
            f"## Cross-encoder time per query (in-process, p50 of {args.latency_queries} queries per set, "
            f"load average {os.getloadavg()[0]:.1f})",
            "",
            "| plan | p50 ms | against depth 10 whole | mean nDCG@10 (w as labelled; cut rows w 0.1) | gain |",
            "|---|---|---|---|---|",
        ]
        for plan in curve:
            mean = statistics.fmean(grid[plan].values()) if plan in grid else float("nan")
            lines.append(
                f"| {label(plan)} | {timed[plan]:.0f} | {timed[plan] / timed[baseline]:.2f}x | {mean:.3f} | "
                f"{mean - base:+.3f} |"
            )
    if args.search:
        cheap_depth, cheap_tokens, full_depth, weight = args.search.split(",")
        plan = CascadePlan(int(cheap_depth), int(cheap_tokens), int(full_depth), float(weight))
        p50 = search_p50(args.search_sets.split(","), plan, args.latency_queries or 5)
        lines += [
            "",
            f"## Search at top_k 10 ({args.search_sets}, {args.latency_queries or 5} queries each, interleaved; "
            f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores)",
            "",
            "| rerank | p50 ms | against depth 10 whole |",
            "|---|---|---|",
        ]
        lines += [f"| {name} | {ms:.0f} | {ms / p50['depth 10, whole']:.2f}x |" for name, ms in p50.items()]
    report = "\n".join(lines)
    print(report)
    (RESULTS / "rerank_cascade.md").write_text(report + "\n")


if __name__ == "__main__":
    main()
