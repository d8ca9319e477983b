"""Loading the configuration: the TOML file read, the environment's overrides applied, the schema (config.py)
enforced, and the rules that span keys checked; every refusal is a ConfigError naming the key. Relative paths
resolve against the config file's folder, so a config file works wherever the server is started from.

Without a config file the built-in defaults (default_config.toml, shipped inside the package) apply; their
relative paths resolve against the ragsidecar home: $RAGSIDECAR_HOME, or the user's data folder.
"""

from __future__ import annotations

import os
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import msgspec

from ragsidecar.config import Config, ConfigError, bounds
from ragsidecar.knowledge.languages import LANGUAGES as LEXICAL_LANGUAGES

# The built-in defaults: used when neither --config nor $RAGSIDECAR_CONFIG names a file.
BUILT_IN_CONFIG = Path(__file__).with_name("default_config.toml")

# Environment overrides, applied after the file is read: (variable, section, key).
ENV_OVERRIDES: tuple[tuple[str, str, str], ...] = (
    ("RAGSIDECAR_HOST", "server", "host"),
    ("RAGSIDECAR_PORT", "server", "port"),
    ("RAGSIDECAR_UNIX_SOCKET", "server", "unix_socket"),
    ("RAGSIDECAR_METRICS_PORT", "metrics", "port"),
    ("RAGSIDECAR_HTTP_HOST", "http", "host"),
    ("RAGSIDECAR_HTTP_PORT", "http", "port"),
    ("RAGSIDECAR_MODELS_DIR", "paths", "models_dir"),
    ("RAGSIDECAR_DATA_DIR", "paths", "data_dir"),
)

# The file's keys: every field but base_dir, which comes from where the file is.
FILE_KEYS = frozenset(Config.__struct_fields__) - {"base_dir"}


def ragsidecar_home(environ: typing.Mapping[str, str] | None = None) -> Path:
    """Where models, the download cache, indexes and knowledge live when no config file says otherwise."""
    home = (os.environ if environ is None else environ).get("RAGSIDECAR_HOME")
    if home:
        return Path(home).expanduser().resolve()
    import platformdirs  # only needed when no home is given

    return platformdirs.user_data_path("ragsidecar", appauthor=False)


def load_config(path: Path, environ: typing.Mapping[str, str] | None = None, check_files: bool = True) -> Config:
    """Reads, overrides from the environment, and validates a config file.

    check_files=False skips the checks that model files exist and that the store's DSN variable is set (to show a
    configuration before installing).
    """
    environ = os.environ if environ is None else environ
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    _apply_env_overrides(raw, environ)
    if "base_dir" in raw:
        raise ConfigError(f"base_dir: unknown key (known: {', '.join(sorted(FILE_KEYS))})")
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as err:
        raise _refusal(str(err), raw) from None
    base_dir = ragsidecar_home(environ) if path.resolve() == BUILT_IN_CONFIG.resolve() else path.resolve().parent
    config = msgspec.structs.replace(config, base_dir=base_dir)
    _check(config, check_files)
    if check_files and config.store.backend == "postgres":
        config.store.dsn(environ)  # refuses now, naming the variable, rather than at the first request
    return config


def _apply_env_overrides(raw: dict[str, Any], environ: typing.Mapping[str, str]) -> None:
    for variable, section, key in ENV_OVERRIDES:
        if variable in environ:
            value: Any = environ[variable]
            if key == "port":
                if not value.isdigit():
                    raise ConfigError(f"{variable}: expected a port number, got {value!r}")
                value = int(value)
            raw.setdefault(section, {})[key] = value


# msgspec's message: what is wrong, then where (`$.retrieval.dense_weight`, `$.models[1]`, `$.x.model_windows[...]`).
_MESSAGE = re.compile(r"(?P<what>.*?)(?: - at `\$(?P<where>[^`]*)`)?")
_STEP = re.compile(r"\.(\w+)|\[(\d+|\.\.\.)\]")
# A value the file does not hold (a table's value msgspec does not name).
_UNKNOWN = object()


def _refusal(message: str, raw: dict[str, Any]) -> ConfigError:
    """A ConfigError in the sidecar's words for msgspec's message: the key, the rule, the value given."""
    match = _MESSAGE.fullmatch(message)
    assert match is not None  # the pattern matches any text
    what, key = match["what"], (match["where"] or "").lstrip(".")
    (kind, declared), value = _schema_at(key), _value_at(raw, key)
    if named := re.fullmatch(r"Object (contains unknown|missing required) field `(.+)`", what):
        full = f"{key}.{named[2]}" if key else named[2]
        if named[1] == "missing required":
            return ConfigError(f"{full}: required key is missing")
        known = sorted(set(f.name for f in kind.fields) - {"base_dir"})
        return ConfigError(f"{full}: unknown key (known: {', '.join(known)})")
    if isinstance(kind, msgspec.inspect.LiteralType):
        return ConfigError(f"{key}: {value!r} is not one of {', '.join(repr(v) for v in declared)}")
    if isinstance(kind, (msgspec.inspect.IntType, msgspec.inspect.FloatType)) and re.match(
        r"Expected `\w+` [<>]", what
    ):
        if key.endswith("[...]"):  # a table's value: msgspec does not say which
            return ConfigError(f"{key.removesuffix('[...]')}: every value must be {bounds(kind)}")
        got = "" if value is _UNKNOWN else f", got {value!r}"
        return ConfigError(f"{key}: must be {bounds(kind)}{got}")
    got = "" if value is _UNKNOWN else f" {value!r}"
    return ConfigError(f"{key}: {what[0].lower()}{what[1:].replace('`', '')}{got}")


def _schema_at(key: str) -> tuple[Any, tuple[Any, ...]]:
    """The type of the key, and the values its annotation declares, in their order (for a Literal)."""
    kind: Any = msgspec.inspect.type_info(Config)
    annotation = None
    for name, _ in _STEP.findall("." + key if key else ""):
        if name:
            annotation = typing.get_type_hints(kind.cls)[name]
            kind = next(f.type for f in kind.fields if f.name == name)
        else:
            kind = kind.value_type if isinstance(kind, msgspec.inspect.DictType) else kind.item_type
    return kind, typing.get_args(annotation)


def _value_at(raw: Any, key: str) -> Any:
    for name, index in _STEP.findall("." + key if key else ""):
        try:
            raw = raw[name] if name else raw[int(index)]
        except (KeyError, IndexError, TypeError, ValueError):
            return _UNKNOWN
    return raw


def _check(config: Config, check_files: bool) -> None:
    """The rules that span keys, or that a type cannot say; each key's own bounds are on its field."""
    retrieval = config.retrieval
    if retrieval.chunk_overlap_tokens >= retrieval.chunk_tokens // 2:
        raise ConfigError("retrieval.chunk_overlap_tokens: must be in [0, chunk_tokens/2)")
    if retrieval.lexical_language not in LEXICAL_LANGUAGES:
        raise ConfigError(
            f"retrieval.lexical_language: {retrieval.lexical_language!r} is not one of {', '.join(LEXICAL_LANGUAGES)}"
        )
    if retrieval.rerank_candidates > config.inference.max_documents_per_request:
        # A Search reranks through the same Reranker as the Rerank RPC, which refuses more documents than that.
        raise ConfigError(
            f"retrieval.rerank_candidates: must be at most inference.max_documents_per_request "
            f"({config.inference.max_documents_per_request}), got {retrieval.rerank_candidates}"
        )
    if bool(config.tls.cert_file) != bool(config.tls.key_file):
        raise ConfigError("tls: cert_file and key_file must be set together")
    _check_models(config, check_files)
    embedders = [m.id for m in config.models if m.kind == "bi-encoder"]
    if retrieval.embedder and retrieval.embedder not in embedders:
        raise ConfigError(
            f"retrieval.embedder: {retrieval.embedder!r} is not a configured bi-encoder "
            f'(configured: {", ".join(embedders) or "none"}; "" disables retrieval)'
        )
    if not config.store.dsn_env.strip():
        raise ConfigError("store.dsn_env: must name an environment variable")


def _check_models(config: Config, check_files: bool) -> None:
    """Model ids unique and not blank, one default at most, the window overlap below half the window, and the
    model files present (unless the model comes from a hub, or check_files is off)."""
    if sum(m.default for m in config.models) > 1:
        raise ConfigError("models: more than one model is marked default")
    seen: set[str] = set()
    for i, model in enumerate(config.models):
        where = f"models[{i}]"
        if not model.id.strip():
            raise ConfigError(f"{where}.id: must not be empty")
        if model.id in seen:
            raise ConfigError(f"{where}.id: {model.id!r} is configured twice")
        seen.add(model.id)
        if model.window_overlap >= model.max_length // 2:
            raise ConfigError(f"{where}.window_overlap: must be in [0, max_length/2)")
        if model.hub:
            _check_hub(model.hub, f"{where}.hub")
            continue  # its files are fetched when it loads
        folder = config.model_dir(model)
        for name in ("model.onnx", "tokenizer.json"):
            if check_files and not (folder / name).is_file():
                raise ConfigError(f"{where}.path: {folder / name} does not exist (run `ragsidecar models install`)")


def _check_hub(hub: str, where: str) -> None:
    from ragsidecar.hub_models import HubRef  # no huggingface_hub import: only the id's syntax is checked

    try:
        HubRef.parse(hub)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
