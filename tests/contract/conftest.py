"""The contract layer's fixture: each test gets the MEMORY store of both backends, in turn (store_helpers.Stores)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from store_helpers import BACKENDS, Stores, databases


@pytest.fixture(params=BACKENDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    dsn = ""
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres").database(f"contract_{next(databases)}")
    opened = Stores(request.param, tmp_path / "data", dsn)
    try:
        yield opened
    finally:
        await opened.close_all()
