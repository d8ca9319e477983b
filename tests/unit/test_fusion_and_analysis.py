"""Retrieval quality's pure functions: the lexical analysis (terms, languages, BM25 over stemmed words), the fusion
of the dense and BM25 lists, and the combination of reranker and retrieval. No server, no models."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragsidecar.knowledge.fusion import (
    ADAPTIVE_WEIGHT_RANGE,
    FEEDBACK_MIN_CANDIDATES,
    SPREAD_DEPTH,
    TYPICAL_DENSE_SPREAD,
    FusionSettings,
    adaptive_dense_weight,
    combine_reranked,
    fed_back,
    fuse,
    interpolate,
    min_max,
    theoretical_min_max,
    weighted_sum,
    with_feedback,
)
from ragsidecar.knowledge.lexical import LANGUAGES, Lexical, terms

# ---- the analysis ---------------------------------------------------------------------------------------


def test_terms_stem_and_drop_stopwords_and_none_keeps_the_words() -> None:
    assert terms(["The lab RUNS a study", "running studies"], "english") == [["lab", "run", "studi"], ["run", "studi"]]
    assert terms(["The lab RUNS a study", "running studies"], "none") == [
        ["lab", "runs", "study"],
        ["running", "studies"],
    ]
    assert terms(["Die Kinder spielten im Garten"], "german") == [["kind", "spielt", "gart"]]
    assert "english" in LANGUAGES and "none" in LANGUAGES


def test_terms_refuse_an_unknown_language() -> None:
    with pytest.raises(ValueError, match="klingon.*english"):
        terms(["text"], "klingon")


def test_lexical_matches_inflections_only_when_stemmed(tmp_path: Path) -> None:
    texts = ["The sleep lab runs a study of night shifts.", "Bread needs flour, water and an oven."]
    assert Lexical.build(texts, "english").top("running studies", 5)[0][0] == 0
    assert Lexical.build(texts, "none").top("running studies", 5) == []
    Lexical.build(texts, "english").save(tmp_path / "bm25")
    assert Lexical.load(tmp_path / "bm25", "english").top("studies", 5)[0][0] == 0


# ---- fusion ---------------------------------------------------------------------------------------------

DENSE = [("a", 0.9), ("b", 0.5), ("c", 0.1)]
LEXICAL = [("c", 12.0), ("d", 6.0)]


def test_rrf_sums_reciprocal_ranks_with_equal_weights() -> None:
    fused = fuse(DENSE, LEXICAL, FusionSettings())
    assert fused == pytest.approx({"a": 1 / 61, "b": 1 / 62, "c": 1 / 63 + 1 / 61, "d": 1 / 62})


def test_weighted_rrf_at_the_extremes_is_one_list_and_at_a_half_orders_as_rrf() -> None:
    def order(fused: dict[str, float]) -> list[str]:
        return sorted(fused, key=lambda k: -fused[k])

    assert order(fuse(DENSE, LEXICAL, FusionSettings("weighted_rrf", 1.0)))[:3] == ["a", "b", "c"]
    assert order(fuse(DENSE, LEXICAL, FusionSettings("weighted_rrf", 0.0)))[:2] == ["c", "d"]
    assert order(fuse(DENSE, LEXICAL, FusionSettings("weighted_rrf", 0.5))) == order(
        fuse(DENSE, LEXICAL, FusionSettings())
    )


def test_convex_scales_cosine_from_minus_one_and_bm25_from_zero_missing_counts_as_the_minimum() -> None:
    fused = fuse(DENSE, LEXICAL, FusionSettings("convex", 0.25))
    cosine = {k: (s + 1) / (0.9 + 1) for k, s in DENSE}
    bm25 = {"c": 1.0, "d": 0.5}
    assert fused == pytest.approx({k: 0.25 * cosine.get(k, 0) + 0.75 * bm25.get(k, 0) for k in "abcd"})
    assert theoretical_min_max([("x", 3.0)], 0.0) == {"x": 1.0}
    assert theoretical_min_max([("x", -1.0)], -1.0) == {"x": 0.0}  # nothing above the minimum: no evidence


def test_fusion_of_one_empty_list_follows_the_other() -> None:
    for settings in (
        FusionSettings(),
        FusionSettings("weighted_rrf", 0.7),
        FusionSettings("convex", 0.7),
        FusionSettings("adaptive", 0.7, spread_gain=30.0),
    ):
        fused = fuse(DENSE, [], settings)
        assert sorted(fused, key=lambda k: -fused[k]) == ["a", "b", "c"]


def spread_of(deviation: float) -> list[float]:
    """Cosines whose (population) standard deviation is `deviation`: half at 0.8 + it, half at 0.8 - it."""
    return [0.8 + deviation, 0.8 - deviation] * 50


def test_the_adaptive_dense_weight_rises_with_the_spread_of_the_cosines_within_its_range() -> None:
    assert adaptive_dense_weight(spread_of(TYPICAL_DENSE_SPREAD), 0.6, 30.0) == pytest.approx(0.6)
    assert adaptive_dense_weight(spread_of(TYPICAL_DENSE_SPREAD + 0.005), 0.6, 30.0) == pytest.approx(0.75)
    assert adaptive_dense_weight(spread_of(TYPICAL_DENSE_SPREAD - 0.005), 0.6, 30.0) == pytest.approx(0.45)
    assert adaptive_dense_weight(spread_of(0.1), 0.6, 30.0) == ADAPTIVE_WEIGHT_RANGE[1]  # BM25 is never dropped
    assert adaptive_dense_weight([0.7] * SPREAD_DEPTH, 0.6, 30.0) == ADAPTIVE_WEIGHT_RANGE[0]  # nor dense
    assert adaptive_dense_weight(spread_of(0.1), 0.6, 0.0) == 0.6
    # Measured over the first SPREAD_DEPTH cosines only; a shorter list gets the configured weight.
    assert adaptive_dense_weight(spread_of(TYPICAL_DENSE_SPREAD) + [0.0] * 50, 0.6, 30.0) == pytest.approx(0.6)
    assert adaptive_dense_weight(spread_of(0.1)[: SPREAD_DEPTH - 1], 0.6, 30.0) == 0.6
    assert adaptive_dense_weight([], 0.6, 30.0) == 0.6


def test_adaptive_fusion_is_minmax_at_the_weight_its_dense_list_earns() -> None:
    wide = [(f"d{i}", 0.8 + 0.03 * (-1) ** i - i * 1e-6) for i in range(SPREAD_DEPTH)]
    lexical = [("d3", 9.0), ("e", 3.0)]
    weight = adaptive_dense_weight([s for _, s in wide], 0.5, 10.0)
    assert weight > 0.5
    fused = fuse(wide, lexical, FusionSettings("adaptive", 0.5, spread_gain=10.0))
    assert fused == pytest.approx(weighted_sum(min_max(wide), min_max(lexical), weight))
    assert fuse(wide, lexical, FusionSettings("adaptive", 0.5)) == fuse(wide, lexical, FusionSettings("minmax", 0.5))


@pytest.mark.parametrize(
    "settings",
    [
        dict(method="max"),
        dict(dense_weight=1.5),
        dict(dense_weight=-0.1),
        dict(rrf_k=0),
        dict(spread_gain=-1.0),
        dict(feedback_documents=-1),
        dict(feedback_weight=1.5),
    ],
)
def test_fusion_settings_refuse_what_they_cannot_mean(settings: dict) -> None:
    with pytest.raises(ValueError):
        FusionSettings(**settings)


def test_feedback_blends_scaled_fused_scores_with_scaled_similarity_to_the_best() -> None:
    fused = {"a": 0.9, "b": 0.5, "c": 0.4, "d": 0.1}
    similarity = {"a": 2.0, "b": 0.4, "c": 1.6, "d": 0.0}
    blended = with_feedback(fused, similarity, 0.5)
    assert blended == pytest.approx({"a": 1.0, "b": 0.5 * 0.5 + 0.5 * 0.2, "c": 0.5 * 0.375 + 0.5 * 0.8, "d": 0.0})
    assert sorted(blended, key=blended.get, reverse=True) == ["a", "c", "b", "d"]  # c resembles a: it passes b
    assert with_feedback(fused, similarity, 0.0) == pytest.approx(min_max(list(fused.items())))
    alike = with_feedback(fused, dict.fromkeys(fused, 0.3), 0.5)  # all alike: each similarity scales to 1
    assert alike == pytest.approx({k: 0.5 * v + 0.5 for k, v in min_max(list(fused.items())).items()})


def test_fed_back_takes_the_best_candidates_ties_by_tiebreak_and_leaves_a_small_pool_alone() -> None:
    fused = {f"d{i:03}": 1.0 - i / 1000 for i in range(FEEDBACK_MIN_CANDIDATES)} | {"a": 1.0}
    asked: list[list[str]] = []

    def similarity(best: list[str], keys: list[str]) -> list[float]:
        asked.append(best)
        return [1.0 if k == "d050" else 0.0 for k in keys]

    settings = FusionSettings("minmax", feedback_documents=2, feedback_weight=0.5)
    blended = fed_back(fused, settings, lambda k: k, similarity)
    assert asked == [["a", "d000"]]  # tied at 1.0: "a" before "d000"
    assert blended == pytest.approx(with_feedback(fused, {k: float(k == "d050") for k in fused}, 0.5))
    small = dict(list(fused.items())[:10])
    assert fed_back(small, settings, lambda k: k, similarity) is small and len(asked) == 1


def test_feedback_is_on_only_with_documents_and_weight_over_a_pool_of_candidates() -> None:
    assert FusionSettings(feedback_documents=2, feedback_weight=0.5).feedback_on(FEEDBACK_MIN_CANDIDATES)
    assert not FusionSettings(feedback_documents=2, feedback_weight=0.5).feedback_on(FEEDBACK_MIN_CANDIDATES - 1)
    assert not FusionSettings(feedback_documents=0, feedback_weight=0.5).feedback_on(FEEDBACK_MIN_CANDIDATES)
    assert not FusionSettings(feedback_documents=2, feedback_weight=0.0).feedback_on(FEEDBACK_MIN_CANDIDATES)


def test_interpolation_scales_both_sides_over_the_head_and_keeps_the_tail_below() -> None:
    relevance, retrieval = [0.2, 0.9, 0.5, None, None], [0.05, 0.04, 0.03, 0.02, 0.01]
    assert interpolate(relevance, retrieval, 1.0)[:3] == pytest.approx([0.0, 1.0, 3 / 7])
    assert interpolate(relevance, retrieval, 0.0)[:3] == pytest.approx([1.0, 0.5, 0.0])
    half = interpolate(relevance, retrieval, 0.5)
    assert half == pytest.approx([0.5, 0.75, 3 / 14, -0.25, -0.5])
    assert max(half[3:]) <= min(half[:3])
    assert interpolate([None, None], [0.3, 0.2], 0.5) == [0.0, 0.0]
    with pytest.raises(ValueError):
        interpolate([0.1], [0.1, 0.2], 0.5)


def test_combining_the_reranked_head_with_retrieval_keeps_the_tail_in_retrieval_order() -> None:
    retrieval, relevance = [0.05, 0.04, 0.03, 0.02, 0.01], {0: 0.2, 1: 0.9, 2: 0.5}
    rrf = combine_reranked(retrieval, relevance, "rrf", 0.5)
    assert [i for i, _ in rrf] == [1, 0, 2, 3, 4]  # 1: ranks 1 and 2; 0: ranks 3 and 1; 2: ranks 2 and 3
    assert rrf[0][1] == pytest.approx(1 / 61 + 1 / 62)
    assert [i for i, _ in combine_reranked(retrieval, relevance, "interpolate", 1.0)] == [1, 2, 0, 3, 4]
    assert [i for i, _ in combine_reranked(retrieval, relevance, "interpolate", 0.0)] == [0, 1, 2, 3, 4]
    for method in ("rrf", "interpolate"):
        scores = [score for _, score in combine_reranked(retrieval, relevance, method, 0.5)]
        assert scores == sorted(scores, reverse=True)
