"""FILE and DIRECTORY sources' files read into units: each file parsed once per size and modification time, and
the state each was indexed in, so that a changed source re-reads only the files that changed."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ragsidecar import metrics
from ragsidecar.cache import ByteLRU
from ragsidecar.knowledge.declarations import Entry
from ragsidecar.knowledge.roots import KnowledgeRoots
from ragsidecar.knowledge.sources.files import provenance_path, read_units
from ragsidecar.knowledge.sources.units import Unit

_PARSED_CACHE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class FileState:
    """A knowledge file as it was indexed."""

    size: int
    mtime_ns: int
    relative: str  # the provenance path its chunks carry (meta "file")
    units: int


class SourceFiles:
    """Reads the files of FILE and DIRECTORY sources, keeping the units of each file as last parsed."""

    def __init__(self, roots: KnowledgeRoots, max_file_bytes: int) -> None:
        self._roots = roots
        self._max_file_bytes = max_file_bytes
        self._parsed: ByteLRU[tuple[str, int, int], list[Unit]] = ByteLRU(_PARSED_CACHE_BYTES)
        metrics.track_size("parsed_files", self._parsed)

    def units(self, entry: Entry) -> list[Unit]:
        """Every unit of the source's files, in source order."""
        return [unit for file in self._roots.files_of(entry) for unit in self._read_file(file)[1]]

    def units_by_file(self, entry: Entry) -> tuple[dict[str, FileState], list[Unit]]:
        """Every unit of the source's files, and the state of each file read (absolute path -> state)."""
        read = [(str(file), self._read_file(file)) for file in self._roots.files_of(entry)]
        return {path: state for path, (state, _) in read}, [unit for _, (_, units) in read for unit in units]

    def changed(
        self, listing: Iterable[tuple[Path, os.stat_result]], indexed: Mapping[str, FileState]
    ) -> tuple[dict[str, FileState], list[Unit], set[str]]:
        """The files of a source's listing (each with its state, as a scan of the source found them), the units
        of those changed since `indexed` (new, or another size or modification time), and the provenance paths
        whose chunks an index of `indexed` holds out of date."""
        files: dict[str, FileState] = {}
        units: list[Unit] = []
        outdated: set[str] = set()
        for file, stat in listing:
            held = indexed.get(str(file))
            if held is not None and (held.size, held.mtime_ns) == (stat.st_size, stat.st_mtime_ns):
                files[str(file)] = held
                continue
            state, parsed = self._read_file(file)
            files[str(file)], units = state, units + parsed
            outdated |= {state.relative} | ({held.relative} if held else set())
        outdated |= {state.relative for path, state in indexed.items() if path not in files}
        return files, units, outdated

    def _read_file(self, file: Path) -> tuple[FileState, list[Unit]]:
        """One file's units, and its state as read; an unchanged file (same size and modification time) is not
        parsed again, since DIRECT and SEQUENTIAL sources are read on every dispatch."""
        stat = self._roots.stat(file)
        key = (str(file), stat.st_size, stat.st_mtime_ns)
        root = self._roots.root_of(file)
        parsed = self._parsed.get(key)
        if parsed is None:
            parsed = read_units(file, root, self._max_file_bytes)
            self._parsed.put(key, parsed, sum(len(u.text) for u in parsed))
        return FileState(stat.st_size, stat.st_mtime_ns, provenance_path(file, root), len(parsed)), parsed
