"""Filter and metadata messages as the domain's filters (api/filter_messages.py): every kind converted, and
hostile messages refused with a violation naming the part before their size costs anything."""

from __future__ import annotations

import pytest

from ragsidecar.api.filter_messages import filter_of, typed_metadata_of, value_message, value_of
from ragsidecar.errors import SidecarError
from ragsidecar.knowledge import filters as f
from ragsidecar.v1 import retrieval_pb2 as pb


def _eq(field: str, value: pb.MetadataValue) -> pb.Filter:
    return pb.Filter(comparison=pb.Comparison(field=field, operator=pb.COMPARISON_OPERATOR_EQUAL, value=value))


def test_every_kind_converts() -> None:
    message = pb.Filter(
        all=pb.FilterList(
            filters=[
                _eq("s", pb.MetadataValue(string_value="x")),
                pb.Filter(negation=pb.Filter(exists=pb.Exists(field="gone"))),
                pb.Filter(
                    any=pb.FilterList(
                        filters=[
                            pb.Filter(
                                membership=pb.Membership(
                                    field="n",
                                    values=[pb.MetadataValue(number_value=1), pb.MetadataValue(number_value=2)],
                                    negated=True,
                                )
                            ),
                            _eq("$created", pb.MetadataValue(timestamp_value={"seconds": 2, "nanos": 5})),
                        ]
                    )
                ),
            ]
        )
    )
    assert filter_of(message, "filter") == f.All(
        (
            f.Compare("s", f.Op.EQUAL, "x"),
            f.Not(f.Exists("gone")),
            f.AnyOf((f.In("n", (1.0, 2.0), negated=True), f.Compare("$created", f.Op.EQUAL, f.Instant(2_000_000_005)))),
        )
    )


@pytest.mark.parametrize(
    "value",
    ["x", 2.5, True, f.Instant(3_000_000_001), ("a", "b")],
)
def test_values_round_trip(value: f.Value) -> None:
    assert value_of(value_message(value), "v") == value


def _nested(levels: int) -> pb.Filter:
    message = pb.Filter(exists=pb.Exists(field="a"))
    for _ in range(levels - 1):
        message = pb.Filter(negation=message)
    return message


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (_nested(90), "filter" + ".negation" * 32),
        (pb.Filter(), "filter"),
        (_eq("a", pb.MetadataValue()), "filter.comparison.value"),
        (
            pb.Filter(comparison=pb.Comparison(field="a", operator=99, value=pb.MetadataValue(bool_value=True))),
            "filter.comparison.operator",
        ),
        (
            pb.Filter(any=pb.FilterList(filters=[pb.Filter(exists=pb.Exists(field="a"))] * 1500)),
            "filter.any.filters[1023]",
        ),
        (_eq("a", pb.MetadataValue(number_value=float("nan"))), "filter.comparison.value"),
        (_eq("a", pb.MetadataValue(string_value="x" * 65536)), "filter.comparison.value"),
    ],
)
def test_hostile_messages_are_refused(message: pb.Filter, field: str) -> None:
    with pytest.raises(SidecarError) as refused:
        filter_of(message, "filter")
    assert refused.value.reason == "INVALID_REQUEST"
    assert [v.field for v in refused.value.violations] == [field]


def test_typed_metadata_is_checked() -> None:
    values, found = typed_metadata_of(
        {
            "ok": pb.MetadataValue(number_value=1),
            "$id": pb.MetadataValue(string_value="x"),
            "dup": pb.MetadataValue(bool_value=True),
            "nan": pb.MetadataValue(number_value=float("nan")),
            "unset": pb.MetadataValue(),
        },
        {"dup": "y"},
        "documents[0]",
    )
    assert values == {"ok": 1.0}
    assert sorted(v.field for v in found) == sorted(
        f"documents[0].typed_metadata[{k!r}]" for k in ("$id", "dup", "nan", "unset")
    )
