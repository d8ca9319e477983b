"""Reading a request body under the API's caps while it arrives: its size, and every array, object and string in
its JSON, counted by a scan that builds nothing, so a body over a cap is refused after the bytes that pass it.

The JSON is decoded (json.loads) only once the whole body passed the scan, so decoding costs what the caps allow:
without the scan, 64 MiB of `[1,1,1,…]` became 33 million Python objects before the first item was checked. The
scan bounds costs, it does not validate: a body that is not JSON passes it as far as it goes and is refused by
the decoder.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ragsidecar.errors import ErrorKind, SidecarError, Violation
from ragsidecar.reranking import LIMIT_EXCEEDED, MAX_DOCUMENT_CHARS

# Bytes outside strings that change the scan's state; everything else (numbers, literals, spaces) is skipped.
_STRUCTURE = re.compile(rb'["\[\]{},:]')
# A string's content up to its closing quote, or to the end of the chunk (a backslash there escapes the next
# chunk's first byte); written unrolled so that the runs between escapes are matched in one C loop.
_STRING_RUN = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
# The most bytes a key is kept for naming a field in a refusal.
_KEY_BYTES = 64


@dataclass(frozen=True)
class JsonCaps:
    """What one request body may hold."""

    # Bytes of the whole body (server.max_message_bytes).
    max_bytes: int
    # Items of any one array, members of any one object (inference.max_documents_per_request).
    max_items: int
    # Bytes of any one string as sent: a string of MAX_DOCUMENT_CHARS characters, each escaped as \\uXXXX.
    max_string_bytes: int = 6 * MAX_DOCUMENT_CHARS
    # Nesting of arrays and objects.
    max_depth: int = 32

    @property
    def max_values(self) -> int:
        """Arrays, objects and separators in the whole body: room for max_items documents of a few fields each."""
        return 16 * self.max_items + 256


class _Frame:
    """An array or object the scan is inside: its items so far and (objects) the key being read."""

    __slots__ = ("is_object", "commas", "expects_key", "key")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.commas = 0
        self.expects_key = is_object
        self.key = b""


class JsonScan:
    """Feeds on a body's chunks in order; raises LIMIT_EXCEEDED (413) at the first byte past a cap."""

    def __init__(self, caps: JsonCaps) -> None:
        self._caps = caps
        self._stack: list[_Frame] = []
        self._values = 0
        self._in_string = False
        self._escaped = False  # the previous chunk ended inside a string on a backslash
        self._string_bytes = 0
        self._key: bytearray | None = None  # the key being read, when the string is one

    def feed(self, chunk: bytes) -> None:
        position = 0
        while position < len(chunk):
            position = self._string(chunk, position) if self._in_string else self._structure(chunk, position)

    def _structure(self, chunk: bytes, position: int) -> int:
        found = _STRUCTURE.search(chunk, position)
        if found is None:
            return len(chunk)
        byte = chunk[found.start()]
        top = self._stack[-1] if self._stack else None
        if byte == 0x22:  # "
            self._in_string, self._string_bytes = True, 0
            self._key = bytearray() if top is not None and top.expects_key else None
        elif byte in b"[{":
            self._count_value()
            if len(self._stack) >= self._caps.max_depth:  # as the decoder's own recursion limit is refused
                what = f"arrays and objects nested more than {self._caps.max_depth} deep"
                self._refuse(what, inside=True, reason="INVALID_REQUEST", summary=f"not valid JSON here: {what}")
            self._stack.append(_Frame(byte == 0x7B))
        elif byte in b"]}":
            if top is not None:
                self._stack.pop()
        elif byte == 0x2C and top is not None:  # ,
            self._count_value()
            top.commas += 1
            top.expects_key = top.is_object
            if top.commas >= self._caps.max_items:
                kind = "members" if top.is_object else "items"
                self._refuse(f"more than {self._caps.max_items} {kind} (inference.max_documents_per_request)")
        elif byte == 0x3A and top is not None:  # :
            top.expects_key = False
        return found.end()

    def _string(self, chunk: bytes, position: int) -> int:
        start = position + 1 if self._escaped else position
        self._escaped = False
        end = _STRING_RUN.match(chunk, start).end()  # type: ignore[union-attr]  # the pattern matches ""
        # A backslash ending the chunk escapes the next chunk's first byte.
        self._escaped = end < len(chunk) and chunk[end] == 0x5C
        self._string_bytes += end + self._escaped - position
        if self._key is not None and len(self._key) < _KEY_BYTES:
            self._key += chunk[start:end][: _KEY_BYTES - len(self._key)]
        if self._string_bytes > self._caps.max_string_bytes:
            self._refuse(f"a string of more than {self._caps.max_string_bytes} bytes", inside=True)
        if end == len(chunk) or self._escaped:
            return end + self._escaped
        self._in_string = False
        if self._key is not None:
            self._stack[-1].key = bytes(self._key)
        return end + 1

    def _count_value(self) -> None:
        self._values += 1
        if self._values > self._caps.max_values:
            self._refuse(f"more than {self._caps.max_values} arrays, objects and items in the body")

    def _path(self, inside: bool) -> str:
        """Where the scan is, as the caller wrote it (`documents`, `input[3]`): the innermost array or object, or
        (`inside`) what it holds."""
        path = ""
        for frame in self._stack if inside else self._stack[:-1]:
            if frame.is_object:
                key = frame.key.decode("utf-8", "replace")
                path += f".{key}" if path else key
            else:
                path += f"[{frame.commas}]"
        return path or "(body)"

    def _refuse(self, what: str, inside: bool = False, reason: str = LIMIT_EXCEEDED, summary: str = "") -> None:
        """Raises the refusal, `what` named at the field the scan is in (`summary` replacing it in the message)."""
        where = self._path(inside)
        message = f"{where}: {summary or what}"
        raise SidecarError(ErrorKind.INVALID_ARGUMENT, reason, message, [Violation(where, what, reason)])


async def read_json_body(chunks: AsyncIterator[bytes], declared: str, caps: JsonCaps) -> bytearray:
    """The whole body (not copied again: the decoder takes a bytearray), refused as soon as it is known to pass a
    cap: its declared length, its size as it arrives, or what the scan counts."""
    if declared.isdigit() and int(declared) > caps.max_bytes:
        raise _too_large(int(declared), caps.max_bytes)
    scan = JsonScan(caps)
    body = bytearray()
    async for chunk in chunks:
        if len(body) + len(chunk) > caps.max_bytes:
            raise _too_large(len(body) + len(chunk), caps.max_bytes)
        scan.feed(chunk)
        body += chunk
    return body


def _too_large(size: int, limit: int) -> SidecarError:
    return SidecarError(
        ErrorKind.INVALID_ARGUMENT,
        LIMIT_EXCEEDED,
        f"the request body ({size} bytes or more) exceeds the limit of {limit} bytes (server.max_message_bytes)",
        metadata={"max_body_bytes": str(limit)},
    )
