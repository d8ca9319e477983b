"""Reading a JSON request body's fields strictly: each missing or mistyped field becomes a violation, all of them
reported at once; fields an API defines but the sidecar does not use are ignored, as are unknown ones."""

from __future__ import annotations

import json
import re
from typing import Any

from ragsidecar import errors
from ragsidecar.errors import ErrorKind, SidecarError, Violation

# A JSON string may escape a lone UTF-16 surrogate ("\ud800"); no tokenizer takes one, so it is refused as
# undecodable bytes are over gRPC.
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_object(body: bytes | bytearray) -> dict[str, Any]:
    """The request body as a JSON object, or INVALID_REQUEST naming why it is not one."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as err:  # bad syntax or encoding; nesting deeper than the decoder takes
        raise SidecarError(
            ErrorKind.INVALID_ARGUMENT,
            "INVALID_REQUEST",
            f"the request body is not valid JSON: {type(err).__name__}: {err}",
        ) from None
    if not isinstance(value, dict):
        raise SidecarError(
            ErrorKind.INVALID_ARGUMENT, "INVALID_REQUEST", f"the request body must be a JSON object, not {_kind(value)}"
        )
    return value


class Fields:
    """One JSON object's fields; `done()` raises every violation found while reading them."""

    def __init__(self, value: dict[str, Any]) -> None:
        self._object = value
        self.problems: list[Violation] = []

    def text(self, name: str, required: bool = False) -> str | None:
        value = self._present(name, required)
        return value if value is None or self.is_text(name, value) else None

    def integer(self, name: str) -> int | None:
        value = self._present(name, False)
        if value is None or isinstance(value, int) and not isinstance(value, bool):
            return value
        self.wrong(name, "an integer", value)
        return None

    def flag(self, name: str, default: bool) -> bool:
        value = self._present(name, False)
        if value is None or isinstance(value, bool):
            return default if value is None else value
        self.wrong(name, "true or false", value)
        return default

    def array(self, name: str) -> list[Any]:
        value = self._present(name, True)
        if value is None or isinstance(value, list):
            return value or []
        self.wrong(name, "an array", value)
        return []

    def raw(self, name: str) -> Any:
        """The field's value as sent (None when absent or null), for fields of several shapes."""
        return self._object.get(name)

    def is_text(self, where: str, value: Any) -> bool:
        if not isinstance(value, str):
            self.wrong(where, "a string", value)
            return False
        if _SURROGATE.search(value):
            self.problems.append(Violation(where, "is not valid Unicode (it holds a lone UTF-16 surrogate)"))
            return False
        return True

    def wrong(self, where: str, expected: str, value: Any) -> None:
        self.problems.append(Violation(where, f"must be {expected}, not {_kind(value)}"))

    def done(self) -> None:
        if self.problems:
            raise errors.invalid(self.problems)

    def _present(self, name: str, required: bool) -> Any:
        value = self._object.get(name)
        if value is None and required:
            self.problems.append(Violation(name, "required"))
        return value


def _kind(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }
    return names[type(value)]
