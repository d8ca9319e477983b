"""The retrieval runtime: the host's RetrievalSpi semantics over declared knowledge (no gRPC here).

validate -> every problem at once; enforce -> DIRECT given whole within budget, SEARCH searched with
the action's query, SEQUENTIAL one unit per dispatch per scope; require_loaded / require_ready ->
preflights that load exactly what a dispatch loads. The parts live beside it: results (what comes
back), validation (entry checks), direct (DIRECT budgets), ranking (SEARCH), sequential (cursors).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import numpy as np

from ragsidecar.config import Config
from ragsidecar.errors import ErrorKind, SidecarError, Violation, invalid
from ragsidecar.inference.registry import ModelRegistry
from ragsidecar.knowledge import filters
from ragsidecar.knowledge.budget import BudgetPolicy
from ragsidecar.knowledge.catalog import Catalog, LoadedSource, source_error
from ragsidecar.knowledge.declarations import Action, Entry, Llm, Reach, Scope, SourceType, Target, Use
from ragsidecar.knowledge.direct import DirectBudgets, DirectMeasure, DirectPlan, direct_block
from ragsidecar.knowledge.ranking import Query, Ranker, SearchSpec
from ragsidecar.knowledge.results import Block, EnforceResult, Hit, StaleSource, Work, block_head, render_block
from ragsidecar.knowledge.sequential import Cursors
from ragsidecar.knowledge.sources.units import SourceError
from ragsidecar.knowledge.storage import Backend
from ragsidecar.knowledge.tokens import Tokens
from ragsidecar.knowledge.validation import EntryChecks, action_problems, duplicate_names, named, require_declared_names
from ragsidecar.reranking import Reranker

# Failures of the retrieval itself, not of its configuration: an entry whose on_failure is CONTINUE
# drops out on these as on a load failure (an unreachable PostgreSQL store is one: its sources cannot be read,
# while local ones still can). Configuration errors (unknown or unready model) always surface.
_RETRIEVAL_FAILURES = (ErrorKind.RESOURCE_EXHAUSTED, ErrorKind.DEADLINE_EXCEEDED)
_RETRIEVAL_FAILURE_REASONS = ("STORE_UNAVAILABLE",)

# What callers of the runtime (the servicers, chat grounding) use of its parts.
__all__ = [
    "Block",
    "DirectMeasure",
    "DirectPlan",
    "EnforceResult",
    "Hit",
    "Query",
    "RetrievalRuntime",
    "SearchSpec",
    "StaleSource",
    "Work",
    "render_block",
]
# Loads of one source in one call while the embedder changes under it (a reload between loading and embedding
# the query): past this, the call is refused as MODEL_NOT_READY, to retry once the reloads settle.
_LOADS_WHILE_THE_MODEL_CHANGES = 3


class RetrievalRuntime:
    def __init__(self, config: Config, registry: ModelRegistry, reranker: Reranker, backend: Backend) -> None:
        self._config = config
        self.catalog = Catalog(config, registry, backend)
        self._tokens = Tokens(registry, config.retrieval.embedder)
        self._checks = EntryChecks(self.catalog, registry)
        self._direct = DirectBudgets(
            self.catalog,
            BudgetPolicy(config.retrieval.direct_budget_fraction, config.retrieval.model_windows),
            self._tokens,
        )
        self._ranker = Ranker(config, reranker)
        self._cursors = Cursors(self.catalog, self._tokens, config.retrieval.max_sequential_cursors)
        self.max_memory_documents = config.retrieval.max_memory_documents_per_request

    async def close(self) -> None:
        """Finishes the catalog's queued index saves and stops its file watches (at shutdown)."""
        await self.catalog.close()

    # -- ValidateConfiguration ----------------------------------------------------------------------

    async def validate(
        self,
        target: Target,
        outer: tuple[Entry, ...],
        llm: Llm | None,
        action_knowledge: dict[str, tuple[str, ...]],
        paths_per_run: bool,
        scope: Scope,
        declarations_only: bool = False,
    ) -> list[Violation]:
        """Every problem of the declarations; unless `declarations_only`, enabled DIRECT sources are also read
        and measured against their budgets (the SPI's one-argument form reads nothing)."""
        reach = Reach.of(target, outer)
        problems = duplicate_names(target.knowledge, outer) + action_problems(target)
        measurable = []
        for entry in reach:
            own = self._checks.entry_problems(entry, paths_per_run) + self._checks.reranker_problems(entry)
            problems += own
            if not own and entry.enabled and entry.use is Use.DIRECT:
                measurable.append(entry)
        for index, action in enumerate(target.actions):
            names = action_knowledge.get(action.name, action.knowledge)
            where = (
                f'action_knowledge["{action.name}"].names'
                if action.name in action_knowledge
                else f"target.actions[{index}].knowledge"
            )
            problems += [
                Violation(
                    f"{where}[{i}]", f"action {action.name!r} names {n!r}, which is not in reach", "UNKNOWN_KNOWLEDGE"
                )
                for i, n in enumerate(names)
                if reach.get(n) is None
            ]
        actions = {a.name for a in target.actions}
        problems += [
            Violation(f'action_knowledge["{name}"]', f"{name!r} is not an action of {target.name!r}")
            for name in action_knowledge
            if name not in actions
        ]
        if not declarations_only:
            problems += (await self._direct.measure(measurable, llm, scope)).problems
        return problems

    # -- Enforce -------------------------------------------------------------------------------------

    async def enforce(
        self,
        target: Target,
        outer: tuple[Entry, ...],
        action_name: str,
        params: list[tuple[str, Any]],
        resolved_paths: dict[str, str],
        llm: Llm | None,
        action_knowledge: tuple[str, ...] | None,
        max_context_tokens: int | None,
        scope: Scope,
        deadline: float | None,
    ) -> EnforceResult:
        started = time.perf_counter()
        require_declared_names(target.knowledge + outer, target)
        action = target.action(action_name)
        if action is None:
            raise invalid([Violation("action", f"{action_name!r} is not an action of {target.name!r}")])
        names = action.knowledge if action_knowledge is None else action_knowledge
        result = EnforceResult()
        if not names:
            return result
        reach = self._checks.with_paths(Reach.of(target, outer), resolved_paths)
        entries = named(reach, names, "action knowledge")
        problems = [p for e in entries for p in self._checks.entry_problems(e, paths_per_run=True)]
        if problems:
            raise invalid(problems, "INVALID_CONFIGURATION")
        enabled = [e for e in entries if e.enabled]
        result.query = _pick_query(action, params)
        if not result.query and any(e.use is Use.SEARCH for e in enabled):
            return result  # the host's silent skip: no query for its SEARCH knowledge, no retrieved text at all
        check = await self._direct.measure([e for e in enabled if e.use is Use.DIRECT], llm, scope, at_dispatch=True)
        if check.problems:
            raise check.error()
        direct = {m.entry.name: m for m in check.plan.blocks}
        query = Query(result.query)
        for entry in enabled:
            block = await self._given(entry, target, scope, direct, query, result, deadline)
            if block is not None and block.hits:
                result.blocks.append(block)
        limit = self._config.retrieval.context_window_tokens if max_context_tokens is None else max_context_tokens
        await asyncio.to_thread(self._assemble, result, limit)
        result.work.total_s = time.perf_counter() - started
        return result

    async def _given(
        self,
        entry: Entry,
        target: Target,
        scope: Scope,
        direct: dict[str, DirectMeasure],
        query: Query,
        result: EnforceResult,
        deadline: float | None,
    ) -> Block | None:
        """What one entry gives this dispatch; None when it drops out (its readiness or on_failure say so)."""
        try:
            if entry.use is Use.DIRECT:
                return direct_block(direct.get(entry.name))
            if entry.use is Use.SEQUENTIAL:
                return await self._cursors.next_unit(entry, target, scope)
            return Block(entry.name, Use.SEARCH, await self._searched(entry, scope, query, result, deadline))
        except (SourceError, OSError, SidecarError) as err:
            if _drops_out(entry, err):
                return None
            raise _surfaced(entry, err) from None

    async def _searched(
        self, entry: Entry, scope: Scope, query: Query, result: EnforceResult, deadline: float | None
    ) -> list[Hit]:
        source, query_vector = await self._loaded(entry, scope, query)
        if source.stale:
            result.stale.append(StaleSource(entry.name, source.stale.reason, source.stale.built_at))
        return await self._ranker.search(entry, source, query.text, query_vector, result.work, deadline)

    async def _loaded(
        self, entry: Entry, scope: Scope, query: Query, rescan: bool = False
    ) -> tuple[LoadedSource, np.ndarray]:
        """The source's index and the query's vector by the same model. The query is embedded after the load,
        so a model reload between the two is seen (the fingerprints differ) and the source is loaded again."""
        entry.require_location()
        for _ in range(_LOADS_WHILE_THE_MODEL_CHANGES):
            source = await self.catalog.load(entry, scope, rescan)
            if source.model not in query.vectors:
                vector, model = await self.catalog.query_vector(query.text)
                query.vectors[model] = vector
            if source.model in query.vectors:
                return source, query.vectors[source.model]
            if source.stale:  # a failed rebuild: its last good index holds an earlier model's vectors
                raise SourceError(
                    "SOURCE_UNREADABLE",
                    f"it failed to rebuild with the current embedder "
                    f"({source.stale.reason}); its last good index was built by another model",
                )
        raise SidecarError(
            ErrorKind.UNAVAILABLE,
            "MODEL_NOT_READY",
            f"the embedder changed with every load of knowledge {entry.name!r}; retry",
            metadata={"sources": entry.name},
        )

    # -- RequireLoaded / RequireReady ---------------------------------------------------------------

    async def require_loaded(
        self, target: Target, outer: tuple[Entry, ...], names: list[str], resolved_paths: dict[str, str], scope: Scope
    ) -> list[tuple[str, int]]:
        if not names or len(set(names)) != len(names):
            raise invalid([Violation("names", "at least one name, without repeats")])
        require_declared_names(target.knowledge + outer, target)
        reach = self._checks.with_paths(Reach.of(target, outer), resolved_paths)
        entries = named(reach, names, "names")
        wrong = [
            Violation(f"names[{i}]", f"{e.name!r} is not an enabled SEARCH entry")
            for i, e in enumerate(entries)
            if not e.enabled or e.use is not Use.SEARCH
        ]
        if wrong:
            raise invalid(wrong)
        counts = []
        for entry in entries:
            try:
                entry.require_location()
                source = await self.catalog.load(entry, scope)
            except (SourceError, OSError) as err:
                raise source_error(entry.name, err) from None
            counts.append((entry.name, source.documents))
        return sorted(counts, key=lambda c: c[0].encode())

    async def require_ready(
        self, target: Target, outer: tuple[Entry, ...], resolved_paths: dict[str, str], scope: Scope
    ) -> list[tuple[str, int]]:
        require_declared_names(target.knowledge + outer, target)
        reach = self._checks.with_paths(Reach.of(target, outer), resolved_paths)
        counts, failing = [], []
        for entry in reach:
            if not (entry.enabled and entry.when_configured and entry.located):
                continue
            try:
                units = await self.catalog.units(entry, scope)
                why = "" if units else "it holds no unit"
            except (SourceError, OSError) as err:
                units, why = [], f"it cannot be read: {err}"
            if why:
                failing.append(
                    Violation(f"knowledge[{entry.name}]", f"{entry.name!r} is not ready: {why}", "KNOWLEDGE_NOT_READY")
                )
            counts.append((entry.name, len(units)))
        if failing:
            names = sorted(v.field[len("knowledge[") : -1] for v in failing)
            raise SidecarError(
                ErrorKind.FAILED_PRECONDITION,
                "KNOWLEDGE_NOT_READY",
                f"knowledge not ready: {', '.join(names)}",
                failing,
                {"sources": ",".join(names)},
            )
        return sorted(counts, key=lambda c: c[0].encode())

    # -- PrepareChatKnowledge -----------------------------------------------------------------------

    async def prepare_chat(self, entries: tuple[Entry, ...], llm: Llm | None, scope: Scope) -> DirectPlan:
        require_declared_names(entries)
        direct = [e for e in entries if e.enabled and e.use is Use.DIRECT]
        self._checks.require_inside_roots(direct)
        problems = [p for e in direct for p in self._checks.entry_problems(e, paths_per_run=False)]
        if problems:
            raise invalid(problems, "INVALID_CONFIGURATION")
        check = await self._direct.measure(direct, llm, scope)
        if check.problems:
            raise check.error()
        positions = {e.name: i for i, e in enumerate(entries)}
        check.plan.blocks = [replace(m, position=positions[m.entry.name]) for m in check.plan.blocks]
        return check.plan

    # -- Search ----------------------------------------------------------------------------------------

    async def search(
        self,
        target: Target,
        outer: tuple[Entry, ...],
        names: list[str],
        query: str,
        spec: SearchSpec,
        resolved_paths: dict[str, str],
        scope: Scope,
        deadline: float | None,
        shared: Query | None = None,
        rescan: bool = False,
        keep: dict[str, filters.Filter] | None = None,
    ) -> tuple[list[Hit], list[StaleSource], Work]:
        """`shared`, when given, holds the query's embeddings (a chat turn embeds it once for all owners).
        `rescan`: DIRECTORY sources' files are listed and stat'ed whatever their watches say. `keep`: a filter by
        knowledge name (each name must be among the entries searched; INVALID_ARGUMENT otherwise)."""
        started = time.perf_counter()
        if not query.strip():
            raise invalid([Violation("query", "must not be blank")])
        require_declared_names(target.knowledge + outer, target)
        reach = self._checks.with_paths(Reach.of(target, outer), resolved_paths)
        entries = named(reach, names, "knowledge") if names else [e for e in reach if e.use is Use.SEARCH]
        entries = [spec.applied_to(e) for e in entries if e.enabled]
        problems = [p for e in entries for p in self._checks.entry_problems(e, paths_per_run=True)]
        if problems:
            raise invalid(problems, "INVALID_CONFIGURATION")
        if keep:
            entries = _filtered(entries, keep)
        embedded = shared or Query(query)
        hits: list[Hit] = []
        stale: list[StaleSource] = []
        work = Work()
        for entry in entries:
            try:
                source, query_vector = await self._loaded(entry, scope, embedded, rescan)
                found = await self._ranker.search(entry, source, query, query_vector, work, deadline)
            except (SourceError, OSError, SidecarError) as err:
                if _drops_out(entry, err):
                    continue
                raise _surfaced(entry, err) from None
            if source.stale:
                stale.append(StaleSource(entry.name, source.stale.reason, source.stale.built_at))
            hits += found
        # Ties across sources are common (each source's best hit in both lists scores 1 under min-max fusion):
        # the cosine breaks them, as it does within a source.
        hits.sort(key=lambda h: (-(h.score or 0.0), -(h.dense or 0.0), h.source, h.chunk_id))
        work.total_s = time.perf_counter() - started
        return hits, stale, work

    # -- assembly -----------------------------------------------------------------------------------

    def _assemble(self, result: EnforceResult, max_tokens: int) -> None:
        """Renders the blocks in order; what does not fit the window is cut and flagged (runs off the loop)."""
        remaining = max_tokens
        kept = []
        for block in result.blocks:
            rendered, tokens, cut = self._rendered(block, remaining)
            if cut:
                block.truncated = result.truncated = True
                block.hits = [h for h in block.hits if h.text[:40] in rendered] or block.hits[:0]
            if not rendered:
                continue
            block.text, block.tokens = rendered, tokens
            remaining -= tokens
            kept.append(block)
        result.blocks = kept
        result.context = "\n\n".join(b.text for b in kept)
        result.document_count = sum(len(b.hits) for b in kept)

    def _rendered(self, block: Block, room: int) -> tuple[str, int, bool]:
        """The block's text cut to `room` tokens, its tokens, and whether it was cut. A DIRECT or SEQUENTIAL
        body was measured where it was read: only its title line is tokenized here."""
        if block.body is None:
            whole = self._tokens.measure(render_block(block))
            kept = whole.first(room)
            return kept.text, kept.tokens, kept.tokens < whole.tokens
        head = block_head(block)
        head_tokens = self._tokens.count(head)
        body = block.body.first(room - head_tokens)
        if head_tokens > room or not body.text:
            return "", 0, True
        return head + body.text, head_tokens + body.tokens, body.tokens < block.body.tokens

    def count_tokens(self, text: str) -> int:
        return self._tokens.count(text)

    @staticmethod
    def direct_block(measure: DirectMeasure | None) -> Block | None:
        return direct_block(measure)


def _pick_query(action: Action, params: list[tuple[str, Any]]) -> str:
    """The declared query parameter's string value, else the first string parameter's; blank -> ""."""
    if action.query_parameter is not None:
        value = dict(params).get(action.query_parameter)
        return value.strip() if isinstance(value, str) else ""
    first = next((v for _, v in params if isinstance(v, str)), "")
    return first.strip()


def _drops_out(entry: Entry, err: Exception) -> bool:
    """Whether a failure of this entry drops it out of the dispatch (its readiness or on_failure say so) instead
    of failing the call: any load failure may; of the domain errors, only failures of the retrieval itself."""
    if isinstance(err, SidecarError) and not (
        err.kind in _RETRIEVAL_FAILURES or err.reason in _RETRIEVAL_FAILURE_REASONS
    ):
        return False
    return entry.skips(err)


def _surfaced(entry: Entry, err: Exception) -> SidecarError:
    """The error a failure that does not drop its entry out is reported as."""
    return err if isinstance(err, SidecarError) else source_error(entry.name, err)


# The reserved fields a filter may name, by source type (INLINE text has none).
_RESERVED: dict[SourceType | None, tuple[str, ...]] = {
    SourceType.MEMORY: filters.DOCUMENT_FIELDS,
    SourceType.BINDING: filters.DOCUMENT_FIELDS,
    SourceType.FILE: filters.FILE_FIELDS,
    SourceType.DIRECTORY: filters.FILE_FIELDS,
}


def _filtered(entries: list[Entry], keep: dict[str, filters.Filter]) -> list[Entry]:
    """The entries with their filters; a filter naming no entry searched, or a reserved field the entry's source
    does not know, is INVALID_ARGUMENT (reason INVALID_REQUEST)."""
    searched = {e.name: e for e in entries}
    problems = [
        Violation(f"filters[{name!r}]", "names no knowledge this search searches", "INVALID_REQUEST")
        for name in keep
        if name not in searched
    ]
    for name, node in keep.items():
        if name in searched:
            problems += filters.problems(node, f"filters[{name!r}]", _RESERVED.get(searched[name].type, ()))
    if problems:
        raise invalid(problems)
    return [replace(e, keep=keep.get(e.name)) for e in entries]
