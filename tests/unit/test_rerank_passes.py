"""The passes of a FUSED rerank (knowledge/ranking.py's rerank_passes); through the server in
tests/test_rerank_cascade.py."""

from __future__ import annotations

import pytest

from ragsidecar.knowledge.ranking import RerankPass, rerank_passes


def test_a_deeper_cascade_adds_a_cut_pass_before_the_full_pass() -> None:
    assert rerank_passes(10, 40, 32) == [RerankPass(40, 32), RerankPass(10, None)]


@pytest.mark.parametrize("cascade_candidates", [0, 5, 10])
def test_a_cascade_no_deeper_than_the_full_pass_is_no_pass(cascade_candidates: int) -> None:
    assert rerank_passes(10, cascade_candidates, 32) == [RerankPass(10, None)]
