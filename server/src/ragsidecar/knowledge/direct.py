"""DIRECT knowledge: every source rendered whole and held to its token budget.

An entry with max_tokens has its own budget; the ones without share a default budget, a fraction of
the model's input window. What validated fits at dispatch: both measure with the same tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragsidecar.errors import ErrorKind, SidecarError, Violation
from ragsidecar.knowledge.budget import BudgetPolicy
from ragsidecar.knowledge.catalog import Catalog, source_error
from ragsidecar.knowledge.declarations import Entry, Llm, Scope, SourceType, Use
from ragsidecar.knowledge.results import Block, Hit
from ragsidecar.knowledge.sources import SourceError
from ragsidecar.knowledge.tokens import Tokens


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


class DirectBudgets:
    def __init__(self, catalog: Catalog, budgets: BudgetPolicy, tokens: Tokens) -> None:
        self._catalog = catalog
        self._budgets = budgets
        self._tokens = tokens

    async def measure(self, entries: list[Entry], llm: Llm | None, scope: Scope,
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
                units = await self._catalog.units(entry, scope)
            except (SourceError, OSError) as err:
                if at_dispatch:
                    if entry.skips(err):
                        continue
                    raise source_error(entry.name, err) from None
                if not (entry.when_configured and isinstance(err, FileNotFoundError)):
                    reason = "INVALID_CONFIGURATION" if isinstance(err, FileNotFoundError) else "SOURCE_UNREADABLE"
                    problems.append(Violation(f"{entry.origin}.path", f"{entry.name!r} cannot be read: {err}", reason))
                continue
            text = "\n\n".join(u.text for u in units)
            tokens = self._tokens.count(text)
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


def direct_block(measure: DirectMeasure | None) -> Block | None:
    if measure is None or not measure.text.strip():
        return None
    entry = measure.entry
    file = entry.path if entry.type in (SourceType.FILE, SourceType.DIRECTORY) else ""
    hit = Hit(f"{entry.name}:direct", entry.name, measure.text,
              {"position": 0, "file": file, "char_start": 0, "char_end": len(measure.text)})
    return Block(measure.entry.name, Use.DIRECT, [hit])


def budget_error(problems: list[Violation]) -> SidecarError:
    reason = "UNKNOWN_MODEL_WINDOW" if any(p.reason == "UNKNOWN_MODEL_WINDOW" for p in problems) else \
        next((p.reason for p in problems if p.reason != "INVALID_CONFIGURATION"), "INVALID_CONFIGURATION")
    kind = ErrorKind.INVALID_ARGUMENT if reason == "INVALID_CONFIGURATION" else ErrorKind.FAILED_PRECONDITION
    sources = sorted({p.description.split("'")[1] for p in problems if "'" in p.description})
    return SidecarError(kind, reason, "; ".join(p.description for p in problems), problems,
                        {"sources": ",".join(sources)})
