"""The rules of a GroundTurn, each written once, here: the caps on the sizes that drive a turn's work, the
shape of its owners, bindings and scopes, the marker cap of a system message, and the declaration rules
checked once its bindings are looked up. Each function returns every problem it finds; none raises."""

from __future__ import annotations

from ragsidecar.chat.markup import marker_count
from ragsidecar.chat.turns import Message, Owner, Turn
from ragsidecar.errors import Violation
from ragsidecar.identifiers import id_problems
from ragsidecar.knowledge.declarations import Scope, Use
from ragsidecar.knowledge.storage import Binding
from ragsidecar.knowledge.validation import unique_name_problems

# Caps on the sizes that drive a turn's work, refused (INVALID_ARGUMENT) before any of it; in the proto comments.
MAX_MESSAGES, MAX_OWNERS, MAX_BINDINGS = 2000, 64, 256
# Knowledge entries one owner lists (every kind: they are all walked to find its chat knowledge).
MAX_OWNER_KNOWLEDGE = 256
# Characters of one message's content, one owner's state_text, or the request section.
MAX_TEXT_CHARS = 1_000_000
# Sidecar markers ("<!-- ragsidecar:" / "<!-- /ragsidecar:") in one system message. Stripping is linear, so
# this only refuses what no real conversation holds (a turn adds a handful) well before the character cap.
MAX_MARKERS = 20_000


def message_count_problems(count: int) -> list[Violation]:
    """The conversation's length: checked first, before its messages are even converted."""
    return [Violation("conversation", f"{count} items; at most {MAX_MESSAGES}")] if count > MAX_MESSAGES else []


def marker_problems(conversation: tuple[Message, ...]) -> list[Violation]:
    """System messages over the marker cap (counting is linear in the turn's size: a worker thread's job)."""
    return [
        Violation(f"conversation[{i}].content", f"{count} sidecar markers; at most {MAX_MARKERS}")
        for i, m in enumerate(conversation)
        if m.role == "system" and m.content and (count := marker_count(m.content)) > MAX_MARKERS
    ]


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
        problems += scope_problems(turn.context.scope, "context.scope")
        if turn.scope is not None and turn.scope != turn.context.scope:
            problems.append(Violation("scope", "differs from context.scope"))
    elif turn.scope is not None:
        problems += scope_problems(turn.scope, "scope")
    elif turn.bindings:
        problems.append(Violation("scope", "a turn that lists bindings needs a scope (its own or its context's)"))
    if turn.activity is not None:
        problems += turn.activity.problems("activity")
    return problems


def _size_problems(turn: Turn) -> list[Violation]:
    counts = (("owners", len(turn.owners), MAX_OWNERS), ("bindings", len(turn.bindings), MAX_BINDINGS))
    problems = message_count_problems(len(turn.conversation))
    problems += [Violation(name, f"{count} items; at most {cap}") for name, count, cap in counts if count > cap]
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


def scope_problems(scope: Scope, at: str) -> list[Violation]:
    return id_problems(scope.tenant, f"{at}.tenant") + id_problems(scope.session, f"{at}.session", required=False)


def _knowledge_name_problems(owner: Owner, at: str) -> list[Violation]:
    """The owner's knowledge names: valid ids, each declared once."""
    return unique_name_problems(
        ((e.name, f"{at}.knowledge[{k}].name") for k, e in enumerate(owner.knowledge)), "knowledge"
    )


def declaration_problems(owners: tuple[Owner, ...], bindings: list[Binding]) -> list[Violation]:
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
