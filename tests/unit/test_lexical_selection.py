"""The selection of a BM25 search's best scores (lexical._highest) against a plain sort, on score arrays large
enough for its sampled threshold, with ties, zeros and too few matches."""

from __future__ import annotations

import numpy as np
import pytest

from ragsidecar.knowledge.lexical import _highest


def expected(scores: np.ndarray, count: int) -> list[int]:
    positive = [i for i in range(len(scores)) if scores[i] > 0]
    return sorted(positive, key=lambda i: (-scores[i], i))[:count]


@pytest.mark.parametrize("matched_share", [0.0005, 0.01, 0.5, 1.0])
@pytest.mark.parametrize("count", [1, 10, 100])
def test_the_best_positive_scores_best_first(matched_share: float, count: int) -> None:
    rng = np.random.default_rng(int(matched_share * 1e4) + count)
    scores = np.zeros(100_000)
    matched = rng.choice(len(scores), int(len(scores) * matched_share), replace=False)
    # Few distinct values: many ties, which must fall to the lower position.
    scores[matched] = rng.integers(1, 50, len(matched)) / 7
    assert _highest(scores, count).tolist() == expected(scores, count)


def test_a_skewed_distribution_whose_sample_misses_the_head() -> None:
    """A handful of high scores the sample may not hold, above a sea of equal low ones."""
    scores = np.full(200_000, 0.5)
    scores[[3, 77_777, 199_999]] = [9.0, 8.0, 9.0]
    assert _highest(scores, 5).tolist() == [3, 199_999, 77_777, 0, 1]


def test_nothing_matched() -> None:
    assert _highest(np.zeros(50_000), 10).tolist() == []
