"""Retrieval quality settings: the lexical analysis' language, the fusion of the dense and BM25 lists and the
combination of reranker and retrieval, through the real server (real files, MEMORY documents, embedder and
reranker) on a small corpus of one-chunk documents written here; the pure functions and the settings' bounds are
tested in tests/unit/test_fusion_and_analysis.py and tests/unit/test_quality_settings.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from retrieval_helpers import PRINCIPAL, SCOPE, entry, retrieval_config, target, write_documents
from sidecar import Sidecar

from ragsidecar.knowledge.fusion import FEEDBACK_MIN_CANDIDATES
from ragsidecar.v1 import retrieval_pb2 as pb
from ragsidecar.v1 import retrieval_pb2_grpc

# ---- through the server ---------------------------------------------------------------------------------

DOCUMENTS = {
    "study.md": "The sleep lab runs a study of night shifts and how nurses rest between them.",
    "volcano.md": "Magma rises through the vent of a volcano; an eruption throws lava and ash over the crater.",
    "garden.md": "Tomato seedlings need compost, mulch and careful watering in the greenhouse.",
    "telescope.md": "A telescope shows a distant galaxy and a comet crossing the orbit of a planet.",
    "bread.md": "Sourdough bread needs flour, water, yeast, a long knead and a hot oven for its crust.",
    "sailing.md": "The sail, the mast and the keel keep the boat steady when the wind and the tide turn.",
    "chess.md": "A gambit in the chess opening gives up a pawn so that bishop and knight develop quickly.",
    "ash.md": "Volcanic ash from the eruption closed the airport; flights waited for the crater to calm.",
}
STEMMED_QUERY = "running studies"  # shares no word with study.md as written, both stems
QUERY = "what comes out of a volcano when it erupts"
DOCS = entry("docs", "DIRECTORY", "SEARCH", "docs")
NOTES = entry("notes", "MEMORY", "SEARCH")


@pytest.fixture(scope="module")
def knowledge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("quality-knowledge")
    write_documents(root / "docs", DOCUMENTS)
    return root


def quality_sidecar(workdir: Path, knowledge: Path, data: Path, **retrieval: object) -> Sidecar:
    config = retrieval_config(knowledge, data, packaged=True)  # what these settings do to real models' rankings
    config["retrieval"].update(retrieval)
    workdir.mkdir(parents=True, exist_ok=True)
    return Sidecar(workdir, config)


def started_sidecar(tmp_path_factory: pytest.TempPathFactory, knowledge: Path, **retrieval: object) -> Sidecar:
    """A running sidecar of its own over `knowledge`, with these [retrieval] settings."""
    workdir, data = tmp_path_factory.mktemp("quality"), tmp_path_factory.mktemp("data")
    return quality_sidecar(workdir, knowledge, data, **retrieval).start()


@pytest.fixture(scope="module")
def english(tmp_path_factory: pytest.TempPathFactory, knowledge: Path) -> Sidecar:
    sidecar = quality_sidecar(
        tmp_path_factory.mktemp("english"),
        knowledge,
        tmp_path_factory.mktemp("data"),
        lexical_language="english",
        fusion="rrf",
        rerank_fusion="rrf",
    )
    yield sidecar.start()
    sidecar.stop()


def search(
    server: Sidecar, query: str = QUERY, top_k: int = 8, source: pb.KnowledgeEntry = DOCS, **options
) -> list[pb.RetrievedChunk]:
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=target([source]),
        query=query,
        top_k=top_k,
        search=pb.SearchOptions(**options),
    )
    return list(retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).Search(request, timeout=120).hits)


def files(hits: list[pb.RetrievedChunk]) -> list[str]:
    return [Path(h.provenance.file).name for h in hits]


def lexical_files(server: Sidecar, query: str, source: pb.KnowledgeEntry = DOCS) -> list[str]:
    return files(search(server, query, source=source, retrieval_mode=pb.RETRIEVAL_MODE_LEXICAL))


def test_a_stemmed_query_finds_other_forms_of_its_words_in_files_and_memory(english: Sidecar) -> None:
    assert lexical_files(english, STEMMED_QUERY) == ["study.md"]
    hybrid = search(english, STEMMED_QUERY)
    assert files(hybrid)[0] == "study.md" and hybrid[0].scores.HasField("bm25")

    documents = [pb.MemoryDocument(id=name, text=text) for name, text in DOCUMENTS.items()]
    stub = retrieval_pb2_grpc.RetrievalServiceStub(english.channel())
    stub.UpsertDocuments(
        pb.UpsertDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge="notes", documents=documents), timeout=120
    )
    found = search(english, STEMMED_QUERY, source=NOTES, retrieval_mode=pb.RETRIEVAL_MODE_LEXICAL)
    assert [h.text for h in found] == [DOCUMENTS["study.md"]]


def test_changing_the_language_rebuilds_the_index_and_none_analyses_as_before(tmp_path: Path, knowledge: Path) -> None:
    data = tmp_path / "data"
    unstemmed = quality_sidecar(tmp_path / "none", knowledge, data, lexical_language="none").start()
    try:
        assert lexical_files(unstemmed, STEMMED_QUERY) == []
        assert lexical_files(unstemmed, "runs study") == ["study.md"]  # the words as written
    finally:
        unstemmed.stop()
    assert _languages(data) == ["none"]

    stemmed = quality_sidecar(tmp_path / "english", knowledge, data, lexical_language="english").start()
    try:
        assert lexical_files(stemmed, STEMMED_QUERY) == ["study.md"]  # the unstemmed index was not reused
        assert stemmed.metric("ragsidecar_index_loads_total", how="built") == 1
        assert stemmed.metric("ragsidecar_index_loads_total", how="disk") == 0
    finally:
        stemmed.stop()
    assert sorted(_languages(data)) == ["english", "none"]


def _languages(data: Path) -> list[str]:
    """The lexical language of each index persisted under the data folder."""
    manifests = (data / "indexes").glob("*/manifest.json")
    return [json.loads(m.read_text(encoding="utf-8"))["lexical_language"] for m in manifests]


def _order(hits: list[pb.RetrievedChunk]) -> list[str]:
    return [h.chunk_id for h in hits]


def _descending(hits: list[pb.RetrievedChunk]) -> bool:
    scores = [h.score for h in hits]
    return scores == sorted(scores, reverse=True)


def test_rrf_fuses_dense_and_lexical_and_reranks_by_fused_ranks(english: Sidecar) -> None:
    dense = _order(search(english, retrieval_mode=pb.RETRIEVAL_MODE_DENSE))
    lexical = _order(search(english, retrieval_mode=pb.RETRIEVAL_MODE_LEXICAL))
    assert dense[: len(lexical)] != lexical  # the two lists disagree: fusion has something to decide
    hybrid = search(english)
    assert _descending(hybrid) and set(_order(hybrid)) == set(dense)
    assert all(h.scores.fused == pytest.approx(h.score) for h in hybrid)
    reranked = search(english, rerank=True, rerank_depth=8)
    assert _descending(reranked) and all(h.scores.HasField("rerank") for h in reranked)


def test_weighted_rrf_and_convex_weigh_the_lists_and_interpolation_weighs_the_reranker(
    tmp_path_factory: pytest.TempPathFactory, knowledge: Path, english: Sidecar
) -> None:
    dense = _order(search(english, retrieval_mode=pb.RETRIEVAL_MODE_DENSE))
    lexical = _order(search(english, retrieval_mode=pb.RETRIEVAL_MODE_LEXICAL))
    retrieval = _order(search(english))
    reranker = _order(search(english, rerank=True, rerank_depth=8, rerank_order=pb.RERANK_ORDER_RERANKER))
    assert reranker != retrieval  # the reranker disagrees with the retrieval order: interpolation decides

    def started(**retrieval_settings: object) -> Sidecar:
        # Without feedback: each list's own order at the extreme weights.
        return started_sidecar(
            tmp_path_factory, knowledge, lexical_language="english", feedback_documents=0, **retrieval_settings
        )

    # All lexical weight: BM25's order first, then the dense-only candidates; the reranker alone orders the head.
    lexical_first = started(fusion="weighted_rrf", dense_weight=0.0, rerank_fusion="interpolate", rerank_weight=1.0)
    try:
        hybrid = search(lexical_first)
        assert _order(hybrid)[: len(lexical)] == lexical and _descending(hybrid) and _order(hybrid) != retrieval
        reranked = search(lexical_first, rerank=True, rerank_depth=8)
        assert _order(reranked) == reranker and _descending(reranked)
        assert reranked[0].score == pytest.approx(1.0)
    finally:
        lexical_first.stop()

    # All dense weight: the cosine order; no reranker weight: the reranked head keeps the retrieval order.
    dense_first = started(fusion="convex", dense_weight=1.0, rerank_fusion="interpolate", rerank_weight=0.0)
    try:
        hybrid = search(dense_first)
        assert _order(hybrid) == dense and _descending(hybrid)
        assert 0 <= hybrid[-1].score <= hybrid[0].score == pytest.approx(1.0)  # scaled scores
        reranked = search(dense_first, rerank=True, rerank_depth=5)
        assert _order(reranked) == dense and _descending(reranked)
        assert [h.scores.HasField("rerank") for h in reranked] == [True] * 5 + [False] * 3
    finally:
        dense_first.stop()


FEEDBACK_DOCUMENTS = {
    "eruption.md": "The volcano eruption threw lava, ash and glowing rock over the rim of the crater.",
    "magma.md": "Molten magma and pyroclastic flows poured down the mountain slopes and buried the villages below.",
    "applause.md": "An eruption of applause filled the concert hall when the orchestra finished the symphony.",
    "bread.md": DOCUMENTS["bread.md"],
    "chess.md": DOCUMENTS["chess.md"],
    "sailing.md": DOCUMENTS["sailing.md"],
}
PAPERWORK = ("ledger", "invoice", "spreadsheet", "payroll", "budget", "audit", "receipt", "tax form", "pension")


def test_feedback_lifts_what_resembles_the_best_hits_over_what_only_shares_a_query_word(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("feedback-knowledge")
    write_documents(root / "small", FEEDBACK_DOCUMENTS)
    notes = {  # a pool as deep as feedback needs
        f"note{i}.md": f"Filing note {i}: the {PAPERWORK[i % len(PAPERWORK)]} of account {1000 + i}, cabinet {i % 7}."
        for i in range(FEEDBACK_MIN_CANDIDATES)
    }
    write_documents(root / "large", FEEDBACK_DOCUMENTS | notes)
    small, large = entry("small", "DIRECTORY", "SEARCH", "small"), entry("large", "DIRECTORY", "SEARCH", "large")

    def started(**feedback: object) -> Sidecar:
        # All lexical weight: without feedback BM25's order leads, so a word match outranks any meaning.
        return started_sidecar(tmp_path_factory, root, fusion="weighted_rrf", dense_weight=0.0, **feedback)

    query = "volcano eruption"
    plain = started(feedback_documents=0)
    try:
        assert files(search(plain, query, source=large))[:2] == ["eruption.md", "applause.md"]
    finally:
        plain.stop()
    # With all the weight on feedback the best hit leads and the rest follow by how much they resemble it.
    resembling = started(feedback_documents=1, feedback_weight=1.0)
    try:
        hits = search(resembling, query, source=large)
        assert files(hits)[:2] == ["eruption.md", "magma.md"] and _descending(hits)
        assert "applause.md" not in files(hits)[:2]
        assert _order(search(resembling, query, top_k=3, source=large)) == _order(hits)[:3]  # whatever top_k is
        # Six documents are too few candidates for feedback: their order is the fusion's.
        assert files(search(resembling, query, source=small))[:2] == ["eruption.md", "applause.md"]
    finally:
        resembling.stop()


def test_an_identifier_finds_its_note_among_near_identical_notes(
    tmp_path_factory: pytest.TempPathFactory, knowledge: Path
) -> None:
    # The default fusion. Dense retrieval barely tells these notes apart; BM25 finds the identifier in one note
    # alone, and that single hit must outweigh a cosine a hair higher.
    server = started_sidecar(tmp_path_factory, knowledge)
    try:
        notes = {f"w{w}-{n}": f"Burst note: parcel zq{w}x{n} shipped from Leeds." for w in range(4) for n in range(6)}
        documents = [pb.MemoryDocument(id=doc_id, text=text) for doc_id, text in notes.items()]
        retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).UpsertDocuments(
            pb.UpsertDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge="notes", documents=documents),
            timeout=120,
        )
        first = {doc_id: search(server, text.split()[3], top_k=3, source=NOTES)[0] for doc_id, text in notes.items()}
        assert {doc_id: hit.provenance.document_id for doc_id, hit in first.items()} == {d: d for d in notes}
    finally:
        server.stop()
