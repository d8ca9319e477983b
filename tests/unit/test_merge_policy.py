"""The BM25 side's tiered merge policy (knowledge/merge_policy.py), alone: which segments merge, and when."""

from __future__ import annotations

from ragsidecar.knowledge.merge_policy import SegmentSize, TieredMergePolicy

POLICY = TieredMergePolicy(fanout=2, base=100, dead_share=0.5)


def test_a_tier_merges_its_two_smallest_segments_once_it_holds_two() -> None:
    assert POLICY.due([SegmentSize(1, 40, 0)]) == []
    assert POLICY.due([SegmentSize(1, 40, 0), SegmentSize(2, 10, 0), SegmentSize(3, 30, 0)]) == [[2, 3]]


def test_tiers_span_the_fanout_and_lower_tiers_merge_first() -> None:
    assert [POLICY.tier(SegmentSize(0, n, 0)) for n in (99, 100, 199, 200, 400)] == [0, 1, 1, 2, 3]
    sizes = [SegmentSize(1, 150, 0), SegmentSize(2, 120, 0), SegmentSize(3, 5, 0), SegmentSize(4, 6, 0)]
    assert POLICY.due(sizes) == [[3, 4], [2, 1]]


def test_a_segment_counts_its_live_postings_and_a_mostly_dead_one_is_rewritten_alone_first() -> None:
    assert POLICY.tier(SegmentSize(1, 250, 200)) == 0  # 50 live
    sizes = [SegmentSize(1, 250, 200), SegmentSize(2, 60, 0)]
    assert POLICY.due(sizes) == [[1], [2, 1]]
    assert POLICY.due([SegmentSize(1, 100, 50)]) == []  # half dead is not mostly dead
