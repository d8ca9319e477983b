"""DIRECTORY sources through the real server: a steady Search lists no file (a file watcher says nothing changed), an
edit is searched once the watcher's event arrives, a caller can ask for a rescan, and without a watcher the source
is scanned again after retrieval.rescan_interval_s. Watches are capped and visible as a metric."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import ir_data
from retrieval_helpers import PRINCIPAL, SCOPE, entry, retrieval_config, scifact_ids, target
from sidecar import Sidecar

from ragsidecar.v1 import retrieval_pb2 as pb
from ragsidecar.v1 import retrieval_pb2_grpc

ZEBRAFISH = "Zebrafish regenerate their heart after injury: cardiomyocytes near the wound divide again."
ZEBRAFISH_QUERY = "can zebrafish regrow heart tissue?"
OCTOPUS = "An octopus changes the colour of its skin within a fraction of a second to hide from predators."
OCTOPUS_QUERY = "how does an octopus camouflage itself?"
SCANS = "ragsidecar_source_scans_total"
WATCHED = "ragsidecar_watched_sources"


def write_folder(folder: Path, files: int) -> dict[str, str]:
    """One SciFact abstract per file; the texts by file name."""
    corpus = ir_data.corpus("scifact")
    folder.mkdir(parents=True)
    texts = {f"abstract{n:02}.txt": corpus[doc_id] for n, doc_id in enumerate(scifact_ids()[:files])}
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    return texts


def top_file(server: Sidecar, query: str, source: str = "science", rescan: bool = False) -> tuple[str, str]:
    """(file name, chunk text) of the best hit of a Search of the DIRECTORY source."""
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=target([entry(source, "DIRECTORY", "SEARCH", source)]),
        query=query,
        top_k=1,
        rescan=rescan,
    )
    (hit,) = retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).Search(request, timeout=120).hits
    return Path(hit.provenance.file).name, hit.text


def eventually(check: Callable[[], bool], seconds: float = 20.0) -> None:
    """Polls until the check holds (the watcher's event, or the rescan interval, arrives in its own time)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not seen before the deadline"
        time.sleep(0.05)


def test_a_steady_search_lists_no_file_and_an_edit_is_searched_after_the_watchers_event(make_sidecar, tmp_path) -> None:
    root = tmp_path / "knowledge"
    texts = write_folder(root / "science", 20)
    server = make_sidecar(retrieval_config(root, tmp_path / "data")).start()
    first = top_file(server, texts["abstract03.txt"][:300])
    assert first[0] == "abstract03.txt"
    assert server.metric(WATCHED) == 1
    scans = server.metric(SCANS)
    for _ in range(5):
        assert top_file(server, texts["abstract03.txt"][:300]) == first
    assert server.metric(SCANS) == scans  # nothing changed: no file listed or stat'ed

    (root / "science" / "abstract07.txt").write_text(ZEBRAFISH, encoding="utf-8")
    eventually(lambda: top_file(server, ZEBRAFISH_QUERY) == ("abstract07.txt", ZEBRAFISH))
    assert server.metric(SCANS) > scans
    assert server.metric("ragsidecar_index_loads_total", how="updated") >= 1

    (root / "science" / "deep" / "er").mkdir(parents=True)  # a new subfolder is watched as well
    (root / "science" / "deep" / "er" / "octopus.md").write_text(OCTOPUS, encoding="utf-8")
    eventually(lambda: top_file(server, OCTOPUS_QUERY) == ("octopus.md", OCTOPUS))
    (root / "science" / "deep" / "er" / "octopus.md").unlink()
    eventually(lambda: top_file(server, OCTOPUS_QUERY)[0] != "octopus.md")
    scans = server.metric(SCANS)
    top_file(server, OCTOPUS_QUERY)
    assert server.metric(SCANS) == scans  # steady again


def test_without_a_watcher_a_source_is_rescanned_after_the_interval_or_when_the_caller_asks(
    make_sidecar, tmp_path
) -> None:
    root = tmp_path / "knowledge"
    write_folder(root / "science", 10)
    config = retrieval_config(root, tmp_path / "data")
    config["retrieval"].update(watch_files=False, rescan_interval_s=8.0)
    server = make_sidecar(config).start()
    top_file(server, ZEBRAFISH_QUERY)  # builds the index (its scan's time is when the scan began, before the build)
    before = top_file(server, ZEBRAFISH_QUERY)  # a scan of its own if the build took the interval
    assert before[1] != ZEBRAFISH and server.metric(WATCHED) == 0
    scans = server.metric(SCANS)

    (root / "science" / "abstract04.txt").write_text(ZEBRAFISH, encoding="utf-8")
    assert top_file(server, ZEBRAFISH_QUERY) == before  # within the interval: not scanned again
    assert server.metric(SCANS) == scans
    assert top_file(server, ZEBRAFISH_QUERY, rescan=True) == ("abstract04.txt", ZEBRAFISH)  # the caller asks
    assert server.metric(SCANS) == scans + 1

    (root / "science" / "abstract05.txt").write_text(OCTOPUS, encoding="utf-8")
    eventually(lambda: top_file(server, OCTOPUS_QUERY) == ("abstract05.txt", OCTOPUS), seconds=60)
    assert server.metric(WATCHED) == 0


def test_watches_are_capped_and_a_source_past_the_cap_still_sees_its_edits(make_sidecar, tmp_path) -> None:
    root = tmp_path / "knowledge"
    write_folder(root / "science", 6)
    write_folder(root / "biology", 6)
    config = retrieval_config(root, tmp_path / "data")
    config["retrieval"].update(max_watched_sources=1)
    server = make_sidecar(config).start()
    top_file(server, ZEBRAFISH_QUERY, "science")
    top_file(server, ZEBRAFISH_QUERY, "biology")
    assert server.metric(WATCHED) == 1  # biology's watch released science's

    (root / "science" / "abstract02.txt").write_text(ZEBRAFISH, encoding="utf-8")
    # science, unwatched, is scanned again (its interval or a new watch): the edit is searched.
    eventually(lambda: top_file(server, ZEBRAFISH_QUERY, "science") == ("abstract02.txt", ZEBRAFISH), seconds=30)
    assert server.metric(WATCHED) == 1
