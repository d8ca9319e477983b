"""Prometheus metrics, exposed on their own port (metrics.port in the config)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

# gRPC requests by method and status code name; HTTP ones by path ("unmatched" for any other) and HTTP status.
REQUESTS = Counter("ragsidecar_requests_total", "gRPC and HTTP requests by method and status code", ["method", "code"])
LATENCY = Histogram(
    "ragsidecar_request_seconds",
    "gRPC and HTTP request latency by method",
    ["method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUEUE_DEPTH = Gauge("ragsidecar_queue_depth", "Model inputs waiting in a model's batching queue", ["model"])
INFERRED_INPUTS = Counter("ragsidecar_inferred_inputs_total", "Model inputs run through a model", ["model"])
SKIPPED_INPUTS = Counter(
    "ragsidecar_skipped_inputs_total",
    "Queued model inputs never run because their request was cancelled or timed out",
    ["model", "reason"],
)
BATCH_SIZE = Histogram(
    "ragsidecar_batch_inputs", "Inputs per scheduled batch", ["model"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
)
INFERENCE_FAILURES = Counter(
    "ragsidecar_inference_failures_total",
    "Batches whose run or scheduling failed in an inference worker (their requests failed)",
    ["model"],
)
LOADED_MODELS = Gauge(
    "ragsidecar_loaded_model_instances",
    "Models holding an onnxruntime session: the serving ones, and replaced ones until their last request ends",
)
TOKENIZING = Gauge("ragsidecar_tokenizations_running", "Requests being tokenized on a worker thread", ["model"])
STOPPED_WORK = Counter(
    "ragsidecar_stopped_work_total",
    "Tokenizations stopped part-way because their caller had gone, by reason: cancelled or deadline",
    ["model", "reason"],
)
CACHE_HITS = Counter("ragsidecar_rerank_cache_hits_total", "Rerank pairs answered from the result cache", ["model"])
MODEL_RELOADS = Counter("ragsidecar_model_reloads_total", "Configuration reloads by outcome", ["outcome"])
SEQUENTIAL_CURSORS = Gauge(
    "ragsidecar_sequential_cursors",
    "SEQUENTIAL cursors kept, in memory or (postgres store) in the database as last counted "
    "by this replica (bounded by retrieval.max_sequential_cursors)",
)


def serve_metrics(host: str, port: int) -> int:
    """Starts the exposition server; returns the port it listens on."""
    server, _ = start_http_server(port, addr=host)
    return server.server_port


INDEX_LOADS = Counter(
    "ragsidecar_index_loads_total", "Knowledge indexes made ready, by how: built (embedded) or read from disk", ["how"]
)
EMBEDDED_CHUNKS = Counter("ragsidecar_embedded_chunks_total", "Knowledge chunks run through the embedder")
OPEN_BINDINGS = Gauge("ragsidecar_open_bindings", "Chat bindings open (bounded by retrieval.max_open_bindings)")
CLOSED_BINDINGS = Counter(
    "ragsidecar_closed_bindings_total",
    "Chat bindings released, by why: closed by the caller, lru (over the cap) or idle",
    ["why"],
)
CACHE_BYTES = Gauge(
    "ragsidecar_cache_bytes", "Estimated bytes held by a bounded in-memory cache or store, by name", ["cache"]
)
CACHE_ENTRIES = Gauge(
    "ragsidecar_cache_entries", "Entries held by a bounded in-memory cache or store, by name", ["cache"]
)
INDEX_BUILDS_JOINED = Counter(
    "ragsidecar_index_builds_joined_total", "Index loads that awaited a build of the same index already in flight"
)
LEFTOVERS_SWEPT = Counter(
    "ragsidecar_leftovers_swept_total",
    "Files and folders left by killed writes or superseded indexes, removed at start-up",
)
STORE_UP = Gauge(
    "ragsidecar_store_up", "1 while the shared store's database (postgres backend) answers its probe, else 0"
)
SHARED_EMBEDDINGS = Gauge(
    "ragsidecar_shared_embeddings",
    "Rows of the embedding cache shared by replicas (postgres store; bounded by "
    "store.embedding_cache_rows), as last counted by this replica",
)
SHARED_EMBEDDING_HITS = Counter(
    "ragsidecar_shared_embedding_hits_total",
    "Chunk vectors found in the embedding cache shared by replicas instead of embedded",
)
STORE_PURGED_DOCUMENTS = Counter(
    "ragsidecar_store_purged_documents_total", "Expired MEMORY and binding documents removed by the purge"
)
STORE_FILLED_CHUNKS = Counter(
    "ragsidecar_store_filled_chunks_total",
    "MEMORY chunks (postgres store) cut and embedded on load for documents another replica's embedder wrote",
)
STORE_CHANGE_LOG_ENTRIES = Gauge(
    "ragsidecar_store_change_log_entries",
    "Removed chunk keys in the postgres store's change log, every partition's, as last "
    "counted by this replica (at most once a minute, after a write that logged some); "
    "at most 10,000 per space",
)
STORE_CHANGE_LOG_PRUNED = Counter(
    "ragsidecar_store_change_log_pruned_total",
    "Removed chunk keys pruned from the postgres store's change log past its bound per "
    "space (replicas further behind reload the space)",
)

INDEX_COMPACTIONS = Counter(
    "ragsidecar_index_compactions_total",
    "Indexes rebuilt from their live chunks in the background once removed chunks outnumbered them",
)
INDEX_COMPACTIONS_PENDING = Gauge(
    "ragsidecar_index_compactions_pending", "Indexes waiting for the background compaction thread"
)
INDEX_SNAPSHOTS = Counter(
    "ragsidecar_index_snapshots_total",
    "Partition index snapshots, by what became of them: written (in the background), refused at load "
    "(torn, altered or stale: the partition was rebuilt from its rows), shared (written to the PostgreSQL "
    "database for replicas with none) or fetched (a shared one downloaded by a replica with none)",
    ["how"],
)
INDEX_SEARCHES_WAITING = Gauge(
    "ragsidecar_index_searches_waiting",
    "Index searches waiting their turn (at most index.SEARCHES_AT_ONCE run at once; one per searching thread)",
)
INDEX_SNAPSHOTS_PENDING = Gauge(
    "ragsidecar_index_snapshots_pending", "Partition indexes with changes not yet in their snapshot"
)
PARTITION_CATCH_UPS = Counter(
    "ragsidecar_partition_catch_ups_total",
    "Searches of a MEMORY or binding partition that first applied changes to its resident "
    "index, by how: changes (from the change log) or reload (the whole partition)",
    ["how"],
)
WATCHED_SOURCES = Gauge(
    "ragsidecar_watched_sources",
    "DIRECTORY sources whose folders a file watcher covers (bounded by retrieval.max_watched_sources)",
)
WATCH_FAILURES = Counter(
    "ragsidecar_watch_failures_total",
    "Folders the file watcher could not watch (inotify limits): their sources rescan at retrieval.rescan_interval_s",
)
SOURCE_SCANS = Counter(
    "ragsidecar_source_scans_total",
    "Searches and loads of FILE and DIRECTORY sources that listed and stat'ed the files (no watch said unchanged)",
)

HTTP_CONNECTIONS = Gauge("ragsidecar_http_connections", "HTTP connections open")
HTTP_CONNECTIONS_CLOSED = Counter(
    "ragsidecar_http_connections_closed_total",
    "HTTP connections the sidecar closed or refused, by why: refused (past http.max_connections with a request "
    "in flight on every connection), evicted (idle, closed to make room), slow_request (not arrived within "
    "http.request_timeout_s), accept_failed (no file descriptor left)",
    ["why"],
)


def track_size(cache: str, sized: Any) -> None:
    """Exposes a bounded cache's `len()` and `.bytes` as ragsidecar_cache_entries/_bytes{cache=...}."""
    CACHE_ENTRIES.labels(cache).set_function(lambda: len(sized))
    CACHE_BYTES.labels(cache).set_function(lambda: sized.bytes)
