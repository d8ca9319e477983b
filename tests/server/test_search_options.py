"""SearchOptions' rerank depth, grouping by document and retrieval mode, through the real server (real files,
embedder and reranker) on a corpus generated here: several multi-chunk documents on distinct topics."""

from __future__ import annotations

import random

import grpc
import pytest
from retrieval_helpers import PRINCIPAL, SCOPE, entry, llm, params, retrieval_config, target
from sidecar import Sidecar, error_details

from ragsidecar.v1 import retrieval_pb2 as pb
from ragsidecar.v1 import retrieval_pb2_grpc

TOPICS = {
    "volcanoes": "volcano magma eruption lava crater ash basalt caldera pyroclastic vent",
    "gardening": "garden soil compost seedling tomato pruning mulch watering harvest greenhouse",
    "astronomy": "telescope galaxy nebula orbit planet comet stellar redshift supernova eclipse",
    "baking": "dough yeast oven flour bread crust knead sourdough pastry butter",
    "sailing": "sail wind mast hull keel harbour tide knot rudder anchor",
    "chess": "chess opening bishop knight endgame gambit checkmate pawn rook castling",
}
# A word no model has seen: a lexical search finds it exactly, whatever the dense vectors make of it.
RARE = "zorblaxite"
QUERY = "how does magma reach the crater during a volcano eruption"


def _document(topic: str, words: str, rng: random.Random) -> str:
    """About 700 words on one topic: several chunks of one file, so that chunks of a document crowd the hits."""
    vocabulary = words.split()
    sentences = [
        f"{rng.choice(vocabulary).capitalize()} and {rng.choice(vocabulary)} matter in {topic}, "
        f"where the {rng.choice(vocabulary)} meets the {rng.choice(vocabulary)}."
        for _ in range(60)
    ]
    return "\n\n".join(" ".join(sentences[i : i + 6]) for i in range(0, len(sentences), 6))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Sidecar:
    root = tmp_path_factory.mktemp("options-knowledge")
    docs = root / "docs"
    docs.mkdir()
    rng = random.Random(13)
    for topic, words in TOPICS.items():
        (docs / f"{topic}.md").write_text(_document(topic, words, rng), encoding="utf-8")
    (docs / "minerals.md").write_text(f"A mineral named {RARE} was catalogued in a quarry ledger.\n", encoding="utf-8")
    config = retrieval_config(root, tmp_path_factory.mktemp("data"))
    config["retrieval"]["fusion_candidates"] = 8  # below the chunks: a top_k of 10 or more reaches past the fused head
    sidecar = Sidecar(tmp_path_factory.mktemp("options"), config)
    yield sidecar.start()
    sidecar.stop()


DOCS = entry("docs", "DIRECTORY", "SEARCH", "docs")


def search(server: Sidecar, query: str = QUERY, top_k: int = 5, **options) -> pb.SearchResponse:
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=target([DOCS]),
        query=query,
        top_k=top_k,
        search=pb.SearchOptions(**options),
    )
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).Search(request, timeout=120)


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    return caught.value


def fields(err: grpc.RpcError) -> set[str]:
    return {field for field, _ in error_details(err)[1]}


def test_a_rerank_depth_below_top_k_gives_the_reranked_head_then_the_rest_in_retrieval_order(server) -> None:
    retrieval = [h.chunk_id for h in search(server, top_k=100).hits]
    assert len(retrieval) > 12  # every chunk of the corpus: more hits than the depth and the default candidates
    response = search(server, top_k=100, rerank=True, rerank_depth=4)
    hits = response.hits
    assert len(hits) == len(retrieval)
    assert {h.chunk_id for h in hits[:4]} == set(retrieval[:4])
    assert [h.chunk_id for h in hits[4:]] == retrieval[4:]
    assert all(h.scores.HasField("rerank") for h in hits[:4])
    assert not any(h.scores.HasField("rerank") for h in hits[4:])
    assert response.usage.pairs == 4  # only the head was reranked
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_a_rerank_depth_above_top_k_reranks_that_many_and_keeps_the_best(server) -> None:
    response = search(server, top_k=3, rerank=True, rerank_depth=10)
    assert response.usage.pairs == 10
    assert len(response.hits) == 3 and all(h.scores.HasField("rerank") for h in response.hits)


def test_rerank_depth_conflicts_are_refused(server) -> None:
    # candidates stays tied to top_k, as before; rerank_depth is not
    refused(lambda: search(server, top_k=10, rerank=True, candidates=4))
    refused(lambda: search(server, top_k=10, rerank=True, candidates=12, rerank_depth=12))
    refused(lambda: search(server, top_k=10, rerank=True, rerank_depth=0))
    # under the reranker's own order, hits past the depth would have no relevance to be ranked by
    refused(lambda: search(server, top_k=10, rerank=True, rerank_depth=4, rerank_order=pb.RERANK_ORDER_RERANKER))
    assert len(search(server, top_k=4, rerank=True, rerank_depth=4, rerank_order=pb.RERANK_ORDER_RERANKER).hits) == 4


def test_grouping_gives_each_documents_best_chunk_and_top_k_counts_documents(server) -> None:
    chunks = search(server, top_k=100).hits
    assert len({h.provenance.file for h in chunks[:5]}) < 5  # ungrouped, one document's chunks crowd the head
    first_of_each = list(dict.fromkeys(h.provenance.file for h in chunks))
    grouped = search(server, top_k=5, group_by_document=True).hits
    assert [h.provenance.file for h in grouped] == first_of_each[:5]
    best = {}
    for hit in chunks:
        best.setdefault(hit.provenance.file, hit.chunk_id)
    assert [h.chunk_id for h in grouped] == [best[h.provenance.file] for h in grouped]
    reranked = search(server, top_k=3, group_by_document=True, rerank=True, rerank_depth=5)
    assert len({h.provenance.file for h in reranked.hits}) == 3 and reranked.usage.pairs == 5


def test_enforce_uses_the_entrys_options(server) -> None:
    stub = retrieval_pb2_grpc.RetrievalServiceStub(server.channel())

    def enforce(options: pb.SearchOptions) -> pb.EnforceResponse:
        docs = entry("docs", "DIRECTORY", "SEARCH", "docs", top_k=4, search=options)
        request = pb.EnforceRequest(
            principal=PRINCIPAL,
            scope=SCOPE,
            target=target([docs], {"answer": ["docs"]}),
            action="answer",
            params=params(question=QUERY),
            llm=llm(),
        )
        return stub.Enforce(request, timeout=120)

    chunks = enforce(pb.SearchOptions()).blocks[0].chunks
    grouped = enforce(pb.SearchOptions(group_by_document=True)).blocks[0].chunks
    assert len({c.provenance.file for c in chunks}) < 4
    assert len(grouped) == 4 and len({c.provenance.file for c in grouped}) == 4
    dense = enforce(pb.SearchOptions(retrieval_mode=pb.RETRIEVAL_MODE_DENSE)).blocks[0].chunks
    assert dense and not any(c.scores.HasField("bm25") for c in dense)
    err = refused(lambda: enforce(pb.SearchOptions(retrieval_mode=7)))
    assert "target.knowledge[0].search.retrieval_mode" in fields(err)


def test_lexical_mode_finds_the_exact_rare_word_and_dense_mode_has_no_bm25(server) -> None:
    lexical = search(server, query=f"{RARE} ledger", top_k=10, retrieval_mode=pb.RETRIEVAL_MODE_LEXICAL).hits
    assert [h.provenance.file for h in lexical] == ["docs/minerals.md"]  # only chunks holding a query term
    assert lexical[0].scores.HasField("bm25") and RARE in lexical[0].text
    dense = search(server, query=f"{RARE} ledger", top_k=10, retrieval_mode=pb.RETRIEVAL_MODE_DENSE).hits
    assert len(dense) == 10 and not any(h.scores.HasField("bm25") for h in dense)
    hybrid = search(server, query=f"{RARE} ledger", top_k=10, retrieval_mode=pb.RETRIEVAL_MODE_HYBRID).hits
    assert hybrid == search(server, query=f"{RARE} ledger", top_k=10).hits  # unspecified is hybrid
    assert any(h.scores.HasField("bm25") for h in hybrid) and not all(h.scores.HasField("bm25") for h in hybrid)


def test_an_unknown_retrieval_mode_is_refused(server) -> None:
    err = refused(lambda: search(server, retrieval_mode=99))
    assert "search.retrieval_mode" in fields(err)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"group_by_document": True},
        {"rerank": True},
        {"rerank": True, "group_by_document": True},
        {"retrieval_mode": pb.RETRIEVAL_MODE_LEXICAL},
    ],
    ids=["hybrid", "grouped", "reranked", "reranked-grouped", "lexical"],
)
def test_the_first_hits_are_the_same_for_every_top_k(server, options: dict) -> None:
    longest = search(server, top_k=100, **options)
    assert longest.hits  # lexical: the chunks sharing a word with the query; else every chunk or document
    for top_k in (1, 3, 10, 12):
        response = search(server, top_k=top_k, **options)
        assert [h.chunk_id for h in response.hits] == [h.chunk_id for h in longest.hits[:top_k]], top_k
        assert response.usage.pairs == longest.usage.pairs  # the same head reranked, whatever top_k is
