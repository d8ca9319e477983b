"""GroundTurn: the grounded outbound copy of one chat turn (the host's SCOPBridge.sendToLLM(ChatTurn)).

The caller's conversation is never changed: the outbound one is a copy with every earlier sidecar region
stripped, then the request section, each owner's state and (with a retrieval context) the owners' chat
knowledge appended to the last system message. Knowledge goes only inside the <tnsai-memory> fence.
Per owner, a recoverable retrieval failure, an empty result, oversized evidence or a spent deadline
fails open; DIRECT budget failures, configuration errors and cancellation surface.

Hostile turns: the sizes that drive work (messages, owners, bindings, characters of a text, markers in a
system message, activity entries and redaction roots) are capped and refused before any work, and
everything proportional to the turn's size (stripping, neutralising, redacting, rendering, counting
tokens) is linear and runs in a worker thread, so the event loop keeps serving other calls meanwhile.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ragsidecar import tracing
from ragsidecar.chat.activity import Activity
from ragsidecar.chat.bindings import Binding, Bindings
from ragsidecar.chat.markup import (
    REQUEST,
    STATE,
    fence,
    marker_count,
    neutralise_fenced,
    neutralise_host_text,
    region,
    strip_regions,
)
from ragsidecar.errors import SidecarError, Violation, invalid
from ragsidecar.identifiers import id_problems
from ragsidecar.knowledge.declarations import Entry, Llm, Scope, Target, Use
from ragsidecar.knowledge.runtime import (
    Block,
    DirectMeasure,
    DirectPlan,
    Hit,
    Query,
    RetrievalRuntime,
    SearchSpec,
    StaleSource,
    Work,
    render_block,
)
from ragsidecar.knowledge.validation import unique_name_problems

log = logging.getLogger(__name__)

# Caps on the sizes that drive a turn's work, refused (INVALID_ARGUMENT) before any of it; in the proto comments.
MAX_MESSAGES, MAX_OWNERS, MAX_BINDINGS = 2000, 64, 256
# Knowledge entries one owner lists (every kind: they are all walked to find its chat knowledge).
MAX_OWNER_KNOWLEDGE = 256
# Characters of one message's content, one owner's state_text, or the request section.
MAX_TEXT_CHARS = 1_000_000
# Sidecar markers ("<!-- ragsidecar:" / "<!-- /ragsidecar:") in one system message. Stripping is linear, so
# this only refuses what no real conversation holds (a turn adds a handful) well before the character cap.
MAX_MARKERS = 20_000
# Errors met while searching that are the configuration's, not the retrieval's: they surface, as in Enforce.
_CONFIGURATION_REASONS = frozenset(
    {
        "UNKNOWN_MODEL",
        "MODEL_NOT_READY",
        "WARMING_UP",
        "INVALID_CONFIGURATION",
        "UNKNOWN_KNOWLEDGE",
        "UNKNOWN_MODEL_WINDOW",
        "PATH_OUTSIDE_ROOTS",
    }
)


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


@dataclass
class _Query:
    """What the owners' searches share: the latest user message, the context and the one deadline."""

    text: str
    context: RetrievalContext
    deadline: float | None
    # The query's embeddings (by model fingerprint), made once for all owners.
    embedded: Query


@dataclass
class _Searched:
    """One owner's searches: what its bindings found, renamed to their source names."""

    bindings: list[Binding]
    hits: list[Hit] = field(default_factory=list)


class Grounder:
    def __init__(self, runtime: RetrievalRuntime, bindings: Bindings) -> None:
        self._runtime = runtime
        self._bindings = bindings

    async def ground(self, turn: Turn) -> TurnResult:
        started = time.perf_counter()
        problems = shape_problems(turn)
        if problems:
            raise invalid(problems)
        owned = await self._resolve(turn)
        conversation, host_text = await asyncio.to_thread(_prepared, turn)
        result = TurnResult(conversation, Grounding.GROUNDED, [OwnerOutcome(o.owner_id) for o in turn.owners])
        with tracing.span("grounding", owners=len(turn.owners), bindings=len(turn.bindings)) as span:
            knowledge = await self._knowledge(turn, owned, host_text, result)
            span.set(
                grounding=result.grounding.value,
                pairs=result.work.pairs,
                cached_pairs=result.work.cached_pairs,
                tokens=result.work.tokens,
            )
        result.conversation = await asyncio.to_thread(_appended, conversation, host_text + knowledge)
        result.work.total_s = time.perf_counter() - started
        return result

    async def _resolve(self, turn: Turn) -> list[list[Binding]]:
        """Each owner's bindings, in the turn's order; NOT_FOUND, PERMISSION_DENIED or the declaration rules."""
        scope = turn.context.scope if turn.context else turn.scope
        resolved = [await self._bindings.get(b.binding_id, b.owner_id, scope, b.handle) for b in turn.bindings]
        problems = _declaration_problems(turn.owners, resolved)
        if problems:
            raise invalid(problems)
        return [[b for b in resolved if b.owner_id == owner.owner_id] for owner in turn.owners]

    async def _knowledge(
        self, turn: Turn, owned: list[list[Binding]], host_text: list[str], result: TurnResult
    ) -> list[str]:
        """The fenced knowledge region (or nothing), and the turn's grounding as a whole."""
        query, context = await asyncio.to_thread(_latest_user_text, result.conversation), turn.context
        if not turn.owners or context is None or not query:
            result.grounding = (
                Grounding.NO_OWNERS
                if not turn.owners
                else Grounding.NO_CONTEXT
                if context is None
                else Grounding.NO_USER_MESSAGE
            )
            return []
        direct = [e for owner in turn.owners for _, e in owner.chat_knowledge(Use.DIRECT)]
        plan = await self._runtime.prepare_chat(tuple(direct), turn.llm, context.scope)
        # One deadline for all owners, searched in order: a later owner may find it spent.
        deadline = min((d for d in (context.deadline, turn.call_deadline) if d is not None), default=None)
        shared = _Query(query, context, deadline, Query(query))
        searched = [
            await self._search(owner, bindings, shared, outcome, result)
            for owner, bindings, outcome in zip(turn.owners, owned, result.owners)
        ]
        try:
            blocks = await asyncio.to_thread(self._render, turn.owners, plan, searched, result, host_text)
        except Exception as err:  # the seed: a failure while rendering dispatches the whole turn ungrounded
            log.exception("rendering a grounded turn failed; it goes out ungrounded")
            result.grounding, result.detail = Grounding.RENDER_FAILED, f"{type(err).__name__}: {err}"
            result.owners = [OwnerOutcome(o.owner_id) for o in turn.owners]
            return []
        result.grounding = Grounding.GROUNDED if blocks else Grounding.NOTHING_GIVEN
        return [await asyncio.to_thread(fence, blocks)] if blocks else []

    # -- searching -------------------------------------------------------------------------------------

    async def _search(
        self, owner: Owner, bindings: list[Binding], query: _Query, outcome: OwnerOutcome, result: TurnResult
    ) -> _Searched:
        """Searches the owner's bindings together under what is left of the turn's deadline."""
        searched = _Searched(bindings)
        if not bindings:
            has_search = next(owner.chat_knowledge(Use.SEARCH), None) is not None
            outcome.search = OwnerSearch.NO_BINDING if has_search else OwnerSearch.NO_SEARCH_KNOWLEDGE
            return searched
        remaining = None if query.deadline is None else query.deadline - asyncio.get_running_loop().time()
        if remaining is not None and remaining <= 0:
            outcome.failed_open(FailOpen.DEADLINE_EXCEEDED, "the deadline was spent before this owner's searches")
            return searched
        outcome.searched_sources = [b.source for b in bindings]
        log.debug("searching for owner %s: %s %s", owner.owner_id, outcome.searched_sources, query.context.metadata)
        target = Target(f"chat owner {owner.owner_id}", tuple(b.entry for b in bindings))
        task = asyncio.ensure_future(self._searched(target, query))
        try:
            hits, stale, work = await asyncio.wait_for(asyncio.shield(task), remaining)
        except TimeoutError:
            # The search goes on without this turn, so an index it was building serves the next one.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            outcome.failed_open(FailOpen.DEADLINE_EXCEEDED, "the deadline was spent during this owner's searches")
            return searched
        except SidecarError as err:
            if err.reason in _CONFIGURATION_REASONS:
                raise
            outcome.failed_open(FailOpen.RETRIEVAL_FAILED, str(err))
            return searched
        except asyncio.CancelledError:
            task.cancel()
            raise
        names = {b.id: b.source for b in bindings}
        searched.hits = [replace(h, source=names[h.source]) for h in hits]
        result.stale += [replace(s, source=names[s.source]) for s in stale]
        _add_work(result.work, work)
        if not hits:
            outcome.failed_open(FailOpen.EMPTY_RESULT, "the searches found nothing")
        return searched

    async def _searched(self, target: Target, query: _Query) -> tuple[list[Hit], list[StaleSource], Work]:
        return await self._runtime.search(
            target, (), [], query.text, SearchSpec(), {}, query.context.scope, query.deadline, query.embedded
        )

    # -- rendering -------------------------------------------------------------------------------------

    def _render(
        self,
        owners: tuple[Owner, ...],
        plan: DirectPlan,
        searched: list[_Searched],
        result: TurnResult,
        host_text: list[str],
    ) -> list[str]:
        """The fenced blocks: owners in list order, each one's blocks in declaration order. DIRECT blocks are
        always given (they passed their budgets); an owner's evidence must fit what is left of the window."""
        measures = {m.entry: m for m in plan.blocks}
        per_owner = [self._direct_blocks(owner, measures, outcome) for owner, outcome in zip(owners, result.owners)]
        room = _Room(plan.window, self._runtime.count_tokens)
        room.take(
            [m.content or "" for m in result.conversation]
            + host_text
            + [fence([])]
            + [text for blocks in per_owner for _, text in blocks]
        )
        for owner, blocks, found, outcome in zip(owners, per_owner, searched, result.owners):
            if not found.hits:
                continue
            evidence = _evidence_blocks(owner, found)
            texts = [text for _, text in evidence]
            if not room.fits(texts):
                outcome.failed_open(
                    FailOpen.EVIDENCE_OVERSIZED,
                    f"{room.tokens(texts)} tokens of evidence do not "
                    f"fit the {room.left()} tokens left of the input window",
                )
                continue
            room.take(texts)
            blocks += evidence
            outcome.search, outcome.document_count = OwnerSearch.GROUNDED, len(found.hits)
        return [text for blocks in per_owner for _, text in sorted(blocks, key=lambda b: b[0])]

    def _direct_blocks(
        self, owner: Owner, measures: dict[Entry, DirectMeasure], outcome: OwnerOutcome
    ) -> list[tuple[int, str]]:
        blocks = []
        for position, entry in owner.chat_knowledge(Use.DIRECT):
            measure = measures.get(entry)
            block = self._runtime.direct_block(measure)
            if block is None:  # skipped (an unconfigured WHEN_CONFIGURED source) or blank
                continue
            outcome.direct.append(replace(measure, position=position))
            blocks.append((position, neutralise_fenced(render_block(block))))
        return blocks


class _Room:
    """What is left of the input window. Counting the tokens of every piece of evidence would cost more than
    the searches themselves, so texts are counted only when their UTF-8 size (an upper bound of the
    tokenizer's count: a token covers at least one byte) might not fit."""

    def __init__(self, window: int | None, count: Callable[[str], int]) -> None:
        self._window, self._count = window, count
        self._taken: list[str] = []
        self._counted: dict[str, int] = {}

    def take(self, texts: list[str]) -> None:
        self._taken += texts

    def fits(self, texts: list[str]) -> bool:
        if self._window is None or sum(len(t.encode()) for t in self._taken + texts) <= self._window:
            return True
        return self.tokens(self._taken + texts) <= self._window

    def tokens(self, texts: list[str]) -> int:
        for text in texts:
            if text not in self._counted:
                self._counted[text] = self._count(text)
        return sum(self._counted[t] for t in texts)

    def left(self) -> int:
        return max((self._window or 0) - self.tokens(self._taken), 0)


def _evidence_blocks(owner: Owner, found: _Searched) -> list[tuple[int, str]]:
    """One block per binding: a declared one at its SEARCH entry's position, undeclared ones after the
    owner's declarations in the turn's order; hits keep their score order."""
    positions = {e.name: k for k, e in owner.chat_knowledge(Use.SEARCH)}
    blocks = []
    for order, binding in enumerate(found.bindings):
        hits = [h for h in found.hits if h.source == binding.source]
        if hits:
            place = positions[binding.source] if binding.declared else len(owner.knowledge) + order
            blocks.append((place, neutralise_fenced(render_block(Block(binding.source, Use.SEARCH, hits)))))
    return blocks


def _add_work(total: Work, work: Work) -> None:
    total.pairs += work.pairs
    total.tokens += work.tokens
    total.cached_pairs += work.cached_pairs
    total.queue_s += work.queue_s
    total.inference_s += work.inference_s


# -- the conversation ------------------------------------------------------------------------------------


def _prepared(turn: Turn) -> tuple[list[Message], list[str]]:
    """The stripped copy and the host regions (worker thread: linear in the turn's size). System messages
    over the marker cap are refused first, before any is stripped."""
    problems = [
        Violation(f"conversation[{i}].content", f"{count} sidecar markers; at most {MAX_MARKERS}")
        for i, m in enumerate(turn.conversation)
        if m.role == "system" and m.content and (count := marker_count(m.content)) > MAX_MARKERS
    ]
    if problems:
        raise invalid(problems)
    return _stripped(turn.conversation), _host_regions(turn)


def _stripped(conversation: tuple[Message, ...]) -> list[Message]:
    """A deep copy without the sidecar's earlier regions; a system message that held nothing else goes."""
    copies = []
    for message in conversation:
        content = message.content
        if message.role == "system" and content:
            content = strip_regions(content)
            if not content and message.content:
                continue
        copies.append(replace(message, content=content, extra=copy.deepcopy(message.extra)))
    return copies


def _host_regions(turn: Turn) -> list[str]:
    """The request section (with the activity block after it), then each owner's state, in owner order."""
    activity = turn.activity.render() if turn.activity else ""
    section = "\n\n".join(p for p in (turn.request_section, activity) if p.strip())
    regions = [region(REQUEST, neutralise_host_text(section))] if section else []
    return regions + [region(STATE, neutralise_host_text(o.state_text)) for o in turn.owners if o.state_text.strip()]


def _appended(conversation: list[Message], regions: list[str]) -> list[Message]:
    """The regions at the end of the last system message, or in a new first one when there is none."""
    if not regions:
        return conversation
    text = "\n\n".join(regions)
    last = max((i for i, m in enumerate(conversation) if m.role == "system"), default=None)
    if last is None:
        return [Message("system", text), *conversation]
    content = conversation[last].content
    conversation[last] = replace(conversation[last], content=f"{content}\n\n{text}" if content else text)
    return conversation


def _latest_user_text(conversation: list[Message]) -> str:
    latest = next((m for m in reversed(conversation) if m.role == "user"), None)
    return (latest.content or "").strip() if latest else ""


# -- validation ------------------------------------------------------------------------------------------


def shape_problems(turn: Turn) -> list[Violation]:
    """The turn's shape, checked before any binding is looked up: every problem at once. The size caps come
    first, and alone when exceeded, so that nothing is walked whose length is not yet bounded."""
    problems = _size_problems(turn)
    if problems:
        return problems
    owners: dict[str, int] = {}
    for i, owner in enumerate(turn.owners):
        if id_problems(owner.owner_id, f"owners[{i}].owner_id"):
            problems += id_problems(owner.owner_id, f"owners[{i}].owner_id")
        elif owner.owner_id in owners:
            problems.append(
                Violation(
                    f"owners[{i}].owner_id",
                    f"owner {owner.owner_id!r} is listed twice (also owners[{owners[owner.owner_id]}])",
                )
            )
        owners.setdefault(owner.owner_id, i)
        problems += _knowledge_name_problems(owner, f"owners[{i}]")
    ids: set[str] = set()
    for j, binding in enumerate(turn.bindings):
        if id_problems(binding.binding_id, f"bindings[{j}].binding_id"):
            problems += id_problems(binding.binding_id, f"bindings[{j}].binding_id")
        elif binding.binding_id in ids:
            problems.append(Violation(f"bindings[{j}].binding_id", "the binding is listed twice"))
        ids.add(binding.binding_id)
        if binding.owner_id not in owners:
            problems.append(Violation(f"bindings[{j}].owner_id", f"{binding.owner_id!r} is not a listed owner"))
    if turn.context is not None:
        if not turn.owners:
            problems.append(Violation("context", "a retrieval context needs at least one owner"))
        problems += _scope_problems(turn.context.scope, "context.scope")
        if turn.scope is not None and turn.scope != turn.context.scope:
            problems.append(Violation("scope", "differs from context.scope"))
    elif turn.scope is not None:
        problems += _scope_problems(turn.scope, "scope")
    elif turn.bindings:
        problems.append(Violation("scope", "a turn that lists bindings needs a scope (its own or its context's)"))
    if turn.activity is not None:
        problems += turn.activity.problems("activity")
    return problems


def _size_problems(turn: Turn) -> list[Violation]:
    counts = (
        ("conversation", len(turn.conversation), MAX_MESSAGES),
        ("owners", len(turn.owners), MAX_OWNERS),
        ("bindings", len(turn.bindings), MAX_BINDINGS),
    )
    problems = [Violation(name, f"{count} items; at most {cap}") for name, count, cap in counts if count > cap]
    problems += [
        Violation(f"owners[{i}].knowledge", f"{len(o.knowledge)} entries; at most {MAX_OWNER_KNOWLEDGE}")
        for i, o in enumerate(turn.owners[:MAX_OWNERS])
        if len(o.knowledge) > MAX_OWNER_KNOWLEDGE
    ]
    if problems:
        return problems
    texts = [(f"conversation[{i}].content", m.content or "") for i, m in enumerate(turn.conversation)]
    texts += [(f"owners[{i}].state_text", o.state_text) for i, o in enumerate(turn.owners)]
    texts.append(("request_section", turn.request_section))
    return [
        Violation(name, f"{len(text)} characters; at most {MAX_TEXT_CHARS}")
        for name, text in texts
        if len(text) > MAX_TEXT_CHARS
    ]


def _scope_problems(scope: Scope, at: str) -> list[Violation]:
    return id_problems(scope.tenant, f"{at}.tenant") + id_problems(scope.session, f"{at}.session", required=False)


def _knowledge_name_problems(owner: Owner, at: str) -> list[Violation]:
    """The owner's knowledge names: valid ids, each declared once."""
    return unique_name_problems(
        ((e.name, f"{at}.knowledge[{k}].name") for k, e in enumerate(owner.knowledge)), "knowledge"
    )


def _declaration_problems(owners: tuple[Owner, ...], bindings: list[Binding]) -> list[Violation]:
    """At most one declared binding per owner, over an enabled SEARCH entry of its own with that entry's
    top_k; no two bindings of one owner on one source; no undeclared binding on a name the owner declares."""
    declared_by = {o.owner_id: {e.name: e for e in o.knowledge} for o in owners}
    first_declared: dict[str, int] = {}
    sources: dict[tuple[str, str], int] = {}
    problems = []
    for j, binding in enumerate(bindings):
        at, owner = f"bindings[{j}]", binding.owner_id
        declared = declared_by[owner]
        if (owner, binding.source) in sources:
            problems.append(
                Violation(
                    at,
                    f"owner {owner!r} already searches {binding.source!r} through "
                    f"bindings[{sources[owner, binding.source]}]",
                )
            )
        sources.setdefault((owner, binding.source), j)
        if not binding.declared:
            if binding.source in declared:
                problems.append(
                    Violation(
                        at,
                        f"an undeclared binding may not use {binding.source!r}, "
                        f"knowledge that owner {owner!r} declares",
                    )
                )
            continue
        if owner in first_declared:
            problems.append(
                Violation(at, f"owner {owner!r} already has a declared binding (bindings[{first_declared[owner]}])")
            )
        first_declared.setdefault(owner, j)
        entry = declared.get(binding.source)
        if entry is None or not entry.enabled or entry.use is not Use.SEARCH:
            problems.append(
                Violation(
                    at, f"declared binding source {binding.source!r} is not an enabled SEARCH entry of owner {owner!r}"
                )
            )
        elif entry.k != binding.top_k:
            problems.append(
                Violation(
                    at, f"declared binding top_k {binding.top_k} differs from {binding.source!r}'s top_k {entry.k}"
                )
            )
    return problems
