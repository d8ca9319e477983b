"""What retrieval hands back: hits, context blocks, stale fallbacks and the model work spent (no gRPC here)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ragsidecar.knowledge.declarations import Use
from ragsidecar.knowledge.sources.units import Unit
from ragsidecar.knowledge.tokens import Measured


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    source: str
    text: str
    provenance: dict[str, Any]
    score: float | None = None
    dense: float | None = None
    bm25: float | None = None
    fused: float | None = None
    rerank: float | None = None


def document_of(hit: Hit) -> tuple[str, str]:
    """The document a chunk came from: its file, and within a file of records the record's key; a MEMORY or
    binding document's id; ("", "") for the one text of INLINE."""
    return hit.provenance.get("file") or "", hit.provenance.get("document_id") or ""


@dataclass
class Block:
    source: str
    use: Use
    hits: list[Hit]
    text: str = ""
    tokens: int = 0
    truncated: bool = False
    # The one hit's text of a DIRECT or SEQUENTIAL block, measured where it was read, so that assembly
    # does not tokenize it again.
    body: Measured | None = None


@dataclass(frozen=True)
class StaleSource:
    source: str
    reason: str
    built_at: dt.datetime


@dataclass
class Work:
    """Model work one call spent (reranking), for the response's usage and timing."""

    pairs: int = 0
    tokens: int = 0
    cached_pairs: int = 0
    queue_s: float = 0.0
    inference_s: float = 0.0
    total_s: float = 0.0


@dataclass
class EnforceResult:
    context: str = ""
    document_count: int = 0
    stale: list[StaleSource] = field(default_factory=list)
    truncated: bool = False
    blocks: list[Block] = field(default_factory=list)
    query: str = ""
    work: Work = field(default_factory=Work)


def provenance_of(unit: Unit) -> dict[str, Any]:
    p = unit.provenance
    return {
        "file": p.file,
        "document_id": p.document_id,
        "line_start": p.line_start,
        "line_end": p.line_end,
        "page": p.page,
        "char_start": p.char_start,
        "char_end": p.char_end,
    }


def _where(hit: Hit) -> str:
    p = hit.provenance
    place = p.get("file") or p.get("document_id") or hit.source
    if p.get("line_start"):
        place += f":{p['line_start']}-{p.get('line_end') or p['line_start']}"
    if p.get("page"):
        place += f" p.{p['page']}"
    return place


def _title(block: Block) -> str:
    return f"### Knowledge: {block.source} ({block.use.value})"


def block_head(block: Block) -> str:
    """What a DIRECT or SEQUENTIAL block's text follows in the context: its title line."""
    return _title(block) + "\n"


def render_block(block: Block) -> str:
    """One block of the action's context: a header naming the source and use, then its text."""
    if block.use is not Use.SEARCH:
        return block_head(block) + "\n\n".join(h.text for h in block.hits)
    lines = [_title(block)]
    for rank, hit in enumerate(block.hits, 1):
        lines.append(f"[{rank}] {_where(hit)} (score {hit.score:.3f})\n{hit.text}")
    return "\n\n".join(lines)
