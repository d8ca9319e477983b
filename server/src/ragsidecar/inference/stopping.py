"""Work on worker threads that stops when its caller has gone (cancelled, or past its deadline).

A thread cannot be interrupted, and asyncio.to_thread keeps running after its awaiting task is
cancelled: without this, a cancelled call's tokenization of megabytes kept a core busy long after
the caller had given up. Long work checks its StopFlag between slices instead.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ragsidecar import errors, metrics

T = TypeVar("T")


class Abandoned(Exception):
    """Raised on a worker thread when the caller has gone; nobody awaits the result any more."""


class StopFlag:
    def __init__(self, deadline: float | None, model: str, what: str) -> None:
        # Absolute time on the event loop's clock (time.monotonic), or None for no deadline.
        self._deadline = deadline
        self._model = model
        self._what = what
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def check(self) -> None:
        """Raises when the work should end: Abandoned once cancelled, DEADLINE_EXCEEDED past the deadline."""
        if self._stopped.is_set():
            metrics.STOPPED_WORK.labels(self._model, "cancelled").inc()
            raise Abandoned(self._what)
        if self._deadline is not None and time.monotonic() >= self._deadline:
            metrics.STOPPED_WORK.labels(self._model, "deadline").inc()
            raise errors.deadline_exceeded(self._what)


async def run_stoppable(work: Callable[[StopFlag], T], deadline: float | None, model: str, what: str) -> T:
    """Runs work(flag) on a thread; cancelling the awaiting task makes the flag's next check stop it."""
    flag = StopFlag(deadline, model, what)

    def tracked() -> T:
        with metrics.TOKENIZING.labels(model).track_inprogress():
            return work(flag)

    try:
        return await asyncio.to_thread(tracked)
    except asyncio.CancelledError:
        flag.stop()
        raise
