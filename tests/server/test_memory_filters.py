"""MEMORY documents as agent frameworks' stores use them, through the real server on both backends: typed
metadata, every filter operator and kind on Search and ListDocuments, nested filters, GetDocuments, paging
with a filter while writes go on, delete by filter, expiry (invisible the moment it passes, gone after the
purge, not back after a restart), and hostile filters refused with INVALID_ARGUMENT while the server serves on."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import timestamp_pb2
from retrieval_helpers import PRINCIPAL, entry, retrieval_config
from sidecar import Sidecar, error_details, status_wire_bytes

from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

BACKENDS = ["embedded", "postgres"]
NOTES = entry("notes", "MEMORY", "SEARCH")
_databases = itertools.count()
_tenants = itertools.count()

# The typed metadata of the documents every filter case runs over.
T = timestamp_pb2.Timestamp
DOCUMENTS = {
    "a": ("Alpine lakes freeze early in the autumn.", {"year": 2019.0, "draft": True, "tags": ["geo", "cold"]}),
    "b": ("Desert dunes move with the wind.", {"year": 2021.0, "draft": False, "tags": ["geo"]}),
    "c": ("Coral reefs bleach when the sea warms.", {"year": 2023.5, "draft": False, "tags": ["sea"]}),
    "d": ("Deep trenches hold strange fish.", {"year": 2023.5, "seen": T(seconds=1_700_000_000)}),
    "e": ("Estuaries mix salt and fresh water.", {"author": "eve", "seen": T(seconds=1_800_000_000)}),
}
AUTHORS = {"a": "ada", "b": "bob", "c": "cy"}  # string metadata (the plain map), filterable as strings


def value(v: object) -> pb.MetadataValue:
    if isinstance(v, bool):
        return pb.MetadataValue(bool_value=v)
    if isinstance(v, float):
        return pb.MetadataValue(number_value=v)
    if isinstance(v, str):
        return pb.MetadataValue(string_value=v)
    if isinstance(v, list):
        return pb.MetadataValue(string_list_value=pb.StringList(values=v))
    assert isinstance(v, T)
    return pb.MetadataValue(timestamp_value=v)


def compare(field: str, op: str, v: object) -> pb.Filter:
    operator = {
        "==": pb.COMPARISON_OPERATOR_EQUAL,
        "!=": pb.COMPARISON_OPERATOR_NOT_EQUAL,
        "<": pb.COMPARISON_OPERATOR_LESS,
        "<=": pb.COMPARISON_OPERATOR_LESS_OR_EQUAL,
        ">": pb.COMPARISON_OPERATOR_GREATER,
        ">=": pb.COMPARISON_OPERATOR_GREATER_OR_EQUAL,
    }[op]
    return pb.Filter(comparison=pb.Comparison(field=field, operator=operator, value=value(v)))


def one_of(field: str, values: list[object], negated: bool = False) -> pb.Filter:
    return pb.Filter(membership=pb.Membership(field=field, values=[value(v) for v in values], negated=negated))


def all_of(*filters: pb.Filter) -> pb.Filter:
    return pb.Filter(all=pb.FilterList(filters=filters))


def any_of(*filters: pb.Filter) -> pb.Filter:
    return pb.Filter(any=pb.FilterList(filters=filters))


def negation(node: pb.Filter) -> pb.Filter:
    return pb.Filter(negation=node)


def exists(field: str) -> pb.Filter:
    return pb.Filter(exists=pb.Exists(field=field))


CASES = [
    (compare("author", "==", "ada"), "a"),
    (compare("author", "!=", "ada"), "bcde"),
    (compare("author", "<", "bz"), "ab"),
    (compare("year", "==", 2023.5), "cd"),
    (compare("year", "!=", 2023.5), "abe"),
    (compare("year", "<", 2021.0), "a"),
    (compare("year", "<=", 2021.0), "ab"),
    (compare("year", ">", 2021.0), "cd"),
    (compare("year", ">=", 2021.0), "bcd"),
    (compare("draft", "==", True), "a"),
    (compare("draft", "!=", True), "bcde"),
    (compare("tags", "==", "geo"), "ab"),
    (compare("tags", "==", ["geo", "cold"]), "a"),
    (compare("seen", "<", T(seconds=1_750_000_000)), "d"),
    (compare("seen", ">=", T(seconds=1_700_000_000)), "de"),
    (one_of("author", ["bob", "eve"]), "be"),
    (one_of("year", [2019.0, 2021.0], negated=True), "cde"),
    (one_of("tags", ["sea", "cold"]), "ac"),
    (exists("seen"), "de"),
    (negation(exists("tags")), "de"),
    (compare("$id", "==", "c"), "c"),
    (one_of("$id", ["a", "e"]), "ae"),
    (compare("year", "==", "2019"), ""),  # another kind: no match
    (all_of(), "abcde"),
    (any_of(), ""),
    (
        any_of(
            all_of(compare("year", ">", 2020.0), negation(compare("tags", "==", "sea"))),
            all_of(exists("author"), one_of("author", ["eve"])),
        ),
        "bde",
    ),
    (negation(any_of(compare("draft", "==", True), negation(exists("year")))), "bcd"),
]


def scope(tenant: str) -> common_pb2.Scope:
    return common_pb2.Scope(tenant=tenant, session="s1")


def stub(server: Sidecar) -> retrieval_pb2_grpc.RetrievalServiceStub:
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel())


def document(doc_id: str, text: str, typed: dict[str, object] | None = None, **fields: object) -> pb.MemoryDocument:
    message = pb.MemoryDocument(id=doc_id, text=text, typed_metadata={k: value(v) for k, v in (typed or {}).items()})
    for name, v in fields.items():
        if name == "metadata":
            message.metadata.update(v)  # type: ignore[arg-type]
        else:
            getattr(message, name).CopyFrom(v)
    return message


def upsert(server: Sidecar, at: common_pb2.Scope, documents: list[pb.MemoryDocument]) -> pb.UpsertDocumentsResponse:
    request = pb.UpsertDocumentsRequest(principal=PRINCIPAL, scope=at, knowledge="notes", documents=documents)
    return stub(server).UpsertDocuments(request, timeout=120)


def listed(server: Sidecar, at: common_pb2.Scope, keep: pb.Filter | None = None, page_size: int = 0) -> list[str]:
    ids, token = [], ""
    while True:
        request = pb.ListDocumentsRequest(
            principal=PRINCIPAL, scope=at, knowledge="notes", page_size=page_size, page_token=token
        )
        if keep is not None:
            request.filter.CopyFrom(keep)
        page = stub(server).ListDocuments(request, timeout=60)
        ids += [d.id for d in page.documents]
        token = page.next_page_token
        if not token:
            return ids


def searched(server: Sidecar, at: common_pb2.Scope, keep: pb.Filter | None, query: str = "water wind sea") -> list[str]:
    request = pb.SearchRequest(
        principal=PRINCIPAL, scope=at, target=pb.Target(name="t", knowledge=[NOTES]), query=query, top_k=10
    )
    if keep is not None:
        request.filters["notes"].CopyFrom(keep)
    return [h.provenance.document_id for h in stub(server).Search(request, timeout=60).hits]


def got(server: Sidecar, at: common_pb2.Scope, ids: list[str]) -> pb.GetDocumentsResponse:
    request = pb.GetDocumentsRequest(principal=PRINCIPAL, scope=at, knowledge="notes", ids=ids)
    return stub(server).GetDocuments(request, timeout=60)


def refused(call) -> tuple[grpc.StatusCode, str, list[str]]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    info, violations = error_details(caught.value)
    return caught.value.code(), info.reason if info else "", [field for field, _ in violations]


class Store:
    """A backend's data folder (and for postgres a fresh database), with sidecars started on it."""

    def __init__(self, backend: str, folder: Path, dsn: str) -> None:
        self.backend, self.folder, self.dsn = backend, folder, dsn
        self.started: list[Sidecar] = []

    def sidecar(self) -> Sidecar:
        root = self.folder / "knowledge"
        root.mkdir(parents=True, exist_ok=True)
        config = retrieval_config(root, self.folder / "data")
        config["inference"]["cache_bytes"] = 0
        config["store"] = {"backend": self.backend, "purge_interval_s": 1.0}
        workdir = self.folder / f"s{len(self.started)}"
        workdir.mkdir(parents=True)
        server = Sidecar(workdir, config, env={"RAGSIDECAR_STORE_DSN": self.dsn} if self.dsn else {})
        self.started.append(server)
        return server.start()

    def stop(self) -> None:
        for server in self.started:
            server.stop()


def _store(backend: str, folder: Path, request: pytest.FixtureRequest) -> Store:
    dsn = ""
    if backend == "postgres":
        dsn = request.getfixturevalue("postgres").database(f"memory_filters_{next(_databases)}")
    return Store(backend, folder, dsn)


@pytest.fixture(scope="module", params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    opened = _store(request.param, tmp_path_factory.mktemp(f"memory-{request.param}"), request)
    try:
        yield opened
    finally:
        opened.stop()


@pytest.fixture(scope="module")
def server(store: Store) -> Sidecar:
    return store.sidecar()


@pytest.fixture(scope="module")
def filled(server: Sidecar) -> common_pb2.Scope:
    at = scope(f"filters-{next(_tenants)}")
    documents = []
    for doc_id, (text, typed) in DOCUMENTS.items():
        metadata = {"author": AUTHORS[doc_id]} if doc_id in AUTHORS else {}
        documents.append(document(doc_id, text, {k: v for k, v in typed.items() if k != "author"}, metadata=metadata))
    documents[-1].typed_metadata["author"].CopyFrom(value("eve"))
    assert upsert(server, at, documents).inserted == len(DOCUMENTS)
    return at


@pytest.mark.parametrize(("keep", "expected"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_every_operator_and_kind_filters_list_and_search(
    server: Sidecar, filled: common_pb2.Scope, keep: pb.Filter, expected: str
) -> None:
    assert listed(server, filled, keep) == list(expected)
    assert sorted(searched(server, filled, keep)) == list(expected)


def test_documents_come_back_typed_with_their_timestamps(server: Sidecar, filled: common_pb2.Scope) -> None:
    answer = got(server, filled, ["d", "zz", "a", "d"])
    assert [d.id for d in answer.documents] == ["d", "a"]
    assert list(answer.not_found) == ["zz"]
    a = answer.documents[1]
    assert a.metadata == {"author": "ada"}
    assert a.typed_metadata["year"].number_value == 2019.0
    assert list(a.typed_metadata["tags"].string_list_value.values) == ["geo", "cold"]
    assert a.created.seconds > 0 and a.created == a.updated
    assert not a.HasField("expires_at")
    hit = next(
        h
        for h in stub(server).Search(_search(filled, "Alpine lakes"), timeout=60).hits
        if h.provenance.document_id == "a"
    )
    assert hit.metadata["author"].string_value == "ada" and hit.metadata["draft"].bool_value is True


def _search(at: common_pb2.Scope, query: str) -> pb.SearchRequest:
    return pb.SearchRequest(principal=PRINCIPAL, scope=at, target=pb.Target(name="t", knowledge=[NOTES]), query=query)


def test_a_replacement_keeps_created_and_moves_updated(server: Sidecar) -> None:
    at = scope(f"stamps-{next(_tenants)}")
    upsert(server, at, [document("x", "first text", {"n": 1.0})])
    before = got(server, at, ["x"]).documents[0]
    time.sleep(0.01)
    assert upsert(server, at, [document("x", "second text", {"n": 2.0})]).replaced == 1
    after = got(server, at, ["x"]).documents[0]
    assert after.created == before.created and after.updated.ToNanoseconds() > before.updated.ToNanoseconds()
    assert listed(server, at, compare("$updated", ">", before.updated)) == ["x"]
    assert listed(server, at, compare("$created", ">", before.created)) == []


def test_paging_with_a_filter_while_writes_go_on_lists_each_document_once(server: Sidecar) -> None:
    at = scope(f"paging-{next(_tenants)}")
    count, batch = 10_000, 1000
    for start in range(0, count, batch):
        upsert(
            server, at, [document(f"n{i:05d}", f"note {i}", {"even": i % 2 == 0}) for i in range(start, start + batch)]
        )
    even = compare("even", "==", True)
    seen: list[str] = []
    deleted: set[str] = set()
    token, page_number = "", 0
    while True:
        request = pb.ListDocumentsRequest(
            principal=PRINCIPAL, scope=at, knowledge="notes", filter=even, page_size=97, page_token=token
        )
        page = stub(server).ListDocuments(request, timeout=60)
        seen += [d.id for d in page.documents]
        token, page_number = page.next_page_token, page_number + 1
        if not token:
            break
        # Writes between pages: documents added behind the cursor ("m") and ahead of it ("o"), one replaced,
        # and one that the filter keeps deleted ahead of the cursor.
        added = [document(f"{side}{page_number:05d}", "added meanwhile", {"even": True}) for side in "mo"]
        replaced = document(f"n{2 * page_number:05d}", f"note {2 * page_number} again", {"even": True})
        upsert(server, at, [*added, replaced])
        gone = f"n{count - 2 * page_number:05d}"
        deleted.add(gone)
        delete = pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=at, knowledge="notes", ids=[gone])
        stub(server).DeleteDocuments(delete, timeout=60)
    assert len(seen) == len(set(seen)), "a document listed twice"
    assert {f"n{i:05d}" for i in range(0, count, 2)} - deleted <= set(seen), "a document present throughout was missed"
    assert all(s[0] in "mo" or int(s[1:]) % 2 == 0 for s in seen), "a document the filter does not keep"
    assert seen == sorted(seen)


def test_delete_by_filter_answers_how_many_went(server: Sidecar) -> None:
    at = scope(f"delete-{next(_tenants)}")
    upsert(server, at, [document(f"d{i}", f"memo {i}", {"user": f"u{i % 3}"}) for i in range(9)])
    request = pb.DeleteDocumentsRequest(
        principal=PRINCIPAL, scope=at, knowledge="notes", filter=one_of("user", ["u0", "u2"])
    )
    answer = stub(server).DeleteDocuments(request, timeout=60)
    assert (answer.deleted, answer.document_count) == (6, 3)
    assert listed(server, at) == ["d1", "d4", "d7"]
    assert sorted(searched(server, at, None, "memo")) == ["d1", "d4", "d7"]
    both = pb.DeleteDocumentsRequest(principal=PRINCIPAL, scope=at, knowledge="notes", ids=["d1"], filter=all_of())
    assert refused(lambda: stub(server).DeleteDocuments(both))[:2] == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )


def _nested(levels: int) -> pb.Filter:
    node = exists("a")
    for _ in range(levels - 1):
        node = negation(node)
    return node


HOSTILE = [
    (_nested(40), "filter" + ".negation" * 32),
    (compare("a", "==", "x" * 65536), "filter.comparison.value"),
    (compare("a", "<", float("nan")), "filter.comparison.value"),
    (compare("a", "<", True), "filter.comparison.value"),
    (compare("$created", ">", "yesterday"), "filter.comparison.value"),
    (compare("$path", "==", "a.md"), "filter.comparison.field"),
    (one_of("a", ["x", 1.0]), "filter.membership.values[1]"),
    (pb.Filter(comparison=pb.Comparison(field="a", operator=42, value=value("x"))), "filter.comparison.operator"),
    (pb.Filter(), "filter"),
    (any_of(*[exists("a")] * 1100), "filter.any.filters[1023]"),
]


@pytest.mark.parametrize(("keep", "field"), HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_filters_are_refused_naming_the_part_and_the_server_serves_on(
    server: Sidecar, filled: common_pb2.Scope, keep: pb.Filter, field: str
) -> None:
    request = pb.ListDocumentsRequest(principal=PRINCIPAL, scope=filled, knowledge="notes", filter=keep)
    search = _search(filled, "lakes")
    search.filters["notes"].CopyFrom(keep)
    for call, where in (
        ((lambda: stub(server).ListDocuments(request)), field),
        (
            (lambda: stub(server).Search(search)),
            field.replace("filter", "filters['notes']", 1),
        ),
    ):
        code, reason, fields = refused(call)
        assert (code, reason, len(fields)) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", 1)
        assert where.startswith(fields[0].rstrip("…")), (fields[0], where)  # a long path is cut in the details
    assert listed(server, filled) == list("abcde")


@pytest.mark.parametrize(
    ("token", "why"), [("not a token", "not a page token"), ("x" * (4 << 20), "longer than")], ids=["garbled", "4 MiB"]
)
def test_a_garbled_or_oversized_page_token_is_refused_and_the_server_serves_on(
    server: Sidecar, filled: common_pb2.Scope, token: str, why: str
) -> None:
    """An oversized token is refused by its length, before it is decoded (not after decoding 4 MiB)."""
    request = pb.ListDocumentsRequest(principal=PRINCIPAL, scope=filled, knowledge="notes", page_token=token)
    with pytest.raises(grpc.RpcError) as caught:
        stub(server).ListDocuments(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [(field, description)] = error_details(caught.value)[1]
    assert field == "page_token" and why in description
    assert status_wire_bytes(caught.value) < 8192
    assert listed(server, filled) == list("abcde")


def test_typed_metadata_problems_are_refused(server: Sidecar, filled: common_pb2.Scope) -> None:
    bad = document("z", "text", {"$id": "x", "n": float("inf")}, metadata={"dup": "y"})
    bad.typed_metadata["dup"].CopyFrom(value(True))
    code, reason, fields = refused(lambda: upsert(server, filled, [bad]))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert sorted(fields) == sorted(f"documents[0].typed_metadata[{k!r}]" for k in ("$id", "n", "dup"))
    assert listed(server, filled) == list("abcde")


@pytest.fixture(params=BACKENDS)
def fresh_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened = _store(request.param, tmp_path, request)
    try:
        yield opened
    finally:
        opened.stop()


def test_an_expired_document_is_invisible_at_once_purged_and_not_back_after_a_restart(fresh_store: Store) -> None:
    server = fresh_store.sidecar()
    at = scope("expiry")
    expires = T()
    expires.FromNanoseconds(time.time_ns() + 3_000_000_000)
    lasting = document("keep", "a lasting note about tides")
    upsert(server, at, [lasting, document("gone", "a fleeting note about tides", expires_at=expires)])
    assert listed(server, at) == ["gone", "keep"]
    assert got(server, at, ["gone"]).documents[0].expires_at == expires
    assert listed(server, at, exists("$expires_at")) == ["gone"]
    assert sorted(searched(server, at, None, "fleeting note tides")) == ["gone", "keep"]
    while time.time_ns() < expires.ToNanoseconds():
        time.sleep(0.05)
    # The moment it passes: no read sees it, purged or not.
    assert list(got(server, at, ["gone", "keep"]).not_found) == ["gone"]
    assert listed(server, at) == ["keep"]
    assert searched(server, at, None, "fleeting note tides") == ["keep"]
    deadline = time.monotonic() + 30
    while upsert(server, at, [lasting]).document_count != 1:  # an unchanged upsert: the count after the purge
        assert time.monotonic() < deadline, "the purge did not remove the expired document"
        time.sleep(0.5)
    server.stop()
    restarted = fresh_store.sidecar()
    assert list(got(restarted, at, ["gone"]).not_found) == ["gone"]
    assert listed(restarted, at) == ["keep"]
    assert searched(restarted, at, None, "fleeting note tides") == ["keep"]
    assert upsert(restarted, at, [lasting]).document_count == 1


def _varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def test_a_filter_nested_past_the_decoders_limit_is_refused_and_the_server_serves_on(
    server: Sidecar, filled: common_pb2.Scope
) -> None:
    """150 negations, written on the wire by hand (the client's own protobuf refuses to build them)."""
    node = b"\x1a\x03" + pb.Exists(field="a").SerializeToString()  # Filter.exists (field 3)
    for _ in range(149):
        node = b"\x32" + _varint(len(node)) + node  # Filter.negation (field 6)
    head = pb.ListDocumentsRequest(principal=PRINCIPAL, scope=filled, knowledge="notes").SerializeToString()
    payload = head + b"\x22" + _varint(len(node)) + node  # ListDocumentsRequest.filter (field 4)
    call = server.channel().unary_unary(
        "/ragsidecar.v1.RetrievalService/ListDocuments",
        request_serializer=lambda raw: raw,
        response_deserializer=pb.ListDocumentsResponse.FromString,
    )
    code, reason, _ = refused(lambda: call(payload, timeout=30))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert listed(server, filled) == list("abcde")


def test_a_directory_source_is_filtered_by_path_and_file_name(store: Store, server: Sidecar) -> None:
    folder = store.folder / "knowledge" / "handbook"
    (folder / "ops").mkdir(parents=True, exist_ok=True)
    (folder / "ops" / "tides.md").write_text("Tides turn twice a day at the harbour.\n")
    (folder / "boats.txt").write_text("Boats leave the harbour when the tide turns.\n")
    (folder / "ferry.md").write_text("The ferry crosses the harbour at noon.\n")
    handbook = entry("handbook", "DIRECTORY", "SEARCH", "handbook")

    def files(keep: pb.Filter) -> list[str]:
        request = pb.SearchRequest(
            principal=PRINCIPAL, scope=scope("files"), target=pb.Target(name="t", knowledge=[handbook]), query="harbour"
        )
        request.filters["handbook"].CopyFrom(keep)
        return sorted(h.provenance.file for h in stub(server).Search(request, timeout=60).hits)

    assert files(compare("$file_name", "==", "boats.txt")) == ["handbook/boats.txt"]
    assert files(one_of("$path", ["handbook/ops/tides.md", "handbook/ferry.md"])) == [
        "handbook/ferry.md",
        "handbook/ops/tides.md",
    ]
    assert files(negation(compare("$file_name", ">=", "f"))) == ["handbook/boats.txt"]
    code, reason, fields = refused(lambda: files(compare("$created", ">", T(seconds=1))))
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        ["filters['handbook'].comparison.field"],
    )
