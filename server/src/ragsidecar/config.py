"""The sidecar's configuration: one TOML file, validated strictly at start-up and on reload.

Every key is declared by a frozen dataclass below; an unknown key, a wrong type or a missing model
path is a ConfigError that names the key. Relative paths resolve against the config file's folder,
so a config file works wherever the server is started from.

Without a config file the built-in defaults (default_config.toml, shipped inside the package) apply; their
relative paths resolve against the ragsidecar home: $RAGSIDECAR_HOME, or the user's data folder.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ragsidecar.knowledge.fusion import FusionMethod, RerankFusion

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


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the problem."""


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50151
    # Optional Unix domain socket path served beside TCP; empty disables it.
    unix_socket: str = ""
    # gRPC's own default is 4 MiB, too small for batches of long documents.
    max_message_bytes: int = 64 * 1024 * 1024
    # Seconds that in-flight calls get to finish after SIGTERM/SIGINT.
    shutdown_grace_s: float = 10.0
    # Seconds between checks of the config file's modification time; 0 disables the watch.
    config_poll_s: float = 2.0
    # Serve a host beyond loopback with neither a bearer token nor TLS. Off by default: such a config refuses
    # to start, since whoever reaches the address could read every tenant's knowledge.
    allow_unprotected_remote: bool = False


@dataclass(frozen=True)
class AuthConfig:
    # Bearer token read from this file (stripped); takes precedence over token_env.
    token_file: str = ""
    # Name of the environment variable holding the bearer token; unset or empty disables auth.
    token_env: str = "RAGSIDECAR_TOKEN"


@dataclass(frozen=True)
class TlsConfig:
    cert_file: str = ""
    key_file: str = ""


@dataclass(frozen=True)
class MetricsConfig:
    host: str = "127.0.0.1"
    # Prometheus exposition port; 0 disables metrics.
    port: int = 9464


@dataclass(frozen=True)
class HttpConfig:
    """The optional HTTP listener (Cohere-, Jina- and TEI-style rerank, OpenAI-style embeddings) beside gRPC.

    It shares the models, queues, caches, metrics, token and TLS of the gRPC listener; its request bodies are
    bounded by server.max_message_bytes."""

    host: str = "127.0.0.1"
    # 0 disables the listener (the default).
    port: int = 0


@dataclass(frozen=True)
class InferenceConfig:
    # Threads inside one onnxruntime run. 1 lets `workers` runs proceed in parallel without contention.
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    # Concurrent inference runs per model (each on its own thread).
    workers: int = 2
    # Token budget of one scheduling batch (TEI's max-batch-tokens).
    max_batch_tokens: int = 16384
    # Pairs that may wait per model before requests get RESOURCE_EXHAUSTED.
    max_queued_pairs: int = 20000
    # Most documents one Rerank request may carry.
    max_documents_per_request: int = 1000
    # Bytes the rerank result cache may hold; 0 disables it.
    cache_bytes: int = 32 * 1024 * 1024
    # "auto": one sequence per run for dynamically quantized graphs (their scores depend on
    # batch-mates), padded batches otherwise; "sequence" or "padded" force a mode.
    batch_mode: Literal["auto", "sequence", "padded"] = "auto"


@dataclass(frozen=True)
class RetrievalConfig:
    # Bi-encoder model (an id of [[models]]) that embeds knowledge chunks and queries.
    embedder: str = "bge-small-en-v1.5"
    # Prepended to queries (not documents) before embedding, as the embedder was trained (bge's instruction).
    query_prefix: str = "Represent this sentence for searching relevant passages: "
    # Chunk size and overlap, in the embedder's tokens.
    chunk_tokens: int = 256
    chunk_overlap_tokens: int = 32
    # Files larger than this are refused (LIMIT_EXCEEDED) before they are read.
    max_file_bytes: int = 50 * 1024 * 1024
    # Depth of the dense and BM25 candidate lists fused into one.
    fusion_candidates: int = 50
    # Fused candidates reranked when an entry asks for rerank without saying how many (10: deeper reranks
    # scored no better on SciFact, Cranfield and MED, and each candidate costs a cross-encoder run; bench/beir.py).
    rerank_candidates: int = 10
    # Analysis of the BM25 side: a Snowball language (its stopwords removed, words stemmed) or "none" (words as
    # written, English stopwords). Part of every index's key: changing it rebuilds the indexes.
    lexical_language: str = "english"
    # How the dense and BM25 lists become one (knowledge/fusion.py): "rrf" (reciprocal rank fusion, equal
    # weights), "weighted_rrf", or "convex" (weighted sum of scaled cosine and BM25 scores).
    fusion: FusionMethod = "weighted_rrf"
    # The dense list's weight in "weighted_rrf" and "convex", in [0, 1]; the BM25 list gets 1 - dense_weight.
    dense_weight: float = 0.9
    # How a rerank with rerank_order FUSED combines the reranker's relevance with the retrieval order: "rrf"
    # (reciprocal rank fusion of the two orders) or "interpolate" (rerank_weight * scaled relevance +
    # (1 - rerank_weight) * scaled retrieval score over the reranked head).
    rerank_fusion: RerankFusion = "interpolate"
    # The reranker's weight in "interpolate", in [0, 1].
    rerank_weight: float = 0.2
    # Most tokens of an Enforce context when the request sets no max_context_tokens.
    context_window_tokens: int = 8192
    # Share of the model's input window that DIRECT entries without max_tokens may take together.
    direct_budget_fraction: float = 0.25
    index_dtype: Literal["f16", "i8"] = "f16"
    index_threads: int = 1
    # Most documents one UpsertDocuments call may carry.
    max_memory_documents_per_request: int = 1000
    # Most UTF-8 bytes (ids, texts, metadata) one UpsertDocuments or AppendToBinding call may carry.
    max_memory_bytes_per_request: int = 16 * 1024 * 1024
    # Estimated bytes of loaded indexes (with their last-good copies) kept in memory, least recently used
    # evicted first; an evicted persisted index is read back from disk, a MEMORY one rebuilt from cached vectors.
    index_cache_bytes: int = 1024 * 1024 * 1024
    # Bytes of persisted MEMORY partitions kept in memory (least recently used evicted; read back on demand).
    memory_cache_bytes: int = 1024 * 1024 * 1024
    # Bytes all open chat bindings' live corpora may hold together (server memory only); an append past it
    # is RESOURCE_EXHAUSTED.
    binding_store_bytes: int = 256 * 1024 * 1024
    # Chat bindings open at once across all tenants; opening one more closes the least recently used.
    max_open_bindings: int = 10_000
    # A chat binding unused this long (seconds) is closed, as if its host had closed it.
    binding_idle_seconds: float = 86_400.0
    # SEQUENTIAL cursors kept in memory (least recently used forgotten: its next dispatch starts again from
    # the first unit, as after a restart).
    max_sequential_cursors: int = 100_000
    # Input windows (tokens) of LLMs by model id, added to the built-in table; used when a request
    # names a model without giving its window.
    model_windows: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PathsConfig:
    models_dir: str = "../models"
    data_dir: str = "../data"
    # Every knowledge path must resolve (after symlinks) inside one of these folders; relative knowledge
    # paths resolve against the first. Empty: no file knowledge can be read.
    knowledge_roots: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    id: str
    kind: Literal["cross-encoder", "bi-encoder"]
    # Folder holding model.onnx and tokenizer.json; relative paths resolve against models_dir. Default: the id.
    path: str = ""
    # "ORG/NAME[@REVISION]": a model hub's ONNX export, fetched into the folder on the first start (as
    # `ragsidecar models install ORG/NAME@REVISION --id ID` does) and found through models.lock afterwards.
    hub: str = ""
    max_length: int = 512
    # Bi-encoders only: how token vectors become one vector.
    pooling: Literal["cls", "mean"] = "cls"
    long_document_strategy: Literal["truncate", "window"] = "truncate"
    # Windowing: tokens shared by neighbouring windows, and most windows scored per document.
    window_overlap: int = 64
    max_chunks_per_document: int = 4
    # Used when a Rerank request names no model.
    default: bool = False


@dataclass(frozen=True)
class StoreConfig:
    # Where MEMORY documents, chat bindings, SEQUENTIAL cursors and the embedding cache live: "embedded" (this
    # pod's disk and memory) or "postgres" (shared by every replica; needs `pip install ragsidecar[postgres]`).
    backend: Literal["embedded", "postgres"] = "embedded"
    # Name of the environment variable holding the PostgreSQL DSN. The DSN never comes from this file (it holds
    # a password) and is never logged or printed.
    dsn_env: str = "RAGSIDECAR_STORE_DSN"
    # Connections the pool may open.
    pool_size: int = 4
    # Seconds a new connection, or a call waiting for a free one, may take before the store counts as down.
    connect_timeout_s: float = 5.0
    # Seconds between probes of the database, so health flips on loss and recovery without traffic.
    health_interval_s: float = 5.0
    # Row-level security policies on every tenant table, on top of the tenant filter every query carries.
    row_level_security: bool = False
    # Apply pending migrations at start-up; false: only check the schema's version (`ragsidecar db migrate`).
    migrate_on_start: bool = True
    # Rows of the embedding cache shared by replicas (least recently used deleted past it); 0: not shared.
    embedding_cache_rows: int = 1_000_000
    # Whose cached vectors of caller-sent text (MEMORY, bindings, INLINE) a tenant may reuse: "all" (as the
    # embedded store's in-process cache) or "tenant" (no timing can tell a tenant what another embedded).
    share_embeddings: Literal["all", "tenant"] = "all"

    def dsn(self, environ: typing.Mapping[str, str] | None = None) -> str:
        """The DSN from the environment; ConfigError (naming the variable, never a value) when unset."""
        dsn = (os.environ if environ is None else environ).get(self.dsn_env, "").strip()
        if not dsn:
            raise ConfigError(f"store: the environment variable {self.dsn_env} (store.dsn_env), which holds the "
                              "PostgreSQL DSN of the postgres backend, is not set")
        return dsn


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    models: tuple[ModelConfig, ...] = ()
    # Folder of the config file; relative paths resolve against it.
    base_dir: Path = Path(".")

    def resolve(self, path: str) -> Path:
        return (self.base_dir / os.path.expanduser(path)).resolve()

    def model_dir(self, model: ModelConfig) -> Path:
        return (self.resolve(self.paths.models_dir) / os.path.expanduser(model.path or model.id)).resolve()

    def knowledge_roots(self) -> list[Path]:
        return [self.resolve(root) for root in self.paths.knowledge_roots]

    def default_model(self) -> ModelConfig | None:
        marked = [m for m in self.models if m.default]
        if marked:
            return marked[0]
        cross = [m for m in self.models if m.kind == "cross-encoder"]
        return (cross or list(self.models) or [None])[0]

    def check_listener_protected(self) -> None:
        """A TCP listener (gRPC, or HTTP when on) beyond loopback needs a bearer token or TLS, unless
        server.allow_unprotected_remote."""
        listeners = [("server.host", self.server.host)] + ([("http.host", self.http.host)] if self.http.port else [])
        remote = [(key, host) for key, host in listeners if not _is_loopback(host)]
        if not remote or self.server.allow_unprotected_remote or self.tls.cert_file or self.bearer_token():
            return
        key, host = remote[0]
        raise ConfigError(f"{key}: {host!r} is reachable beyond this machine but neither auth (a bearer "
                          "token) nor tls is configured; configure one, or set server.allow_unprotected_remote")

    def bearer_token(self) -> str | None:
        if self.auth.token_file:
            return self.resolve(self.auth.token_file).read_text().strip() or None
        return os.environ.get(self.auth.token_env) or None if self.auth.token_env else None


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
    base_dir = ragsidecar_home(environ) if path.resolve() == BUILT_IN_CONFIG.resolve() else path.resolve().parent
    config = _build(Config, {**raw, "base_dir": base_dir}, "")
    _validate(config, check_files)
    if check_files and config.store.backend == "postgres":
        config.store.dsn(environ)  # refuses now, naming the variable, rather than at the first request
    return config


def to_toml(config: Config) -> str:
    """The configuration as a TOML file that loads back to the same settings, wherever it is saved.

    Paths are written resolved (absolute), since a saved copy no longer sits where they were relative to.
    """
    resolved = dataclasses.replace(config, paths=dataclasses.replace(
        config.paths, models_dir=str(config.resolve(config.paths.models_dir)),
        data_dir=str(config.resolve(config.paths.data_dir)),
        knowledge_roots=tuple(str(root) for root in config.knowledge_roots())))
    lines: list[str] = []
    for section in dataclasses.fields(Config):
        value = getattr(resolved, section.name)
        if dataclasses.is_dataclass(value):
            lines += ["", f"[{section.name}]", *_toml_pairs(value)]
        elif section.name == "models":
            for model in value:
                lines += ["", "[[models]]", *_toml_pairs(model)]
    return "\n".join(lines).lstrip() + "\n"


def _toml_pairs(table: Any) -> list[str]:
    return [f"{f.name} = {_toml_value(getattr(table, f.name))}" for f in dataclasses.fields(table)]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _apply_env_overrides(raw: dict[str, Any], environ: typing.Mapping[str, str]) -> None:
    for variable, section, key in ENV_OVERRIDES:
        if variable in environ:
            value: Any = environ[variable]
            if key == "port":
                if not value.isdigit():
                    raise ConfigError(f"{variable}: expected a port number, got {value!r}")
                value = int(value)
            raw.setdefault(section, {})[key] = value


def _build(cls: type, raw: Any, where: str) -> Any:
    """Builds a dataclass from a TOML table, refusing unknown keys and wrong types."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'config'}: expected a table, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{_key(where, unknown[0])}: unknown key (known: {', '.join(sorted(fields))})")
    values = {}
    for name, value in raw.items():
        values[name] = _coerce(hints[name], value, _key(where, name))
    missing = [n for n, f in fields.items() if n not in values and _required(f)]
    if missing:
        raise ConfigError(f"{_key(where, missing[0])}: required key is missing")
    return cls(**values)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is Path:
        return value
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if origin is Literal:
        if value not in typing.get_args(hint):
            allowed = ", ".join(repr(a) for a in typing.get_args(hint))
            raise ConfigError(f"{where}: {value!r} is not one of {allowed}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {type(value).__name__}")
        item = typing.get_args(hint)[1]
        return {k: _coerce(item, v, f"{where}.{k}") for k, v in value.items()}
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected an array, got {type(value).__name__}")
        return tuple(_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (types.UnionType, typing.Union):
        raise ConfigError(f"{where}: unsupported type")  # no optional keys: defaults stand in
    expected = {float: (int, float)}.get(hint, hint)
    if isinstance(value, bool) and hint is not bool or not isinstance(value, expected):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return float(value) if hint is float else value


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _key(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _validate(config: Config, check_files: bool) -> None:
    positive = {
        "server.max_message_bytes": config.server.max_message_bytes,
        "inference.intra_op_threads": config.inference.intra_op_threads,
        "inference.inter_op_threads": config.inference.inter_op_threads,
        "inference.workers": config.inference.workers,
        "inference.max_batch_tokens": config.inference.max_batch_tokens,
        "inference.max_queued_pairs": config.inference.max_queued_pairs,
        "inference.max_documents_per_request": config.inference.max_documents_per_request,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}: must be positive, got {value}")
    retrieval = config.retrieval
    for key, value in (("retrieval.chunk_tokens", retrieval.chunk_tokens),
                       ("retrieval.max_file_bytes", retrieval.max_file_bytes),
                       ("retrieval.fusion_candidates", retrieval.fusion_candidates),
                       ("retrieval.rerank_candidates", retrieval.rerank_candidates),
                       ("retrieval.context_window_tokens", retrieval.context_window_tokens),
                       ("retrieval.index_threads", retrieval.index_threads),
                       ("retrieval.max_memory_documents_per_request", retrieval.max_memory_documents_per_request),
                       ("retrieval.max_memory_bytes_per_request", retrieval.max_memory_bytes_per_request),
                       ("retrieval.index_cache_bytes", retrieval.index_cache_bytes),
                       ("retrieval.memory_cache_bytes", retrieval.memory_cache_bytes),
                       ("retrieval.binding_store_bytes", retrieval.binding_store_bytes),
                       ("retrieval.max_open_bindings", retrieval.max_open_bindings),
                       ("retrieval.binding_idle_seconds", retrieval.binding_idle_seconds),
                       *((f"retrieval.model_windows.{k}", v) for k, v in retrieval.model_windows.items())):
        if value <= 0:
            raise ConfigError(f"{key}: must be positive, got {value}")
    if not 0 <= retrieval.chunk_overlap_tokens < retrieval.chunk_tokens // 2:
        raise ConfigError("retrieval.chunk_overlap_tokens: must be in [0, chunk_tokens/2)")
    if not 0 < retrieval.direct_budget_fraction <= 1:
        raise ConfigError("retrieval.direct_budget_fraction: must be in (0, 1]")
    # Imported here: the lexical analysis loads bm25s and the stemmers, which commands that read no config
    # (the container's `ragsidecar health`) should not pay for.
    from ragsidecar.knowledge.lexical import LANGUAGES as LEXICAL_LANGUAGES

    if retrieval.lexical_language not in LEXICAL_LANGUAGES:
        raise ConfigError(f"retrieval.lexical_language: {retrieval.lexical_language!r} is not one of "
                          f"{', '.join(LEXICAL_LANGUAGES)}")
    for key, weight in (("retrieval.dense_weight", retrieval.dense_weight),
                        ("retrieval.rerank_weight", retrieval.rerank_weight)):
        if not 0 <= weight <= 1:
            raise ConfigError(f"{key}: must be in [0, 1], got {weight}")
    for key, port in (("server.port", config.server.port), ("metrics.port", config.metrics.port),
                      ("http.port", config.http.port)):
        if not 0 <= port <= 65535:
            raise ConfigError(f"{key}: {port} is not a port number")
    if bool(config.tls.cert_file) != bool(config.tls.key_file):
        raise ConfigError("tls: cert_file and key_file must be set together")
    seen: set[str] = set()
    for i, model in enumerate(config.models):
        where = f"models[{i}]"
        if not model.id.strip():
            raise ConfigError(f"{where}.id: must not be empty")
        if model.id in seen:
            raise ConfigError(f"{where}.id: {model.id!r} is configured twice")
        seen.add(model.id)
        if model.max_length < 16:
            raise ConfigError(f"{where}.max_length: must be at least 16, got {model.max_length}")
        if not 0 <= model.window_overlap < model.max_length // 2:
            raise ConfigError(f"{where}.window_overlap: must be in [0, max_length/2)")
        if model.max_chunks_per_document < 1:
            raise ConfigError(f"{where}.max_chunks_per_document: must be at least 1")
        if model.hub:
            _validate_hub(model.hub, f"{where}.hub")
            continue  # its files are fetched when it loads
        folder = config.model_dir(model)
        for name in ("model.onnx", "tokenizer.json"):
            if check_files and not (folder / name).is_file():
                raise ConfigError(f"{where}.path: {folder / name} does not exist (run `ragsidecar models install`)")
    embedders = [m.id for m in config.models if m.kind == "bi-encoder"]
    if config.retrieval.embedder and config.retrieval.embedder not in embedders:
        raise ConfigError(f"retrieval.embedder: {config.retrieval.embedder!r} is not a configured bi-encoder "
                          f"(configured: {', '.join(embedders) or 'none'}; \"\" disables retrieval)")
    if sum(m.default for m in config.models) > 1:
        raise ConfigError("models: more than one model is marked default")
    _validate_store(config.store)


def _validate_hub(hub: str, where: str) -> None:
    from ragsidecar.hub_models import HubRef  # no huggingface_hub import: only the id's syntax is checked

    try:
        HubRef.parse(hub)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None


def _validate_store(store: StoreConfig) -> None:
    for key, value in (("store.pool_size", store.pool_size), ("store.connect_timeout_s", store.connect_timeout_s),
                       ("store.health_interval_s", store.health_interval_s)):
        if value <= 0:
            raise ConfigError(f"{key}: must be positive, got {value}")
    if not store.dsn_env.strip():
        raise ConfigError("store.dsn_env: must name an environment variable")
    if store.embedding_cache_rows < 0:
        raise ConfigError(f"store.embedding_cache_rows: must be 0 or more, got {store.embedding_cache_rows}")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve anywhere
        return False

