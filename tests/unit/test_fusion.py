"""knowledge/fusion.py's per-list scalings and the merge past the fused head: pure functions, no server."""

from __future__ import annotations

import itertools
import math

import pytest

from ragsidecar.knowledge.fusion import FUSIONS, FusionSettings, alternate, fuse, min_max, weighted_sum, z_scores

DENSE = [("a", 0.9), ("c", 0.85), ("b", 0.7)]
LEXICAL = [("c", 12.0), ("d", 6.0), ("e", 3.0)]


def test_min_max_maps_each_list_onto_zero_to_one() -> None:
    assert min_max(LEXICAL) == pytest.approx({"c": 1.0, "d": 1 / 3, "e": 0.0})
    assert min_max([("x", 5.0), ("y", 5.0)]) == {"x": 1.0, "y": 1.0}  # equal scores: each is the list's best
    assert min_max([("x", 0.2)]) == {"x": 1.0}  # a one-chunk source's hit, found by both lists, scores 1
    assert min_max([]) == {}


def test_z_scores_center_each_list_and_divide_by_its_spread() -> None:
    scaled = z_scores([("a", 0.9), ("b", 0.8), ("c", 0.7)])
    assert scaled["b"] == pytest.approx(0.0)
    assert scaled["a"] == pytest.approx(math.sqrt(1.5)) and scaled["c"] == pytest.approx(-math.sqrt(1.5))
    assert z_scores([("x", 2.0)]) == {"x": 0.0}


def test_a_candidate_one_list_lacks_gets_that_lists_lowest_scaled_score() -> None:
    fused = weighted_sum({"a": 1.0, "b": 0.0}, {"b": 2.0, "c": -1.0}, 0.25)
    assert fused == pytest.approx({"a": 0.25 * 1.0 + 0.75 * -1.0, "b": 0.75 * 2.0, "c": 0.25 * 0.0 + 0.75 * -1.0})
    assert weighted_sum({"a": 0.5}, {}, 0.5) == {"a": 0.25}


def test_a_candidate_missing_from_a_list_of_one_score_counts_below_its_members() -> None:
    # min_max scales a one-hit list to 1: the others, absent from it, get 0 there, not its lowest (1).
    fused = fuse([("a", 0.9), ("b", 0.85), ("c", 0.8)], [("b", 4.0)], FusionSettings("minmax", 0.5))
    assert fused == pytest.approx({"a": 0.5, "b": 0.5 * 0.5 + 0.5, "c": 0.0})


@pytest.mark.parametrize("method", ["minmax", "zscore"])
def test_scaled_fusions_let_a_strong_lexical_match_lead_and_agreement_win(method: str) -> None:
    fused = fuse(DENSE, LEXICAL, FusionSettings(method, 0.5))
    order = sorted(fused, key=lambda k: -fused[k])
    assert order[0] == "c"  # the lexical list's best, also in the dense list
    assert set(order) == set("abcde")
    dense_only = fuse(DENSE, LEXICAL, FusionSettings(method, 1.0))
    assert sorted(dense_only, key=lambda k: -dense_only[k])[:3] == ["a", "c", "b"]


def test_every_fusion_of_one_empty_list_follows_the_other() -> None:
    for method in FUSIONS:
        fused = fuse(DENSE, [], FusionSettings(method, 0.7))
        assert sorted(fused, key=lambda k: -fused[k]) == ["a", "c", "b"], method


def test_alternate_takes_a_rank_of_each_list_at_a_time_each_key_once() -> None:
    assert alternate(["a", "b", "c"], ["c", "d"]) == ["a", "c", "b", "d"]
    assert alternate([], ["x"]) == ["x"]
    assert alternate() == []


def test_alternating_deeper_lists_only_adds_keys_after_those_of_shallower_ones() -> None:
    dense, lexical = list("abcdefgh"), list("dzaybxcw")
    merges = [alternate(dense[:n], lexical[:n]) for n in range(len(dense) + 1)]
    for shallow, deep in itertools.pairwise(merges):
        assert deep[: len(shallow)] == shallow
