"""The config schema (config.py) and its loader (config_loading.py): every key typed and bounded on its field,
errors that name the key and the range, the documented table in step with the schema, the environment overrides
and the TOML writer. No server, no models."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from ragsidecar.cli import main
from ragsidecar.config import ConfigError, bounds, schema_keys
from ragsidecar.config_loading import load_config
from ragsidecar.config_writer import to_toml

REPO = Path(__file__).resolve().parents[2]
NUMERIC = (msgspec.inspect.IntType, msgspec.inspect.FloatType)
# The default embedder, configured last so that each test's own [[models]] is models[0].
EMBEDDER = '\n[[models]]\nid = "bge-small-en-v1.5"\nkind = "bi-encoder"\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ragsidecar.toml"
    path.write_text(text + EMBEDDER, encoding="utf-8")
    return path


def numeric(kind: msgspec.inspect.Type) -> msgspec.inspect.Type | None:
    """The number type a key holds, itself or as the values of its table (retrieval.model_windows)."""
    kind = getattr(kind, "value_type", kind)
    return kind if isinstance(kind, NUMERIC) else None


def test_every_numeric_key_declares_its_bounds_on_the_field() -> None:
    keys = {key: numeric(kind) for key, kind in schema_keys().items()}
    unbounded = [key for key, kind in keys.items() if kind is not None and kind.ge is None and kind.gt is None]
    assert unbounded == []
    assert sum(kind is not None for kind in keys.values()) > 30  # the walk reached every section


def test_a_key_without_bounds_would_be_caught() -> None:
    class Loose(msgspec.Struct):
        count: int = 1

    (field,) = msgspec.inspect.type_info(Loose).fields
    assert field.type.ge is None and field.type.gt is None


def test_zero_sequential_cursors_is_refused_since_every_cursor_would_be_forgotten_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^retrieval\.max_sequential_cursors: must be positive, got 0$"):
        load_config(write(tmp_path, "[retrieval]\nmax_sequential_cursors = 0\n"), environ={}, check_files=False)
    one = load_config(write(tmp_path, "[retrieval]\nmax_sequential_cursors = 1\n"), environ={}, check_files=False)
    assert one.retrieval.max_sequential_cursors == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\nshutdown_grace_s = -1.0", "server.shutdown_grace_s: must be at least 0, got -1.0"),
        ("[server]\nconfig_poll_s = -2", "server.config_poll_s: must be at least 0, got -2"),
        ("[server]\nport = 70000", "server.port: must be in [0, 65535], got 70000"),
        ("[server]\nmax_message_bytes = 0", "server.max_message_bytes: must be in [1, 2147483647], got 0"),
        ("[inference]\ncache_bytes = -1", "inference.cache_bytes: must be at least 0, got -1"),
        ('[inference]\nworkers = "two"', "inference.workers: expected int, got str 'two'"),
        ("[retrieval]\ndirect_budget_fraction = 0.0", "retrieval.direct_budget_fraction: must be in (0, 1], got 0.0"),
        ("[retrieval.model_windows]\nllm = 0", "retrieval.model_windows: every value must be positive"),
        ("[retrieval]\nchunk_overlap_tokens = 200", "retrieval.chunk_overlap_tokens: must be in [0, chunk_tokens/2)"),
        (
            "[retrieval]\nrerank_candidates = 20\n[inference]\nmax_documents_per_request = 10",
            "retrieval.rerank_candidates: must be at most inference.max_documents_per_request (10), got 20",
        ),
        ('[retrieval]\nfusion = "max"', "retrieval.fusion: 'max' is not one of 'rrf', 'weighted_rrf', 'convex'"),
        ("[store]\nprot = 1", "store.prot: unknown key (known: backend, connect_timeout_s, dsn_env,"),
        ('[[models]]\nkind = "bi-encoder"', "models[0].id: required key is missing"),
        (
            '[[models]]\nid = "m"\nkind = "bi-encoder"\nmax_length = 8',
            "models[0].max_length: must be at least 16, got 8",
        ),
        ("server = 3", "server: expected object, got int 3"),
        ('base_dir = "/"', "base_dir: unknown key"),
    ],
)
def test_errors_name_the_key_and_the_allowed_range(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(write(tmp_path, text + "\n"), environ={}, check_files=False)
    assert str(refused.value).startswith(message)


def test_a_refused_config_exits_with_code_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "[retrieval]\nmax_sequential_cursors = 0\n")
    assert main(["config", "--config", str(path)]) == 2
    refusal = "invalid configuration: retrieval.max_sequential_cursors: must be positive, got 0"
    assert refusal in capsys.readouterr().err


def test_bounds_read_as_ranges() -> None:
    keys = schema_keys()
    assert bounds(keys["retrieval.dense_weight"]) == "in [0, 1]"
    assert bounds(keys["store.connect_timeout_s"]) == "positive"
    assert bounds(keys["inference.workers"]) == "positive"
    assert bounds(keys["models.max_length"]) == "at least 16"


def test_environment_overrides_apply_after_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nport = 1\n[paths]\ndata_dir = "here"\n')
    environ = {"RAGSIDECAR_PORT": "6123", "RAGSIDECAR_DATA_DIR": "/elsewhere", "RAGSIDECAR_HTTP_PORT": "0"}
    config = load_config(path, environ=environ, check_files=False)
    assert (config.server.port, config.paths.data_dir, config.http.port) == (6123, "/elsewhere", 0)
    with pytest.raises(ConfigError, match=r"RAGSIDECAR_METRICS_PORT: expected a port number, got 'x'"):
        load_config(path, environ={"RAGSIDECAR_METRICS_PORT": "x"}, check_files=False)
    with pytest.raises(ConfigError, match=r"server\.port: must be in \[0, 65535\], got 99999"):
        load_config(path, environ={"RAGSIDECAR_PORT": "99999"}, check_files=False)


def test_the_written_toml_loads_back_to_the_same_settings_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    text = '[paths]\nknowledge_roots = ["docs"]\n[retrieval.model_windows]\n"acme/llm \\"x\\"" = 4096\n'
    first = load_config(write(tmp_path / "a", text), environ={}, check_files=False)
    written = to_toml(first)
    (tmp_path / "copy.toml").write_text(written, encoding="utf-8")
    second = load_config(tmp_path / "copy.toml", environ={}, check_files=False)
    assert to_toml(second) == written
    assert second.paths.knowledge_roots == (str(tmp_path / "a" / "docs"),)
    assert second.retrieval.model_windows == {'acme/llm "x"': 4096}
    assert msgspec.structs.replace(second, base_dir=first.base_dir, paths=first.paths) == first


def documented_keys() -> tuple[set[str], set[str]]:
    """The keys of the configuration tables (`| key | default | meaning |`) in the README and docs/: full keys
    (`server.port`, and the `[[models]]` rows' keys), and the bare keys of a section's own table (docs/store.md)."""
    full: set[str] = set()
    bare: set[str] = set()
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for table in page.read_text(encoding="utf-8").split("| key | default | meaning |")[1:]:
            for row in re.findall(r"^\| (.+?) \|", table.split("\n\n")[0], re.MULTILINE):
                prefix = "models." if row.startswith("`[[models]]`") else ""
                for key in re.findall(r"`([a-z_.]+)`", row):
                    (full if prefix or "." in key else bare).add(prefix + key)
    return full, bare


def test_the_documented_configuration_table_lists_exactly_the_schema_keys() -> None:
    documented, _ = documented_keys()
    assert documented, "no configuration table found"
    assert sorted(documented - set(schema_keys())) == []  # documented, but no such key
    assert sorted(set(schema_keys()) - documented) == []  # a key nobody documented


def test_a_sections_own_table_names_only_keys_of_some_section() -> None:
    _, bare = documented_keys()
    assert bare and sorted(bare - {key.split(".", 1)[1] for key in schema_keys()}) == []
