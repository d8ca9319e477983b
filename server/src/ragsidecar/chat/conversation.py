"""The outbound conversation of a GroundTurn: the caller's copied without the sidecar's earlier regions, the
host regions (request section, activity, owners' states) rendered, and the regions appended to the last system
message. The caller's conversation is never changed."""

from __future__ import annotations

import copy
from dataclasses import replace

from ragsidecar.chat.markup import REQUEST, STATE, neutralise_host_text, region, strip_regions
from ragsidecar.chat.turn_rules import marker_problems
from ragsidecar.chat.turns import Message, Turn
from ragsidecar.errors import invalid


def prepared(turn: Turn) -> tuple[list[Message], list[str]]:
    """The stripped copy and the host regions (worker thread: linear in the turn's size). System messages
    over the marker cap are refused first, before any is stripped."""
    problems = marker_problems(turn.conversation)
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


def appended(conversation: list[Message], regions: list[str]) -> list[Message]:
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


def latest_user_text(conversation: list[Message]) -> str:
    latest = next((m for m in reversed(conversation) if m.role == "user"), None)
    return (latest.content or "").strip() if latest else ""
