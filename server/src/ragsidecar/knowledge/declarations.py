"""The knowledge a host declares: entries, actions and targets, and which entries are in reach.

Mirrors the host's @Knowledge / @ActionSpec model (RetrievalSpi): names are the keys of everything,
an outer entry (the agent's) replaces the target's entry of the same name.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from ragsidecar.knowledge import filters


class SourceType(enum.Enum):
    FILE = "FILE"
    DIRECTORY = "DIRECTORY"
    MEMORY = "MEMORY"
    INLINE = "INLINE"
    # A chat binding's live corpus, held in server memory; never declared by a host.
    BINDING = "BINDING"


class Use(enum.Enum):
    DIRECT = "DIRECT"
    SEARCH = "SEARCH"
    SEQUENTIAL = "SEQUENTIAL"


class RerankOrder(enum.Enum):
    # The reranker's order fused with the retrieval order (reciprocal rank fusion): the measured default.
    FUSED = "FUSED"
    # The reranker's own relevance order, cut to top k: the host's Reranker SPI order.
    RERANKER = "RERANKER"


class RetrievalMode(enum.Enum):
    # Dense and BM25 lists fused by reciprocal rank fusion: the default.
    HYBRID = "HYBRID"
    DENSE = "DENSE"
    LEXICAL = "LEXICAL"


DEFAULT_TOP_K = 5

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    name: str
    type: SourceType | None
    use: Use | None
    path: str = ""
    inline_text: str = ""
    top_k: int | None = None
    min_score: float | None = None
    max_tokens: int | None = None
    when_configured: bool = False
    enabled: bool = True
    continue_on_failure: bool = False
    rerank: bool = False
    reranker_model: str = ""
    candidates: int | None = None
    rerank_order: RerankOrder = RerankOrder.FUSED
    # Hits reranked independently of top_k (the reranked head, then the rest in retrieval order).
    rerank_depth: int | None = None
    # One hit per document (its best chunk); top_k then counts documents.
    group_by_document: bool = False
    retrieval_mode: RetrievalMode = RetrievalMode.HYBRID
    # Only chunks whose document (or file) this filter keeps are searched (a Search's per-entry filter).
    keep: filters.Filter | None = None
    # Where the entry sits in the request, for violations ("target.knowledge[2]", "outer[0]").
    origin: str = ""

    @property
    def k(self) -> int:
        return self.top_k or DEFAULT_TOP_K

    @property
    def located(self) -> bool:
        """Whether the entry has content to read (a path, inline text, or memory)."""
        return self.type in (SourceType.MEMORY, SourceType.INLINE, SourceType.BINDING) or bool(self.path)

    def with_path(self, path: str) -> Entry:
        return replace(self, path=path)

    def require_location(self) -> None:
        """Raises FileNotFoundError for an entry with nothing to read: a FILE or DIRECTORY entry with neither a
        declared nor a resolved path (never the whole knowledge root)."""
        if not self.located:
            raise FileNotFoundError("(no location declared or resolved)")

    def skips(self, err: Exception) -> bool:
        """Whether a load failure drops this entry out quietly: a missing WHEN_CONFIGURED source is
        skipped; a CONTINUE entry drops out on any load failure."""
        if self.when_configured and isinstance(err, FileNotFoundError):
            return True
        if self.continue_on_failure:
            log.warning("knowledge %s failed and is skipped (on_failure CONTINUE): %s", self.name, err)
            return True
        return False


@dataclass(frozen=True)
class Action:
    name: str
    knowledge: tuple[str, ...] = ()
    query_parameter: str | None = None


@dataclass(frozen=True)
class Target:
    name: str
    knowledge: tuple[Entry, ...] = ()
    actions: tuple[Action, ...] = ()

    def action(self, name: str) -> Action | None:
        return next((a for a in self.actions if a.name == name), None)


@dataclass(frozen=True)
class Scope:
    tenant: str
    session: str = ""


@dataclass(frozen=True)
class Llm:
    model: str = ""
    input_window_tokens: int | None = None


@dataclass(frozen=True)
class Reach:
    """The entries a target can use: its own with the outer ones applied, by name, in order."""

    entries: dict[str, Entry] = field(default_factory=dict)

    @classmethod
    def of(cls, target: Target, outer: tuple[Entry, ...] = ()) -> Reach:
        entries = {e.name: e for e in target.knowledge}
        for entry in outer:
            entries[entry.name] = entry  # replaces in place, or appends a new name
        return cls(entries)

    def get(self, name: str) -> Entry | None:
        return self.entries.get(name)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries.values())
