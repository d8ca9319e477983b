"""Fusion of a dense (cosine) and a lexical (BM25) candidate list into one score per candidate.

- "rrf": reciprocal rank fusion, both lists weighted equally (sum of 1 / (rrf_k + rank)); uses ranks only.
- "weighted_rrf": the same with weights `dense_weight` and 1 - `dense_weight`: a weak list drags less.
- "convex": `dense_weight` * scaled cosine + (1 - `dense_weight`) * scaled BM25, after Bruch, Gai and Ingber,
  "An Analysis of Fusion Functions for Hybrid Retrieval" (ACM TOIS, 2023, doi:10.1145/3596512), who find a
  convex combination of normalised scores beats RRF in and out of domain. Scaling is their theoretical min-max
  (TMM): (score - theoretical minimum) / (best score in the list - theoretical minimum), the minimum being -1
  for a cosine and 0 for BM25; unlike min-max over the list, it does not stretch a list of uniformly weak
  matches to span [0, 1]. A candidate missing from one list gets that side's minimum (scaled 0).

Pure functions: the embedded index and the PostgreSQL store fuse alike.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

K = TypeVar("K", bound=Hashable)

FUSIONS = ("rrf", "weighted_rrf", "convex")
COSINE_MIN = -1.0
BM25_MIN = 0.0


@dataclass(frozen=True)
class FusionSettings:
    method: Literal["rrf", "weighted_rrf", "convex"] = "rrf"
    # Share of the dense list ("weighted_rrf", "convex"); the lexical list gets the rest.
    dense_weight: float = 0.5
    rrf_k: int = 60

    def __post_init__(self) -> None:
        if self.method not in FUSIONS:
            raise ValueError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.method!r}")
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ValueError(f"dense_weight must be in [0, 1], got {self.dense_weight}")
        if self.rrf_k <= 0:
            raise ValueError(f"rrf_k must be positive, got {self.rrf_k}")


def fuse(dense: Sequence[tuple[K, float]], lexical: Sequence[tuple[K, float]],
         settings: FusionSettings) -> dict[K, float]:
    """The fused score of every candidate of either list; `dense` and `lexical` are best first, with their
    cosine and BM25 scores. Higher is better; ties are the caller's to break."""
    if settings.method == "convex":
        return convex_combination(dense, lexical, settings.dense_weight)
    weights = (1.0, 1.0) if settings.method == "rrf" else (settings.dense_weight, 1.0 - settings.dense_weight)
    return reciprocal_rank_fusion([[k for k, _ in dense], [k for k, _ in lexical]], settings.rrf_k, weights)


def reciprocal_rank_fusion(rankings: Sequence[Sequence[K]], rrf_k: int = 60,
                           weights: Sequence[float] | None = None) -> dict[K, float]:
    """Sum over the rankings of weight / (rrf_k + rank), rank 1-based: items high in several lists win."""
    fused: dict[K, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings), strict=True):
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + weight / (rrf_k + rank)
    return fused


def convex_combination(dense: Sequence[tuple[K, float]], lexical: Sequence[tuple[K, float]],
                       dense_weight: float) -> dict[K, float]:
    """dense_weight * TMM-scaled cosine + (1 - dense_weight) * TMM-scaled BM25 (missing: scaled 0)."""
    cosines, bm25 = theoretical_min_max(dense, COSINE_MIN), theoretical_min_max(lexical, BM25_MIN)
    return {k: dense_weight * cosines.get(k, 0.0) + (1.0 - dense_weight) * bm25.get(k, 0.0)
            for k in [*cosines, *bm25]}


def theoretical_min_max(scored: Sequence[tuple[K, float]], floor: float) -> dict[K, float]:
    """Scores mapped to [0, 1]: the theoretical minimum `floor` to 0, the list's best score to 1."""
    if not scored:
        return {}
    span = max(score for _, score in scored) - floor
    return {k: (max(score, floor) - floor) / span if span > 0 else 0.0 for k, score in scored}
