"""The field index of a snapshot (knowledge/index_files.py names its files): for each field, the slots whose chunk
holds it and each one's value as a code into the field's distinct values, so that an index opened from the snapshot
answers its first filtered search without reading every chunk's record (filters.FieldIndex over `FieldColumns`).

A field's slots and codes are one span of an int32 array (memory-mapped); its distinct values one JSON line, read
and parsed the first time a filter names the field. A later save that replaces the folder leaves the file open
and the mapping readable."""

from __future__ import annotations

import bisect
import json
import os
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragsidecar.knowledge import filters
from ragsidecar.knowledge.index_files import FIELD_MEMBERS, FIELD_VALUES, FIELDS, IndexCorrupt

_NONE = np.zeros(0, dtype=np.int32)


@dataclass
class _Column:
    """One field as saved: the slots holding it (ascending), each one's value's code, the distinct values as
    parsed JSON (`raw`: filters.value_to_json's), typed when first needed."""

    slots: np.ndarray
    codes: np.ndarray
    raw: list[Any]
    _values: list[filters.Value] | None = None
    _by_key: dict[tuple[filters.Kind | str, Any], list[int]] | None = None
    # Per kind, built on a range query: the field's values of that kind in order (a timestamp as its nanoseconds),
    # and their codes; built from the raw values, so a range over one value per chunk types none of them.
    ordered: dict[filters.Kind, tuple[list[Any], list[int]]] = field(default_factory=dict)

    @property
    def values(self) -> list[filters.Value]:
        if self._values is None:
            self._values = [filters.value_from_json(v) for v in self.raw]
        return self._values

    @property
    def by_key(self) -> dict[tuple[filters.Kind | str, Any], list[int]]:
        """Codes by the keys == finds a value under (filters.index_keys)."""
        if self._by_key is None:
            by_key: dict[tuple[filters.Kind | str, Any], list[int]] = {}
            string = filters.Kind.STRING
            for code, raw in enumerate(self.raw):
                if isinstance(raw, str):  # most are: typed without a call
                    by_key.setdefault((string, raw), []).append(code)
                    continue
                for key in filters.index_keys(filters.value_from_json(raw)):
                    by_key.setdefault(key, []).append(code)
            self._by_key = by_key
        return self._by_key

    def in_order(self, kind: filters.Kind) -> tuple[list[Any], list[int]]:
        if kind not in self.ordered:
            pairs = sorted(
                (key, code) for code, v in enumerate(self.raw) if (key := _ordering_key(v, kind)) is not None
            )
            self.ordered[kind] = ([key for key, _ in pairs], [code for _, code in pairs])
        return self.ordered[kind]

    def having(self, codes: list[int]) -> np.ndarray:
        """The slots whose value is one of `codes`."""
        if not codes:
            return _NONE
        if len(codes) == 1:
            return self.slots[self.codes == codes[0]]
        wanted = np.zeros(len(self.raw), dtype=bool)
        wanted[codes] = True
        return self.slots[wanted[self.codes]]


class FieldColumns:
    """A snapshot's field index, read only (filters.SavedMembers); `count` the slots the snapshot holds."""

    def __init__(self, folder: Path) -> None:
        header = json.loads((folder / FIELDS).read_text(encoding="utf-8"))
        members = np.load(folder / FIELD_MEMBERS, mmap_mode="r", allow_pickle=False)
        self.count = int(header["count"])
        self._spans: dict[str, list[int]] = header["fields"]
        size = (folder / FIELD_VALUES).stat().st_size
        if members.dtype != np.int32 or members.ndim != 2 or members.shape[0] != 2:
            raise IndexCorrupt(f"{folder}: field members {members.dtype} {members.shape}")
        for name, (start, end, offset, length, values) in self._spans.items():
            slots, codes = members[0, start:end], members[1, start:end]
            if (
                not 0 <= start <= end <= members.shape[1]
                or not 0 <= offset <= offset + length <= size
                or (end > start and (slots.min() < 0 or slots.max() >= self.count))
                or (end > start and (codes.min() < 0 or codes.max() >= values))
            ):
                raise IndexCorrupt(f"{folder}: field {name!r} spans {start}..{end} of {members.shape[1]}")
        self._members = members.view(np.ndarray)
        self._fd = os.open(folder / FIELD_VALUES, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)
        self._columns: dict[str, _Column] = {}

    def names(self) -> list[str]:
        return list(self._spans)

    def span(self, name: str) -> list[int] | None:
        """The field's [start, end, offset, length, values] in the files, None when no member holds it."""
        return self._spans.get(name)

    def members(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The slots holding the field and their codes."""
        start, end = self._spans[name][:2]
        return self._members[0, start:end], self._members[1, start:end]

    def values_line(self, name: str) -> bytes:
        """The field's values as saved: one JSON list."""
        offset, length = self._spans[name][2:4]
        return os.pread(self._fd, length, offset)

    def column(self, name: str) -> _Column | None:
        """The field's column, its values parsed on first use (two threads may both parse it: either's is kept)."""
        column = self._columns.get(name)
        if column is None and name in self._spans:
            raw = json.loads(self.values_line(name))
            if not isinstance(raw, list) or len(raw) != self._spans[name][4]:
                raise IndexCorrupt(f"field {name!r}: values are not a list of {self._spans[name][4]}")
            column = self._columns[name] = _Column(*self.members(name), raw)
        return column

    def present(self, field: str) -> np.ndarray:
        column = self.column(field)
        return _NONE if column is None else column.slots

    def equal(self, field: str, key: tuple[filters.Kind | str, Any]) -> np.ndarray:
        column = self.column(field)
        return _NONE if column is None else column.having(column.by_key.get(key, []))

    def ordered(self, field: str, kind: filters.Kind, low: Any, high: Any, closed: tuple[bool, bool]) -> np.ndarray:
        column = self.column(field)
        if column is None:
            return _NONE
        values, codes = column.in_order(kind)
        if kind is filters.Kind.TIMESTAMP:
            low, high = (None if b is None else b.nanos for b in (low, high))
        first = 0 if low is None else (bisect.bisect_left if closed[0] else bisect.bisect_right)(values, low)
        last = len(values) if high is None else (bisect.bisect_right if closed[1] else bisect.bisect_left)(values, high)
        return column.having(codes[first:last])


def _ordering_key(raw: Any, kind: filters.Kind) -> Any:
    """What orders a raw value of `kind` among its kind (None for a value of another kind)."""
    if kind is filters.Kind.STRING:
        return raw if isinstance(raw, str) else None
    if kind is filters.Kind.TIMESTAMP:
        return int(raw["t"]) if isinstance(raw, dict) else None
    if kind is filters.Kind.NUMBER and isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    return None


def write(
    folder: Path,
    count: int,
    base: FieldColumns | None,
    kept: np.ndarray,
    added: Iterable[tuple[int, Mapping[str, filters.Value]]],
) -> None:
    """The field index of slots 0..count-1 into `folder`: `base`'s members still `kept` (a mask over base.count)
    with their saved values, and the `added` slots' fields."""
    new: dict[str, tuple[list[int], list[filters.Value]]] = {}
    for slot, fields in added:
        for name, value in fields.items():
            slots, values = new.setdefault(name, ([], []))
            slots.append(slot)
            values.append(value)
    names = sorted({*(base.names() if base else ()), *new})
    spans: dict[str, list[int]] = {}
    parts: list[np.ndarray] = []
    start = offset = 0
    with open(folder / FIELD_VALUES, "wb") as lines:
        for name in names:
            members, codes, line, distinct = _merged(base, name, kept, *new.get(name, ([], [])))
            if not len(members):
                continue
            lines.write(line + b"\n")
            spans[name] = [start, start + len(members), offset, len(line), distinct]
            parts.append(np.stack([members, codes]))
            start, offset = start + len(members), offset + len(line) + 1
    members = np.concatenate(parts, axis=1) if parts else np.zeros((2, 0), dtype=np.int32)
    with open(folder / FIELD_MEMBERS, "wb") as f:
        np.save(f, members.astype(np.int32), allow_pickle=False)
    (folder / FIELDS).write_text(json.dumps({"count": count, "fields": spans}), encoding="utf-8")


class _Coder:
    """Codes for values, equal values one code, from `first` on."""

    def __init__(self, first: int = 0) -> None:
        self.first = first
        self.values: list[filters.Value] = []
        self._code_of: dict[tuple[filters.Kind, Any], int] = {}

    def code(self, value: filters.Value) -> int:
        kind = filters.kind_of(value)
        key = (kind, float(value) if kind is filters.Kind.NUMBER else value)  # type: ignore[arg-type]
        code = self._code_of.get(key)
        if code is None:
            code = self._code_of[key] = self.first + len(self.values)
            self.values.append(value)
        return code

    def json(self) -> bytes:
        return json.dumps([filters.value_to_json(v) for v in self.values], ensure_ascii=False, allow_nan=False).encode()


def _merged(
    base: FieldColumns | None, name: str, kept: np.ndarray, slots: list[int], values: list[filters.Value]
) -> tuple[np.ndarray, np.ndarray, bytes, int]:
    """One field's slots (ascending), codes, values line and count of values: the base's kept members, then
    `slots`. While most of the saved values are still held, they are kept as saved (not parsed) and the new ones
    follow them (a value may then have two codes); else the field's values are written afresh, those held only."""
    span = base.span(name) if base is not None else None
    if span is None:
        coder = _Coder()
        codes = [coder.code(v) for v in values]
        return _in_order(_NONE, _NONE, slots, codes) + (coder.json(), len(coder.values))
    assert base is not None
    saved_slots, saved_codes = base.members(name)
    keep = kept[saved_slots]
    saved_slots, saved_codes = saved_slots[keep], saved_codes[keep]
    saved_count = span[4]
    used = np.unique(saved_codes)
    if 2 * len(used) >= saved_count:
        coder = _Coder(saved_count)
        codes = [coder.code(v) for v in values]
        line = base.values_line(name)
        if coder.values:
            line = line[:-1] + (b"," if saved_count else b"") + coder.json()[1:]
        return _in_order(saved_slots, saved_codes, slots, codes) + (line, saved_count + len(coder.values))
    column = base.column(name)
    assert column is not None
    coder = _Coder()
    renumbered = np.zeros(saved_count, dtype=np.int32)
    renumbered[used] = [coder.code(column.values[c]) for c in used.tolist()]
    codes = [coder.code(v) for v in values]
    return _in_order(saved_slots, renumbered[saved_codes], slots, codes) + (coder.json(), len(coder.values))


def _in_order(
    saved_slots: np.ndarray, saved_codes: np.ndarray, slots: list[int], codes: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    all_slots = np.concatenate([saved_slots, np.asarray(slots, dtype=np.int32)])
    all_codes = np.concatenate([saved_codes, np.asarray(codes, dtype=np.int32)])
    order = np.argsort(all_slots, kind="stable")
    return all_slots[order].astype(np.int32), all_codes[order].astype(np.int32)
