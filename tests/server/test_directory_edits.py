"""DIRECTORY sources through the real server: an edited file is searched by plain Searches (no rescan) within a few
seconds of the write, as an update of that file's chunks alone (the old text is gone, nothing else re-read), edit
after edit of the same file and of others, and again after a restart that reads the index back from disk."""

from __future__ import annotations

import time
from pathlib import Path

import ir_data
from retrieval_helpers import PRINCIPAL, SCOPE, entry, retrieval_config, scifact_ids, target
from sidecar import Sidecar

from ragsidecar.v1 import retrieval_pb2 as pb
from ragsidecar.v1 import retrieval_pb2_grpc

FILES = 200
# The watcher's event, one file re-read and re-embedded, the index updated: well under a second; the bound only
# keeps a broken watcher from hanging the test.
EDIT_SEEN_WITHIN_S = 5.0
EDITS = [
    ("abstract007.txt", "Zebrafish regenerate their heart after injury: cardiomyocytes near the wound divide again."),
    ("abstract007.txt", "An octopus changes the colour of its skin within a fraction of a second to hide from prey."),
    ("abstract150.txt", "Honeybees tell their hive mates where flowers are by dancing a figure eight in the dark."),
]
UPDATED = {"how": "updated"}


def best_hit(server: Sidecar, query: str) -> tuple[str, str]:
    """(file name, chunk text) of the best hit of a plain Search (no rescan) of the DIRECTORY source."""
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=SCOPE,
        target=target([entry("science", "DIRECTORY", "SEARCH", "science")]),
        query=query,
        top_k=1,
    )
    (hit,) = retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).Search(request, timeout=60).hits
    return Path(hit.provenance.file).name, hit.text


def edit_and_wait(server: Sidecar, folder: Path, name: str, text: str) -> None:
    """Writes the file, then searches its new text until it is the best hit, failing after EDIT_SEEN_WITHIN_S."""
    old = (folder / name).read_text(encoding="utf-8")
    updates = server.metric("ragsidecar_index_loads_total", **UPDATED)
    (folder / name).write_text(text, encoding="utf-8")
    deadline = time.monotonic() + EDIT_SEEN_WITHIN_S
    while best_hit(server, text) != (name, text):
        assert time.monotonic() < deadline, f"{name} edited but not searched within {EDIT_SEEN_WITHIN_S} s"
        time.sleep(0.02)
    assert server.metric("ragsidecar_index_loads_total", **UPDATED) > updates  # updated, not built again
    assert best_hit(server, old[:300])[0] != name  # its old chunks are gone


def test_an_edited_file_is_searched_within_seconds_without_a_rescan_and_after_a_restart(
    make_sidecar, tmp_path: Path
) -> None:
    root, data = tmp_path / "knowledge", tmp_path / "data"
    folder = root / "science"
    folder.mkdir(parents=True)
    corpus = ir_data.corpus("scifact")
    abstracts = [corpus[doc_id] for doc_id in scifact_ids()]
    for n in range(FILES):
        (folder / f"abstract{n:03}.txt").write_text(abstracts[n % len(abstracts)], encoding="utf-8")
    config = retrieval_config(root, data)
    server = make_sidecar(config).start()
    assert best_hit(server, abstracts[3][:300])[0] == "abstract003.txt"

    for name, text in EDITS[:2]:
        edit_and_wait(server, folder, name, text)
    server.stop()

    restarted = make_sidecar(config).start()  # the updated index read back from disk
    assert best_hit(restarted, EDITS[1][1]) == EDITS[1]
    edit_and_wait(restarted, folder, *EDITS[2])
    assert best_hit(restarted, EDITS[1][1]) == EDITS[1]  # the earlier edit kept
