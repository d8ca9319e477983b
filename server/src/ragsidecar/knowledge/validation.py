"""Checks of declared knowledge: each entry on its own, names in reach, and per-call locations."""

from __future__ import annotations

from collections.abc import Iterable

from ragsidecar.errors import SidecarError, Violation, invalid
from ragsidecar.identifiers import id_problems
from ragsidecar.inference.registry import ModelRegistry
from ragsidecar.knowledge.catalog import Catalog
from ragsidecar.knowledge.declarations import Entry, Reach, RerankOrder, SourceType, Target


class EntryChecks:
    def __init__(self, catalog: Catalog, registry: ModelRegistry) -> None:
        self._catalog = catalog
        self._registry = registry

    def with_paths(self, reach: Reach, resolved_paths: dict[str, str]) -> Reach:
        """Applies per-call locations: only to FILE/DIRECTORY entries in reach, each inside the roots."""
        entries = dict(reach.entries)
        for name, path in resolved_paths.items():
            entry = entries.get(name)
            if entry is None:
                raise invalid(
                    [Violation(f'resolved_paths["{name}"]', f"{name!r} is not knowledge in reach")], "UNKNOWN_KNOWLEDGE"
                )
            if entry.type not in (SourceType.FILE, SourceType.DIRECTORY):
                raise invalid(
                    [
                        Violation(
                            f'resolved_paths["{name}"]',
                            f"{name!r} is {entry.type.value if entry.type else 'untyped'} "
                            f"knowledge; only FILE and DIRECTORY sources take a path",
                        )
                    ]
                )
            self._catalog.roots.resolve_path(path)
            entries[name] = entry.with_path(path)
        self.require_inside_roots(entries.values())
        return Reach(entries)

    def require_inside_roots(self, entries: Iterable[Entry]) -> None:
        """PERMISSION_DENIED (PATH_OUTSIDE_ROOTS) for the first FILE or DIRECTORY path outside the roots."""
        for entry in entries:
            if entry.path and entry.type in (SourceType.FILE, SourceType.DIRECTORY):
                self._catalog.roots.resolve_path(entry.path)

    def entry_problems(self, entry: Entry, paths_per_run: bool) -> list[Violation]:
        at = entry.origin
        problems = []

        def problem(name: str, why: str, reason: str = "INVALID_CONFIGURATION") -> None:
            problems.append(Violation(f"{at}.{name}", f"knowledge {entry.name!r}: {why}", reason))

        problems += name_problems(entry.name, f"{at}.name", "knowledge name")
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
                    self._catalog.roots.resolve_path(entry.path)
                except SidecarError as err:  # outside the roots, a NUL, a symlink loop: each its own reason
                    problem("path", str(err), err.reason)
        elif entry.type is not None:
            if entry.path:
                problem("path", f"{entry.type.value} sources take no path")
            if entry.type is SourceType.INLINE and (not entry.inline_text or entry.inline_text.isspace()):
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
            depth = entry.rerank_depth
            if depth is not None and entry.candidates is not None:
                problem("search.rerank_depth", "set rerank_depth or candidates, not both (rerank_depth supersedes)")
            if depth is not None and depth < 1:
                problem("search.rerank_depth", "must be at least 1 when set")
            if depth is not None and depth < entry.k and entry.rerank_order is not RerankOrder.FUSED:
                problem(
                    "search.rerank_depth",
                    f"a depth of {depth} below top_k {entry.k} needs the FUSED rerank "
                    "order: hits past the depth have no relevance to be ranked by",
                )
        return problems

    def reranker_problems(self, entry: Entry) -> list[Violation]:
        """Validation names an unknown reranker among the violations; at use, it is NOT_FOUND from the registry."""
        if (
            entry.rerank
            and entry.reranker_model
            and entry.reranker_model not in {s.spec.id for s in self._registry.statuses()}
        ):
            return [
                Violation(
                    f"{entry.origin}.search.reranker_model",
                    f"knowledge {entry.name!r}: reranker model {entry.reranker_model!r} is not configured",
                    "UNKNOWN_MODEL",
                )
            ]
        return []


def named(reach: Reach, names: Iterable[str], field_name: str) -> list[Entry]:
    """The entries the names pick, in the names' order; any name not in reach is UNKNOWN_KNOWLEDGE.

    A name listed again picks nothing more: repeats must not multiply the work (a request naming one
    source 5,000 times would search it 5,000 times)."""
    entries, unknown, picked = [], [], set()
    for i, name in enumerate(names):
        entry = reach.get(name)
        if entry is None:
            unknown.append(Violation(f"{field_name}[{i}]", f"{name!r} is not knowledge in reach", "UNKNOWN_KNOWLEDGE"))
        elif name not in picked:
            picked.add(name)
            entries.append(entry)
    if unknown:
        raise invalid(unknown, "UNKNOWN_KNOWLEDGE")
    return entries


def name_problems(name: str, field: str, what: str) -> list[Violation]:
    """A declared knowledge or action name, checked as a caller id (identifiers.id_problems: required, at
    most MAX_ID_CHARS, no control characters): names key caches, cursors and index files."""
    return [Violation(v.field, f"{what}: {v.description}", "INVALID_CONFIGURATION") for v in id_problems(name, field)]


def require_declared_names(entries: Iterable[Entry], target: Target | None = None) -> None:
    """INVALID_ARGUMENT for any bad knowledge name (or the target's action names), before anything is read."""
    problems = [p for e in entries for p in name_problems(e.name, f"{e.origin}.name", "knowledge name")]
    problems += action_problems(target) if target is not None else []
    if problems:
        raise invalid(problems, "INVALID_CONFIGURATION")


def unique_name_problems(names: Iterable[tuple[str, str]], what: str) -> list[Violation]:
    """(name, field) pairs: each name a valid id (name_problems) and declared once."""
    problems, seen = [], set()
    for name, field in names:
        if found := name_problems(name, field, f"{what} name"):
            problems += found
        elif name in seen:
            problems.append(Violation(field, f"{what} {name!r} is declared twice"))
        seen.add(name)
    return problems


def action_problems(target: Target) -> list[Violation]:
    """Action names are valid ids and unique within the target (they key action_knowledge and Enforce)."""
    return unique_name_problems(((a.name, f"target.actions[{i}].name") for i, a in enumerate(target.actions)), "action")


def duplicate_names(own: tuple[Entry, ...], outer: tuple[Entry, ...]) -> list[Violation]:
    problems = []
    for group in (own, outer):
        seen: set[str] = set()
        for entry in group:
            if entry.name in seen:
                problems.append(Violation(f"{entry.origin}.name", f"knowledge {entry.name!r} is declared twice"))
            seen.add(entry.name)
    return problems
