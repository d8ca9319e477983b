"""The HTTP body scan (http/body.py): what it counts, where it refuses, and that chunk boundaries change nothing."""

from __future__ import annotations

import asyncio
import json

import pytest

from ragsidecar.errors import SidecarError
from ragsidecar.http.body import JsonCaps, JsonScan, read_json_body

CAPS = JsonCaps(max_bytes=1 << 20, max_items=10, max_string_bytes=100, max_depth=4)


def scanned(body: bytes, caps: JsonCaps = CAPS, chunk: int = 0) -> SidecarError | None:
    """The refusal the scan raises, feeding the body whole or `chunk` bytes at a time."""
    scan = JsonScan(caps)
    size = chunk or len(body) or 1
    try:
        for start in range(0, len(body), size):
            scan.feed(body[start : start + size])
    except SidecarError as err:
        return err
    return None


ACCEPTED = [
    {"query": "q", "documents": ["a"] * 10},
    {"documents": [{"text": "x" * 100, "id": 1}] * 10, "top_n": 3},
    {"input": ['say "hi" \\ there', "\u00e9\U0001f600"], "nested": [[1, {"k": 2}]]},
    {"query": ",,,,,,,,,,,,[[[[[[{{{{{", "documents": ["]]]]]]]}}}}}}", '\\\\\\"' * 10]},
]


@pytest.mark.parametrize("value", ACCEPTED)
@pytest.mark.parametrize("chunk", [0, 1, 2, 3, 7])
def test_bodies_within_the_caps_pass_whatever_the_chunking(value: object, chunk: int) -> None:
    for body in (json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode()):
        assert scanned(body, chunk=chunk) is None


@pytest.mark.parametrize(
    ("body", "field", "what"),
    [
        (b'{"documents": [' + b"1," * 10 + b"1]}", "documents", "more than 10 items"),
        (b'{"input": ["a", [' + b"null," * 10 + b"0]]}", "input[1]", "more than 10 items"),
        (b'{"a": {' + b'"k": 1,' * 10 + b'"z": 0}}', "a", "more than 10 members"),
        (b'{"query": "' + b"x" * 101 + b'"}', "query", "more than 100 bytes"),
        (b'{"query": "' + b"\\n" * 51 + b'"}', "query", "more than 100 bytes"),
    ],
)
@pytest.mark.parametrize("chunk", [0, 1, 5])
def test_the_first_cap_passed_is_refused_naming_the_field(body: bytes, field: str, what: str, chunk: int) -> None:
    err = scanned(body, chunk=chunk)
    assert err is not None and err.reason == "LIMIT_EXCEEDED", err
    assert err.violations[0].field == field and what in err.violations[0].description


def test_nesting_deeper_than_the_cap_is_not_json_the_api_takes() -> None:
    """As the decoder's recursion limit was: INVALID_REQUEST (400), not a size limit."""
    err = scanned(b"[[[[[[]]]]]]")
    assert err is not None and err.reason == "INVALID_REQUEST" and "not valid JSON" in err.message, err
    assert err.violations[0].field == "[0][0][0][0]" and "nested more than 4 deep" in err.violations[0].description


def test_values_are_bounded_in_all_not_only_per_array() -> None:
    caps = JsonCaps(max_bytes=1 << 20, max_items=10)
    many_small = b'{"x": [' + b",".join([b"[1,2,3]"] * (caps.max_values // 3)) + b"]}"
    assert scanned(many_small, caps) is not None


def test_the_scan_refuses_before_reading_the_rest() -> None:
    """A body of tiny items stops being read after the cap: the chunks after it are never pulled."""
    pulled = 0

    async def chunks():  # 64 MiB of `1,` in 64 KiB chunks
        nonlocal pulled
        yield b'{"documents": ['
        for _ in range(1024):
            pulled += 1
            yield b"1," * 32768

    with pytest.raises(SidecarError) as refused:
        asyncio.run(read_json_body(chunks(), "", JsonCaps(max_bytes=64 << 20, max_items=1000)))
    assert refused.value.reason == "LIMIT_EXCEEDED" and pulled == 1


def test_a_declared_or_counted_size_over_the_limit_is_refused() -> None:
    async def chunks():
        yield b'{"query": "' + b"x" * 200 + b'"}'

    caps = JsonCaps(max_bytes=100, max_items=10, max_string_bytes=1000)
    for declared in ("101", ""):
        with pytest.raises(SidecarError, match="exceeds the limit of 100 bytes"):
            asyncio.run(read_json_body(chunks(), declared, caps))
