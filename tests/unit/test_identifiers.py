"""identifiers.py: the one way keys are built from caller ids, and how ids are checked. Pure functions."""

from __future__ import annotations

import pytest

from ragsidecar.identifiers import MAX_ID_CHARS, id_problems, key_of


def test_keys_of_different_tuples_differ_whatever_the_ids_hold() -> None:
    assert key_of("acme\0x", "s") != key_of("acme", "x\0s")  # a separator join would collide here
    assert key_of("ab", "c") != key_of("a", "bc") != key_of("abc")
    assert key_of("") != key_of() != key_of("", "")


def test_a_key_is_stable_and_hex() -> None:
    assert key_of("tenant", "owner") == key_of("tenant", "owner")
    assert len(key_of("t")) == 64 and int(key_of("t"), 16) >= 0


def test_lone_surrogates_make_keys_rather_than_errors() -> None:
    assert key_of("\ud800") != key_of("\udc00")


@pytest.mark.parametrize(
    ("value", "required", "problem"),
    [
        ("", True, "required"),
        ("   ", True, "required"),
        ("", False, None),
        ("x" * (MAX_ID_CHARS + 1), True, f"longer than {MAX_ID_CHARS} characters ({MAX_ID_CHARS + 1})"),
        ("x" * MAX_ID_CHARS, True, None),
        ("tab\there", True, "contains control characters"),
        ("bell\a", True, "contains control characters"),
        ("caf\u00e9 \u4e2d\u6587", True, None),
    ],
)
def test_id_problems_name_the_field_and_what_is_wrong(value: str, required: bool, problem: str | None) -> None:
    found = id_problems(value, "owner_id", required=required)
    if problem is None:
        assert found == []
    else:
        assert [(v.field, v.description) for v in found] == [("owner_id", problem)]
