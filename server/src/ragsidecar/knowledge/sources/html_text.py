"""HTML (.html, .htm): the text a browser would show, one block element per line, as one unit."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from ragsidecar.knowledge.sources.units import Provenance, Unit

# Elements whose content is never shown to a reader.
_HIDDEN_TAGS = frozenset({"script", "style", "template", "noscript"})
# Elements that start a new line when rendered; everything else flows inline.
_BLOCK_TAGS = frozenset(
    """address article aside blockquote br caption dd details dialog div dl dt fieldset figcaption
    figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr li main nav ol p pre section summary
    table tbody thead tfoot tr ul""".split()
)
_CELL_TAGS = frozenset({"td", "th"})
_SPACES = re.compile(r"[ \t\f\v\u00a0\u2000-\u200a\u202f\u205f\u3000]+")


def html_units(text: str, rel: str) -> list[Unit]:
    """A page's visible text as one unit; none when nothing is visible."""
    parser = _VisibleText()
    parser.feed(text)
    parser.close()
    visible = parser.text()
    if not visible:
        return []
    return [Unit(visible, Provenance(file=rel, char_end=len(visible)))]


class _VisibleText(HTMLParser):
    """Collects the text a browser would show, one block element per line."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0
        self._in_head = False
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "head":
            self._in_head = True
        elif tag == "body":
            # A missing </head> must not hide the whole page.
            self._in_head = False
        elif tag in _HIDDEN_TAGS:
            self._hidden += 1
        elif tag == "pre":
            self._pre += 1
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")
        elif tag in _CELL_TAGS:
            self.parts.append(" ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # <br/>, <hr/>: a line break, and no nesting to track (a self-closed <script/> hides nothing).
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "head":
            self._in_head = False
        elif tag in _HIDDEN_TAGS:
            self._hidden = max(0, self._hidden - 1)
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._hidden or self._in_head:
            return
        # Outside <pre>, source newlines are just whitespace to a browser.
        self.parts.append(data if self._pre else re.sub(r"\s+", " ", data))

    def text(self) -> str:
        lines = (_SPACES.sub(" ", line).strip() for line in "".join(self.parts).split("\n"))
        return "\n".join(line for line in lines if line)
