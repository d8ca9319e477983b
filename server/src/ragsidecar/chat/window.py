"""Fitting text into the model's input window: what is left of it as a grounded turn's pieces are taken."""

from __future__ import annotations

from collections.abc import Callable


class Room:
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
