"""The knowledge store under hostile input and crashes: bad paths get their documented status, start-up sweeps
what killed writes and superseded indexes left, in-memory state stays within its configured bounds, a shared
index build survives its first caller cancelling, and a changed encoder setting never reuses old vectors."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import grpc
import pytest
from memory_helpers import found_ids, refused, upsert
from retrieval_helpers import (
    BUILT,
    DISK,
    PRINCIPAL,
    SCOPE,
    entry,
    load,
    retrieval_config,
    stub,
    target,
    write_abstracts,
)
from sidecar import Sidecar

from ragsidecar.v1 import (
    chat_knowledge_pb2 as cpb,
)
from ragsidecar.v1 import (
    chat_knowledge_pb2_grpc,
    common_pb2,
    retrieval_pb2_grpc,
)
from ragsidecar.v1 import (
    retrieval_pb2 as pb,
)

DEAD_PID = 999_999_999  # above any pid_max: never a live process
SCIENCE = entry("science", "DIRECTORY", "SEARCH", "science")


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    root, data = tmp_path / "knowledge", tmp_path / "data"
    write_abstracts(root / "science", files=2, per_file=20)
    (root / "guide").mkdir()
    (root / "guide" / "returns.md").write_text("Items can be returned within 30 days of delivery.\n")
    (root / "guide" / "shipping.txt").write_text("Standard shipping takes 3 to 5 business days.\n")
    return root, data


def test_a_nul_in_a_path_or_a_symlink_loop_gets_its_documented_status(make_sidecar, folders) -> None:
    root, data = folders
    os.symlink("loop-b", root / "loop-a")
    os.symlink("loop-a", root / "loop-b")
    os.symlink("../loop-a", root / "guide" / "inner-loop.md")  # a loop inside a DIRECTORY source: skipped
    server = make_sidecar(retrieval_config(root, data)).start()
    nul = [entry("bad", "FILE", "SEARCH", "guide/returns.md\0.txt")]
    assert refused(lambda: load(server, ["bad"], nul))[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=target([SCIENCE]),
        query="heart",
        resolved_paths={"science": "science\0/x"},
    )
    assert refused(lambda: stub(server).Search(request, timeout=60))[:2] == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    for path in ("loop-a", "loop-a/deeper.md"):
        looped = [entry("looped", "FILE", "SEARCH", path)]
        assert refused(functools.partial(load, server, ["looped"], looped))[:2] == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "SOURCE_UNREADABLE",
        ), path
    guide = [entry("guide", "DIRECTORY", "SEARCH", "guide")]
    assert load(server, ["guide"], guide).counts[0].count == 2


def test_start_up_sweeps_what_killed_writes_and_superseded_indexes_left(make_sidecar, folders) -> None:
    root, data = folders
    first = make_sidecar(retrieval_config(root, data)).start()
    assert load(first).counts[0].count == 40
    upsert(first, SCOPE, "n1", "The customer Bob prefers delivery on Saturdays.")
    first.signal(signal.SIGKILL)
    first.process.wait(30)
    (superseded,) = [p for p in (data / "indexes").iterdir() if not p.name.startswith(".")]
    with (root / "science" / "part1.jsonl").open("a") as out:  # the source changes before the restart
        out.write(json.dumps({"id": "new-doc", "text": "Zebrafish regenerate their heart after injury."}) + "\n")

    second = make_sidecar(retrieval_config(root, data)).start()
    assert load(second).counts[0].count == 41
    second.signal(signal.SIGKILL)
    second.process.wait(30)
    (current,) = [p for p in (data / "indexes").iterdir() if p.name not in (superseded.name,)]
    # What kill -9 leaves mid-write: a temp index folder of a save; and an index set aside by a save killed
    # between its two renames, with no index in its place (kept: it is the only copy). MEMORY writes leave
    # nothing: SQLite rolls its journal back or forward.
    crashed_save = data / "indexes" / f".{superseded.name}.tmp-{DEAD_PID}-abc"
    shutil.copytree(superseded, crashed_save)
    set_aside = data / "indexes" / f".{current.name}.old-{DEAD_PID}-0123"
    current.rename(set_aside)
    in_flight = data / "indexes" / f".{current.name}.tmp-{os.getpid()}-live"  # a live process's save: kept
    in_flight.mkdir()
    leftovers = [superseded, crashed_save]
    expected_bytes = sum(
        f.stat().st_size for p in leftovers for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()
    )

    third = make_sidecar(retrieval_config(root, data)).start()
    assert not any(p.exists() for p in leftovers) and in_flight.exists() and current.is_dir()
    assert f"start-up sweep removed 2 leftover index folders ({expected_bytes} bytes)" in third.log()
    assert load(third).counts[0].count == 41
    assert third.metric("ragsidecar_index_loads_total", **DISK) == 1  # the set-aside index, put back
    assert third.metric("ragsidecar_embedded_chunks_total") == 0
    assert found_ids(third, SCOPE, "when does Bob want his delivery?") == ["n1"]


def test_acknowledged_memory_writes_survive_kill_9_and_their_temp_files_are_swept(make_sidecar, tmp_path) -> None:
    root, data = tmp_path / "knowledge", tmp_path / "data"
    root.mkdir()
    server = make_sidecar(retrieval_config(root, data)).start()
    acknowledged: list[str] = []

    def write_until_killed() -> None:
        with contextlib.suppress(grpc.RpcError):
            while True:  # each write rewrites the whole partition file: a long window to be killed in
                doc_id = f"d{len(acknowledged)}"
                upsert(server, SCOPE, doc_id, f"Note {doc_id}: " + "the parcel waits at the depot. " * 600)
                acknowledged.append(doc_id)

    writer = threading.Thread(target=write_until_killed)
    writer.start()
    while len(acknowledged) < 30:
        assert writer.is_alive(), server.log()
        time.sleep(0.01)
    server.signal(signal.SIGKILL)
    server.process.wait(30)
    writer.join(60)
    restarted = make_sidecar(retrieval_config(root, data)).start()
    assert list((data / "memory").glob("*.tmp")) == []
    # Every acknowledged write is there (one more may have landed without its acknowledgement).
    count = upsert(restarted, SCOPE, "after", "The depot opens at 8am.").document_count - 1
    assert len(acknowledged) <= count <= len(acknowledged) + 1


def test_loaded_indexes_and_memory_partitions_stay_within_their_bounds(make_sidecar, folders) -> None:
    root, data = folders
    config = retrieval_config(root, data)
    # Room for one small index (about 5.5 KB each: its vectors, text and BM25 tables), not two, and for a few MEMORY
    # partitions' indexes of one document.
    config["retrieval"].update(index_cache_bytes=9_000, memory_cache_bytes=30_000)
    server = make_sidecar(config).start()
    files = [entry(name, "FILE", "SEARCH", f"guide/{name}") for name in ("returns.md", "shipping.txt")]
    for source in files * 2:
        assert load(server, [source.name], [source]).counts[0].count == 1
        assert server.metric("ragsidecar_cache_entries", cache="indexes") == 1
        assert 0 < server.metric("ragsidecar_cache_bytes", cache="indexes") <= 9_000
    # The evicted indexes were read back from disk, never embedded again.
    assert (
        server.metric("ragsidecar_index_loads_total", **BUILT),
        server.metric("ragsidecar_index_loads_total", **DISK),
    ) == (2, 2)
    sessions = [common_pb2.Scope(tenant="acme", session=f"s{i}") for i in range(8)]
    for i, scope in enumerate(sessions):
        upsert(server, scope, f"note{i}", f"Note {i}: " + "the parcel waits at the depot. " * 12)
    assert server.metric("ragsidecar_cache_entries", cache="memory_partitions") == len(sessions)
    embedded = server.metric("ragsidecar_embedded_chunks_total")
    for _ in range(2):  # the second round finds evicted indexes, rebuilt from the stored vectors
        for i, scope in enumerate(sessions):
            assert found_ids(server, scope, "where is the parcel?") == [f"note{i}"]
            assert server.metric("ragsidecar_cache_bytes", cache="memory_indexes") <= 30_000
    assert 0 < server.metric("ragsidecar_cache_entries", cache="memory_indexes") < len(sessions)
    assert server.metric("ragsidecar_embedded_chunks_total") == embedded  # rebuilt from stored vectors


def test_writes_past_the_byte_limits_are_refused_and_change_nothing(make_sidecar, folders) -> None:
    root, data = folders
    config = retrieval_config(root, data)
    config["retrieval"].update(max_memory_bytes_per_request=2000, binding_store_bytes=3000)
    server = make_sidecar(config).start()
    upsert(server, SCOPE, "small", "x" * 1000)
    documents = [pb.MemoryDocument(id="a", text="y" * 1000), pb.MemoryDocument(id="b", text="z" * 1000)]
    request = pb.UpsertDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge="notes", documents=documents)
    assert refused(lambda: stub(server).UpsertDocuments(request, timeout=60)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "LIMIT_EXCEEDED",
        ["documents"],
    )
    assert upsert(server, SCOPE, "small", "x" * 1000).document_count == 1

    chat = chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub(server.channel())

    def open_and_append(text: str) -> cpb.AppendToBindingResponse:
        opened = chat.OpenBinding(
            cpb.OpenBindingRequest(
                principal=PRINCIPAL, scope=SCOPE, owner_id="owner", source="tool-results", declared=True
            ),
            timeout=30,
        )
        return chat.AppendToBinding(
            cpb.AppendToBindingRequest(
                principal=PRINCIPAL,
                scope=SCOPE,
                binding_id=opened.binding_id,
                owner_id="owner",
                binding_handle=opened.binding_handle,
                documents=[pb.MemoryDocument(id="r", text=text)],
            ),
            timeout=30,
        )

    assert open_and_append("w" * 1500).document_count == 1
    assert refused(lambda: open_and_append("v" * 1500))[:2] == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED")
    assert server.metric("ragsidecar_cache_bytes", cache="binding_corpora") <= 3000


def test_a_cancelled_caller_does_not_fail_others_sharing_its_index_build(make_sidecar, tmp_path) -> None:
    root, data = tmp_path / "knowledge", tmp_path / "data"
    write_abstracts(root / "science", files=6, per_file=40)
    server = make_sidecar(retrieval_config(root, data)).start()
    request = pb.SearchRequest(
        principal=PRINCIPAL, scope=SCOPE, target=target([SCIENCE]), query="heart regeneration", top_k=3
    )
    first = stub(server).Search.future(request, timeout=300)
    _wait_for(server, "ragsidecar_embedded_chunks_total")  # the build has started, inside the first call
    second = stub(server).Search.future(request, timeout=300)
    _wait_for(server, "ragsidecar_index_builds_joined_total")  # the second call awaits that same build
    first.cancel()
    assert len(second.result().hits) == 3
    assert first.cancelled() and server.metric("ragsidecar_index_loads_total", **BUILT) == 1


def test_a_changed_encoder_setting_never_reuses_old_vectors(make_sidecar, folders) -> None:
    root, data = folders
    server = make_sidecar(retrieval_config(root, data)).start()
    assert load(server).counts[0].count == 40
    embedded = server.metric("ragsidecar_embedded_chunks_total")
    config = retrieval_config(root, data)
    (embedder,) = [m for m in config["models"] if m["kind"] == "bi-encoder"]
    embedder["pooling"] = "cls" if embedder["pooling"] == "mean" else "mean"  # same model id and files, other vectors
    server.write_config(config)
    server.signal(signal.SIGHUP)
    _wait_for(server, "ragsidecar_model_reloads_total", outcome="ok")
    assert load(server).counts[0].count == 40
    assert server.metric("ragsidecar_index_loads_total", **BUILT) == 2
    assert server.metric("ragsidecar_embedded_chunks_total") == 2 * embedded  # every chunk embedded again
    server.stop()
    restarted = make_sidecar(config).start()
    assert load(restarted).counts[0].count == 40
    assert restarted.metric("ragsidecar_index_loads_total", **DISK) == 1  # the mean-pooled index, read back


def _wait_for(server: Sidecar, metric: str, **labels: str) -> None:
    deadline = time.monotonic() + 240
    while server.metric(metric, **labels) == 0:
        assert time.monotonic() < deadline and server.process.poll() is None, server.log()
        time.sleep(0.005)


def _validated(server: Sidecar, entries: list[pb.KnowledgeEntry], **fields) -> list[tuple[str, str, str]]:
    """ValidateConfiguration's violations as (field, reason name, description)."""
    response = stub(server).ValidateConfiguration(
        pb.ValidateConfigurationRequest(principal=PRINCIPAL, scope=SCOPE, target=target(entries), **fields), timeout=120
    )
    return [(v.field, common_pb2.ErrorReason.Name(v.reason), v.description) for v in response.violations]


def test_paths_too_long_are_invalid_and_errors_name_paths_as_sent(make_sidecar, folders) -> None:
    """The file system's own messages name the absolute path it tried: errors show paths relative to the root."""
    root, data = folders
    (root / "guide" / "binary.md").write_bytes(b"\x00\x01 not text")
    server = make_sidecar(retrieval_config(root, data)).start()
    long_name, long_path = "y" * 300 + ".md", "/".join(["z" * 200] * 25) + "/a.md"
    for path, limit in ((long_name, "255"), (f"{'y' * 300}/returns.md", "255"), (long_path, "4095")):
        for type_ in ("FILE", "DIRECTORY"):
            entries = [entry("long", type_, "SEARCH", path)]
            assert refused(functools.partial(load, server, ["long"], entries))[:2] == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_REQUEST",
            )
            [(field, reason, why)] = _validated(server, entries)
            assert (field, reason) == ("target.knowledge[0].path", "ERROR_REASON_INVALID_REQUEST")
            assert f"the limit of {limit}" in why and str(root) not in why
    messages = []
    for type_, path in (
        ("DIRECTORY", "guide"),
        ("DIRECTORY", "missing"),
        ("FILE", "missing.md"),
        ("FILE", "guide/binary.md"),
        ("FILE", str(root / "guide" / "binary.md")),
    ):  # the last sent absolute
        entries = [entry("read", type_, "SEARCH", path)]
        with pytest.raises(grpc.RpcError) as caught:
            load(server, ["read"], entries)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        messages.append(caught.value.details())
        direct = [entry("read", type_, "DIRECT", path, max_tokens=1000)]
        messages += [why for _, _, why in _validated(server, direct)]
    assert "guide/binary.md: binary content" in messages[0] and "guide/binary.md: binary content" in messages[-1]
    assert all(str(root) not in message for message in messages), messages


def test_an_8_mib_direct_text_is_measured_as_far_as_its_budget_needs(make_sidecar, folders) -> None:
    """Measuring stops once the text passes its budget: validation costs what the budget holds, not the text."""
    root, data = folders
    server = make_sidecar(retrieval_config(root, data)).start()
    text = ("Items can be returned within thirty days of delivery, unused.\n" * 140_000)[: 8 << 20]
    big = entry("handbook", "INLINE", "DIRECT", inline_text=text, max_tokens=1000)
    channel = server.channel(**{"grpc.max_send_message_length": 16 << 20})
    before = server.rss_mib()
    for _ in range(3):
        response = retrieval_pb2_grpc.RetrievalServiceStub(channel).ValidateConfiguration(
            pb.ValidateConfigurationRequest(principal=PRINCIPAL, scope=SCOPE, target=target([big])), timeout=300
        )
        [violation] = response.violations
        assert common_pb2.ErrorReason.Name(violation.reason) == "ERROR_REASON_DIRECT_BUDGET_EXCEEDED"
        assert "takes at least" in violation.description
    # Tokenizing all 8 MiB kept about 600 MiB of encoding; the start of the text that settles it, a few MiB.
    assert server.rss_mib() - before < 150
    fits = entry("handbook", "INLINE", "DIRECT", inline_text=text[:20_000], max_tokens=100_000)
    assert _validated(server, [fits]) == []
