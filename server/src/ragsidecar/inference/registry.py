"""The served model set, swapped whole on configuration reload without failing in-flight requests."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ragsidecar import errors, metrics
from ragsidecar.config import Config, ModelConfig
from ragsidecar.inference.heap import fix_mmap_threshold
from ragsidecar.inference.models import BiEncoder, LoadedModel, load_model

log = logging.getLogger(__name__)


class ModelState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class ModelStatus:
    spec: ModelConfig
    state: ModelState
    is_default: bool
    error: str = ""


@dataclass
class _ModelSet:
    models: dict[str, LoadedModel] = field(default_factory=dict)
    default_id: str | None = None


class ModelRegistry:
    """Holds the serving models. Requests take a model reference, so a swap never pulls one from
    under them: a replaced model's queue finishes its queued work and then stops."""

    def __init__(self, config: Config) -> None:
        fix_mmap_threshold()  # before any model loads: see inference/heap.py
        self._config = config
        self._serving = _ModelSet()
        # Models of the current configuration that are not serving: loading, or failed to load.
        self._pending: dict[str, ModelStatus] = {
            m.id: ModelStatus(m, ModelState.LOADING, m == config.default_model()) for m in config.models
        }
        self.generation = 0
        self.last_reload_error = ""
        self._reload_lock = asyncio.Lock()
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        """Loads every configured model; raises if any fails (the server then refuses to start)."""
        self._serving = await self._build(self._config, _ModelSet())
        self._pending = {}
        self._notify()

    async def reload(self, config: Config) -> bool:
        """Swaps in the models of a new configuration; on any failure keeps the old set serving."""
        async with self._reload_lock:
            try:
                fresh = await self._build(config, self._serving)
            except Exception as err:  # noqa: BLE001 - any load failure must leave the old set serving
                self.last_reload_error = f"{type(err).__name__}: {err}"
                log.error("configuration reload failed, the previous models keep serving: %s", self.last_reload_error)
                metrics.MODEL_RELOADS.labels("failed").inc()
                self._pending = {
                    m.id: ModelStatus(m, ModelState.FAILED, False, self.last_reload_error)
                    for m in config.models
                    if m.id not in self._serving.models
                }
                self._notify()
                return False
            retired = [m for m in self._serving.models.values() if m not in fresh.models.values()]
            self._serving, self._config, self._pending = fresh, config, {}
            self.generation += 1
            self.last_reload_error = ""
            metrics.MODEL_RELOADS.labels("ok").inc()
            for model in retired:
                model.retire()
            log.info("configuration reloaded (generation %d): serving %s", self.generation, ", ".join(fresh.models))
            self._notify()
            return True

    async def close(self) -> None:
        await asyncio.gather(*(m.close() for m in self._serving.models.values()))

    def get(self, model_id: str) -> LoadedModel:
        """The serving model of that id ('' for the default), or a NOT_FOUND / UNAVAILABLE error."""
        model_id = model_id or self._serving.default_id or self._pending_default()
        if model_id in self._serving.models:
            return self._serving.models[model_id]
        if model_id in self._pending:
            status = self._pending[model_id]
            # Models are LOADING only while the sidecar starts (a reload swaps a built set in, or keeps the old).
            if status.state is ModelState.LOADING:
                raise errors.warming_up(model_id)
            raise errors.model_not_ready(model_id, status.error or status.state.value)
        raise errors.unknown_model(model_id, [s.spec.id for s in self.statuses()])

    def _pending_default(self) -> str:
        """The configured default model while it is not serving yet (start-up), so that '' names it."""
        return next((s.spec.id for s in self._pending.values() if s.is_default), "")

    def embedder(self, model_id: str) -> BiEncoder:
        model = self.get(model_id)
        if not isinstance(model, BiEncoder):
            raise errors.unknown_model(
                model_id, [m.id for m in self._serving.models.values() if isinstance(m, BiEncoder)]
            )
        return model

    def is_ready(self, model_id: str) -> bool:
        return model_id in self._serving.models

    def statuses(self) -> list[ModelStatus]:
        """Every configured model in configuration order, serving or not."""
        serving = [
            ModelStatus(m.spec, ModelState.READY, m.id == self._serving.default_id)
            for m in self._serving.models.values()
        ]
        return serving + [s for s in self._pending.values() if s.spec.id not in self._serving.models]

    async def _build(self, config: Config, current: _ModelSet) -> _ModelSet:
        default = config.default_model()
        fresh = _ModelSet(default_id=default.id if default else None)
        loaded: list[LoadedModel] = []
        try:
            for spec in config.models:
                folder = config.model_dir(spec)
                old = current.models.get(spec.id)
                if old is not None and old.same_as(spec, folder, config.inference):
                    fresh.models[spec.id] = old
                    continue
                log.info("loading model %s (%s) from %s", spec.id, spec.kind, folder)
                model = await load_model(spec, folder, config.inference)
                loaded.append(model)
                fresh.models[spec.id] = model
        except BaseException:
            await asyncio.gather(*(m.close() for m in loaded))
            raise
        return fresh

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()
