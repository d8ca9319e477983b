"""Random documents' fields and random filters over them, for tests that check a field index against evaluation."""

from __future__ import annotations

import random

from ragsidecar.knowledge import filters as f


def random_fields(rng: random.Random, i: int) -> dict[str, f.Value]:
    """A document's fields: an id, and at random numbers, strings, booleans, timestamps, string lists, a kind mixed."""
    fields: dict[str, f.Value] = {f.ID: f"d{i}"}
    if rng.random() < 0.8:
        fields["n"] = float(rng.randrange(10))
    if rng.random() < 0.7:
        fields["s"] = rng.choice("abcde")
    if rng.random() < 0.5:
        fields["b"] = rng.random() < 0.5
    if rng.random() < 0.5:
        fields["t"] = f.Instant(rng.randrange(5))
    if rng.random() < 0.5:
        fields["l"] = tuple(rng.sample("abcde", rng.randrange(3)))
    if rng.random() < 0.1:
        fields["s"] = 3.0  # the same key with another kind
    return fields


def random_filter(rng: random.Random, depth: int = 0) -> f.Filter:
    """A valid filter over random_fields' names, up to 3 levels deep."""
    if depth < 3 and rng.random() < 0.4:
        children = tuple(random_filter(rng, depth + 1) for _ in range(rng.randrange(4)))
        return rng.choice([f.All, f.AnyOf])(children)
    if depth < 3 and rng.random() < 0.1:
        return f.Not(random_filter(rng, depth + 1))
    field = rng.choice(["n", "s", "b", "t", "l", "missing"])
    values: dict[str, list[f.Value]] = {
        "n": [float(rng.randrange(10))],
        "s": [rng.choice("abcde")],
        "b": [rng.random() < 0.5],
        "t": [f.Instant(rng.randrange(5))],
        "l": [rng.choice("abcde")],
        "missing": ["x"],
    }
    value = values[field][0]
    choice = rng.random()
    if choice < 0.5:
        ops = list(f.Op) if not isinstance(value, bool) else [f.Op.EQUAL, f.Op.NOT_EQUAL]
        return f.Compare(field, rng.choice(ops), value)
    if choice < 0.8:
        return f.In(field, (value, *values[field]), negated=rng.random() < 0.5)
    return f.Exists(field)
