"""DIRECT knowledge: every source rendered whole and held to its token budget.

An entry with max_tokens has its own budget; the ones without share a default budget, a fraction of
the model's input window. What validated fits at dispatch: both measure with the same tokenizer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ragsidecar.errors import ErrorKind, SidecarError, Violation
from ragsidecar.knowledge.budget import BudgetPolicy
from ragsidecar.knowledge.catalog import Catalog, source_error
from ragsidecar.knowledge.declarations import Entry, Llm, Scope, SourceType, Use
from ragsidecar.knowledge.results import Block, Hit
from ragsidecar.knowledge.sources.units import SourceError, Unit
from ragsidecar.knowledge.tokens import Measured, Tokens


@dataclass(frozen=True)
class DirectMeasure:
    entry: Entry
    position: int
    body: Measured
    budget: int
    shared: bool
    documents: int

    @property
    def text(self) -> str:
        return self.body.text

    @property
    def tokens(self) -> int:
        return self.body.tokens


@dataclass
class DirectPlan:
    blocks: list[DirectMeasure]
    window: int | None
    default_budget: int
    default_used: int


@dataclass
class DirectCheck:
    """What measuring found: the plan, the problems, and the names of the entries they concern."""

    plan: DirectPlan
    problems: list[Violation] = field(default_factory=list)
    sources: set[str] = field(default_factory=set)

    def add(self, problem: Violation, *names: str) -> None:
        self.problems.append(problem)
        self.sources.update(names)

    def error(self) -> SidecarError:
        """The problems as the one error a dispatch or PrepareChatKnowledge reports; metadata["sources"] names
        the entries concerned (never a model)."""
        reasons = [p.reason for p in self.problems]
        reason = (
            "UNKNOWN_MODEL_WINDOW"
            if "UNKNOWN_MODEL_WINDOW" in reasons
            else next((r for r in reasons if r != "INVALID_CONFIGURATION"), "INVALID_CONFIGURATION")
        )
        kind = {
            "INVALID_CONFIGURATION": ErrorKind.INVALID_ARGUMENT,
            "PATH_OUTSIDE_ROOTS": ErrorKind.PERMISSION_DENIED,
        }.get(reason, ErrorKind.FAILED_PRECONDITION)
        return SidecarError(
            kind,
            reason,
            "; ".join(p.description for p in self.problems),
            self.problems,
            {"sources": ",".join(sorted(self.sources))},
        )


class DirectBudgets:
    def __init__(self, catalog: Catalog, budgets: BudgetPolicy, tokens: Tokens) -> None:
        self._catalog = catalog
        self._budgets = budgets
        self._tokens = tokens

    async def measure(
        self, entries: list[Entry], llm: Llm | None, scope: Scope, at_dispatch: bool = False
    ) -> DirectCheck:
        """Reads and measures every DIRECT entry (tokenized once, off the event loop) against its budget.

        At dispatch a source that fails to load, or has no location, follows its readiness and on_failure;
        when validating, an unlocated entry waits for its per-run path and a read failure is one more problem
        (a missing WHEN_CONFIGURED file is skipped either way)."""
        window = self._budgets.window(llm)
        default_budget = self._budgets.default_budget(window) if window else 0
        check = DirectCheck(DirectPlan([], window, 0, 0))
        for position, entry in enumerate(entries):
            try:
                if at_dispatch:
                    entry.require_location()
                elif not entry.located:
                    continue
                units = await self._catalog.units(entry, scope)
            except (SourceError, OSError) as err:
                if at_dispatch:
                    if entry.skips(err):
                        continue
                    raise source_error(entry.name, err) from None
                if not (entry.when_configured and isinstance(err, FileNotFoundError)):
                    reason = "INVALID_CONFIGURATION" if isinstance(err, FileNotFoundError) else "SOURCE_UNREADABLE"
                    check.add(
                        Violation(f"{entry.origin}.path", f"{entry.name!r} cannot be read: {err}", reason), entry.name
                    )
                continue
            except SidecarError as err:
                if at_dispatch or err.reason != "PATH_OUTSIDE_ROOTS":
                    raise
                check.add(Violation(f"{entry.origin}.path", f"knowledge {entry.name!r}: {err}", err.reason), entry.name)
                continue
            budget = entry.max_tokens or default_budget
            body = await asyncio.to_thread(self._measure_units, units, budget)
            check.plan.blocks.append(DirectMeasure(entry, position, body, budget, entry.max_tokens is None, len(units)))
            if entry.max_tokens is not None and body.tokens > entry.max_tokens:
                check.add(
                    Violation(
                        f"{entry.origin}.max_tokens",
                        f"DIRECT source {entry.name!r} takes "
                        f"{body.counted()} tokens, over its max_tokens of {entry.max_tokens}",
                        "DIRECT_BUDGET_EXCEEDED",
                    ),
                    entry.name,
                )
        self._check_shared(check, llm, default_budget)
        return check

    def _measure_units(self, units: list[Unit], budget: int) -> Measured:
        """The units' text measured as far as the budget needs: past it, only that it is over counts."""
        return self._tokens.measure("\n\n".join(u.text for u in units), budget)

    @staticmethod
    def _check_shared(check: DirectCheck, llm: Llm | None, default_budget: int) -> None:
        """The entries without max_tokens share the default budget, which needs a known window."""
        shared = [m for m in check.plan.blocks if m.shared]
        used = sum(m.tokens for m in shared)
        # A share measured only in part is over the budget on its own: the sum is then a lower bound too.
        together = str(used) if all(m.body.whole for m in shared) else f"at least {used}"
        names = [m.entry.name for m in shared]
        if shared and check.plan.window is None:
            model = llm.model if llm else ""
            check.add(
                Violation(
                    "llm.input_window_tokens",
                    f"the input window of model {model!r} is unknown and "
                    f"none was given; DIRECT entries without max_tokens cannot be sized",
                    "UNKNOWN_MODEL_WINDOW",
                ),
                *names,
            )
        elif used > default_budget:
            for m in shared:
                check.add(
                    Violation(
                        f"{m.entry.origin}.max_tokens",
                        f"DIRECT sources without max_tokens take "
                        f"{together} tokens together ({m.entry.name!r}: {m.body.counted()}), over the "
                        f"shared default budget of {default_budget}",
                        "DIRECT_BUDGET_EXCEEDED",
                    ),
                    *names,
                )
        check.plan.default_budget = default_budget if shared else 0
        check.plan.default_used = used


def direct_block(measure: DirectMeasure | None) -> Block | None:
    if measure is None or not measure.text.strip():
        return None
    entry = measure.entry
    file = entry.path if entry.type in (SourceType.FILE, SourceType.DIRECTORY) else ""
    hit = Hit(
        f"{entry.name}:direct",
        entry.name,
        measure.text,
        {"position": 0, "file": file, "char_start": 0, "char_end": len(measure.text)},
    )
    return Block(measure.entry.name, Use.DIRECT, [hit], body=measure.body)
