"""MEMORY partitions are isolated by (tenant, session, source) in memory, in index keys and on disk, across
restarts; caller ids with control characters or over the documented length are refused before anything is
read or written; partitions persisted under the old file names survive the upgrade."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import grpc
import pytest
from memory_helpers import found_ids, refused, upsert
from retrieval_helpers import PRINCIPAL, SCOPE, retrieval_config, stub
from sidecar import Sidecar

from ragsidecar.identifiers import MAX_ID_CHARS
from ragsidecar.v1 import common_pb2
from ragsidecar.v1 import retrieval_pb2 as pb

# Pairs of scopes that a separator join ("tenant" + sep + "session") would merge into one key.
LOOK_ALIKE_SCOPES = [
    (("a:b", "c"), ("a", "b:c")),
    (("t/u", "s"), ("t", "u/s")),
    (("x y", ""), ("x", "y")),
    (("acme|1", "s"), ("acme", "1|s")),
]


@pytest.fixture
def server(make_sidecar, tmp_path: Path) -> Sidecar:
    root = tmp_path / "knowledge"
    root.mkdir()
    return make_sidecar(retrieval_config(root, tmp_path / "data")).start()


def test_ids_with_control_characters_or_too_long_are_refused_before_anything_is_written(server, tmp_path) -> None:
    long_id = "t" * (MAX_ID_CHARS + 1)
    cases = {
        "scope.tenant": dict(scope=common_pb2.Scope(tenant="acme\0x", session="s")),
        "scope.session": dict(scope=common_pb2.Scope(tenant="acme", session="x\0s")),
        "principal.id": dict(principal=common_pb2.Principal(id="agent\x1bhost")),
        "knowledge": dict(knowledge="notes\n"),
        "documents[0].id": dict(doc_id="doc\x7f"),
    }
    for field, overrides in cases.items():
        args = {"scope": SCOPE, "doc_id": "d1", "text": "Bob prefers Saturdays.", **overrides}
        assert refused(functools.partial(upsert, server, **args)) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_REQUEST",
            [field],
        ), field
    too_long = common_pb2.Scope(tenant=long_id, session="s")
    assert refused(lambda: upsert(server, too_long, "d1", "text"))[2] == ["scope.tenant"]
    assert refused(lambda: found_ids(server, common_pb2.Scope(tenant="acme", session="x\0s"), "Bob"))[:2] == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    delete = pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=SCOPE, knowledge="notes", ids=["ok", "bad\0"])
    assert refused(lambda: stub(server).DeleteDocuments(delete, timeout=60))[2] == ["ids[1]"]
    memory = tmp_path / "data" / "memory"
    assert not memory.exists() or not list(memory.iterdir())  # nothing was written
    # An id of exactly the documented length is accepted.
    assert upsert(server, common_pb2.Scope(tenant="t" * MAX_ID_CHARS), "d1", "text").inserted == 1


def test_look_alike_scopes_never_share_a_partition_before_or_after_a_restart(make_sidecar, tmp_path) -> None:
    root, data = tmp_path / "knowledge", tmp_path / "data"
    root.mkdir()
    first = make_sidecar(retrieval_config(root, data)).start()
    scopes = {}
    for pair, (one, two) in enumerate(LOOK_ALIKE_SCOPES):
        for side, (tenant, session) in enumerate((one, two)):
            scope = common_pb2.Scope(tenant=tenant, session=session)
            doc_id = f"pair{pair}-side{side}"
            assert (
                upsert(first, scope, doc_id, f"Delivery note {doc_id}: the parcel waits at the depot.").document_count
                == 1
            )
            scopes[doc_id] = scope

    def each_scope_sees_only_its_own(server: Sidecar) -> None:
        for doc_id, scope in scopes.items():
            assert found_ids(server, scope, "where is the parcel?") == [doc_id], doc_id

    each_scope_sees_only_its_own(first)
    assert first.metric("ragsidecar_cache_entries", cache="memory_partitions") == len(scopes)  # one each
    first.stop()
    each_scope_sees_only_its_own(make_sidecar(retrieval_config(root, data)).start())


def test_partitions_persisted_under_the_old_file_names_are_kept_on_upgrade(make_sidecar, tmp_path) -> None:
    root, memory = tmp_path / "knowledge", tmp_path / "data" / "memory"
    root.mkdir()
    memory.mkdir(parents=True)
    legacy_key = ("acme", "s1", "notes")
    legacy = memory / (hashlib.sha256("\x00".join(legacy_key).encode()).hexdigest()[:40] + ".json")
    legacy.write_text(
        json.dumps(
            {
                "tenant": "acme",
                "session": "s1",
                "source": "notes",
                "documents": [
                    {"id": "old1", "text": "The customer Bob prefers delivery on Saturdays.", "metadata": {}}
                ],
            }
        )
    )
    server = make_sidecar(retrieval_config(root, tmp_path / "data")).start()
    assert not legacy.exists()
    assert found_ids(server, SCOPE, "when does Bob want his delivery?") == ["old1"]
    assert upsert(server, SCOPE, "new1", "The Leeds warehouse closes at 6pm.").document_count == 2
    assert list(memory.glob("*.json")) == []  # imported into data/memory.sqlite3
    assert server.metric("ragsidecar_cache_entries", cache="memory_partitions") == 1
