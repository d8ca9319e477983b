"""The sidecar's configuration schema: every key of the TOML file, with its type and bounds on its field.

Every table is a frozen msgspec Struct below, so no key goes unchecked: an unknown key, a wrong type or a value out
of bounds is refused by the loader (config_loading.py) with a ConfigError that names the key and the allowed range.
Rules that span keys, or that a type cannot say, live in the loader's checks.

msgspec, not pydantic: the config is loaded on every command's path (the container's `ragsidecar health`
included), and importing msgspec and declaring this schema cost about a fifth of pydantic's (44-64 ms against
200-313 ms in one process, measured side by side).
"""

from __future__ import annotations

import ipaddress
import os
import typing
from pathlib import Path
from typing import Annotated, Literal

import msgspec

# Bounds shared by many keys. Every numeric key declares at least a lower bound (tests/unit/test_config.py).
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]  # 0: a free port, or off where the key says so
Positive = Annotated[int, msgspec.Meta(ge=1)]  # counts, sizes and limits that 0 would make useless
NonNegative = Annotated[int, msgspec.Meta(ge=0)]  # overlaps, and sizes where 0 turns the feature off
Seconds = Annotated[float, msgspec.Meta(gt=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
# How a hybrid search fuses its dense and BM25 lists, and how a rerank fuses the reranker's order with the
# retrieval's (knowledge/fusion.py implements each).
FusionMethod = Literal["rrf", "weighted_rrf", "convex", "minmax", "zscore", "adaptive"]
RerankFusion = Literal["rrf", "interpolate"]


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the problem."""


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A table of the file: its keys are its fields, and nothing else is accepted."""


class ServerConfig(_Section, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 50151
    # Optional Unix domain socket path served beside TCP; empty disables it.
    unix_socket: str = ""
    # gRPC's own default is 4 MiB, too small for batches of long documents; gRPC counts in a C int. A request
    # is held about three times while it is received (gRPC's buffers, its copy into Python, the copy's bytes),
    # so 48 MiB keeps the largest one under 200 MiB of memory.
    max_message_bytes: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = 48 * 1024 * 1024
    # Fields one gRPC request may hold, each item of a repeated field counted, at any depth. They are counted on
    # the wire before the request is parsed, since parsing costs per field (about 60 bytes and 0.3 us each).
    max_message_fields: Annotated[int, msgspec.Meta(ge=1)] = 262144
    # Seconds that in-flight calls get to finish after SIGTERM/SIGINT.
    shutdown_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    # Seconds between checks of the config file's modification time; 0 disables the watch.
    config_poll_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    # Seconds an idle gRPC connection stays open (its client reconnects when it next calls); 0: no limit.
    max_connection_idle_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    # Seconds a gRPC connection lives at most, after which its calls in flight get shutdown_grace_s to finish
    # and its client reconnects; 0: no limit.
    max_connection_age_s: Annotated[float, msgspec.Meta(ge=0)] = 3600.0
    # Serve a host beyond loopback with neither a bearer token nor TLS. Off by default: such a config refuses
    # to start, since whoever reaches the address could read every tenant's knowledge.
    allow_unprotected_remote: bool = False


class AuthConfig(_Section, frozen=True):
    # Bearer token read from this file (stripped); takes precedence over token_env.
    token_file: str = ""
    # Name of the environment variable holding the bearer token; unset or empty disables auth.
    token_env: str = "RAGSIDECAR_TOKEN"


class TlsConfig(_Section, frozen=True):
    cert_file: str = ""
    key_file: str = ""


class MetricsConfig(_Section, frozen=True):
    host: str = "127.0.0.1"
    # Prometheus exposition port; 0 disables metrics.
    port: Port = 9464


class HttpConfig(_Section, frozen=True):
    """The optional HTTP listener (Cohere-, Jina- and TEI-style rerank, OpenAI-style embeddings) beside gRPC.

    It shares the models, queues, caches, metrics, token and TLS of the gRPC listener; its request bodies are
    bounded by server.max_message_bytes."""

    host: str = "127.0.0.1"
    # 0 disables the listener (the default).
    port: Port = 0
    # Seconds a connection with no request in flight stays open: new, idle after a response, or partway
    # through a request head.
    idle_timeout_s: Seconds = 5.0
    # Seconds a request's head and body have, from its first byte, to arrive in full; a slower one is dropped.
    request_timeout_s: Seconds = 30.0
    # Connections open at once, and at most a quarter of the process's file descriptors. A connection past the cap
    # closes the longest-idle one with no request in flight, or is refused when every one has a request.
    max_connections: Positive = 512


class InferenceConfig(_Section, frozen=True):
    # Threads inside one onnxruntime run. 1 lets `workers` runs proceed in parallel without contention.
    intra_op_threads: Positive = 1
    inter_op_threads: Positive = 1
    # Concurrent inference runs per model (each on its own thread).
    workers: Positive = 2
    # Token budget of one scheduling batch (TEI's max-batch-tokens).
    max_batch_tokens: Positive = 16384
    # Pairs that may wait per model before requests get RESOURCE_EXHAUSTED.
    max_queued_pairs: Positive = 20000
    # Most documents one Rerank request may carry.
    max_documents_per_request: Positive = 1000
    # Bytes the rerank result cache may hold; 0 disables it.
    cache_bytes: NonNegative = 32 * 1024 * 1024
    # "auto": one sequence per run for dynamically quantized graphs (their scores depend on
    # batch-mates), padded batches otherwise; "sequence" or "padded" force a mode.
    batch_mode: Literal["auto", "sequence", "padded"] = "auto"


class RetrievalConfig(_Section, frozen=True):
    # Bi-encoder model (an id of [[models]]) that embeds knowledge chunks and queries.
    embedder: str = "bge-small-en-v1.5"
    # Prepended to queries (not documents) before embedding, as the embedder was trained (bge's instruction).
    query_prefix: str = "Represent this sentence for searching relevant passages: "
    # Chunk size and overlap, in the embedder's tokens (the overlap also below half the size: the loader checks).
    chunk_tokens: Positive = 256
    chunk_overlap_tokens: NonNegative = 32
    # Files larger than this are refused (LIMIT_EXCEEDED) before they are read.
    max_file_bytes: Positive = 50 * 1024 * 1024
    # Depth of the dense and BM25 candidate lists fused into one.
    fusion_candidates: Positive = 100
    # Fused candidates reranked when an entry asks for rerank without saying how many. 3: on the hybrid with
    # feedback no depth, cut or cascade of ms-marco-MiniLM-L-12-v2 beat rerank off by more than 0.002 nDCG@10 over
    # five sets (bench/rerank_cascade.py, leave-one-set-out: three folds picked 3 at weight 0.15), and 3 whole
    # documents cost 0.3x the cross-encoder time of 0.2.0's 10.
    rerank_candidates: Positive = 3
    # Analysis of the BM25 side: a Snowball language (its stopwords removed, words stemmed) or "none" (words as
    # written, English stopwords). Part of every index's key: changing it rebuilds the indexes.
    lexical_language: str = "english"
    # How the dense and BM25 lists become one (knowledge/fusion.py): "rrf" (reciprocal rank fusion, equal
    # weights), "weighted_rrf", or a weighted sum of scores scaled per list: "convex" (theoretical min-max),
    # "minmax", "zscore", or "adaptive" ("minmax" with a dense weight per query from the spread of the dense list's
    # cosines). "adaptive" at 0.625, gain 30, over 100-deep lists: picked by leave-one-set-out cross-validation
    # over SciFact, Cranfield, MED, NPL and LISA (bench/beir.py); the only fusion measured at or above the better
    # single list (less 0.005) on all five.
    fusion: FusionMethod = "adaptive"
    # The dense list's weight in every fusion but "rrf"; the BM25 list gets 1 - dense_weight. Under "adaptive",
    # the weight of a dense list of typical spread (cosines' standard deviation 0.0235, bge-small's mean).
    dense_weight: Fraction = 0.625
    # dense_weight for the documents a host writes (MEMORY and chat bindings' corpora): short turns and notes,
    # where BM25 holds up better against the dense list than on documents. On LoCoMo's development half (R@5 / R@10)
    # 0.625 gave 0.642 / 0.743, 0.45 0.671 / 0.766, 0.3 0.675 / 0.767 but open-domain questions 0.04 R@10 below
    # 0.45; the leave-one-conversation-out folds picked 0.3 (four) and 0.45 (one), held out 0.665 / 0.766
    # (bench/memory.py --loco, docs/retrieval.md). File sources keep dense_weight.
    memory_dense_weight: Fraction = 0.45
    # fusion for the same written documents. "minmax" (adaptive's scaling without its spread gain): on LoCoMo's
    # development half it lifted the default 0.011 R@5 / R@10 over "adaptive" at 0.45, "zscore" by as much (the
    # leave-one-conversation-out folds over fusion, dense weight and feedback, in-process, all picked zscore 0.45),
    # but z-scores stretch a flat dense list (near-identical notes) past the one BM25 hit of an identifier, which
    # min-max at a dense weight below 0.5 does not (tests/server/test_quality.py). File sources keep `fusion`.
    memory_fusion: FusionMethod = "minmax"
    # In a hybrid search of written documents: the share of a conversation turn's best neighbour's fused score (the
    # turn before or after it in its session, among the fused candidates) added to its own; 0 turns it off. Chosen
    # by leave-one-conversation-out on LoCoMo's development half (bench/memory.py --loco, docs/retrieval.md).
    memory_neighbour_weight: Fraction = 0.5
    # Under "adaptive": how much the dense weight rises per unit of standard deviation of the dense list's cosines
    # above the typical spread (and falls below it), within [0.1, 0.9]; 0 is "minmax". Tuned for bge-small's cosines.
    dense_spread_gain: Annotated[float, msgspec.Meta(ge=0, le=100)] = 30.0
    # Pseudo-relevance feedback in a hybrid search (knowledge/fusion.py with_feedback): the best this many fused
    # candidates stand for what the query means (0: off), and each candidate's similarity to them weighs
    # feedback_weight against its fused score. 2 at 0.5: every leave-one-set-out fold over the five sets picked 2
    # documents, at 0.5 or 0.6 (bench/beir.py); 0.5 lowers no set and adds 0.010 nDCG@10 to their mean. It costs a
    # few hundred dot products, and applies over at least 100 fused candidates (fusion.FEEDBACK_MIN_CANDIDATES).
    feedback_documents: Annotated[int, msgspec.Meta(ge=0, le=100)] = 2
    feedback_weight: Fraction = 0.5
    # How a rerank with rerank_order FUSED combines the reranker's relevance with the retrieval order: "rrf"
    # (reciprocal rank fusion of the two orders) or "interpolate" (rerank_weight * scaled relevance +
    # (1 - rerank_weight) * scaled retrieval score over the reranked head).
    rerank_fusion: RerankFusion = "interpolate"
    # The reranker's weight in "interpolate" (see rerank_candidates).
    rerank_weight: Fraction = 0.15
    # A FUSED rerank scores each document cut to its first rerank_document_tokens tokens (0: as many as the
    # reranker's window holds), then, when rerank_head_candidates is above 0 and below the rerank depth, scores
    # the new top rerank_head_candidates whole (a cascade; knowledge/ranking.py's rerank_passes).
    rerank_document_tokens: Annotated[int, msgspec.Meta(ge=0, le=8192)] = 0
    rerank_head_candidates: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 0
    # Most tokens of an Enforce context when the request sets no max_context_tokens.
    context_window_tokens: Positive = 8192
    # Share of the model's input window that DIRECT entries without max_tokens may take together.
    direct_budget_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.25
    index_dtype: Literal["f16", "i8"] = "f16"
    index_threads: Positive = 1
    # Most documents one UpsertDocuments call may carry.
    max_memory_documents_per_request: Positive = 1000
    # Most UTF-8 bytes (ids, texts, metadata) one UpsertDocuments or AppendToBinding call may carry.
    max_memory_bytes_per_request: Positive = 16 * 1024 * 1024
    # Estimated bytes of loaded indexes (with their last-good copies) kept in memory, least recently used
    # evicted first; an evicted persisted index is read back from disk, a MEMORY one rebuilt from cached vectors.
    index_cache_bytes: Positive = 1024 * 1024 * 1024
    # Bytes of persisted MEMORY partitions kept in memory (least recently used evicted; read back on demand).
    memory_cache_bytes: Positive = 1024 * 1024 * 1024
    # Bytes all open chat bindings' live corpora may hold together (server memory only); an append past it
    # is RESOURCE_EXHAUSTED.
    binding_store_bytes: Positive = 256 * 1024 * 1024
    # Watch DIRECTORY sources' folders for changes (inotify), so that a Search of an unchanged source stats no
    # file; false, or where events do not arrive, a source is scanned again once its last scan is older than
    # rescan_interval_s. At most max_watched_sources folders are watched (least recently searched released).
    watch_files: bool = True
    max_watched_sources: Positive = 64
    rescan_interval_s: Seconds = 10.0
    # Chat bindings open at once across all tenants; opening one more closes the least recently used.
    max_open_bindings: Positive = 10_000
    # A chat binding unused this long (seconds) is closed, as if its host had closed it.
    binding_idle_seconds: Seconds = 86_400.0
    # SEQUENTIAL cursors kept in memory (least recently used forgotten: its next dispatch starts again from
    # the first unit, as after a restart). At least 1: with none kept, every cursor was forgotten as soon as it
    # was stored and every dispatch handed out the first unit again.
    max_sequential_cursors: Positive = 100_000
    # Input windows (tokens) of LLMs by model id, added to the built-in table; used when a request
    # names a model without giving its window.
    model_windows: dict[str, Positive] = msgspec.field(default_factory=dict)


class PathsConfig(_Section, frozen=True):
    models_dir: str = "../models"
    data_dir: str = "../data"
    # Every knowledge path must resolve (after symlinks) inside one of these folders; relative knowledge
    # paths resolve against the first. Empty: no file knowledge can be read.
    knowledge_roots: tuple[str, ...] = ()


class ModelConfig(_Section, frozen=True):
    id: str
    kind: Literal["cross-encoder", "bi-encoder"]
    # Folder holding model.onnx and tokenizer.json; relative paths resolve against models_dir. Default: the id.
    path: str = ""
    # "ORG/NAME[@REVISION]": a model hub's ONNX export, fetched into the folder on the first start (as
    # `ragsidecar models install ORG/NAME@REVISION --id ID` does) and found through models.lock afterwards.
    hub: str = ""
    max_length: Annotated[int, msgspec.Meta(ge=16)] = 512
    # Bi-encoders only: how token vectors become one vector.
    pooling: Literal["cls", "mean"] = "cls"
    long_document_strategy: Literal["truncate", "window"] = "truncate"
    # Windowing: tokens shared by neighbouring windows (also below half of max_length: the loader checks), and most
    # windows scored per document.
    window_overlap: NonNegative = 64
    max_chunks_per_document: Positive = 4
    # Used when a Rerank request names no model.
    default: bool = False


class StoreConfig(_Section, frozen=True):
    # Where MEMORY documents, chat bindings, SEQUENTIAL cursors and the embedding cache live: "embedded" (this
    # pod's disk and memory) or "postgres" (shared by every replica; needs `pip install ragsidecar[postgres]`).
    backend: Literal["embedded", "postgres"] = "embedded"
    # Name of the environment variable holding the PostgreSQL DSN. The DSN never comes from this file (it holds
    # a password) and is never logged or printed.
    dsn_env: str = "RAGSIDECAR_STORE_DSN"
    # Connections the pool may open.
    pool_size: Positive = 4
    # Seconds a new connection, or a call waiting for a free one, may take before the store counts as down.
    connect_timeout_s: Seconds = 5.0
    # Seconds between probes of the database, so health flips on loss and recovery without traffic.
    health_interval_s: Seconds = 5.0
    # Row-level security policies on every tenant table, on top of the tenant filter every query carries.
    row_level_security: bool = False
    # Apply pending migrations at start-up; false: only check the schema's version (`ragsidecar db migrate`).
    migrate_on_start: bool = True
    # Rows of the embedding cache shared by replicas (least recently used deleted past it); 0: not shared.
    embedding_cache_rows: NonNegative = 1_000_000
    # Whose cached vectors of caller-sent text (MEMORY, bindings, INLINE) a tenant may reuse: "all" (as the
    # embedded store's in-process cache) or "tenant" (no timing can tell a tenant what another embedded).
    share_embeddings: Literal["all", "tenant"] = "all"
    # Partition index snapshots under data_dir/snapshots (both backends): one is written in the background after
    # this many chunk changes since the last, so a restart or an eviction replays at most about that many; 0: none.
    snapshot_after_changes: NonNegative = 1000
    # ... or once a partition with changes not yet in its snapshot has seen none for this many seconds.
    snapshot_idle_s: Seconds = 10.0
    # postgres: a partition index's snapshot of at least this many chunks is also shared through the database, so
    # a replica with no snapshot of its own loads it instead of building the index; 0: none shared.
    shared_snapshot_chunks: NonNegative = 5000
    # ... replaced at most once in this many seconds (each replacement writes the whole snapshot) ...
    shared_snapshot_interval_s: Seconds = 300.0
    # ... and only while its files hold at most this many bytes (about 5 KB per 384-dimension chunk).
    shared_snapshot_max_bytes: Positive = 2 << 30
    # Seconds between purges of expired MEMORY and binding documents (each removes at most 1,000; an expired
    # document is invisible from its expiry on, whatever the purge).
    purge_interval_s: Seconds = 60.0

    def dsn(self, environ: typing.Mapping[str, str] | None = None) -> str:
        """The DSN from the environment; ConfigError (naming the variable, never a value) when unset."""
        dsn = (os.environ if environ is None else environ).get(self.dsn_env, "").strip()
        if not dsn:
            raise ConfigError(
                f"store: the environment variable {self.dsn_env} (store.dsn_env), which holds the "
                "PostgreSQL DSN of the postgres backend, is not set"
            )
        return dsn


class Config(_Section, frozen=True):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    tls: TlsConfig = msgspec.field(default_factory=TlsConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    inference: InferenceConfig = msgspec.field(default_factory=InferenceConfig)
    paths: PathsConfig = msgspec.field(default_factory=PathsConfig)
    retrieval: RetrievalConfig = msgspec.field(default_factory=RetrievalConfig)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    models: tuple[ModelConfig, ...] = ()
    # Folder of the config file; relative paths resolve against it. Set by the loader, never by the file.
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
        candidates = [m for m in self.models if m.kind == "cross-encoder"] or list(self.models)
        return candidates[0] if candidates else None

    def check_listener_protected(self) -> None:
        """A TCP listener (gRPC, or HTTP when on) beyond loopback needs a bearer token or TLS, unless
        server.allow_unprotected_remote."""
        listeners = [("server.host", self.server.host)] + ([("http.host", self.http.host)] if self.http.port else [])
        remote = [(key, host) for key, host in listeners if not _is_loopback(host)]
        if not remote or self.server.allow_unprotected_remote or self.tls.cert_file or self.bearer_token():
            return
        key, host = remote[0]
        raise ConfigError(
            f"{key}: {host!r} is reachable beyond this machine but neither auth (a bearer "
            "token) nor tls is configured; configure one, or set server.allow_unprotected_remote"
        )

    def bearer_token(self) -> str | None:
        if self.auth.token_file:
            return self.resolve(self.auth.token_file).read_text().strip() or None
        return os.environ.get(self.auth.token_env) or None if self.auth.token_env else None


def bounds(kind: msgspec.inspect.IntType | msgspec.inspect.FloatType) -> str:
    """A numeric key's allowed range in words: "positive", "at least 16", "in [0, 1]"."""
    low = "[" + str(kind.ge) if kind.ge is not None else "(" + str(kind.gt) if kind.gt is not None else "(-inf"
    high = str(kind.le) + "]" if kind.le is not None else str(kind.lt) + ")" if kind.lt is not None else None
    if high is not None:
        return f"in {low}, {high}"
    if kind.gt == 0 or kind.ge == 1 and isinstance(kind, msgspec.inspect.IntType):
        return "positive"
    return f"at least {kind.ge}" if kind.ge is not None else f"more than {kind.gt}"


def schema_keys() -> dict[str, msgspec.inspect.Type]:
    """Every key of the file ("server.port", "models.max_length", "retrieval.model_windows") and its type."""
    keys: dict[str, msgspec.inspect.Type] = {}
    config = msgspec.inspect.type_info(Config)
    assert isinstance(config, msgspec.inspect.StructType)
    for section in config.fields:
        table = section.type.item_type if isinstance(section.type, msgspec.inspect.VarTupleType) else section.type
        for item in table.fields if isinstance(table, msgspec.inspect.StructType) else ():
            keys[f"{section.name}.{item.name}"] = item.type
    return keys


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve anywhere
        return False
