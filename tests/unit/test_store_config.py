"""The store's settings, read in process: the embedded default, bounds, where the DSN comes from, the install hint
without psycopg, connection timeouts, and the pgvector versions migrations accept."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from sidecar import default_config, to_toml

from ragsidecar.config import ConfigError, StoreConfig
from ragsidecar.config_loading import load_config
from ragsidecar.store import migrate


@pytest.mark.parametrize(
    "installed, supported",
    [("0.8.0", True), ("0.8.5", True), ("1.0", True), ("0.7.4", False), ("0.5.1", False), (None, False)],
)
def test_the_pgvector_floor(installed: str | None, supported: bool) -> None:
    assert migrate.pgvector_supported(installed) is supported


def test_the_store_defaults_to_the_embedded_backend(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, {}), environ={}).store == StoreConfig()
    assert StoreConfig().backend == "embedded"


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ({"backend": "sqlite"}, "store.backend: 'sqlite' is not one of 'embedded', 'postgres'"),
        ({"dsn": "postgresql://x"}, "store.dsn: unknown key"),
        ({"pool_size": 0}, "store.pool_size: must be positive"),
        ({"connect_timeout_s": 0}, "store.connect_timeout_s: must be positive"),
        ({"health_interval_s": -1.0}, "store.health_interval_s: must be positive"),
        ({"dsn_env": " "}, "store.dsn_env: must name an environment variable"),
        ({"row_level_security": "yes"}, "store.row_level_security: expected bool"),
        ({"backend": "postgres", "dsn_env": "MY_DSN"}, "MY_DSN .*is not set"),
    ],
)
def test_store_settings_are_validated(tmp_path: Path, store: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, store), environ={})


def test_the_dsn_comes_from_the_named_variable_and_only_when_needed(tmp_path: Path) -> None:
    path = write(tmp_path, {"backend": "postgres", "dsn_env": "MY_DSN"})
    config = load_config(path, environ={"MY_DSN": "postgresql:///x"})
    assert config.store.dsn({"MY_DSN": "postgresql:///x"}) == "postgresql:///x"
    # Showing a configuration needs no database.
    assert load_config(path, environ={}, check_files=False).store.backend == "postgres"


def test_the_postgres_backend_without_psycopg_fails_with_the_install_hint(monkeypatch, tmp_path: Path) -> None:
    from ragsidecar.store.database import open_database

    config = load_config(write(tmp_path, {"backend": "postgres"}), environ={"RAGSIDECAR_STORE_DSN": "dbname=x"})
    for module in ("psycopg", "psycopg_pool"):
        monkeypatch.setitem(sys.modules, module, None)  # what an install without the extra sees: ImportError
    with pytest.raises(ConfigError, match=r'psycopg is not installed: pip install "ragsidecar\[postgres\]"'):
        open_database(config, {"RAGSIDECAR_STORE_DSN": "dbname=x"})


def test_connections_bound_a_silent_server_unless_the_dsn_says_otherwise() -> None:
    from ragsidecar.store.database import _connection_settings

    assert _connection_settings("host=db dbname=x", 2.5) == {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 30_000,
        "connect_timeout": 3,
    }  # libpq counts whole seconds
    own = _connection_settings("postgresql://u@db/x?keepalives_idle=60&tcp_user_timeout=0&connect_timeout=99", 5)
    assert "keepalives_idle" not in own and "tcp_user_timeout" not in own
    assert own["connect_timeout"] == 5  # store.connect_timeout_s decides


def write(tmp_path: Path, store: dict) -> Path:
    config = default_config()
    config["store"] = store
    path = tmp_path / "ragsidecar.toml"
    path.write_text(to_toml(config))
    return path
