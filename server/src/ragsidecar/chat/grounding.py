"""GroundTurn: the grounded outbound copy of one chat turn (the host's SCOPBridge.sendToLLM(ChatTurn)).

The caller's conversation is never changed: the outbound one is a copy with every earlier sidecar region
stripped, then the request section, each owner's state and (with a retrieval context) the owners' chat
knowledge appended to the last system message. Knowledge goes only inside the <tnsai-memory> fence.
Per owner, a recoverable retrieval failure, an empty result, oversized evidence or a spent deadline
fails open; DIRECT budget failures, configuration errors and cancellation surface.

Hostile turns: the sizes that drive work (messages, owners, bindings, characters of a text, markers in a
system message, activity entries and redaction roots) are capped and refused before any work (turn_rules.py), and
everything proportional to the turn's size (stripping, neutralising, redacting, rendering, counting
tokens) is linear and runs in a worker thread, so the event loop keeps serving other calls meanwhile.

Here: the orchestration. The turn's types are in turns.py, its rules in turn_rules.py, the outbound conversation
in conversation.py and the window accounting in window.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace

from ragsidecar import tracing
from ragsidecar.chat.conversation import appended, latest_user_text, prepared
from ragsidecar.chat.markup import fence, neutralise_fenced
from ragsidecar.chat.open_bindings import Bindings
from ragsidecar.chat.turn_rules import declaration_problems, shape_problems
from ragsidecar.chat.turns import (
    FailOpen,
    Grounding,
    Owner,
    OwnerOutcome,
    OwnerSearch,
    RetrievalContext,
    Turn,
    TurnResult,
)
from ragsidecar.chat.window import Room
from ragsidecar.errors import SidecarError, invalid
from ragsidecar.knowledge.declarations import Entry, Target, Use
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
from ragsidecar.knowledge.storage import Binding

log = logging.getLogger(__name__)

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
        conversation, host_text = await asyncio.to_thread(prepared, turn)
        result = TurnResult(conversation, Grounding.GROUNDED, [OwnerOutcome(o.owner_id) for o in turn.owners])
        with tracing.span("grounding", owners=len(turn.owners), bindings=len(turn.bindings)) as span:
            knowledge = await self._knowledge(turn, owned, host_text, result)
            span.set(
                grounding=result.grounding.value,
                pairs=result.work.pairs,
                cached_pairs=result.work.cached_pairs,
                tokens=result.work.tokens,
            )
        result.conversation = await asyncio.to_thread(appended, conversation, host_text + knowledge)
        result.work.total_s = time.perf_counter() - started
        return result

    async def _resolve(self, turn: Turn) -> list[list[Binding]]:
        """Each owner's bindings, in the turn's order; NOT_FOUND, PERMISSION_DENIED or the declaration rules."""
        scope = turn.context.scope if turn.context else turn.scope
        resolved = [await self._bindings.get(b.binding_id, b.owner_id, scope, b.handle) for b in turn.bindings]
        problems = declaration_problems(turn.owners, resolved)
        if problems:
            raise invalid(problems)
        return [[b for b in resolved if b.owner_id == owner.owner_id] for owner in turn.owners]

    async def _knowledge(
        self, turn: Turn, owned: list[list[Binding]], host_text: list[str], result: TurnResult
    ) -> list[str]:
        """The fenced knowledge region (or nothing), and the turn's grounding as a whole."""
        query, context = await asyncio.to_thread(latest_user_text, result.conversation), turn.context
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
            for owner, bindings, outcome in zip(turn.owners, owned, result.owners, strict=True)
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
        per_owner = [
            self._direct_blocks(owner, measures, outcome) for owner, outcome in zip(owners, result.owners, strict=True)
        ]
        room = Room(plan.window, self._runtime.count_tokens)
        room.take(
            [m.content or "" for m in result.conversation]
            + host_text
            + [fence([])]
            + [text for blocks in per_owner for _, text in blocks]
        )
        for owner, blocks, found, outcome in zip(owners, per_owner, searched, result.owners, strict=True):
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
            if measure is None or block is None:  # skipped (an unconfigured WHEN_CONFIGURED source) or blank
                continue
            outcome.direct.append(replace(measure, position=position))
            blocks.append((position, neutralise_fenced(render_block(block))))
        return blocks


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
