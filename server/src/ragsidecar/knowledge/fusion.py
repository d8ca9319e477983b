"""Fusion of a dense (cosine) and a lexical (BM25) candidate list into one score per candidate.

- "rrf": reciprocal rank fusion, both lists weighted equally (sum of 1 / (rrf_k + rank)); uses ranks only.
- "weighted_rrf": the same with weights `dense_weight` and 1 - `dense_weight`: a weak list drags less.
- "convex": `dense_weight` * scaled cosine + (1 - `dense_weight`) * scaled BM25, after Bruch, Gai and Ingber,
  "An Analysis of Fusion Functions for Hybrid Retrieval" (ACM TOIS, 2023, doi:10.1145/3596512), who find a
  convex combination of normalised scores beats RRF in and out of domain. Scaling is their theoretical min-max
  (TMM): (score - theoretical minimum) / (best score in the list - theoretical minimum), the minimum being -1
  for a cosine and 0 for BM25; unlike min-max over the list, it does not stretch a list of uniformly weak
  matches to span [0, 1]. A candidate missing from one list gets that side's minimum (scaled 0).
- "minmax" and "zscore": the same weighted sum over scores scaled per list, by min-max or z-score.
- "adaptive": "minmax" with a dense weight per query, from how spread the dense list's cosines are
  (`adaptive_dense_weight`): a dense list whose head stands far above its tail gets more weight.

`with_feedback` then blends in pseudo-relevance feedback (every method): each candidate's similarity to the best
`feedback_documents` fused candidates (their vectors' centroid, as the index computes it), with `feedback_weight`.

`combine_reranked` puts a reranker's relevance and the retrieval order together ([retrieval] rerank_fusion):
by reciprocal rank fusion of the two orders, or by `interpolate`, a convex combination of scaled scores.

Pure functions: the embedded index and the PostgreSQL store fuse alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

import numpy as np

from ragsidecar.config import FusionMethod, RerankFusion

K = TypeVar("K", bound=Hashable)

FUSIONS: tuple[str, ...] = get_args(FusionMethod)
COSINE_MIN = -1.0
BM25_MIN = 0.0
# The mean standard deviation of a 100-deep dense list's cosines (bge-small-en-v1.5) over the queries of the five
# development sets: "adaptive" gives such a list `dense_weight`.
TYPICAL_DENSE_SPREAD = 0.0235
# The cosines that spread is measured over, as it was measured; a shorter list (a source of fewer chunks, or
# fusion_candidates below it) says nothing comparable and gets `dense_weight`.
SPREAD_DEPTH = 100
# The adaptive weight stays within these: neither list is ever dropped, so an exact term match can still rise
# on a source whose dense list is widely spread (small sources are), and a cosine match on one whose is flat.
ADAPTIVE_WEIGHT_RANGE = (0.1, 0.9)
# Feedback needs a pool to separate. Over a handful of candidates the feedback documents are most of it, and
# min-max scaling their similarities stretches differences of rounding over [0, 1] (two candidates, equally
# similar to their own sum, scale to 0 and 1); a small source would reorder its hits at random and lose its lead
# when a search merges sources by score. Feedback was measured over pools of 100 to 200 candidates.
FEEDBACK_MIN_CANDIDATES = 100


@dataclass(frozen=True)
class FusionSettings:
    method: FusionMethod = "rrf"
    # Share of the dense list (every method but "rrf"); the lexical list gets the rest. Under "adaptive", the share
    # at the typical spread, raised by `spread_gain` per unit of standard deviation above it (lowered below it).
    dense_weight: float = 0.5
    rrf_k: int = 60
    spread_gain: float = 0.0
    # Pseudo-relevance feedback over the fused candidates (`with_feedback`): how many of the best stand for the
    # query's meaning (0: none, no feedback) and the weight of each candidate's similarity to them.
    feedback_documents: int = 0
    feedback_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in FUSIONS:
            raise ValueError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.method!r}")
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ValueError(f"dense_weight must be in [0, 1], got {self.dense_weight}")
        if self.rrf_k <= 0:
            raise ValueError(f"rrf_k must be positive, got {self.rrf_k}")
        if self.spread_gain < 0:
            raise ValueError(f"spread_gain must be at least 0, got {self.spread_gain}")
        if self.feedback_documents < 0:
            raise ValueError(f"feedback_documents must be at least 0, got {self.feedback_documents}")
        if not 0.0 <= self.feedback_weight <= 1.0:
            raise ValueError(f"feedback_weight must be in [0, 1], got {self.feedback_weight}")

    @property
    def feedback(self) -> bool:
        """Whether feedback is asked for: some documents give it with some weight."""
        return self.feedback_documents > 0 and self.feedback_weight > 0

    def feedback_on(self, candidates: int) -> bool:
        """Whether `with_feedback` applies to a search of this many fused candidates: asked for, and a pool of at
        least FEEDBACK_MIN_CANDIDATES."""
        return self.feedback and candidates >= FEEDBACK_MIN_CANDIDATES


def fuse(
    dense: Sequence[tuple[K, float]], lexical: Sequence[tuple[K, float]], settings: FusionSettings
) -> dict[K, float]:
    """The fused score of every candidate of either list; `dense` and `lexical` are best first, with their
    cosine and BM25 scores. Higher is better; ties are the caller's to break."""
    positions, lexical_at = _union([k for k, _ in dense], [k for k, _ in lexical])
    scores = fuse_scores(_scores_of(dense), _scores_of(lexical), lexical_at, len(positions), settings)
    return dict(zip(positions, scores.tolist(), strict=True))


def fuse_scores(
    dense: np.ndarray, lexical: np.ndarray, lexical_at: np.ndarray, count: int, settings: FusionSettings
) -> np.ndarray:
    """`fuse` over arrays, in a few numpy calls whatever the candidates (the index's search path: numpy lets go of
    the GIL where a loop per candidate would hold it). `dense` and `lexical` hold the lists' scores (float64,
    best first); the dense list's i-th candidate is candidate i, the lexical list's i-th candidate
    `lexical_at[i]`; `count` candidates in all. Each fused score equals `fuse`'s to the bit."""
    if settings.method == "convex":
        cosines, bm25 = _theoretical_min_max_of(dense, COSINE_MIN), _theoretical_min_max_of(lexical, BM25_MIN)
        return _weighted_sum(cosines, bm25, lexical_at, count, settings.dense_weight, (0.0, 0.0))
    if settings.method in ("rrf", "weighted_rrf"):
        weights = (1.0, 1.0) if settings.method == "rrf" else (settings.dense_weight, 1.0 - settings.dense_weight)
        fused = np.zeros(count)
        fused[: len(dense)] = weights[0] / (settings.rrf_k + np.arange(1, len(dense) + 1))
        fused[lexical_at] += weights[1] / (settings.rrf_k + np.arange(1, len(lexical) + 1))
        return fused
    weight = settings.dense_weight
    if settings.method == "adaptive":
        weight = adaptive_dense_weight(dense, settings.dense_weight, settings.spread_gain)
    scale = _z_scores_of if settings.method == "zscore" else _min_max_of
    dense_scaled, lexical_scaled = scale(dense), scale(lexical)
    floors = (_absent(dense_scaled), _absent(lexical_scaled))
    return _weighted_sum(dense_scaled, lexical_scaled, lexical_at, count, weight, floors)


def union(dense: np.ndarray, lexical: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidates of two lists of distinct integer keys, the dense list's first (in its order), then the
    lexical list's others (in theirs), and where each of the lexical list's is among them (`fuse_scores`'s
    `lexical_at`)."""
    if not len(dense):
        return lexical, np.arange(len(lexical), dtype=np.intp)
    order = np.argsort(dense, kind="stable")
    at = order[np.minimum(np.searchsorted(dense, lexical, sorter=order), len(dense) - 1)]
    found = dense[at] == lexical
    lexical_at = np.where(found, at, len(dense) - 1 + np.cumsum(~found))
    return np.concatenate((dense, lexical[~found])), lexical_at.astype(np.intp)


def _union(dense: Iterable[K], lexical: Iterable[K]) -> tuple[dict[K, int], np.ndarray]:
    """`union` for keys of any kind: each candidate's position, and where each of the lexical list's is."""
    positions = {k: i for i, k in enumerate(dense)}
    lexical_at = [positions.setdefault(k, len(positions)) for k in lexical]
    return positions, np.array(lexical_at, dtype=np.intp)


def _scores_of(scored: Sequence[tuple[Any, float]]) -> np.ndarray:
    return np.fromiter((score for _, score in scored), np.float64, len(scored))


def _weighted_sum(
    dense: np.ndarray,
    lexical: np.ndarray,
    lexical_at: np.ndarray,
    count: int,
    dense_weight: float,
    floors: tuple[float, float],
) -> np.ndarray:
    """dense_weight * dense + (1 - dense_weight) * lexical per candidate, a list's floor where it lacks one."""
    dense_full, lexical_full = np.full(count, floors[0]), np.full(count, floors[1])
    dense_full[: len(dense)] = dense
    lexical_full[lexical_at] = lexical
    return dense_weight * dense_full + (1.0 - dense_weight) * lexical_full


def with_feedback(fused: Mapping[K, float], similarity: Mapping[K, float], weight: float) -> dict[K, float]:
    """Pseudo-relevance feedback (Rocchio's idea over the candidates, not the collection): (1 - weight) * the
    min-max scaled fused score + weight * the min-max scaled `similarity` of each candidate to the best fused
    candidates (`similarity` holds every candidate of `fused`). What the top documents share beyond the query's
    own words or its embedding lifts the candidates that share it too: on the five development sets two documents
    at weight 0.5 raised nDCG@10 by 0.010 on the mean and lowered none (bench/beir.py). Both sides scaled over
    the candidates, the weight means what it says whatever the fusion's scale."""
    scores = np.fromiter(fused.values(), np.float64, len(fused))
    similarities = np.fromiter((similarity[k] for k in fused), np.float64, len(fused))
    return dict(zip(fused, _with_feedback(scores, similarities, weight).tolist(), strict=True))


def _with_feedback(fused: np.ndarray, similarity: np.ndarray, weight: float) -> np.ndarray:
    fused_low, fused_factor, fused_base = _scaling(fused, 1.0 - weight)
    similarity_low, similarity_factor, similarity_base = _scaling(similarity, weight)
    base = fused_base + similarity_base
    return base + fused_factor * (fused - fused_low) + similarity_factor * (similarity - similarity_low)


def fed_back(
    fused: dict[K, float],
    settings: FusionSettings,
    tiebreak: Callable[[K], Any],
    similarity: Callable[[list[K], list[K]], Sequence[float]],
) -> dict[K, float]:
    """`fused` with pseudo-relevance feedback when `settings.feedback_on` its candidates (else `fused` itself): the
    best `feedback_documents` candidates (ties: `tiebreak` ascending) are the feedback, and `similarity(best,
    keys)` gives each of `keys` its likeness to them (the index: the dot product with the sum of their vectors)."""
    if not settings.feedback_on(len(fused)):
        return fused
    keys = list(fused)
    scores = fed_back_scores(
        np.fromiter(fused.values(), np.float64, len(fused)),
        settings,
        lambda i: tiebreak(keys[i]),
        lambda best: np.array(similarity([keys[i] for i in best], keys), dtype=np.float64),
    )
    return dict(zip(keys, scores.tolist(), strict=True))


def fed_back_scores(
    fused: np.ndarray,
    settings: FusionSettings,
    tiebreak: Callable[[int], Any],
    similarity: Callable[[list[int]], np.ndarray],
) -> np.ndarray:
    """`fed_back` over an array of fused scores (candidates by position, as `fuse_scores` gives them):
    `similarity(best)` gives every candidate's likeness (float64) to the positions `best`."""
    if not settings.feedback_on(len(fused)):
        return fused
    count = min(settings.feedback_documents, len(fused))
    kth = np.partition(fused, len(fused) - count)[len(fused) - count]  # only those that can be among the best
    near = np.flatnonzero(fused >= kth).tolist()  # meet `tiebreak`
    best = sorted(near, key=lambda i: (-fused[i], tiebreak(i)))[:count]
    return _with_feedback(fused, similarity(best), settings.feedback_weight)


def _scaling(values: np.ndarray, weight: float) -> tuple[float, float, float]:
    """(low, factor, base) with weight * min_max(value) = base + factor * (value - low) over `values` (not empty;
    all equal: each scales to 1, as min_max has it)."""
    low, high = float(values.min()), float(values.max())
    return (low, weight / (high - low), 0.0) if high > low else (low, 0.0, weight)


def adaptive_dense_weight(cosines: Sequence[float] | np.ndarray, dense_weight: float, spread_gain: float) -> float:
    """The dense list's weight for one query: `dense_weight` + `spread_gain` * (the standard deviation of its
    first SPREAD_DEPTH cosines - TYPICAL_DENSE_SPREAD), within ADAPTIVE_WEIGHT_RANGE; `dense_weight` for a shorter
    list. The spread of a retrieval list's scores predicts how well it ranks (Perez-Iglesias and Araujo, "Standard
    deviation as a query hardness estimator", SPIRE 2010): a dense list whose best hits stand clear of the rest
    is trusted more. It depends on the candidate list alone (always `fusion_candidates` deep), so the weight,
    like the fused head, is the same for every `top_k`."""
    if len(cosines) < SPREAD_DEPTH:
        return dense_weight
    _, spread = _mean_and_deviation(np.asarray(cosines[:SPREAD_DEPTH], dtype=np.float64))
    low, high = ADAPTIVE_WEIGHT_RANGE
    return min(high, max(low, dense_weight + spread_gain * (spread - TYPICAL_DENSE_SPREAD)))


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[K]], rrf_k: int = 60, weights: Sequence[float] | None = None
) -> dict[K, float]:
    """Sum over the rankings of weight / (rrf_k + rank), rank 1-based: items high in several lists win."""
    fused: dict[K, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings), strict=True):
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + weight / (rrf_k + rank)
    return fused


def weighted_sum(dense: Mapping[K, float], lexical: Mapping[K, float], dense_weight: float) -> dict[K, float]:
    """dense_weight * dense + (1 - dense_weight) * lexical over scaled scores; a candidate one list lacks gets
    that list's `_absent` score."""
    positions, lexical_at = _union(dense, lexical)
    dense_scores = np.fromiter(dense.values(), np.float64, len(dense))
    lexical_scores = np.fromiter(lexical.values(), np.float64, len(lexical))
    floors = (_absent(dense_scores), _absent(lexical_scores))
    scores = _weighted_sum(dense_scores, lexical_scores, lexical_at, len(positions), dense_weight, floors)
    return dict(zip(positions, scores.tolist(), strict=True))


def _absent(scaled: np.ndarray) -> float:
    """The scaled score of a candidate a list lacks: the list's lowest, or 0 when its candidates all share one
    score (none, or one: min_max scales each to 1). Ranked below every candidate of the list, it must not tie
    with them: a memory of near-identical notes searched for one note's identifier ("parcel zq3x1") found that note
    alone in the BM25 list, and when its lowest counted for the others too the identifier weighed nothing."""
    if not len(scaled):
        return 0.0
    low, high = float(scaled.min()), float(scaled.max())
    return low if low < high else 0.0


def min_max(scored: Sequence[tuple[K, float]]) -> dict[K, float]:
    """Scores mapped to [0, 1]: the list's lowest to 0, its best to 1. When they are all equal (a list of one
    among them), each is the list's best: 1. Scoring them 0 would put a one-chunk source's only hit, found by
    both lists, below every other source's hits when a search merges sources by score."""
    return dict(zip([k for k, _ in scored], _min_max_of(_scores_of(scored)).tolist(), strict=True))


def _min_max_of(scores: np.ndarray) -> np.ndarray:
    if not len(scores):
        return scores
    low, high = float(scores.min()), float(scores.max())
    return np.ones(len(scores)) if high == low else (scores - low) / (high - low)


def z_scores(scored: Sequence[tuple[K, float]]) -> dict[K, float]:
    """(score - the list's mean) / its standard deviation (all 0 when the scores are equal)."""
    return dict(zip([k for k, _ in scored], _z_scores_of(_scores_of(scored)).tolist(), strict=True))


def _z_scores_of(scores: np.ndarray) -> np.ndarray:
    if not len(scores):
        return scores
    mean, spread = _mean_and_deviation(scores)
    return (scores - mean) / spread if spread > 0 else np.zeros(len(scores))


def _mean_and_deviation(values: np.ndarray) -> tuple[float, float]:
    """The values' mean and (population) standard deviation; `values` is not empty. Summed in order (cumsum),
    as Python's sum does, not pairwise (np.sum): the same bits as before they were arrays."""
    mean = float(np.cumsum(values)[-1]) / len(values)
    return mean, math.sqrt(float(np.cumsum(np.square(values - mean))[-1]) / len(values))


def theoretical_min_max(scored: Sequence[tuple[K, float]], floor: float) -> dict[K, float]:
    """Scores mapped to [0, 1]: the theoretical minimum `floor` to 0, the list's best score to 1."""
    return dict(zip([k for k, _ in scored], _theoretical_min_max_of(_scores_of(scored), floor).tolist(), strict=True))


def _theoretical_min_max_of(scores: np.ndarray, floor: float) -> np.ndarray:
    if not len(scores):
        return scores
    span = float(scores.max()) - floor
    return (np.maximum(scores, floor) - floor) / span if span > 0 else np.zeros(len(scores))


def alternate(*rankings: Sequence[K]) -> list[K]:
    """The rankings merged a rank at a time (the first of each, then the second of each, ...), each key once,
    where it first appears. A longer ranking only adds keys after those of a shorter one's: the merge of the
    first n of each is a prefix of the merge of the first n + 1."""
    merged: dict[K, None] = {}
    for rank in range(max(map(len, rankings), default=0)):
        for ranking in rankings:
            if rank < len(ranking):
                merged.setdefault(ranking[rank])
    return list(merged)


def combine_reranked(
    retrieval: Sequence[float], relevance: Mapping[int, float], method: RerankFusion, rerank_weight: float
) -> list[tuple[int, float]]:
    """The final order of hits given in retrieval order, as (position, score) pairs best first. `retrieval`
    holds every hit's retrieval (fused) score, `relevance` the reranker's relevance by position of the hits
    reranked (the head); hits past the rerank depth follow the head in retrieval order.

    "rrf": reciprocal rank fusion of the reranker's order and the retrieval order (the former default: on
    the stemmed, dense-weighted hybrid it lowers nDCG@10 on SciFact, Cranfield and MED; bench/beir.py). Hits not
    reranked keep their retrieval rank in the reranker's list too, so 2/(k + rank) puts them below every
    reranked hit.
    "interpolate" (the default): `interpolate` with `rerank_weight`; with a small weight the cross-encoder
    (ms-marco, trained on web questions) only reorders what the retrieval leaves close, the one combination
    measured never below rerank off on the three sets."""
    count = len(retrieval)
    if method == "rrf":
        by_relevance = sorted(relevance, key=lambda i: (-relevance[i], i))
        reranker_order = by_relevance + [i for i in range(count) if i not in relevance]
        fused = reciprocal_rank_fusion([reranker_order, range(count)])
        return [(i, fused[i]) for i in sorted(fused, key=lambda i: -fused[i])]  # ties: the reranker's order
    scores = interpolate([relevance.get(i) for i in range(count)], retrieval, rerank_weight)
    head = sorted(relevance, key=lambda i: (-scores[i], i))  # ties: retrieval order
    return [(i, scores[i]) for i in head] + [(i, scores[i]) for i in range(count) if i not in relevance]


def interpolate(relevance: Sequence[float | None], retrieval: Sequence[float], rerank_weight: float) -> list[float]:
    """Per hit, rerank_weight * scaled relevance + (1 - rerank_weight) * scaled retrieval score.

    `relevance` is None for a hit past the rerank depth. Both sides are min-max scaled over the reranked hits:
    neither has bounds that hold for every reranker and every fusion, and over the head both span [0, 1], so
    the weight means what it says. A hit not reranked counts as the least relevant (scaled 0); as its retrieval
    score is at most the head's lowest, its score is at most 0, below every reranked hit but a tie at 0."""
    if len(relevance) != len(retrieval):
        raise ValueError(f"{len(relevance)} relevance scores for {len(retrieval)} retrieval scores")
    head = [(r, s) for r, s in zip(relevance, retrieval, strict=True) if r is not None]
    if not head:
        return [0.0] * len(retrieval)
    scale_relevance, scale_retrieval = _min_max([r for r, _ in head]), _min_max([s for _, s in head])
    return [
        rerank_weight * (0.0 if r is None else scale_relevance(r)) + (1.0 - rerank_weight) * scale_retrieval(s)
        for r, s in zip(relevance, retrieval, strict=True)
    ]


def _min_max(scores: Sequence[float]) -> Callable[[float], float]:
    """Maps the scores' minimum to 0 and maximum to 1 (everything to 0 when they are equal: no evidence)."""
    low, span = min(scores), max(scores) - min(scores)
    return lambda score: (score - low) / span if span > 0 else 0.0
