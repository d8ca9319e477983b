"""The passes of a FUSED rerank (knowledge/ranking.py's rerank_passes); through the server in
tests/server/test_rerank_cascade.py."""

from __future__ import annotations

import pytest

from ragsidecar.knowledge.ranking import RerankPass, rerank_passes


def test_cut_documents_then_the_head_whole() -> None:
    assert rerank_passes(40, 32, 10) == [RerankPass(40, 32), RerankPass(10, None)]


@pytest.mark.parametrize("head_candidates", [0, 40, 50])
def test_a_head_pass_not_inside_the_depth_is_no_pass(head_candidates: int) -> None:
    assert rerank_passes(40, 32, head_candidates) == [RerankPass(40, 32)]


def test_uncut_documents_need_no_head_pass() -> None:
    assert rerank_passes(20, 0, 5) == [RerankPass(20, None)]
