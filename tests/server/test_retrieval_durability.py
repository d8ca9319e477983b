"""Indexes survive restarts and crashes; changed sources re-embed only what changed; bad files are refused."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import grpc
import ir_data
import pytest
from retrieval_helpers import (
    BUILT,
    DISK,
    PRINCIPAL,
    SCOPE,
    entry,
    llm,
    load,
    params,
    retrieval_config,
    scifact_ids,
    target,
    write_abstracts,
)
from sidecar import error_details

from ragsidecar.v1 import retrieval_pb2 as pb
from ragsidecar.v1 import retrieval_pb2_grpc


def search(server, query: str, entries=None) -> pb.SearchResponse:
    """A search with the sources' files rescanned: an edit just made is searched without waiting for the watcher."""
    entries = entries or [entry("science", "DIRECTORY", "SEARCH", "science")]
    request = pb.SearchRequest(
        principal=PRINCIPAL, scope=SCOPE, target=target(entries), query=query, top_k=3, rescan=True
    )
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).Search(request, timeout=120)


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    root, data = tmp_path / "knowledge", tmp_path / "data"
    write_abstracts(root / "science", files=4, per_file=30)
    return root, data


def test_indexes_persist_and_only_changed_files_are_re_embedded(make_sidecar, folders) -> None:
    root, data = folders
    first = make_sidecar(retrieval_config(root, data)).start()
    assert load(first).counts[0].count == 120
    embedded = first.metric("ragsidecar_embedded_chunks_total")
    assert embedded >= 120 and first.metric("ragsidecar_index_loads_total", **BUILT) == 1
    query = ir_data.corpus("scifact")[scifact_ids()[5]][:200]
    expected = [h.chunk_id for h in search(first, query).hits]
    first.stop()

    second = make_sidecar(retrieval_config(root, data)).start()
    assert load(second).counts[0].count == 120
    assert second.metric("ragsidecar_index_loads_total", **DISK) == 1
    assert second.metric("ragsidecar_embedded_chunks_total") == 0  # read back, nothing embedded
    assert [h.chunk_id for h in search(second, query).hits] == expected

    with (root / "science" / "part3.jsonl").open("a") as out:
        out.write(json.dumps({"id": "new-doc", "text": "Zebrafish regenerate their heart after injury."}) + "\n")
    search(second, "zebrafish")  # rescans: the load below then finds the updated index
    assert load(second).counts[0].count == 121
    assert second.metric("ragsidecar_embedded_chunks_total") == 1  # only the new record's chunk
    # The superseded index left the disk with the new one in place.
    assert len([p for p in (data / "indexes").iterdir() if not p.name.startswith(".")]) == 1
    assert search(second, "can zebrafish regrow heart tissue?").hits[0].provenance.document_id == "new-doc"


def test_a_source_that_breaks_is_served_from_its_last_good_index(make_sidecar, folders) -> None:
    root, data = folders
    server = make_sidecar(retrieval_config(root, data)).start()
    good = search(server, "heart regeneration")
    assert good.hits and not good.stale_fallbacks
    (root / "science" / "part1.jsonl").write_text('{"id": "x", "text": "ok"}\n{not json\n')
    degraded = search(server, "heart regeneration")
    assert [h.chunk_id for h in degraded.hits] == [h.chunk_id for h in good.hits]
    (stale,) = degraded.stale_fallbacks
    assert stale.source == "science" and "part1.jsonl" in stale.reason and stale.last_good_built_at.seconds > 0
    enforced = retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).Enforce(
        pb.EnforceRequest(
            principal=PRINCIPAL,
            scope=SCOPE,
            llm=llm(),
            action="answer",
            target=target([entry("science", "DIRECTORY", "SEARCH", "science")], {"answer": ["science"]}),
            params=params(q="heart regeneration"),
        ),
        timeout=60,
    )
    assert enforced.stale_fallbacks[0].source == "science" and enforced.document_count > 0


@pytest.mark.parametrize("kill_when", ["embedding", "saving"])
def test_killing_the_server_during_an_index_build_never_leaves_a_corrupt_index(
    make_sidecar, tmp_path, kill_when
) -> None:
    root, data = tmp_path / "knowledge", tmp_path / "data"
    write_abstracts(root / "science", files=4, per_file=40)
    server = make_sidecar(retrieval_config(root, data)).start()
    threading.Thread(target=lambda: pytest.raises(grpc.RpcError, load, server), daemon=True).start()
    metric, labels = (
        ("ragsidecar_embedded_chunks_total", {})
        if kill_when == "embedding"
        else ("ragsidecar_index_loads_total", BUILT)
    )
    deadline = time.monotonic() + 240
    while server.metric(metric, **labels) == 0:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.005)
    server.signal(signal.SIGKILL)
    server.process.wait(30)

    restarted = make_sidecar(retrieval_config(root, data)).start()
    assert load(restarted).counts[0].count == 160
    hits = search(restarted, ir_data.corpus("scifact")[scifact_ids()[7]][:300]).hits
    assert hits[0].provenance.document_id == scifact_ids()[7]
    assert "corrupt" not in restarted.log() or restarted.metric("ragsidecar_index_loads_total", **BUILT) == 1
    # Whatever the killed save left (a temp folder, a set-aside index) is gone after the restart.
    assert [p.name for p in (data / "indexes").iterdir() if p.name.startswith(".")] == []


def test_a_corrupted_index_is_detected_and_rebuilt(make_sidecar, folders) -> None:
    root, data = folders
    first = make_sidecar(retrieval_config(root, data)).start()
    load(first)
    first.stop()
    (index_dir,) = [p for p in (data / "indexes").iterdir() if p.is_dir() and not p.name.startswith(".")]
    biggest = max((f for f in index_dir.iterdir() if f.is_file()), key=lambda f: f.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
    second = make_sidecar(retrieval_config(root, data)).start()
    assert load(second).counts[0].count == 120
    assert second.metric("ragsidecar_index_loads_total", **BUILT) == 1 and "corrupt" in second.log()


def test_oversized_binary_and_malformed_files_are_refused_and_nothing_else_breaks(make_sidecar, folders) -> None:
    root, data = folders
    with (root / "huge.txt").open("wb") as f:
        f.truncate(200 * 1024 * 1024)  # sparse: 200 MB on paper, nothing written
    (root / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog >>\ngarbage without xref\n")
    (root / "binary.md").write_bytes(bytes(range(256)) * 64)
    server = make_sidecar(retrieval_config(root, data)).start()
    before = search(server, "heart regeneration")
    for name, reason in (
        ("huge.txt", "LIMIT_EXCEEDED"),
        ("broken.pdf", "SOURCE_UNREADABLE"),
        ("binary.md", "SOURCE_UNREADABLE"),
    ):
        bad = [entry("bad", "FILE", "SEARCH", name)]
        with pytest.raises(grpc.RpcError) as caught:
            load(server, ["bad"], bad)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, name
        info, _ = error_details(caught.value)
        assert info.reason == reason and info.metadata["sources"] == "bad", name
    assert [h.chunk_id for h in search(server, "heart regeneration").hits] == [h.chunk_id for h in before.hits]


def test_an_unknown_reranker_is_not_found_at_use(make_sidecar, folders) -> None:
    root, data = folders
    server = make_sidecar(retrieval_config(root, data)).start()
    ghost = [
        entry(
            "science",
            "DIRECTORY",
            "SEARCH",
            "science",
            search=pb.SearchOptions(rerank=True, reranker_model="no-such-reranker"),
        )
    ]
    with pytest.raises(grpc.RpcError) as caught:
        search(server, "heart", ghost)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_details(caught.value)[0].reason == "UNKNOWN_MODEL"


def test_the_index_command_builds_what_the_server_then_reads(make_sidecar, folders) -> None:
    import subprocess
    import sys

    from sidecar import to_toml

    root, data = folders
    config = retrieval_config(root, data)
    config_file = root.parent / "index.toml"
    config_file.write_text(to_toml(config))
    done = subprocess.run(
        [sys.executable, "-m", "ragsidecar", "index", "--config", str(config_file), "science", "--name", "science"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "indexed science: 120 documents" in done.stdout and "chunks embedded" in done.stderr
    server = make_sidecar(config).start()
    assert load(server).counts[0].count == 120
    assert server.metric("ragsidecar_index_loads_total", **DISK) == 1
    assert server.metric("ragsidecar_embedded_chunks_total") == 0
    outside = subprocess.run(
        [sys.executable, "-m", "ragsidecar", "index", "--config", str(config_file), "../..", "--name", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outside.returncode == 1 and "outside the configured knowledge roots" in outside.stderr
