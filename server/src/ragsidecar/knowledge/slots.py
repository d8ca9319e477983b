"""The slot storage of an index (knowledge/index.py): each chunk in a slot, with its float32 row and its record.

A slot's chunk is held in memory until a snapshot holds it; then only its id is kept, and its record (text and
metadata, read for hits and changes only) is read from the snapshot's chunks file through a small cache of recent
hits, its row from the snapshot's vectors, memory-mapped, and its fields, for filters, from the snapshot's field
index (knowledge/field_columns.py). A removed chunk leaves a dead slot behind until the index compacts."""

from __future__ import annotations

import itertools
import json
import os
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragsidecar import metrics
from ragsidecar.cache import ByteLRU
from ragsidecar.knowledge import field_columns, filters
from ragsidecar.knowledge.field_columns import FieldColumns
from ragsidecar.knowledge.index_files import CHUNKS, OFFSETS, VECTORS, IndexCorrupt

# Selections kept per index, until its next change (each a sorted array of the slots a filter keeps).
_CACHED_SELECTIONS = 8

# Rows of mapped vectors copied into a save at a time.
_ROWS_PER_BLOCK = 4096
# The records of hits read from snapshots' chunk files most recently, by (file, slot): a host's searches come back
# to the same chunks, and reading and parsing a record costs a search 15 to 25 microseconds a hit
# (bench/lean_reference.py); metric ragsidecar_cache_bytes{cache="hit_records"}.
HIT_RECORD_CACHE_BYTES = 8 << 20
_HIT_RECORDS: ByteLRU[tuple[int, int], IndexedChunk] = ByteLRU(HIT_RECORD_CACHE_BYTES)
metrics.track_size("hit_records", _HIT_RECORDS)
_RECORD_FILES = itertools.count()
# A cached record's objects beside its text (the dict of its metadata and the chunk).
_RECORD_OVERHEAD = 600


@dataclass(frozen=True)
class IndexedChunk:
    id: str
    text: str
    meta: dict[str, Any]


def _required_field(node: filters.Filter | None) -> str | None:
    """The field every chunk the filter keeps holds, when it is a comparison other than != (else None)."""
    if isinstance(node, filters.Compare) and node.op is not filters.Op.NOT_EQUAL:
        return node.field
    return None


def fields_of(chunk: IndexedChunk) -> dict[str, filters.Value]:
    """What a filter sees of a chunk: its document's fields as the store recorded them (meta "fields", with
    "$id" and the timestamps), and for a file's chunk its "$path" and "$file_name"."""
    meta = chunk.meta
    fields = filters.from_json(meta.get("fields") or {})
    if path := meta.get("file"):
        fields[filters.PATH] = path
        fields[filters.FILE_NAME] = path.rsplit("/", 1)[-1]
    return fields


class Rows:
    """Float32 vectors by slot: the first `len(mapped)` rows memory-mapped from a snapshot's vectors (the page
    cache's, not the process's), the rest in `tail`, grown by doubling (rows past the slots used are spare). A
    slot's row never changes once written, so a reader holding this object reads consistent rows without a lock."""

    def __init__(self, mapped: np.ndarray, tail: np.ndarray) -> None:
        self.mapped, self.tail = mapped, tail

    def __getitem__(self, slots: np.ndarray | list[int]) -> np.ndarray:
        slots = np.asarray(slots, dtype=np.intp)
        boundary = len(self.mapped)
        if not boundary:
            return self.tail.take(slots, axis=0)
        if not len(slots) or slots.max() < boundary:
            return self.mapped.take(slots, axis=0)  # take: fancy indexing of a read-only mapping is 3x slower
        rows = np.empty((len(slots), self.tail.shape[1]), dtype=np.float32)
        low = slots < boundary
        rows[low] = self.mapped.take(slots[low], axis=0)
        rows[~low] = self.tail.take(slots[~low] - boundary, axis=0)
        return rows

    def appended(self, first: int, vectors: np.ndarray) -> Rows:
        """These rows with `vectors` at slots first.. (a new object when the tail had to grow)."""
        start, end = first - len(self.mapped), first - len(self.mapped) + len(vectors)
        tail = self.tail
        if end > len(tail):
            tail = np.zeros((max(end, 2 * len(tail)), tail.shape[1]), dtype=np.float32)
            tail[:start] = self.tail[:start]
        tail[start:end] = vectors
        return self if tail is self.tail else Rows(self.mapped, tail)

    def nbytes(self) -> int:
        """Bytes held in the process (the mapped rows are the page cache's)."""
        return self.tail.nbytes

    def write(self, path: Path, used: int) -> None:
        """Rows 0..used-1 as one .npy file, written a block at a time (the mapped rows are never copied whole)."""
        with open(path, "wb") as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f4", "fortran_order": False, "shape": (used, self.tail.shape[1])}
            )
            boundary = min(len(self.mapped), used)
            for start in range(0, boundary, _ROWS_PER_BLOCK):
                f.write(np.ascontiguousarray(self.mapped[start : min(start + _ROWS_PER_BLOCK, boundary)]).data)
            f.write(np.ascontiguousarray(self.tail[: used - boundary]).data)


class _Records:
    """The chunk records of a snapshot's chunks file (one JSON line per slot), read by slot when a hit or a
    change needs one. The file stays open: a later save that replaces its folder leaves it readable."""

    def __init__(self, path: Path, offsets: np.ndarray) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)
        self._offsets = offsets
        self._number = next(_RECORD_FILES)  # names its records in _HIT_RECORDS (an id() could be reused)

    def hit(self, slot: int) -> IndexedChunk:
        """The slot's chunk, through the cache of hits' records (a record never changes: no entry goes stale)."""
        key = (self._number, slot)
        chunk = _HIT_RECORDS.get(key)
        if chunk is None:
            line = self.line(slot)
            chunk = chunk_from(json.loads(line))
            _HIT_RECORDS.put(key, chunk, _RECORD_OVERHEAD + 2 * len(line))
        return chunk

    def line(self, slot: int) -> bytes:
        """The slot's line, without its newline."""
        start, end = int(self._offsets[slot]), int(self._offsets[slot + 1])
        return os.pread(self._fd, end - start - 1, start)

    def chunk(self, slot: int) -> IndexedChunk:
        return chunk_from(json.loads(self.line(slot)))


def _from_records(records: _Records | None, slot: int, hit: bool = False) -> IndexedChunk:
    if records is None:
        raise LookupError(f"index slot {slot} names a record but the index reads no file")
    return records.hit(slot) if hit else records.chunk(slot)


@dataclass(frozen=True)
class Taken:
    """Slots a search found, as it took them under its index's lock: each one's chunk (or its id, the chunk then
    read from `records` when it becomes a hit) and the rows, enough to fuse, feed back and build the hits after
    letting go of the lock. A slot's row and record never change once written, and a change or a compaction
    meanwhile swaps in other objects, leaving these as they were."""

    vectors: Rows
    records: _Records | None
    entries: dict[int, IndexedChunk | str]

    def id_of(self, slot: int) -> str:
        entry = self.entries[slot]
        return entry if isinstance(entry, str) else entry.id

    def hit_chunk(self, slot: int) -> IndexedChunk:
        """The slot's chunk for a hit: a record read from the file goes through the hits' cache (changes and
        compactions read theirs around it, Slots.live_chunk, so as not to flush what searches come back to)."""
        entry = self.entries[slot]
        return _from_records(self.records, slot, hit=True) if isinstance(entry, str) else entry


class Slots:
    """The chunks of an index by slot, their float32 vectors by row (= slot), and the key of each live one.

    A slot's chunk is held in memory until a snapshot holds it; then only its id is kept and the rest (text and
    meta, read for hits only) is read from the snapshot's chunks file, its vector from the snapshot's mapped
    vectors (`map`): what a search scores stays resident, what it reports is read for the few hits."""

    def __init__(self, dimensions: int) -> None:
        # Per slot: its chunk, or its id when its record is read from `records`, or None once released.
        self.chunks: list[IndexedChunk | str | None] = []
        self.vectors = Rows(np.zeros((0, dimensions), dtype=np.float32), np.zeros((0, dimensions), dtype=np.float32))
        self.records: _Records | None = None
        # The field index of the slots `records` holds, when their snapshot saved one (older ones did not).
        self.saved_fields: FieldColumns | None = None
        self.of_key: dict[str, int] = {}
        self.text_chars = 0  # of the live chunks (kept as they change: sizing an index must not scan it)
        # The live slots by field and value, built by the first filtered search, then kept as slots change.
        self.filterable: filters.FieldIndex | None = None
        # Live chunks holding each field (kept as they change, cheaply): a search hiding by a field no chunk has
        # needs no field index.
        self.holding: Counter[str] = Counter()
        # The last filters' selections (a host's memory searches repeat one filter, say its user's, between writes).
        self.selections: OrderedDict[filters.Filter, np.ndarray] = OrderedDict()
        # Searches run together (under the index's read lock) and share the two above: one selects at a time.
        self.selecting = threading.Lock()

    @property
    def used(self) -> int:
        return len(self.chunks)

    def append(self, keys: list[str], chunks: list[IndexedChunk], vectors: np.ndarray) -> np.ndarray:
        first = self.used
        needed = first + len(chunks)
        self.vectors = self.vectors.appended(first, vectors)
        self.chunks += chunks
        self.of_key.update(zip(keys, range(first, needed), strict=True))
        self.text_chars += sum(len(c.text) for c in chunks)
        for chunk in chunks:
            self.holding.update(list(chunk.meta.get("fields") or ()))  # the field names (a mapping adds its values)
        if self.filterable is not None:
            self.selections.clear()
            for slot, chunk in enumerate(chunks, first):
                self.filterable.add(slot, fields_of(chunk))
        return np.arange(first, needed, dtype=np.int64)

    def release(self, keys: Iterable[str]) -> list[int]:
        slots = [slot for key in keys if (slot := self.of_key.pop(key, None)) is not None]
        for slot in slots:
            chunk = self.live_chunk(slot)
            self.text_chars -= len(chunk.text)
            self.holding.subtract(list(chunk.meta.get("fields") or ()))
            self.chunks[slot] = None
            if self.filterable is not None:
                self.filterable.remove(slot)
        if slots:
            self.selections.clear()
        return slots

    def allowed(self, keep: filters.Filter | None, hide: filters.Filter | None) -> np.ndarray | None:
        """The live slots a search may find, ascending (read only: it may be cached): those `keep` keeps, less
        those `hide` keeps; None when that is every live slot. `hide` costs what it selects (expired documents
        not purged yet), `keep` what it keeps."""
        needed = _required_field(hide)
        if needed is not None and self.holding[needed] <= 0:
            hide = None  # it could select nothing
        if keep is None and hide is None:
            return None
        with self.selecting:
            fields = self._filterable()
            hidden = fields.select(hide) if hide is not None else set()
            if keep is None and not hidden:
                return None
            slots = self._selection(fields, filters.KEEP_ALL if keep is None else keep)
        if hidden:
            slots = slots[~np.isin(slots, np.fromiter(hidden, dtype=np.int64, count=len(hidden)))]
        return slots

    def _filterable(self) -> filters.FieldIndex:
        """The field index: from the snapshot's (its live members' fields left in its files) plus the chunks added
        since, or, when the snapshot saved none, from every live chunk's fields (a mapped chunk's read from its
        record: 4.3 s at 100k chunks)."""
        if self.filterable is None:
            saved = self.saved_fields
            if saved is None:
                self.filterable = filters.FieldIndex()
                for slot in self.of_key.values():
                    self.filterable.add(slot, fields_of(self.live_chunk(slot)))
            else:
                live = np.fromiter(self.of_key.values(), dtype=np.int64, count=len(self.of_key))
                alive = np.zeros(saved.count, dtype=bool)
                alive[live[live < saved.count]] = True
                self.filterable = filters.FieldIndex(saved, alive, lambda slot: fields_of(self.live_chunk(slot)))
                for slot in live[live >= saved.count].tolist():
                    self.filterable.add(slot, fields_of(self.live_chunk(slot)))
        return self.filterable

    def _selection(self, fields: filters.FieldIndex, keep: filters.Filter) -> np.ndarray:
        cached = self.selections.get(keep)
        if cached is not None:
            self.selections.move_to_end(keep)
            return cached
        selected = fields.select(keep)
        slots = np.sort(np.fromiter(selected, dtype=np.int64, count=len(selected)))
        slots.flags.writeable = False
        self.selections[keep] = slots
        if len(self.selections) > _CACHED_SELECTIONS:
            self.selections.popitem(last=False)
        return slots

    def live_chunk(self, slot: int) -> IndexedChunk:
        """The chunk of a slot a key or a search names (never a released one)."""
        chunk = self.chunks[slot]
        if chunk is None:
            raise LookupError(f"index slot {slot} was released")
        return _from_records(self.records, slot) if isinstance(chunk, str) else chunk

    def taken(self, slots: Iterable[int]) -> Taken:
        """The live `slots` as they are now, for reading without the caller's lock (Taken)."""
        entries: dict[int, IndexedChunk | str] = {}
        for slot in slots:
            chunk = self.chunks[slot]
            if chunk is None:
                raise LookupError(f"index slot {slot} was released")
            entries[slot] = chunk
        return Taken(self.vectors, self.records, entries)

    def restore(self, records: list[dict[str, Any] | None], vectors: np.ndarray) -> None:
        """The slots as a save wrote them (records of dead slots are None), held in memory."""
        self.vectors = Rows(self.vectors.mapped, vectors)
        self.chunks = [None if r is None else chunk_from(r) for r in records]
        self.of_key = {r.get("key", r["id"]): slot for slot, r in enumerate(records) if r is not None}
        self.text_chars = sum(len(c.text) for c in self.chunks if isinstance(c, IndexedChunk))
        self.holding = Counter(
            name for c in self.chunks if isinstance(c, IndexedChunk) for name in c.meta.get("fields") or ()
        )

    def restore_mapped(self, folder: Path, listing: dict[str, Any], offsets: np.ndarray, with_fields: bool) -> None:
        """The slots as a save wrote them, their records and vectors left in the folder's files (`map`);
        `listing` is the save's keys file: each slot's key and chunk id (None for a dead slot), and the fields
        the live chunks hold; `with_fields`: whether the save wrote a field index (its manifest names it)."""
        keys, ids = listing["keys"], listing["ids"]
        self.chunks = list(ids)
        self.of_key = {key: slot for slot, key in enumerate(keys) if key is not None}
        self.holding = Counter(listing["holding"])
        self.map(folder, len(ids), offsets, with_fields)

    def map(self, folder: Path, saved: int, offsets: np.ndarray, with_fields: bool = True) -> None:
        """Reads slots 0..saved-1 from the files a save wrote into `folder` from now on: their chunks from its
        chunks file, their vectors from its vectors mapped, the rows after them kept in memory, and their fields
        from its field index (`with_fields`; it replaces the field index held)."""
        mapped = np.load(folder / VECTORS, mmap_mode="r", allow_pickle=False)
        if (
            mapped.shape != (saved, self.vectors.tail.shape[1])
            or mapped.dtype != np.float32
            or len(offsets) != saved + 1
        ):
            raise IndexCorrupt(
                f"{folder}: vectors {mapped.dtype} {mapped.shape} and {len(offsets)} offsets for {saved} slots"
            )
        saved_fields = FieldColumns(folder) if with_fields else None
        if saved_fields is not None and saved_fields.count != saved:
            raise IndexCorrupt(f"{folder}: a field index of {saved_fields.count} slots for {saved}")
        tail = self.vectors[np.arange(saved, self.used)]
        self.records = _Records(folder / CHUNKS, offsets)
        self.vectors = Rows(mapped.view(np.ndarray), tail)
        self.saved_fields = saved_fields
        if saved_fields is not None:  # the next filtered search builds it again, over the saved one: less held
            self.filterable = None
            self.selections.clear()
        for slot in range(saved):
            chunk = self.chunks[slot]
            if isinstance(chunk, IndexedChunk):
                self.text_chars -= len(chunk.text)
                self.chunks[slot] = chunk.id

    def live(self) -> Callable[[], tuple[list[str], list[IndexedChunk], np.ndarray]]:
        """Keys, chunks and vectors of the live slots, in slot order: which slots is taken now (under the caller's
        lock), their chunks and vectors are read when called, which needs no lock (a slot's content never changes
        once written, and the objects taken hold it)."""
        order = sorted(self.of_key.items(), key=lambda item: item[1])
        slots = [slot for _, slot in order]
        chunks = [self.chunks[slot] for slot in slots]
        records, vectors = self.records, self.vectors

        def read() -> tuple[list[str], list[IndexedChunk], np.ndarray]:
            held = [
                c if isinstance(c, IndexedChunk) else _from_records(records, slot)
                for c, slot in zip(chunks, slots, strict=True)
            ]
            return [key for key, _ in order], held, vectors[slots]

        return read

    def saved(self) -> Callable[[Path], dict[str, Any]]:
        """What a save writes of the slots: taken now (under the caller's lock), written when called with the
        folder (without it); returns the keys file's content."""
        used, chunks, records, vectors = self.used, list(self.chunks), self.records, self.vectors
        saved_fields = self.saved_fields
        key_at = {slot: key for key, slot in self.of_key.items()}
        holding = {name: count for name, count in self.holding.items() if count > 0}

        def write(folder: Path) -> dict[str, Any]:
            offsets = np.zeros(used + 1, dtype=np.int64)
            with open(folder / CHUNKS, "wb") as f:
                for slot, chunk in enumerate(chunks):
                    if chunk is None:
                        line = b"null"
                    elif isinstance(chunk, IndexedChunk):
                        line = json.dumps(_record(key_at[slot], chunk), ensure_ascii=False, allow_nan=False).encode()
                    else:
                        assert records is not None  # an id stands for a record in the file
                        line = records.line(slot)
                    f.write(line + b"\n")
                    offsets[slot + 1] = offsets[slot] + len(line) + 1
            vectors.write(folder / VECTORS, used)
            with open(folder / OFFSETS, "wb") as f:
                np.save(f, offsets, allow_pickle=False)
            _write_fields(folder, chunks, records, saved_fields)
            ids = [None if c is None else c if isinstance(c, str) else c.id for c in chunks]
            return {"keys": [key_at.get(slot) for slot in range(used)], "ids": ids, "holding": holding}

        return write


def _write_fields(
    folder: Path, chunks: list[IndexedChunk | str | None], records: _Records | None, saved: FieldColumns | None
) -> None:
    """The live slots' fields as a field index (field_columns): those of the slots the snapshot read holds from
    its field index, the others' from their chunks (a snapshot that saved none: from its records, once)."""
    count = saved.count if saved is not None else 0
    kept = np.fromiter((isinstance(c, str) for c in chunks[:count]), dtype=bool, count=min(count, len(chunks)))
    kept = np.concatenate([kept, np.zeros(count - len(kept), dtype=bool)])
    added = (
        (slot, fields_of(c if isinstance(c, IndexedChunk) else _from_records(records, slot)))
        for slot, c in enumerate(chunks)
        if c is not None and (slot >= count or isinstance(c, IndexedChunk))
    )
    field_columns.write(folder, len(chunks), saved, kept, added)


def _record(key: str, chunk: IndexedChunk) -> dict[str, Any]:
    record = {"id": chunk.id, "text": chunk.text, "meta": chunk.meta}
    return record if key == chunk.id else {**record, "key": key}


def chunk_from(record: dict[str, Any]) -> IndexedChunk:
    return IndexedChunk(record["id"], record["text"], record["meta"])


def read_records(path: Path) -> list[dict[str, Any] | None]:
    """One record per slot; None for a dead one. The lines are parsed as one JSON array: a parse per line cost
    most of a snapshot's load."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line]
    records = json.loads("[" + ",".join(lines) + "]")
    if not isinstance(records, list) or len(records) != len(lines):
        raise IndexCorrupt(f"{path}: {len(lines)} lines are not one record each")
    return records
