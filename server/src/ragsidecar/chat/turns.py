"""A GroundTurn in domain terms: the turn a host sends (conversation, owners, bindings, retrieval context) and
the result it gets back (the grounded conversation, and how each owner's knowledge was given or why it failed
open)."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ragsidecar.chat.activity import Activity
from ragsidecar.knowledge.declarations import Entry, Llm, Scope, Use
from ragsidecar.knowledge.runtime import DirectMeasure, StaleSource, Work


@dataclass(frozen=True)
class Message:
    role: str
    content: str | None = None
    name: str = ""
    tool_call_id: str = ""
    # Every other key of the message, copied unchanged and never read.
    extra: dict[str, Any] | None = None


@dataclass(frozen=True)
class Owner:
    owner_id: str
    # As the request lists them; only enabled SEARCH and DIRECT entries are its chat knowledge.
    knowledge: tuple[Entry, ...] = ()
    state_text: str = ""

    def chat_knowledge(self, use: Use) -> Iterator[tuple[int, Entry]]:
        """(position in the request's list, entry) of its enabled entries of that use, in declaration order."""
        return ((k, e) for k, e in enumerate(self.knowledge) if e.enabled and e.use is use)


@dataclass(frozen=True)
class TurnBinding:
    binding_id: str
    owner_id: str
    handle: str = field(default="", repr=False)


@dataclass(frozen=True)
class RetrievalContext:
    scope: Scope
    # Event-loop time by which the owners' searches must be done; None: only the call's deadline.
    deadline: float | None = None
    # Run id, agent name, simulation state, episode, source revision: logged with each owner's searches.
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    conversation: tuple[Message, ...]
    owners: tuple[Owner, ...] = ()
    bindings: tuple[TurnBinding, ...] = ()
    context: RetrievalContext | None = None
    request_section: str = ""
    activity: Activity | None = None
    llm: Llm | None = None
    # The call's own deadline (event-loop time), or None.
    call_deadline: float | None = None
    # The turn's own scope, for checking its bindings without a context; None: the context's.
    scope: Scope | None = None


class Grounding(enum.Enum):
    GROUNDED = "GROUNDED"
    NO_OWNERS = "NO_OWNERS"
    NO_CONTEXT = "NO_CONTEXT"
    NO_USER_MESSAGE = "NO_USER_MESSAGE"
    RENDER_FAILED = "RENDER_FAILED"
    NOTHING_GIVEN = "NOTHING_GIVEN"


class OwnerSearch(enum.Enum):
    GROUNDED = "GROUNDED"
    FAILED_OPEN = "FAILED_OPEN"
    NO_BINDING = "NO_BINDING"
    NO_SEARCH_KNOWLEDGE = "NO_SEARCH_KNOWLEDGE"
    NOT_ATTEMPTED = "NOT_ATTEMPTED"


class FailOpen(enum.Enum):
    RETRIEVAL_FAILED = "RETRIEVAL_FAILED"
    EMPTY_RESULT = "EMPTY_RESULT"
    EVIDENCE_OVERSIZED = "EVIDENCE_OVERSIZED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


@dataclass
class OwnerOutcome:
    owner_id: str
    search: OwnerSearch = OwnerSearch.NOT_ATTEMPTED
    document_count: int = 0
    fail_open: FailOpen | None = None
    detail: str = ""
    searched_sources: list[str] = field(default_factory=list)
    # The DIRECT blocks given, each with its position in the owner's knowledge list.
    direct: list[DirectMeasure] = field(default_factory=list)

    def failed_open(self, reason: FailOpen, detail: str) -> None:
        self.search, self.fail_open, self.detail = OwnerSearch.FAILED_OPEN, reason, detail


@dataclass
class TurnResult:
    conversation: list[Message]
    grounding: Grounding
    owners: list[OwnerOutcome]
    detail: str = ""
    stale: list[StaleSource] = field(default_factory=list)
    work: Work = field(default_factory=Work)
