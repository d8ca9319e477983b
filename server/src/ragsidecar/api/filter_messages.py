"""Filter and typed-metadata messages (retrieval.proto) as the domain's filter language (knowledge/filters.py),
and back. Conversion stops at the domain's bounds (depth, nodes) so a hostile message costs no more than an
allowed one; every problem is a Violation naming the part by its proto path."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf import timestamp_pb2

from ragsidecar.errors import Violation, invalid
from ragsidecar.knowledge import filters as f
from ragsidecar.knowledge.storage import MemoryDocument
from ragsidecar.v1 import retrieval_pb2 as pb

_OPERATORS = {
    pb.COMPARISON_OPERATOR_EQUAL: f.Op.EQUAL,
    pb.COMPARISON_OPERATOR_NOT_EQUAL: f.Op.NOT_EQUAL,
    pb.COMPARISON_OPERATOR_LESS: f.Op.LESS,
    pb.COMPARISON_OPERATOR_LESS_OR_EQUAL: f.Op.LESS_OR_EQUAL,
    pb.COMPARISON_OPERATOR_GREATER: f.Op.GREATER,
    pb.COMPARISON_OPERATOR_GREATER_OR_EQUAL: f.Op.GREATER_OR_EQUAL,
}


class _Refused(Exception):
    def __init__(self, violation: Violation) -> None:
        self.violation = violation


def filter_of(message: pb.Filter, where: str, reserved: Iterable[str] = f.RESERVED_KINDS) -> f.Filter:
    """The domain filter of a Filter message, checked (INVALID_ARGUMENT, reason INVALID_REQUEST, naming the part)."""
    budget = [f.MAX_NODES]
    try:
        node = _node(message, where, 1, budget)
    except _Refused as refused:
        raise invalid([refused.violation]) from None
    if found := f.problems(node, where, reserved):
        raise invalid(found[:1])
    return node


def _node(message: pb.Filter, path: str, depth: int, budget: list[int]) -> f.Filter:
    budget[0] -= 1
    if budget[0] < 0:
        raise _Refused(Violation(path, f"more than {f.MAX_NODES} filter nodes", "INVALID_REQUEST"))
    if depth > f.MAX_DEPTH:
        raise _Refused(Violation(path, f"filter nested deeper than {f.MAX_DEPTH} levels", "INVALID_REQUEST"))
    kind = message.WhichOneof("kind")
    if kind == "comparison":
        c = message.comparison
        op = _OPERATORS.get(c.operator)
        if op is None:
            raise _Refused(
                Violation(f"{path}.comparison.operator", f"unknown operator {c.operator}", "INVALID_REQUEST")
            )
        return f.Compare(c.field, op, value_of(c.value, f"{path}.comparison.value"))
    if kind == "membership":
        m = message.membership
        if len(m.values) > f.MAX_IN_VALUES:
            raise _Refused(
                Violation(
                    f"{path}.membership.values", f"an in-list holds at most {f.MAX_IN_VALUES} values", "INVALID_REQUEST"
                )
            )
        values = tuple(value_of(v, f"{path}.membership.values[{i}]") for i, v in enumerate(m.values))
        return f.In(m.field, values, m.negated)
    if kind == "exists":
        return f.Exists(message.exists.field)
    if kind in ("all", "any"):
        children = getattr(message, kind).filters
        nodes = tuple(
            _node(child, f"{path}.{kind}.filters[{i}]", depth + 1, budget) for i, child in enumerate(children)
        )
        return f.All(nodes) if kind == "all" else f.AnyOf(nodes)
    if kind == "negation":
        return f.Not(_node(message.negation, f"{path}.negation", depth + 1, budget))
    raise _Refused(Violation(path, "a filter node must set one of its kinds", "INVALID_REQUEST"))


def value_of(message: pb.MetadataValue, path: str) -> f.Value:
    """The domain value of a MetadataValue (its kind must be set; its size and finiteness are checked later)."""
    kind = message.WhichOneof("kind")
    if kind == "string_value":
        return message.string_value
    if kind == "number_value":
        return float(message.number_value)
    if kind == "bool_value":
        return bool(message.bool_value)
    if kind == "timestamp_value":
        return f.Instant(message.timestamp_value.seconds * 1_000_000_000 + message.timestamp_value.nanos)
    if kind == "string_list_value":
        return tuple(message.string_list_value.values)
    raise _Refused(Violation(path, "a value must set one of its kinds", "INVALID_REQUEST"))


def typed_metadata_of(
    typed: Mapping[str, pb.MetadataValue], strings: Mapping[str, str], where: str
) -> tuple[dict[str, f.Value], list[Violation]]:
    """A document's typed metadata, and what is wrong with it (`where`: the document's path)."""
    values: dict[str, f.Value] = {}
    found: list[Violation] = []
    for key in sorted(typed):
        at = f"{where}.typed_metadata[{key!r}]"
        if not key or len(key) > f.MAX_FIELD_CHARS or key.startswith(f.RESERVED_PREFIX) or key in strings:
            why = (
                "names a reserved field"
                if key.startswith(f.RESERVED_PREFIX)
                else "is also in metadata"
                if key in strings
                else "must be 1 to 256 characters"
            )
            found.append(Violation(at, f"the key {why}", "INVALID_REQUEST"))
            continue
        try:
            value = value_of(typed[key], at)
        except _Refused as refused:
            found.append(refused.violation)
            continue
        if problem := f.value_problem(value):
            found.append(Violation(at, problem, "INVALID_REQUEST"))
        else:
            values[key] = value
    return values, found


def instant_of(message: timestamp_pb2.Timestamp) -> f.Instant:
    return f.Instant(message.seconds * 1_000_000_000 + message.nanos)


def timestamp_of(instant: f.Instant) -> timestamp_pb2.Timestamp:
    seconds, nanos = divmod(instant.nanos, 1_000_000_000)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


def value_message(value: f.Value) -> pb.MetadataValue:
    if isinstance(value, bool):
        return pb.MetadataValue(bool_value=value)
    if isinstance(value, str):
        return pb.MetadataValue(string_value=value)
    if isinstance(value, float | int):
        return pb.MetadataValue(number_value=float(value))
    if isinstance(value, f.Instant):
        return pb.MetadataValue(timestamp_value=timestamp_of(value))
    return pb.MetadataValue(string_list_value=pb.StringList(values=list(value)))


def metadata_messages(values: Mapping[str, Any]) -> dict[str, pb.MetadataValue]:
    return {k: value_message(v) for k, v in values.items()}


def document_message(document: MemoryDocument) -> pb.MemoryDocument:
    message = pb.MemoryDocument(
        id=document.id,
        text=document.text,
        metadata=document.metadata,
        typed_metadata=metadata_messages(document.typed),
        created=timestamp_of(f.Instant(document.created)),
        updated=timestamp_of(f.Instant(document.updated)),
    )
    if document.expires_at is not None:
        message.expires_at.CopyFrom(timestamp_of(f.Instant(document.expires_at)))
    return message


# -- page tokens: the id to list after, bound to the listing's knowledge and filter -------------------------------


# The longest token a listing hands out (an id of at most MAX_ID_CHARS, JSON-escaped, and the listing's hash, in
# base64) is about 2 KB; a longer one is refused before it is decoded.
MAX_PAGE_TOKEN_CHARS = 8192


def page_token(after: str, knowledge: str, keep: f.Filter) -> str:
    body = json.dumps({"after": after, "of": _listing(knowledge, keep)}, ensure_ascii=False)
    return base64.urlsafe_b64encode(body.encode("utf-8", "surrogatepass")).decode("ascii")


def after_of(token: str, knowledge: str, keep: f.Filter) -> str:
    """The id a page token lists after ("" for none); INVALID_ARGUMENT for a token of another listing."""
    if not token:
        return ""
    if len(token) > MAX_PAGE_TOKEN_CHARS:
        raise invalid([Violation("page_token", f"longer than {MAX_PAGE_TOKEN_CHARS} characters", "LIMIT_EXCEEDED")])
    try:
        body = json.loads(base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8", "surrogatepass"))
        after, listing = body["after"], body["of"]
    except (ValueError, KeyError, TypeError, UnicodeError, binascii.Error):
        raise invalid([Violation("page_token", "not a page token of this call", "INVALID_REQUEST")]) from None
    if not isinstance(after, str) or listing != _listing(knowledge, keep):
        raise invalid([Violation("page_token", "a page token of another knowledge or filter", "INVALID_REQUEST")])
    return after


def _listing(knowledge: str, keep: f.Filter) -> str:
    return hashlib.sha256(repr((knowledge, keep)).encode("utf-8", "surrogatepass")).hexdigest()[:32]
