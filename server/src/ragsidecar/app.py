"""The application: builds the runtime once (model registry, reranker, embedder, storage backend, retrieval runtime)
and serves it over gRPC (with health and reflection) and, when configured, the HTTP API; reload on SIGHUP or a
changed config file, the background purge of expired documents, and graceful shutdown. The transports (`api`,
`http`) know nothing of each other: this module, above both, is the one place that starts them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ragsidecar import metrics, tracing
from ragsidecar.api.chat_service import ChatKnowledgeService
from ragsidecar.api.interceptors import (
    AccessLogInterceptor,
    AuthInterceptor,
    DecodeGuardInterceptor,
    TracingInterceptor,
)
from ragsidecar.api.reranker_service import RerankerService
from ragsidecar.api.retrieval_service import RetrievalService
from ragsidecar.auth import BearerToken
from ragsidecar.config import Config, ConfigError, ServerConfig
from ragsidecar.config_loading import load_config
from ragsidecar.embedding import Embedder
from ragsidecar.inference.heap import trim_as_memory_grows
from ragsidecar.inference.registry import ModelRegistry
from ragsidecar.knowledge.runtime import RetrievalRuntime
from ragsidecar.reranking import Reranker
from ragsidecar.store.factory import open_backend
from ragsidecar.v1 import (
    chat_knowledge_pb2,
    chat_knowledge_pb2_grpc,
    reranker_pb2,
    reranker_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
)

if TYPE_CHECKING:
    from ragsidecar.http.listener import HttpListener

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    reranker_pb2.DESCRIPTOR.services_by_name["RerankerService"].full_name,
    retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"].full_name,
    chat_knowledge_pb2.DESCRIPTOR.services_by_name["ChatKnowledgeService"].full_name,
)
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class Sidecar:
    def __init__(self, config_path: Path, config: Config, environ: dict[str, str]) -> None:
        self._config_path = config_path
        # The environment (and command-line overrides) the config was read with; reloads reuse it.
        self._environ = environ
        self._config = config
        self.registry = ModelRegistry(config)
        # The storage backend ([store] backend); started by `listen`.
        self.backend = open_backend(config, environ)
        self._health = health.aio.HealthServicer()
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()
        self._model_health_names: set[str] = set()
        self._background: set[asyncio.Task] = set()
        # The start-up load of the models, which a stop cancels: a load finishing after the stop would leave
        # inference workers running into the event loop's teardown, which cancels them as if they had failed.
        self._loading: asyncio.Task | None = None
        inference = config.inference
        self.reranker = Reranker(self.registry, inference.max_documents_per_request, inference.cache_bytes)
        self._server = self._build_server()
        # The HTTP listener ([http] port), started by `listen`; its URL once it serves.
        self._http: HttpListener | None = None
        self.http_url: str | None = None
        # The overall health (the health service's "" entry), which the HTTP API's /health reports too.
        self.serving = False
        self.addresses: list[str] = []
        self.metrics_port: int | None = None

    def _build_server(self) -> grpc.aio.Server:
        config = self._config
        interceptors: list[grpc.aio.ServerInterceptor] = [AccessLogInterceptor()]
        if tracing.enabled():  # outermost, so that the access log line falls inside the call's span
            interceptors.insert(0, TracingInterceptor())
        token = config.bearer_token()
        if token:
            interceptors.append(AuthInterceptor(token))
        # Innermost: authentication, when it refuses a call, replaces the decoder this one installs.
        interceptors.append(DecodeGuardInterceptor(config.server.max_message_fields))
        server = grpc.aio.server(interceptors=interceptors, options=_grpc_options(config.server))
        reranker_pb2_grpc.add_RerankerServiceServicer_to_server(RerankerService(self.registry, self.reranker), server)
        runtime = RetrievalRuntime(config, self.registry, self.reranker, self.backend)
        self._runtime = runtime
        retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(RetrievalService(runtime), server)
        chat = ChatKnowledgeService(runtime, config.retrieval)
        chat_knowledge_pb2_grpc.add_ChatKnowledgeServiceServicer_to_server(chat, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        return server

    def _credentials(self) -> grpc.ServerCredentials | None:
        tls = self._config.tls
        if not tls.cert_file:
            return None
        key, cert = self._config.resolve(tls.key_file).read_bytes(), self._config.resolve(tls.cert_file).read_bytes()
        return grpc.ssl_server_credentials([(key, cert)])

    async def listen(self) -> None:
        """Starts serving at once; health says NOT_SERVING until load_models has warmed the models.

        The store's database is connected (and migrated) first: a schema this build cannot use stops start-up, an
        unreachable database does not (retrieval and chat say NOT_SERVING until the probe reaches it)."""
        self.backend.on_health_change(lambda _healthy: self._schedule_health_refresh())
        await self.backend.start()
        await self._refresh_health()
        credentials = self._credentials()
        server_config = self._config.server
        targets = [f"{server_config.host}:{server_config.port}"]
        if server_config.unix_socket:
            targets.append(f"unix:{self._config.resolve(server_config.unix_socket)}")
        for target in targets:
            port = (
                self._server.add_secure_port(target, credentials)
                if credentials
                else self._server.add_insecure_port(target)
            )
            self.addresses.append(target if target.startswith("unix:") else f"{server_config.host}:{port}")
        await self._server.start()
        if self._config.http.port:
            self._http = self._build_http()
            self.http_url = await self._http.start()
        if self._config.metrics.port:
            self.metrics_port = metrics.serve_metrics(self._config.metrics.host, self._config.metrics.port)

    def _build_http(self) -> HttpListener:
        # The HTTP stack loads only when it serves.
        from ragsidecar.http.app import Services
        from ragsidecar.http.body import JsonCaps
        from ragsidecar.http.listener import HttpListener

        token = self._config.bearer_token()
        embedder = Embedder(self.registry, self._config.inference.max_documents_per_request)
        services = Services(
            self.registry,
            self.reranker,
            embedder,
            BearerToken(token) if token else None,
            JsonCaps(self._config.server.max_message_bytes, self._config.inference.max_documents_per_request),
            lambda: self.serving,
        )
        return HttpListener(self._config, services)

    async def load_models(self) -> bool:
        """Loads the configured models; False when the sidecar was stopped first (what had loaded is closed)."""
        self.registry.on_change(self._schedule_health_refresh)
        self._loading = asyncio.get_running_loop().create_task(self.registry.start())
        try:
            await self._loading
        except asyncio.CancelledError:
            if not self._stopping.is_set():
                raise
            return False
        await self._refresh_health()
        return True

    def _schedule_health_refresh(self) -> None:
        task = asyncio.get_running_loop().create_task(self._refresh_health())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _refresh_health(self) -> None:
        """Per-model entries ("<RerankerService>/<model id>") and the services' overall status."""
        if self._stopping.is_set():
            return
        names = set()
        for status in self.registry.statuses():
            name = f"{SERVICE_NAMES[0]}/{status.spec.id}"
            names.add(name)
            await self._health.set(name, SERVING if self.registry.is_ready(status.spec.id) else NOT_SERVING)
        for gone in self._model_health_names - names:
            await self._health.set(gone, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        self._model_health_names = names
        default = self._config.default_model()
        embedder = self._config.retrieval.embedder
        store_up = self.backend.healthy
        ready = {
            SERVICE_NAMES[0]: default is None or self.registry.is_ready(default.id),
            SERVICE_NAMES[1]: bool(embedder) and self.registry.is_ready(embedder) and store_up,
        }
        ready[SERVICE_NAMES[2]] = ready[SERVICE_NAMES[1]]
        for name, up in ready.items():
            await self._health.set(name, SERVING if up else NOT_SERVING)
        # Overall: every enabled service is up (a sidecar configured without an embedder only reranks). While the
        # store's database is unreachable retrieval and chat are down, so the overall entry is too; Rerank serves.
        overall = ready[SERVICE_NAMES[0]] and (ready[SERVICE_NAMES[1]] or not embedder)
        self.serving = overall
        await self._health.set("", SERVING if overall else NOT_SERVING)

    async def _set_health(self, status: int) -> None:
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status)

    async def reload(self) -> bool:
        """Re-reads the config file and swaps the model set; a bad file keeps the old set serving.

        Only [models] and [inference] take effect on reload; listener, auth and TLS settings need a restart.
        """
        try:
            config = load_config(self._config_path, self._environ)
        except ConfigError as err:
            self.registry.last_reload_error = f"ConfigError: {err}"
            log.error("configuration reload refused, the previous models keep serving: %s", err)
            metrics.MODEL_RELOADS.labels("failed").inc()
            return False
        ok = await self.registry.reload(config)
        if ok:
            self._config = config
        return ok

    async def watch_config(self) -> None:
        """Reloads when the config file's modification time changes (polling: no extra dependency)."""
        interval = self._config.server.config_poll_s
        if interval <= 0:
            return
        last = _mtime(self._config_path)
        while not self._stopping.is_set():
            await asyncio.sleep(interval)
            current = _mtime(self._config_path)
            if current != last:
                last = current
                log.info("config file %s changed; reloading", self._config_path)
                await self.reload()

    async def purge_expired(self) -> None:
        """Removes expired MEMORY and binding documents every [store] purge_interval_s, each store at most
        interface.PURGE_BOUND documents a round (they are invisible from their expiry on, purged or not)."""
        interval = self._config.store.purge_interval_s
        catalog = self._runtime.catalog
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
                return
            for store in (catalog.memory, catalog.bindings):
                try:
                    metrics.STORE_PURGED_DOCUMENTS.inc(await store.purge(time.time_ns()))
                except Exception:  # the store unreachable: the next round tries again
                    log.warning("purging expired documents failed", exc_info=True)

    async def stop(self) -> None:
        """Stops accepting calls and lets in-flight ones finish within the grace period."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._loading is not None:
            self._loading.cancel()
        self.serving = False
        await self._set_health(NOT_SERVING)
        for name in self._model_health_names:
            await self._health.set(name, NOT_SERVING)
        log.info("shutting down; draining in-flight calls for up to %.1fs", self._config.server.shutdown_grace_s)
        await asyncio.gather(
            self._server.stop(self._config.server.shutdown_grace_s), *([self._http.stop()] if self._http else [])
        )
        await self._runtime.close()
        await self.registry.close()
        await self.backend.close()
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


def _grpc_options(server: ServerConfig) -> list[tuple[str, int]]:
    """Message size limits, and connection idle and age limits (0: none)."""
    limit = server.max_message_bytes
    options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    if server.max_connection_idle_s:
        options.append(("grpc.max_connection_idle_ms", round(server.max_connection_idle_s * 1000)))
    if server.max_connection_age_s:
        options.append(("grpc.max_connection_age_ms", round(server.max_connection_age_s * 1000)))
        options.append(("grpc.max_connection_age_grace_ms", round(server.shutdown_grace_s * 1000)))
    return options


def _mtime(path: Path) -> int:
    with contextlib.suppress(OSError):
        return path.stat().st_mtime_ns
    return 0


async def serve(config_path: Path, config: Config, environ: dict[str, str]) -> None:
    """Runs the sidecar until SIGTERM or SIGINT; SIGHUP reloads the configuration."""
    tracing.configure()
    sidecar = Sidecar(config_path, config, environ)
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task] = set()

    def spawn(coroutine: Coroutine[Any, Any, object]) -> None:
        task = loop.create_task(coroutine)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: spawn(sidecar.stop()))
    loop.add_signal_handler(signal.SIGHUP, lambda: spawn(sidecar.reload()))
    await sidecar.listen()
    for address in sidecar.addresses:
        print(f"ragsidecar listening on {address}", flush=True)
    if sidecar.http_url:
        print(f"ragsidecar http on {sidecar.http_url}", flush=True)
    if sidecar.metrics_port:
        print(f"ragsidecar metrics on http://{config.metrics.host}:{sidecar.metrics_port}/metrics", flush=True)
    if await sidecar.load_models():
        print("ragsidecar ready: models: " + ", ".join(s.spec.id for s in sidecar.registry.statuses()), flush=True)
        spawn(sidecar.watch_config())
        spawn(trim_as_memory_grows())
        spawn(sidecar.purge_expired())
    await sidecar.wait_stopped()
    await asyncio.to_thread(tracing.shutdown)  # the last calls' spans go out before the process ends
