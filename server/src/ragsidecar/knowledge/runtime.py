"""The retrieval runtime: the host's RetrievalSpi semantics over declared knowledge (no gRPC here).

validate -> every problem at once; enforce -> DIRECT given whole within budget, SEARCH searched with
the action's query, SEQUENTIAL one unit per dispatch per scope; require_loaded / require_ready ->
preflights that load exactly what a dispatch loads.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ragsidecar.config import Config
from ragsidecar.errors import ErrorKind, SidecarError, Violation, invalid
from ragsidecar.inference.registry import ModelRegistry
from ragsidecar.knowledge.budget import BudgetPolicy
from ragsidecar.knowledge.catalog import Catalog, LoadedSource, Stale, source_error
from ragsidecar.knowledge.index import reciprocal_rank_fusion
from ragsidecar.knowledge.declarations import Action, Entry, Llm, Reach, Scope, SourceType, Target, Use
from ragsidecar.knowledge.sources import SourceError, Unit
from ragsidecar.reranking import Candidate, Reranker, RerankQuery

log = logging.getLogger(__name__)


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


@dataclass
class Block:
    source: str
    use: Use
    hits: list[Hit]
    text: str = ""
    tokens: int = 0
    truncated: bool = False


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


@dataclass(frozen=True)
class DirectMeasure:
    entry: Entry
    position: int
    text: str
    tokens: int
    budget: int
    shared: bool
    documents: int


@dataclass
class DirectPlan:
    blocks: list[DirectMeasure]
    window: int | None
    default_budget: int
    default_used: int


@dataclass(frozen=True)
class SearchSpec:
    """Per-call overrides of Search."""

    top_k: int | None = None
    min_score: float | None = None
    rerank: bool | None = None
    reranker_model: str | None = None
    candidates: int | None = None


class RetrievalRuntime:
    def __init__(self, config: Config, registry: ModelRegistry, reranker: Reranker) -> None:
        self._config = config
        self._registry = registry
        self._reranker = reranker
        self.catalog = Catalog(config, registry)
        self._budgets = BudgetPolicy(config.retrieval.direct_budget_fraction, config.retrieval.model_windows)
        self._cursors: dict[tuple[str, str, str, str], int] = {}
        self.max_memory_documents = config.retrieval.max_memory_documents_per_request

    # -- ValidateConfiguration ----------------------------------------------------------------------

    async def validate(self, target: Target, outer: tuple[Entry, ...], llm: Llm | None,
                       action_knowledge: dict[str, tuple[str, ...]], paths_per_run: bool,
                       scope: Scope) -> list[Violation]:
        reach = Reach.of(target, outer)
        problems = self._duplicate_names(target.knowledge, outer)
        measurable = []
        for entry in reach:
            own = self._entry_problems(entry, paths_per_run) + self._reranker_problems(entry)
            problems += own
            if not own and entry.enabled and entry.use is Use.DIRECT:
                measurable.append(entry)
        for index, action in enumerate(target.actions):
            names = action_knowledge.get(action.name, action.knowledge)
            where = (f'action_knowledge["{action.name}"].names' if action.name in action_knowledge
                     else f"target.actions[{index}].knowledge")
            problems += [Violation(f"{where}[{i}]", f"action {action.name!r} names {n!r}, which is not in reach",
                                   "UNKNOWN_KNOWLEDGE") for i, n in enumerate(names) if reach.get(n) is None]
        actions = {a.name for a in target.actions}
        problems += [Violation(f'action_knowledge["{name}"]', f"{name!r} is not an action of {target.name!r}")
                     for name in action_knowledge if name not in actions]
        problems += (await self._measure_direct(measurable, llm, scope))[1]
        return problems

    # -- Enforce -------------------------------------------------------------------------------------

    async def enforce(self, target: Target, outer: tuple[Entry, ...], action_name: str, params: list[tuple[str, Any]],
                      resolved_paths: dict[str, str], llm: Llm | None, action_knowledge: tuple[str, ...] | None,
                      max_context_tokens: int | None, scope: Scope, deadline: float | None) -> EnforceResult:
        started = time.perf_counter()
        action = target.action(action_name)
        if action is None:
            raise invalid([Violation("action", f"{action_name!r} is not an action of {target.name!r}")])
        names = action.knowledge if action_knowledge is None else action_knowledge
        result = EnforceResult()
        if not names:
            return result
        reach = self._with_paths(Reach.of(target, outer), resolved_paths)
        entries = self._named(reach, names, "action knowledge")
        problems = [p for e in entries for p in self._entry_problems(e, paths_per_run=True)]
        if problems:
            raise invalid(problems, "INVALID_CONFIGURATION")
        enabled = [e for e in entries if e.enabled]
        plan, problems = await self._measure_direct([e for e in enabled if e.use is Use.DIRECT], llm, scope,
                                                    at_dispatch=True)
        if problems:
            raise _budget_error(problems)
        direct = {m.entry.name: m for m in plan.blocks}
        result.query = _pick_query(action, params)
        query_vector = None
        for entry in enabled:
            try:
                if entry.use is Use.DIRECT:
                    block = self.direct_block(direct.get(entry.name))
                elif entry.use is Use.SEQUENTIAL:
                    block = await self._next_unit(entry, target, scope)
                elif not result.query:
                    continue  # a blank or unpickable query skips SEARCH entries: benign
                else:
                    if query_vector is None:
                        query_vector = await self.catalog.query_vector(result.query)
                    source = await self.catalog.load(entry, scope)
                    if source.stale:
                        result.stale.append(StaleSource(entry.name, source.stale.reason, source.stale.built_at))
                    block = Block(entry.name, Use.SEARCH,
                                  await self._search(entry, source, result.query, query_vector, result.work, deadline))
            except (SourceError, OSError) as err:
                if self._benign(entry, err):
                    continue
                raise source_error(entry.name, err) from None
            if block is not None and block.hits:
                result.blocks.append(block)
        self._assemble(result, max_context_tokens or self._config.retrieval.context_window_tokens)
        result.work.total_s = time.perf_counter() - started
        return result

    def _benign(self, entry: Entry, err: Exception) -> bool:
        """Missing WHEN_CONFIGURED sources are skipped; CONTINUE entries drop out on any load failure."""
        if entry.when_configured and isinstance(err, FileNotFoundError):
            return True
        if entry.continue_on_failure:
            log.warning("knowledge %s failed and is skipped (on_failure CONTINUE): %s", entry.name, err)
            return True
        return False

    # -- RequireLoaded / RequireReady ---------------------------------------------------------------

    async def require_loaded(self, target: Target, outer: tuple[Entry, ...], names: list[str],
                             resolved_paths: dict[str, str], scope: Scope) -> list[tuple[str, int]]:
        if not names or len(set(names)) != len(names):
            raise invalid([Violation("names", "at least one name, without repeats")])
        reach = self._with_paths(Reach.of(target, outer), resolved_paths)
        entries = self._named(reach, names, "names")
        wrong = [Violation(f"names[{i}]", f"{e.name!r} is not an enabled SEARCH entry")
                 for i, e in enumerate(entries) if not e.enabled or e.use is not Use.SEARCH]
        if wrong:
            raise invalid(wrong)
        counts = []
        for entry in entries:
            if not entry.located:
                raise source_error(entry.name, FileNotFoundError("no location declared or resolved"))
            try:
                source = await self.catalog.load(entry, scope)
            except (SourceError, OSError) as err:
                raise source_error(entry.name, err) from None
            counts.append((entry.name, len(source.units)))
        return sorted(counts, key=lambda c: c[0].encode())

    async def require_ready(self, target: Target, outer: tuple[Entry, ...], resolved_paths: dict[str, str],
                            scope: Scope) -> list[tuple[str, int]]:
        reach = self._with_paths(Reach.of(target, outer), resolved_paths)
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
                failing.append(Violation(f"knowledge[{entry.name}]", f"{entry.name!r} is not ready: {why}",
                                         "KNOWLEDGE_NOT_READY"))
            counts.append((entry.name, len(units)))
        if failing:
            names = sorted(v.field[len("knowledge["):-1] for v in failing)
            raise SidecarError(ErrorKind.FAILED_PRECONDITION, "KNOWLEDGE_NOT_READY",
                               f"knowledge not ready: {', '.join(names)}", failing, {"sources": ",".join(names)})
        return sorted(counts, key=lambda c: c[0].encode())

    # -- PrepareChatKnowledge -----------------------------------------------------------------------

    async def prepare_chat(self, entries: tuple[Entry, ...], llm: Llm | None, scope: Scope) -> DirectPlan:
        problems = [p for e in entries if e.enabled and e.use is Use.DIRECT
                    for p in self._entry_problems(e, paths_per_run=False)]
        if problems:
            raise invalid(problems, "INVALID_CONFIGURATION")
        direct = [e for e in entries if e.enabled and e.use is Use.DIRECT]
        plan, problems = await self._measure_direct(direct, llm, scope)
        if problems:
            raise _budget_error(problems)
        positions = {e.name: i for i, e in enumerate(entries)}
        plan.blocks = [replace(m, position=positions[m.entry.name]) for m in plan.blocks]
        return plan

    # -- Search ----------------------------------------------------------------------------------------

    async def search(self, target: Target, outer: tuple[Entry, ...], names: list[str], query: str, spec: SearchSpec,
                     resolved_paths: dict[str, str], scope: Scope, deadline: float | None,
                     query_vector: np.ndarray | None = None) -> tuple[list[Hit], list[StaleSource], Work]:
        """`query_vector`, when given, is the query's embedding (a chat turn embeds it once for all owners)."""
        started = time.perf_counter()
        if not query.strip():
            raise invalid([Violation("query", "must not be blank")])
        reach = self._with_paths(Reach.of(target, outer), resolved_paths)
        entries = (self._named(reach, names, "knowledge") if names
                   else [e for e in reach if e.use is Use.SEARCH])
        entries = [e for e in entries if e.enabled]
        problems = [p for e in entries for p in self._entry_problems(self._override(e, spec), paths_per_run=True)]
        if problems:
            raise invalid(problems, "INVALID_CONFIGURATION")
        if query_vector is None:
            query_vector = await self.catalog.query_vector(query)
        hits: list[Hit] = []
        stale: list[StaleSource] = []
        work = Work()
        for entry in entries:
            try:
                source = await self.catalog.load(entry, scope)
            except (SourceError, OSError) as err:
                if self._benign(entry, err):
                    continue
                raise source_error(entry.name, err) from None
            if source.stale:
                stale.append(StaleSource(entry.name, source.stale.reason, source.stale.built_at))
            hits += await self._search(self._override(entry, spec), source, query, query_vector, work, deadline)
        hits.sort(key=lambda h: (-(h.score or 0.0), h.source, h.chunk_id))
        work.total_s = time.perf_counter() - started
        return hits, stale, work

    @staticmethod
    def _override(entry: Entry, spec: SearchSpec) -> Entry:
        changes = {k: v for k, v in (("top_k", spec.top_k), ("min_score", spec.min_score), ("rerank", spec.rerank),
                                     ("reranker_model", spec.reranker_model), ("candidates", spec.candidates))
                   if v is not None}
        return replace(entry, **changes)

    async def _search(self, entry: Entry, source: LoadedSource, query: str, query_vector, work: Work,
                      deadline: float | None) -> list[Hit]:
        if source.index is None or len(source.index) == 0:
            return []
        retrieval = self._config.retrieval
        depth = max(entry.k, entry.candidates or retrieval.rerank_candidates) if entry.rerank else entry.k
        found = await asyncio.to_thread(source.index.search, query_vector, query, depth,
                                        max(retrieval.fusion_candidates, depth))
        hits = [Hit(h.chunk.id, entry.name, h.chunk.text, h.chunk.meta, h.fused, h.dense, h.bm25, h.fused)
                for h in found]
        if entry.rerank:
            outcome = await self._reranker.rerank(
                RerankQuery(entry.reranker_model, query, [Candidate(h.chunk_id, h.text) for h in hits]), deadline)
            hits = _fuse_with_retrieval(hits, [(r.index, r.relevance_score) for r in outcome.results])
            work.pairs += outcome.pairs
            work.tokens += outcome.tokens
            work.cached_pairs += outcome.cached_pairs
            work.queue_s += outcome.queue_s
            work.inference_s += outcome.inference_s
        if entry.min_score is not None:
            hits = [h for h in hits if (h.rerank if entry.rerank else h.dense) >= entry.min_score]
        return hits[: entry.k]

    # -- DIRECT and SEQUENTIAL -------------------------------------------------------------------------

    async def _measure_direct(self, entries: list[Entry], llm: Llm | None, scope: Scope,
                              at_dispatch: bool = False) -> tuple[DirectPlan, list[Violation]]:
        """Renders every DIRECT entry and checks it against its budget; returns the plan and the problems.

        At dispatch a source that fails to load follows its readiness and on_failure; when validating,
        it is one more problem (a missing WHEN_CONFIGURED file is skipped either way)."""
        window = self._budgets.window(llm)
        default_budget = self._budgets.default_budget(window) if window else 0
        measures: list[DirectMeasure] = []
        problems: list[Violation] = []
        for position, entry in enumerate(entries):
            if not entry.located:
                continue
            try:
                units = await self.catalog.units(entry, scope)
            except (SourceError, OSError) as err:
                if at_dispatch:
                    if self._benign(entry, err):
                        continue
                    raise source_error(entry.name, err) from None
                if not (entry.when_configured and isinstance(err, FileNotFoundError)):
                    reason = "INVALID_CONFIGURATION" if isinstance(err, FileNotFoundError) else "SOURCE_UNREADABLE"
                    problems.append(Violation(f"{entry.origin}.path", f"{entry.name!r} cannot be read: {err}", reason))
                continue
            text = "\n\n".join(u.text for u in units)
            tokens = self.count_tokens(text)
            budget = entry.max_tokens or default_budget
            measures.append(DirectMeasure(entry, position, text, tokens, budget, entry.max_tokens is None, len(units)))
            if entry.max_tokens is not None and tokens > entry.max_tokens:
                problems.append(Violation(f"{entry.origin}.max_tokens", f"DIRECT source {entry.name!r} takes {tokens} "
                                          f"tokens, over its max_tokens of {entry.max_tokens}", "DIRECT_BUDGET_EXCEEDED"))
        shared = [m for m in measures if m.shared]
        used = sum(m.tokens for m in shared)
        if shared and window is None:
            model = llm.model if llm else ""
            problems.append(Violation("llm.input_window_tokens", f"the input window of model {model!r} is unknown and "
                                      f"none was given; DIRECT entries without max_tokens cannot be sized",
                                      "UNKNOWN_MODEL_WINDOW"))
        elif used > default_budget:
            problems += [Violation(f"{m.entry.origin}.max_tokens", f"DIRECT sources without max_tokens take {used} "
                                   f"tokens together ({m.entry.name!r}: {m.tokens}), over the shared default budget "
                                   f"of {default_budget}", "DIRECT_BUDGET_EXCEEDED") for m in shared]
        return DirectPlan(measures, window, default_budget if shared else 0, used), problems

    @staticmethod
    def direct_block(measure: DirectMeasure | None) -> Block | None:
        if measure is None or not measure.text.strip():
            return None
        entry = measure.entry
        file = entry.path if entry.type in (SourceType.FILE, SourceType.DIRECTORY) else ""
        hit = Hit(f"{entry.name}:direct", entry.name, measure.text,
                  {"position": 0, "file": file, "char_start": 0, "char_end": len(measure.text)})
        return Block(measure.entry.name, Use.DIRECT, [hit])

    async def _next_unit(self, entry: Entry, target: Target, scope: Scope) -> Block | None:
        units = await self.catalog.units(entry, scope)
        key = (scope.tenant, scope.session, target.name, entry.name)
        position = self._cursors.get(key, 0)
        if position >= len(units):
            return None
        self._cursors[key] = position + 1
        unit = units[position]
        text = self._cut(unit.text, entry.max_tokens) if entry.max_tokens else unit.text
        provenance = {"position": position, **_provenance_dict(unit)}
        return Block(entry.name, Use.SEQUENTIAL, [Hit(f"{entry.name}:{position}", entry.name, text, provenance)])

    # -- assembly -----------------------------------------------------------------------------------

    def _assemble(self, result: EnforceResult, max_tokens: int) -> None:
        """Renders the blocks in order; what does not fit the window is cut and flagged."""
        remaining = max_tokens
        kept = []
        for block in result.blocks:
            rendered = render_block(block)
            tokens = self.count_tokens(rendered)
            if tokens > remaining:
                rendered = self._cut(rendered, remaining) if remaining > 0 else ""
                block.truncated = result.truncated = True
                block.hits = [h for h in block.hits if h.text[:40] in rendered] or block.hits[:0]
                tokens = self.count_tokens(rendered) if rendered else 0
            if not rendered:
                continue
            block.text, block.tokens = rendered, tokens
            remaining -= tokens
            kept.append(block)
        result.blocks = kept
        result.context = "\n\n".join(b.text for b in kept)
        result.document_count = sum(len(b.hits) for b in kept)

    def count_tokens(self, text: str) -> int:
        tokenizer = self._registry.embedder(self._config.retrieval.embedder).encoder.tokenizer
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    def _cut(self, text: str, max_tokens: int) -> str:
        tokenizer = self._registry.embedder(self._config.retrieval.embedder).encoder.tokenizer
        offsets = tokenizer.encode(text, add_special_tokens=False).offsets
        return text if len(offsets) <= max_tokens else text[: offsets[max_tokens - 1][1]]

    # -- declarations -----------------------------------------------------------------------------

    def _with_paths(self, reach: Reach, resolved_paths: dict[str, str]) -> Reach:
        """Applies per-call locations: only to FILE/DIRECTORY entries in reach, each inside the roots."""
        entries = dict(reach.entries)
        for name, path in resolved_paths.items():
            entry = entries.get(name)
            if entry is None:
                raise invalid([Violation(f'resolved_paths["{name}"]', f"{name!r} is not knowledge in reach")],
                              "UNKNOWN_KNOWLEDGE")
            if entry.type not in (SourceType.FILE, SourceType.DIRECTORY):
                raise invalid([Violation(f'resolved_paths["{name}"]', f"{name!r} is {entry.type.value if entry.type else 'untyped'} "
                                         f"knowledge; only FILE and DIRECTORY sources take a path")])
            self.catalog.resolve_path(path)
            entries[name] = entry.with_path(path)
        for entry in entries.values():
            if entry.path and entry.type in (SourceType.FILE, SourceType.DIRECTORY):
                self.catalog.resolve_path(entry.path)
        return Reach(entries)

    @staticmethod
    def _named(reach: Reach, names: Iterable[str], field_name: str) -> list[Entry]:
        entries, unknown = [], []
        for i, name in enumerate(names):
            entry = reach.get(name)
            if entry is None:
                unknown.append(Violation(f"{field_name}[{i}]", f"{name!r} is not knowledge in reach", "UNKNOWN_KNOWLEDGE"))
            else:
                entries.append(entry)
        if unknown:
            raise invalid(unknown, "UNKNOWN_KNOWLEDGE")
        return entries

    @staticmethod
    def _duplicate_names(own: tuple[Entry, ...], outer: tuple[Entry, ...]) -> list[Violation]:
        problems = []
        for group in (own, outer):
            seen: set[str] = set()
            for entry in group:
                if entry.name in seen:
                    problems.append(Violation(f"{entry.origin}.name", f"knowledge {entry.name!r} is declared twice"))
                seen.add(entry.name)
        return problems

    def _entry_problems(self, entry: Entry, paths_per_run: bool) -> list[Violation]:
        at = entry.origin
        problems = []

        def problem(name: str, why: str, reason: str = "INVALID_CONFIGURATION") -> None:
            problems.append(Violation(f"{at}.{name}", f"knowledge {entry.name!r}: {why}", reason))

        if not entry.name.strip():
            problem("name", "a name is required")
        if entry.type is None:
            problem("type", "a type (FILE, DIRECTORY, MEMORY, INLINE) is required")
        if entry.use is None:
            problem("use", "a use (DIRECT, SEARCH, SEQUENTIAL) is required")
        if entry.type in (SourceType.FILE, SourceType.DIRECTORY):
            if not entry.path and not (paths_per_run or entry.when_configured):
                problem("path", "a FILE or DIRECTORY source needs a path (or paths_per_run)")
            if entry.inline_text:
                problem("inline_text", "only INLINE sources carry inline_text")
            if entry.path:
                try:
                    self.catalog.resolve_path(entry.path)
                except SidecarError as err:
                    problem("path", str(err), "PATH_OUTSIDE_ROOTS")
        elif entry.type is not None:
            if entry.path:
                problem("path", f"{entry.type.value} sources take no path")
            if entry.type is SourceType.INLINE and not entry.inline_text.strip():
                problem("inline_text", "an INLINE source needs text")
            if entry.type is SourceType.MEMORY and entry.inline_text:
                problem("inline_text", "only INLINE sources carry inline_text")
        if entry.top_k is not None and entry.top_k < 1:
            problem("top_k", "must be at least 1 when set")
        if entry.max_tokens is not None and entry.max_tokens < 1:
            problem("max_tokens", "must be at least 1 when set")
        if entry.min_score is not None:
            low = 0.0 if entry.rerank else -1.0
            if not low <= entry.min_score <= 1.0:
                scale = "rerank relevance (0..1)" if entry.rerank else "cosine similarity (-1..1)"
                problem("min_score", f"{entry.min_score} can never be met by a {scale}: contradictory")
        if entry.rerank:
            if entry.candidates is not None and entry.candidates < entry.k:
                problem("search.candidates", f"{entry.candidates} candidates cannot yield top_k {entry.k}")
        return problems

    def _reranker_problems(self, entry: Entry) -> list[Violation]:
        """Validation names an unknown reranker among the violations; at use, it is NOT_FOUND from the registry."""
        if entry.rerank and entry.reranker_model and \
                entry.reranker_model not in {s.spec.id for s in self._registry.statuses()}:
            return [Violation(f"{entry.origin}.search.reranker_model",
                              f"knowledge {entry.name!r}: reranker model {entry.reranker_model!r} is not configured",
                              "UNKNOWN_MODEL")]
        return []


def _fuse_with_retrieval(hits: list[Hit], reranked: list[tuple[int, float]]) -> list[Hit]:
    """The reranker's order and the retrieval order, combined by reciprocal rank fusion.

    A cross-encoder trained on web questions (ms-marco) and the hybrid retrieval err differently; fusing
    their ranks beats either alone (SciFact nDCG@10: hybrid 0.697, rerank order 0.695, fused 0.718;
    bench/beir.py). The score is the fused one; the reranker's relevance stays in `rerank`."""
    fused = reciprocal_rank_fusion([[i for i, _ in reranked], list(range(len(hits)))])
    relevance = dict(reranked)
    order = sorted(relevance, key=lambda i: -fused[i])
    return [replace(hits[i], score=fused[i], rerank=relevance[i]) for i in order]


def _pick_query(action: Action, params: list[tuple[str, Any]]) -> str:
    """The declared query parameter's string value, else the first string parameter's; blank -> ""."""
    if action.query_parameter is not None:
        value = dict(params).get(action.query_parameter)
        return value.strip() if isinstance(value, str) else ""
    first = next((v for _, v in params if isinstance(v, str)), "")
    return first.strip()


def _provenance_dict(unit: Unit) -> dict[str, Any]:
    p = unit.provenance
    return {"file": p.file, "document_id": p.document_id, "line_start": p.line_start, "line_end": p.line_end,
            "page": p.page, "char_start": p.char_start, "char_end": p.char_end}


def _where(hit: Hit) -> str:
    p = hit.provenance
    place = p.get("file") or p.get("document_id") or hit.source
    if p.get("line_start"):
        place += f":{p['line_start']}-{p.get('line_end') or p['line_start']}"
    if p.get("page"):
        place += f" p.{p['page']}"
    return place


def render_block(block: Block) -> str:
    """One block of the action's context: a header naming the source and use, then its text."""
    header = f"### Knowledge: {block.source} ({block.use.value})"
    if block.use is not Use.SEARCH:
        return header + "\n" + "\n\n".join(h.text for h in block.hits)
    lines = [header]
    for rank, hit in enumerate(block.hits, 1):
        lines.append(f"[{rank}] {_where(hit)} (score {hit.score:.3f})\n{hit.text}")
    return "\n\n".join(lines)


def _budget_error(problems: list[Violation]) -> SidecarError:
    reason = "UNKNOWN_MODEL_WINDOW" if any(p.reason == "UNKNOWN_MODEL_WINDOW" for p in problems) else \
        next((p.reason for p in problems if p.reason != "INVALID_CONFIGURATION"), "INVALID_CONFIGURATION")
    kind = ErrorKind.INVALID_ARGUMENT if reason == "INVALID_CONFIGURATION" else ErrorKind.FAILED_PRECONDITION
    sources = sorted({p.description.split("'")[1] for p in problems if "'" in p.description})
    return SidecarError(kind, reason, "; ".join(p.description for p in problems), problems,
                        {"sources": ",".join(sources)})
