"""Fitting text into the model's input window: chat/window.py's room accounting and knowledge/budget.py's
windows and DIRECT budgets. Pure; tokens are counted by a word counter here."""

from __future__ import annotations

from ragsidecar.chat.window import Room
from ragsidecar.knowledge.budget import KNOWN_WINDOWS, BudgetPolicy
from ragsidecar.knowledge.declarations import Llm


class WordCounter:
    """One token per word; remembers what it counted, to show which texts were counted at all."""

    def __init__(self) -> None:
        self.counted: list[str] = []

    def __call__(self, text: str) -> int:
        self.counted.append(text)
        return len(text.split())


def test_texts_that_fit_by_their_bytes_are_never_counted() -> None:
    counter = WordCounter()
    room = Room(100, counter)
    room.take(["a short system prompt"])
    assert room.fits(["some evidence", "more evidence"])
    assert counter.counted == []  # 48 bytes: at most 48 tokens, under 100


def test_texts_are_counted_only_when_their_bytes_might_not_fit_and_then_once() -> None:
    counter = WordCounter()
    room = Room(10, counter)
    room.take(["one two three four"])  # 4 tokens, 18 bytes
    assert room.fits(["five six seven eight nine ten"])  # 29 bytes > 10: counted, 6 tokens: fits exactly
    assert not room.fits(["five six seven eight nine ten eleven"])
    assert counter.counted.count("one two three four") == 1
    room.take(["five six"])
    assert room.left() == 4


def test_without_a_window_everything_fits_and_nothing_is_counted() -> None:
    counter = WordCounter()
    room = Room(None, counter)
    assert room.fits(["word " * 100_000])
    assert room.left() == 0 and counter.counted == []


def test_a_window_comes_from_the_request_then_the_tables_by_id_then_by_base_name() -> None:
    policy = BudgetPolicy(fraction=0.25, extra_windows={"acme/llm": 4096, "gpt-4o": 1000})
    assert policy.window(None) is None
    assert policy.window(Llm(model="gpt-4o", input_window_tokens=5000)) == 5000
    assert policy.window(Llm(model="gpt-4o")) == 1000  # the operator's table wins over the built-in one
    assert policy.window(Llm(model="acme/llm")) == 4096
    assert policy.window(Llm(model="ollama/llama3.1:8b")) == KNOWN_WINDOWS["llama3.1"]  # longest base name first
    assert policy.window(Llm(model="unknown-model")) is None


def test_the_direct_budget_is_a_share_of_the_window_and_at_least_one_token() -> None:
    policy = BudgetPolicy(fraction=0.25, extra_windows={})
    assert policy.default_budget(8192) == 2048
    assert policy.default_budget(2) == 1
