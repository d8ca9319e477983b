"""Cut documents and the rerank cascade through the real server: a FUSED rerank scores each document's first
retrieval.rerank_document_tokens tokens, then the new top retrieval.rerank_head_candidates whole
(knowledge/ranking.py; rerank_passes is tested in tests/unit/test_rerank_passes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from retrieval_helpers import PRINCIPAL, SCOPE, entry, retrieval_config, target, write_documents
from sidecar import Sidecar

from ragsidecar.v1 import reranker_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

# The late volcano document holds its answer past its first CUT tokens: only the full pass sees it.
DOCUMENTS = {
    "late.md": "Minutes of the town council on parking permits, school holidays and the library budget for next "
    "year. Magma rises through the vent of a volcano; an eruption throws lava and ash over the crater.",
    "ash.md": "Volcanic ash from the eruption closed the airport; flights waited for the crater to calm.",
    "bread.md": "Sourdough bread needs flour, water, yeast, a long knead and a hot oven for its crust.",
    "sailing.md": "The sail, the mast and the keel keep the boat steady when the wind and the tide turn.",
    "chess.md": "A gambit in the chess opening gives up a pawn so that bishop and knight develop quickly.",
    "garden.md": "Tomato seedlings need compost, mulch and careful watering in the greenhouse.",
}
UNRELATED = ("bread.md", "sailing.md", "chess.md", "garden.md")
QUERY = "what comes out of a volcano when it erupts"
CUT = 8
POOL, HEAD = 6, 2
DOCS = entry("docs", "DIRECTORY", "SEARCH", "docs")


@pytest.fixture(scope="module")
def cascading(tmp_path_factory: pytest.TempPathFactory) -> Sidecar:
    root = tmp_path_factory.mktemp("cascade-knowledge")
    write_documents(root / "docs", DOCUMENTS)
    # The packaged reranker: how far the late document's relevance falls when cut is the model's doing.
    config = retrieval_config(root, tmp_path_factory.mktemp("data"), packaged=True)
    config["retrieval"].update(
        rerank_candidates=POOL, rerank_document_tokens=CUT, rerank_head_candidates=HEAD, rerank_weight=0.5
    )
    sidecar = Sidecar(tmp_path_factory.mktemp("cascade"), config)
    yield sidecar.start()
    sidecar.stop()


def relevance(server: Sidecar, texts: dict[str, str], cap: int | None) -> dict[str, float]:
    """Each text's relevance to the query from the Rerank RPC, cut to `cap` tokens (None: whole)."""
    documents = [reranker_pb2.RerankDocument(id=name, text=text) for name, text in texts.items()]
    request = reranker_pb2.RerankRequest(query=QUERY, documents=documents, max_document_tokens=cap)
    return {r.id: r.relevance_score for r in server.reranker().Rerank(request, timeout=120).results}


def test_the_cut_pass_scores_the_pool_and_the_head_pass_rescores_the_head_whole(cascading: Sidecar) -> None:
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=target([DOCS]),
        query=QUERY,
        top_k=POOL,
        search=pb.SearchOptions(rerank=True),
    )
    response = retrieval_pb2_grpc.RetrievalServiceStub(cascading.channel()).Search(request, timeout=120)
    names = [Path(h.provenance.file).name for h in response.hits]
    assert sorted(names) == sorted(DOCUMENTS) and response.usage.pairs == POOL + HEAD

    texts = {name: hit.text for name, hit in zip(names, response.hits, strict=True)}
    cut, whole = relevance(cascading, texts, CUT), relevance(cascading, texts, None)
    # The late document's answer lies past the cut: cut, it looks no better than an unrelated text; whole, far better.
    unrelated = max(whole[n] for n in UNRELATED)
    assert cut["late.md"] < 2 * max(cut[n] for n in UNRELATED) and whole["late.md"] > 20 * unrelated
    scored = {name: hit.scores.rerank for name, hit in zip(names, response.hits, strict=True)}
    # The head carries the full pass's relevance, the rest of the pool the cheap pass's.
    assert {n: scored[n] for n in names[:HEAD]} == pytest.approx({n: whole[n] for n in names[:HEAD]}, abs=1e-6)
    assert {n: scored[n] for n in names[HEAD:]} == pytest.approx({n: cut[n] for n in names[HEAD:]}, abs=1e-6)
    # Both volcano documents stay in the head, and the whole late document now ranks by its answer.
    assert set(names[:HEAD]) == {"late.md", "ash.md"}
    assert [h.score for h in response.hits] == sorted((h.score for h in response.hits), reverse=True)
