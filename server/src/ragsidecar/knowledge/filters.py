"""The filter language over documents' fields: typed values, filter trees, their bounded validation, their
evaluation on one document, and an index (field and value -> members) that selects the members a filter keeps
at a cost proportional to what matches.

A document's fields are its metadata keys (typed values, or strings) and the reserved "$" names: "$id",
"$created", "$updated", "$expires_at" for stored documents, "$path" and "$file_name" for files. Semantics
(docs/memory.md has the grammar): values of different kinds never compare equal and never order; a
string-list field equals a string it holds; != and not-in are the negations of == and in, so they keep a
document lacking the field. Validation refuses, naming the part, whatever would make the cost depend on the
request rather than on our bounds, or could never be meant: too deep, too many nodes, too long, NaN, an ordering
of booleans or lists, mixed in-lists, a reserved field given another kind.

Pure domain: no protobuf, no gRPC (api/filter_messages.py converts the messages).
"""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import numpy as np

from ragsidecar.errors import Violation

MAX_DEPTH = 32
MAX_NODES = 1024
MAX_FIELD_CHARS = 256
MAX_STRING_BYTES = 4096
MAX_IN_VALUES = 1024
MAX_LIST_STRINGS = 256

RESERVED_PREFIX = "$"
ID, CREATED, UPDATED, EXPIRES_AT, PATH, FILE_NAME = "$id", "$created", "$updated", "$expires_at", "$path", "$file_name"


@dataclass(frozen=True, order=True)
class Instant:
    """A timestamp, in nanoseconds since the Unix epoch (a kind of its own: never a number)."""

    nanos: int


# A field's value: string, number, boolean, timestamp or string list.
Value: TypeAlias = str | float | bool | Instant | tuple[str, ...]


class Kind(enum.Enum):
    STRING = "string"
    NUMBER = "number"
    BOOLEAN = "boolean"
    TIMESTAMP = "timestamp"
    STRING_LIST = "string list"


DOCUMENT_FIELDS = (ID, CREATED, UPDATED, EXPIRES_AT)
FILE_FIELDS = (PATH, FILE_NAME)
RESERVED_KINDS = {
    ID: Kind.STRING,
    CREATED: Kind.TIMESTAMP,
    UPDATED: Kind.TIMESTAMP,
    EXPIRES_AT: Kind.TIMESTAMP,
    PATH: Kind.STRING,
    FILE_NAME: Kind.STRING,
}
_ORDERED = (Kind.STRING, Kind.NUMBER, Kind.TIMESTAMP)


def kind_of(value: Value) -> Kind:
    if isinstance(value, bool):  # before float: bool is an int
        return Kind.BOOLEAN
    if isinstance(value, str):
        return Kind.STRING
    if isinstance(value, float | int):
        return Kind.NUMBER
    if isinstance(value, Instant):
        return Kind.TIMESTAMP
    return Kind.STRING_LIST


class Op(enum.Enum):
    EQUAL = "=="
    NOT_EQUAL = "!="
    LESS = "<"
    LESS_OR_EQUAL = "<="
    GREATER = ">"
    GREATER_OR_EQUAL = ">="


@dataclass(frozen=True)
class Compare:
    field: str
    op: Op
    value: Value


@dataclass(frozen=True)
class In:
    field: str
    values: tuple[Value, ...]
    negated: bool = False


@dataclass(frozen=True)
class Exists:
    field: str


@dataclass(frozen=True)
class All:
    filters: tuple[Filter, ...]


@dataclass(frozen=True)
class AnyOf:
    filters: tuple[Filter, ...]


@dataclass(frozen=True)
class Not:
    filter: Filter


Filter: TypeAlias = Compare | In | Exists | All | AnyOf | Not
KEEP_ALL = All(())


def expired_at(now: int) -> Filter:
    """The documents expired at `now` (nanoseconds since the epoch): what no read may see."""
    return Compare(EXPIRES_AT, Op.LESS_OR_EQUAL, Instant(now))


# ---- validation ------------------------------------------------------------------------------------------


def problems(node: Filter, where: str, reserved: Iterable[str] = RESERVED_KINDS) -> list[Violation]:
    """Everything wrong with a filter (at most one violation per node), `where` the request path of its root,
    each violation naming the part (for example `filter.all.filters[1].comparison.value`). `reserved`: the "$"
    fields the filtered source knows. The walk stops at MAX_NODES nodes or MAX_DEPTH levels, so its cost is
    bounded whatever was sent."""
    found: list[Violation] = []
    known = frozenset(reserved)
    stack: list[tuple[Filter, str, int]] = [(node, where, 1)]
    nodes = 0
    while stack:
        current, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            found.append(Violation(where, f"more than {MAX_NODES} filter nodes", "INVALID_REQUEST"))
            break
        if depth > MAX_DEPTH:
            found.append(Violation(path, f"filter nested deeper than {MAX_DEPTH} levels", "INVALID_REQUEST"))
            break
        if isinstance(current, All | AnyOf):
            name = "all" if isinstance(current, All) else "any"
            stack.extend(
                (child, f"{path}.{name}.filters[{i}]", depth + 1)
                for i, child in reversed(list(enumerate(current.filters)))
            )
        elif isinstance(current, Not):
            stack.append((current.filter, f"{path}.negation", depth + 1))
        else:
            found += _leaf_problems(current, path, known)
    return found


def _leaf_problems(leaf: Compare | In | Exists, path: str, known: frozenset[str]) -> list[Violation]:
    part = {Compare: "comparison", In: "membership", Exists: "exists"}[type(leaf)]
    field_problem = _field_problem(leaf.field, known)
    if field_problem:
        return [Violation(f"{path}.{part}.field", field_problem, "INVALID_REQUEST")]
    expected = RESERVED_KINDS.get(leaf.field)
    if isinstance(leaf, Compare):
        at = f"{path}.comparison.value"
        problem = _value_problem(leaf.value)
        kind = kind_of(leaf.value) if problem is None else None
        if problem is None and leaf.op not in (Op.EQUAL, Op.NOT_EQUAL) and kind not in _ORDERED:
            problem = f"{leaf.op.value} does not order a {kind.value if kind else 'value'}"
        if problem is None and expected is not None and kind is not expected:
            problem = f"{leaf.field} is a {expected.value}, not a {kind.value if kind else 'value'}"
        return [Violation(at, problem, "INVALID_REQUEST")] if problem else []
    if isinstance(leaf, In):
        return _membership_problems(leaf, f"{path}.membership.values", expected)
    return []


def _membership_problems(leaf: In, at: str, expected: Kind | None) -> list[Violation]:
    if not leaf.values or len(leaf.values) > MAX_IN_VALUES:
        return [
            Violation(at, f"an in-list holds 1 to {MAX_IN_VALUES} values, not {len(leaf.values)}", "INVALID_REQUEST")
        ]
    first = kind_of(leaf.values[0])
    for i, value in enumerate(leaf.values):
        problem = _value_problem(value)
        kind = kind_of(value) if problem is None else None
        if problem is None and kind is Kind.STRING_LIST:
            problem = "an in-list holds single values, not string lists"
        elif problem is None and kind is not first:
            problem = f"an in-list holds values of one kind: {kind.value if kind else ''} after {first.value}"
        elif problem is None and expected is not None and kind is not expected:
            problem = f"{leaf.field} is a {expected.value}, not a {kind.value if kind else 'value'}"
        if problem:
            return [Violation(f"{at}[{i}]", problem, "INVALID_REQUEST")]
    return []


def _field_problem(field: str, known: frozenset[str]) -> str | None:
    if not field:
        return "a field name is required"
    if len(field) > MAX_FIELD_CHARS:
        return f"a field name is at most {MAX_FIELD_CHARS} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in field):
        return "a field name holds no control characters"
    if field.startswith(RESERVED_PREFIX) and field not in known:
        return f"{field!r} is not a reserved field of this source (known: {', '.join(sorted(known)) or 'none'})"
    return None


def value_problem(value: Value) -> str | None:
    """What is wrong with one metadata value (a document's or a filter's), or None."""
    return _value_problem(value)


def _value_problem(value: Value) -> str | None:
    if isinstance(value, str):
        return _string_problem(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "a number must be finite (no NaN or infinity)"
    if isinstance(value, tuple):
        if len(value) > MAX_LIST_STRINGS:
            return f"a string list holds at most {MAX_LIST_STRINGS} strings"
        return next((p for p in map(_string_problem, value) if p), None)
    return None


def _string_problem(value: str) -> str | None:
    if len(value) > MAX_STRING_BYTES or len(value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
        return f"a string is at most {MAX_STRING_BYTES} bytes"
    return None


# ---- evaluation on one document ---------------------------------------------------------------------------


def matches(node: Filter, fields: Mapping[str, Value]) -> bool:
    """Whether a document with these fields passes the (validated) filter."""
    if isinstance(node, Compare):
        return _compare(fields.get(node.field), node.op, node.value)
    if isinstance(node, In):
        value = fields.get(node.field)
        return (value is not None and any(_equal(value, v) for v in node.values)) != node.negated
    if isinstance(node, Exists):
        return node.field in fields
    if isinstance(node, All):
        return all(matches(child, fields) for child in node.filters)
    if isinstance(node, AnyOf):
        return any(matches(child, fields) for child in node.filters)
    return not matches(node.filter, fields)


def _compare(value: Value | None, op: Op, wanted: Value) -> bool:
    if op is Op.EQUAL:
        return value is not None and _equal(value, wanted)
    if op is Op.NOT_EQUAL:
        return value is None or not _equal(value, wanted)
    if value is None or kind_of(value) is not kind_of(wanted):
        return False
    left: Any = value
    if op is Op.LESS:
        return bool(left < wanted)
    if op is Op.LESS_OR_EQUAL:
        return bool(left <= wanted)
    if op is Op.GREATER:
        return bool(left > wanted)
    return bool(left >= wanted)


def _equal(value: Value, wanted: Value) -> bool:
    kind, wanted_kind = kind_of(value), kind_of(wanted)
    if kind is Kind.STRING_LIST and wanted_kind is Kind.STRING:
        return wanted in value  # type: ignore[operator]
    return kind is wanted_kind and value == wanted


# ---- the filter index ---------------------------------------------------------------------------------------


# The index key kind of a string a string list holds (== a string finds it; no range does).
_ELEMENT = "element"


def index_keys(value: Value) -> list[tuple[Kind | str, Any]]:
    """The (kind, value) keys a member with this value is found under by ==: a string list under each string
    it holds (as an element: == a string) and under itself (== the list)."""
    kind = kind_of(value)
    if kind is Kind.STRING_LIST:
        return [(_ELEMENT, s) for s in set(value)] + [(kind, value)]  # type: ignore[arg-type]
    return [(kind, float(value) if kind is Kind.NUMBER else value)]  # type: ignore[arg-type]


class SavedMembers(Protocol):
    """Members by field and value as a snapshot saved them (knowledge/field_columns.py), read only: each answer
    an array of members, those removed since included (FieldIndex masks them)."""

    count: int  # the members are below it

    def present(self, field: str) -> np.ndarray: ...

    def equal(self, field: str, key: tuple[Kind | str, Any]) -> np.ndarray: ...

    def ordered(self, field: str, kind: Kind, low: Any, high: Any, closed: tuple[bool, bool]) -> np.ndarray: ...


class FieldIndex:
    """Members (ints: index slots) by field and value. `select` answers a filter with the set of members it
    keeps: == and in cost the members found, ranges a bisection plus the members found, and, from the
    members' side, !=, not-in and not cost the members held (the complement).

    Built from `saved` (a snapshot's field columns) and the members of it still `alive` (a mask over
    saved.count), the index holds only the members added since; a saved member's fields, read for few members
    only, come from `read_fields`."""

    def __init__(
        self,
        saved: SavedMembers | None = None,
        alive: np.ndarray | None = None,
        read_fields: Callable[[int], Mapping[str, Value]] | None = None,
    ) -> None:
        self._saved, self._read_fields = saved, read_fields
        self._alive = np.zeros(0, dtype=bool) if alive is None else alive.copy()
        self._members: set[int] = set(np.flatnonzero(self._alive).tolist())
        self._present: dict[str, set[int]] = {}
        self._by_value: dict[str, dict[tuple[Kind | str, Any], set[int]]] = {}
        self._fields_of: dict[int, Mapping[str, Value]] = {}
        # Per (field, kind): the distinct values in order, built on a range query, dropped when the field changes.
        self._ordered: dict[tuple[str, Kind | str], list[Any]] = {}

    def __len__(self) -> int:
        return len(self._members)

    def add(self, member: int, fields: Mapping[str, Value]) -> None:
        self._members.add(member)
        self._fields_of[member] = fields
        for name, value in fields.items():
            self._present.setdefault(name, set()).add(member)
            values = self._by_value.setdefault(name, {})
            for key in index_keys(value):
                if key not in values:
                    self._ordered.pop((name, key[0]), None)
                values.setdefault(key, set()).add(member)

    def remove(self, member: int) -> None:
        fields = self._fields_of.pop(member, None)
        if fields is None:
            if member < len(self._alive) and self._alive[member]:
                self._alive[member] = False
                self._members.discard(member)
            return
        self._members.discard(member)
        for name, value in fields.items():
            _discard(self._present, name, member)
            values = self._by_value[name]
            for key in index_keys(value):
                held = values[key]
                held.discard(member)
                if not held:
                    del values[key]
                    self._ordered.pop((name, key[0]), None)
            if not values:
                del self._by_value[name]

    def fields(self, member: int) -> Mapping[str, Value]:
        fields = self._fields_of.get(member)
        if fields is None and self._read_fields is not None and member < len(self._alive) and self._alive[member]:
            return self._read_fields(member)
        return fields or {}

    def _from_saved(self, found: np.ndarray) -> set[int]:
        """Saved members found, less those removed since."""
        return set(found[self._alive[found]].tolist()) if len(found) else set()

    def select(self, node: Filter) -> set[int]:
        """The members the (validated) filter keeps; the result is the caller's to change."""
        if isinstance(node, Compare):
            return self._compare(node)
        if isinstance(node, In):
            found = set().union(*(self._equal(node.field, v) for v in node.values))
            return self._members - found if node.negated else found
        if isinstance(node, Exists):
            present = set(self._present.get(node.field, ()))
            return present | self._from_saved(self._saved.present(node.field)) if self._saved else present
        if isinstance(node, Not):
            return self._members - self.select(node.filter)
        if isinstance(node, AnyOf):
            return set().union(*(self.select(child) for child in node.filters))
        return self._all_of(node)

    def _all_of(self, node: All) -> set[int]:
        if not node.filters:
            return set(self._members)
        # Narrow with the positive leaves first; each further child only filters what is left.
        chosen = sorted(node.filters, key=lambda child: not isinstance(child, Compare | In | Exists))
        kept = self.select(chosen[0])
        for child in chosen[1:]:
            if not kept:
                break
            if len(kept) < 64:
                kept = {m for m in kept if matches(child, self.fields(m))}
            else:
                kept &= self.select(child)
        return kept

    def _equal(self, field: str, value: Value) -> set[int]:
        values = self._by_value.get(field, {})
        kind = kind_of(value)
        keys: list[tuple[Kind | str, Any]] = [(kind, float(value) if kind is Kind.NUMBER else value)]  # type: ignore[arg-type]
        if kind is Kind.STRING:
            keys.append((_ELEMENT, value))
        found = set().union(*(values.get(key, ()) for key in keys))
        if self._saved is not None:
            for key in keys:
                found |= self._from_saved(self._saved.equal(field, key))
        return found

    def _compare(self, node: Compare) -> set[int]:
        if node.op is Op.EQUAL:
            return self._equal(node.field, node.value)
        if node.op is Op.NOT_EQUAL:
            return self._members - self._equal(node.field, node.value)
        kind = kind_of(node.value)
        values = self._by_value.get(node.field, {})
        ordered = self._ordered.get((node.field, kind))
        if ordered is None:
            ordered = sorted(v for k, v in values if k is kind)
            self._ordered[(node.field, kind)] = ordered
        wanted: Any = float(node.value) if kind is Kind.NUMBER else node.value  # type: ignore[arg-type]
        low, high, closed = _bounds(node.op, wanted)
        chosen = ordered[_position(ordered, low, not closed[0], 0) : _position(ordered, high, closed[1], len(ordered))]
        found: set[int] = set().union(*(values[(kind, v)] for v in chosen))
        if self._saved is not None:
            found |= self._from_saved(self._saved.ordered(node.field, kind, low, high, closed))
        return found


def _bounds(op: Op, wanted: Any) -> tuple[Any, Any, tuple[bool, bool]]:
    """An ordering as a range: (low, high, whether each bound is kept); None for an open end."""
    if op is Op.LESS:
        return None, wanted, (False, False)
    if op is Op.LESS_OR_EQUAL:
        return None, wanted, (False, True)
    if op is Op.GREATER:
        return wanted, None, (False, False)
    return wanted, None, (True, False)


def _position(ordered: list[Any], bound: Any, right: bool, open_end: int) -> int:
    """Where a bound cuts the ordered values: past its equals when `right`; `open_end` when there is no bound."""
    if bound is None:
        return open_end
    return bisect.bisect_right(ordered, bound) if right else bisect.bisect_left(ordered, bound)


def _discard(sets: dict[str, set[int]], name: str, member: int) -> None:
    held = sets.get(name)
    if held is not None:
        held.discard(member)
        if not held:
            del sets[name]


# ---- persisted form -----------------------------------------------------------------------------------------


def to_json(fields: Mapping[str, Value]) -> dict[str, Any]:
    """Fields as JSON values (a timestamp as {"t": nanos}, a string list as a list), for chunk records."""
    return {k: value_to_json(v) for k, v in fields.items()}


def from_json(record: Mapping[str, Any]) -> dict[str, Value]:
    """The inverse of `to_json`."""
    return {k: value_from_json(v) for k, v in record.items()}


def value_to_json(value: Value) -> Any:
    return {"t": value.nanos} if isinstance(value, Instant) else list(value) if isinstance(value, tuple) else value


def value_from_json(value: Any) -> Value:
    """The inverse of `value_to_json`."""
    if isinstance(value, dict):
        return Instant(int(value["t"]))
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
