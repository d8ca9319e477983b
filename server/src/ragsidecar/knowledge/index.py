"""Hybrid retrieval index: dense HNSW (usearch) plus BM25 (lexical.py), fused as fusion.py says.

An index is immutable once built: incremental updates rebuild from `chunks()` and `vectors()` (the embedding
cache keeps the float vectors, so a rebuild re-embeds nothing). Persistence is one folder, replaced atomically;
its manifest names the source it indexes, so a start-up `sweep` can drop indexes a newer one superseded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from usearch.index import Index

from ragsidecar.knowledge import leftovers
from ragsidecar.knowledge.fusion import FusionSettings, fuse
from ragsidecar.knowledge.lexical import NO_STEMMING, Lexical

FORMAT_VERSION = 1
DTYPES = ("f16", "i8")

# Defaults measured by bench/index.py (100k clustered 384-d vectors, recall@10 vs exact search >= 0.98 for
# both dtypes). `expansion_search` is a floor: usearch widens it to the number of results asked for, and
# hybrid search asks for `candidates` (50) results, so real queries search wider than the bench's k=10.
DEFAULT_CONNECTIVITY = 16
DEFAULT_EXPANSION_ADD = 128
DEFAULT_EXPANSION_SEARCH = 64

_VECTORS = "vectors.npy"
_CHUNKS = "chunks.jsonl"
_DENSE = "dense.usearch"
_BM25 = "bm25"
_MANIFEST = "manifest.json"
_HASH_BLOCK = 1 << 20
# `.NAME.tmp-<pid>-...` (a save in progress, or killed) and `.NAME.old-<pid>-...` (the index a save set aside).
_STRAY = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<tag>.*)")


class IndexCorrupt(Exception):
    """A persisted index is missing, incomplete or fails its checksum; the caller should rebuild it."""


@dataclass(frozen=True)
class IndexedChunk:
    id: str
    text: str
    meta: dict[str, Any]


@dataclass(frozen=True)
class Hit:
    chunk: IndexedChunk
    dense: float
    bm25: float | None
    fused: float


def make_hnsw(
    dimensions: int,
    dtype: str = "f16",
    connectivity: int = DEFAULT_CONNECTIVITY,
    expansion_add: int = DEFAULT_EXPANSION_ADD,
    expansion_search: int = DEFAULT_EXPANSION_SEARCH,
) -> Index:
    """The usearch index HybridIndex uses; public so the benchmark measures exactly this configuration."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return Index(
        ndim=dimensions,
        metric="cos",
        dtype=dtype,
        connectivity=connectivity,
        expansion_add=expansion_add,
        expansion_search=expansion_search,
    )


class HybridIndex:
    def __init__(
        self,
        dimensions: int,
        threads: int = 1,
        dtype: str = "f16",
        connectivity: int = DEFAULT_CONNECTIVITY,
        expansion_add: int = DEFAULT_EXPANSION_ADD,
        expansion_search: int = DEFAULT_EXPANSION_SEARCH,
        lexical_language: str = NO_STEMMING,
    ) -> None:
        if dimensions <= 0 or threads <= 0:
            raise ValueError("dimensions and threads must be positive")  # usearch reads threads=0 as all cores
        self.dimensions = dimensions
        self.threads = threads
        self.dtype = dtype
        self._settings = {"connectivity": connectivity, "expansion_add": expansion_add,
                          "expansion_search": expansion_search}
        self._hnsw = make_hnsw(dimensions, dtype, connectivity, expansion_add, expansion_search)
        self._chunks: list[IndexedChunk] = []
        self._vectors = np.zeros((0, dimensions), dtype=np.float32)
        self._lexical = Lexical(None, lexical_language)

    @classmethod
    def build(
        cls,
        chunks: list[IndexedChunk],
        vectors: np.ndarray,
        threads: int = 1,
        dtype: str = "f16",
        *,
        connectivity: int = DEFAULT_CONNECTIVITY,
        expansion_add: int = DEFAULT_EXPANSION_ADD,
        expansion_search: int = DEFAULT_EXPANSION_SEARCH,
        lexical_language: str = NO_STEMMING,
    ) -> HybridIndex:
        """`vectors[i]` is the unit-length float32 embedding of `chunks[i]`; `lexical_language` names the
        analysis of the BM25 side (lexical.LANGUAGES), kept by the index and applied to its queries."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(chunks):
            raise ValueError(f"vectors must be [{len(chunks)}, d], got {vectors.shape}")
        if len({c.id for c in chunks}) != len(chunks):
            raise ValueError("chunk ids must be unique")
        index = cls(vectors.shape[1], threads, dtype, connectivity, expansion_add, expansion_search,
                    lexical_language)
        index._chunks = list(chunks)
        index._vectors = vectors
        if chunks:
            index._hnsw.add(np.arange(len(chunks), dtype=np.uint64), vectors, threads=threads)
        index._lexical = Lexical.build([c.text for c in chunks], lexical_language)
        return index

    def __len__(self) -> int:
        return len(self._chunks)

    def vectors(self) -> np.ndarray:
        return self._vectors

    def chunks(self) -> list[IndexedChunk]:
        return list(self._chunks)

    @property
    def lexical_language(self) -> str:
        return self._lexical.language

    def search(
        self, query_vector: np.ndarray, query_text: str, k: int, candidates: int = 50,
        use_dense: bool = True, use_lexical: bool = True, fusion: FusionSettings = FusionSettings(),
    ) -> list[Hit]:
        """Best `k` chunks by `fusion` of the dense and BM25 top-`candidates` lists (ties: higher cosine first).
        `use_dense` / `use_lexical` pick the lists searched (dense-only or lexical-only retrieval: that list's
        own order, whatever the fusion's weights); every hit still gets its exact cosine."""
        if k <= 0 or not self._chunks:
            return []
        query = self._unit_query(query_vector)
        # A list shorter than k could not fill k results, so each side fetches at least k.
        depth = min(max(candidates, k), len(self._chunks))
        dense = self._dense_top(query, depth) if use_dense else []
        lexical = self._lexical.top(query_text or "", depth) if use_lexical else []
        fused = fuse(dense, lexical, fusion if use_dense and use_lexical else FusionSettings())
        cosines = dict(dense)
        missing = [p for p in fused if p not in cosines]
        if missing:  # BM25-only candidates still get an exact cosine
            cosines.update(zip(missing, (self._vectors[missing] @ query).tolist()))
        bm25 = dict(lexical)
        order = sorted(fused, key=lambda p: (-fused[p], -cosines[p], self._chunks[p].id))[:k]
        return [Hit(self._chunks[p], float(cosines[p]), bm25.get(p), fused[p]) for p in order]

    def _unit_query(self, query_vector: np.ndarray) -> np.ndarray:
        query = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        if query.shape[0] != self.dimensions:
            raise ValueError(f"query vector has {query.shape[0]} dimensions, index has {self.dimensions}")
        norm = float(np.linalg.norm(query))
        # Normalising makes `dense` a true cosine even if a caller passes an unnormalised embedding.
        return query / norm if norm > 0 else query

    def _dense_top(self, query: np.ndarray, count: int) -> list[tuple[int, float]]:
        """HNSW candidates re-scored with exact float32 cosines (the graph's f16/i8 distances are approximate)."""
        matches = self._hnsw.search(query, count, threads=self.threads)
        keys = np.asarray(matches.keys, dtype=np.int64)
        exact = self._vectors[keys] @ query
        order = np.lexsort((keys, -exact))
        return [(int(keys[i]), float(exact[i])) for i in order]

    # ---- persistence -------------------------------------------------------------------------------------

    def save(self, folder: Path, source: str = "") -> None:
        """Replace `folder` atomically: readers and crashes see the old complete index or the new one.
        `source` names what the index indexes (one name per source, whatever its content): `sweep` keeps
        only the newest index of each.

        Saves to the same folder must not run concurrently (callers serialise them per folder)."""
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-{leftovers.owner_tag()}", dir=folder.parent))
        try:
            self._write_files(temp)
            # Last: its presence marks the folder complete.
            _write_manifest(temp, {**self._manifest_header(), "source": source})
            _fsync_dir(temp)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        _swap_in(temp, folder)
        _remove_strays(folder)

    def _write_files(self, temp: Path) -> None:
        with open(temp / _VECTORS, "wb") as f:
            np.save(f, self._vectors, allow_pickle=False)
        with open(temp / _CHUNKS, "w", encoding="utf-8") as f:
            for chunk in self._chunks:
                record = {"id": chunk.id, "text": chunk.text, "meta": chunk.meta}
                f.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        self._hnsw.save(str(temp / _DENSE))
        self._lexical.save(temp / _BM25)
        for path in _files(temp):
            _fsync_file(path)
        for sub in (p for p in temp.rglob("*") if p.is_dir()):
            _fsync_dir(sub)

    def _manifest_header(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "count": len(self._chunks), "dimensions": self.dimensions,
                "dtype": self.dtype, "lexical_language": self.lexical_language, **self._settings}

    @classmethod
    def load(cls, folder: Path, threads: int = 1) -> HybridIndex:
        """Load a saved index; IndexCorrupt when it is missing, incomplete or altered (then rebuild)."""
        folder = _readable_folder(Path(folder))
        try:
            manifest = _verified_manifest(folder)
            return cls._from_folder(folder, manifest, threads)
        except IndexCorrupt:
            raise
        except Exception as error:  # usearch, numpy and bm25s each fail differently on damaged files
            raise IndexCorrupt(f"{folder}: {type(error).__name__}: {error}") from error

    @classmethod
    def _from_folder(cls, folder: Path, manifest: dict[str, Any], threads: int) -> HybridIndex:
        count, dimensions = int(manifest["count"]), int(manifest["dimensions"])
        # An index saved before languages were configurable was analysed without stemming.
        index = cls(dimensions, threads, manifest["dtype"], int(manifest["connectivity"]),
                    int(manifest["expansion_add"]), int(manifest["expansion_search"]),
                    manifest.get("lexical_language", NO_STEMMING))
        index._vectors = np.load(folder / _VECTORS, allow_pickle=False)
        index._chunks = _read_chunks(folder / _CHUNKS)
        index._hnsw.load(str(folder / _DENSE))
        index._lexical = Lexical.load(folder / _BM25, count, index.lexical_language)
        _check_shapes(index, count, dimensions)
        return index


def _check_shapes(index: HybridIndex, count: int, dimensions: int) -> None:
    if index._vectors.shape != (count, dimensions) or index._vectors.dtype != np.float32:
        raise IndexCorrupt(f"vectors are {index._vectors.dtype} {index._vectors.shape}, expected [{count}, {dimensions}]")
    if len(index._chunks) != count or len(index._hnsw) != count:
        raise IndexCorrupt(f"{len(index._chunks)} chunks and {len(index._hnsw)} vectors, expected {count}")
    if str(index._hnsw.dtype).rsplit(".", 1)[-1].lower() != index.dtype:
        raise IndexCorrupt(f"HNSW dtype {index._hnsw.dtype} differs from manifest {index.dtype}")


def _read_chunks(path: Path) -> list[IndexedChunk]:
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return [IndexedChunk(r["id"], r["text"], r["meta"]) for r in records]


# ---- atomic folder replacement ---------------------------------------------------------------------------

def _swap_in(temp: Path, folder: Path) -> None:
    """Two renames, the old folder set aside first: POSIX cannot rename a folder onto a non-empty one.

    A crash between them leaves no `folder` but a complete `.NAME.old-*`, which load falls back to."""
    if folder.exists():
        aside = folder.parent / f".{folder.name}.old-{leftovers.owner_tag()}{uuid.uuid4().hex}"
        os.rename(folder, aside)
        os.rename(temp, folder)
        _fsync_dir(folder.parent)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(temp, folder)
        _fsync_dir(folder.parent)


def _remove_strays(folder: Path) -> None:
    """Temp and set-aside folders left by earlier crashed saves of this folder (not another live process's)."""
    for pattern in (f".{folder.name}.tmp-*", f".{folder.name}.old-*"):
        for stray in folder.parent.glob(pattern):
            if leftovers.orphaned(_STRAY.fullmatch(stray.name)["tag"]):
                shutil.rmtree(stray, ignore_errors=True)


def sweep(index_dir: Path) -> tuple[int, int]:
    """Start-up clean-up of a folder of indexes; returns (folders, bytes) removed.

    Removes what killed saves left (temp folders; set-aside ones, unless a crash between the two renames
    left no index in their place: those are put back), and every index but the newest of each source.
    A complete index that names no source was written by an earlier version under a key no longer used."""
    if not index_dir.is_dir():
        return 0, 0
    removed = [_sweep_stray(path) for path in sorted(index_dir.iterdir()) if _STRAY.fullmatch(path.name)]
    newest: dict[str, list[Path]] = {}
    for path in sorted(index_dir.iterdir()):
        if path.name.startswith(".") or not path.is_dir():
            continue
        source = _indexed_source(path)
        if source:
            newest.setdefault(source, []).append(path)
        else:
            removed.append(leftovers.remove(path))
    for paths in newest.values():
        paths.sort(key=lambda p: (p / _MANIFEST).stat().st_mtime_ns)
        removed += [leftovers.remove(p) for p in paths[:-1]]
    removed = [size for size in removed if size is not None]
    return len(removed), sum(removed)


def _sweep_stray(path: Path) -> int | None:
    """Bytes removed, or None when the stray was kept (its writer lives) or put back."""
    stray = _STRAY.fullmatch(path.name)
    if not leftovers.orphaned(stray["tag"]):
        return None
    home = path.parent / stray["name"]
    if stray["kind"] == "old" and not home.exists() and (path / _MANIFEST).is_file():
        os.rename(path, home)
        return None
    return leftovers.remove(path)


def _indexed_source(folder: Path) -> str:
    """The source a complete index names in its manifest ("" when it names none or is incomplete)."""
    try:
        return str(json.loads((folder / _MANIFEST).read_text(encoding="utf-8")).get("source") or "")
    except (OSError, ValueError, AttributeError):
        return ""


def _readable_folder(folder: Path) -> Path:
    """`folder`, or when a save crashed between its two renames, the complete previous index it set aside."""
    if (folder / _MANIFEST).is_file():
        return folder
    if not folder.exists():
        asides = sorted(folder.parent.glob(f".{folder.name}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        for aside in asides:
            if (aside / _MANIFEST).is_file():
                return aside
        raise IndexCorrupt(f"no index at {folder}")
    raise IndexCorrupt(f"{folder}: manifest missing")


# ---- manifest and checksums ------------------------------------------------------------------------------

def _write_manifest(folder: Path, header: dict[str, Any]) -> None:
    files = {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in _files(folder)}
    path = folder / _MANIFEST
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**header, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def _verified_manifest(folder: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / _MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise IndexCorrupt(f"{folder}: unreadable manifest: {error}") from error
    if manifest.get("format") != FORMAT_VERSION:
        raise IndexCorrupt(f"{folder}: format {manifest.get('format')!r}, expected {FORMAT_VERSION}")
    for name, expected in manifest["files"].items():
        path = folder / name
        # The size check catches truncation without hashing; the hash catches everything else.
        if not path.is_file() or path.stat().st_size != expected["bytes"] or _sha256(path) != expected["sha256"]:
            raise IndexCorrupt(f"{folder}: {name} is missing, truncated or altered")
    return manifest


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != _MANIFEST)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Directory fsync makes the renames and new entries durable; not every platform allows opening a folder.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
