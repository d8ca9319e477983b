"""The batching queue: pairs of concurrent requests scheduled together under a token budget.

Modelled on text-embeddings-inference's queue: requests enqueue their model inputs, workers take
inputs in arrival order until the batch's token budget is spent, length-sort them to cut padding,
and run them on a thread (onnxruntime releases the GIL). A request that is cancelled, or whose
deadline passes, while it waits leaves the queue: its remaining inputs are never run, and inputs of
a batch already taken are skipped if their request has gone before they run.

Workers are supervised: a failure anywhere in a worker (running a batch, or picking one) fails the
requests it concerns with an error, is logged with its traceback and counted, and the worker carries on.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np

from ragsidecar import errors, metrics, tracing
from ragsidecar.inference.backend import OnnxBackend
from ragsidecar.inference.tokenization import ModelInput

if TYPE_CHECKING:
    from opentelemetry.context import Context

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    outputs: list[np.ndarray]
    queue_s: float
    inference_s: float


@dataclass(eq=False)
class _Job:
    inputs: list[ModelInput]
    future: asyncio.Future[BatchResult]
    # Absolute loop time after which the job is dropped; None for no deadline.
    deadline: float | None
    enqueued_at: float
    outputs: list[np.ndarray | None] = field(default_factory=list)
    scheduled: int = 0
    remaining: int = 0
    started_at: float | None = None
    # Wall-clock span of the job's runs (perf_counter): its batches may run on several workers at once.
    first_run: float | None = None
    last_run: float = 0.0
    # The submitting request's trace context (tracing.current()), None while tracing is off.
    trace: Context | None = None

    def abandoned(self, now: float) -> str | None:
        """Why the job's inputs need not run any more ("deadline", "cancelled"), or None."""
        if self.deadline is not None and now >= self.deadline:
            return "deadline"
        return "cancelled" if self.future.done() else None


def charged_tokens(rows: int, widest: int, real_tokens: int, padded: bool) -> int:
    """What a batch costs against the token budget: a padded run computes every row at the widest
    row's length, so it pays rows x widest; per-sequence runs pay only their real tokens."""
    return rows * widest if padded else real_tokens


Batch = list[tuple[_Job, int]]


class BatchQueue:
    def __init__(
        self, model_id: str, backend: OnnxBackend, workers: int, max_batch_tokens: int, max_queued_inputs: int
    ) -> None:
        self.model_id = model_id
        self._backend = backend
        self._max_batch_tokens = max_batch_tokens
        self._max_queued = max_queued_inputs
        self._jobs: collections.deque[_Job] = collections.deque()
        self._queued_inputs = 0
        self._wakeup = asyncio.Event()
        self._closed = False
        self._executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=f"infer-{model_id}")
        self._workers = [self._start_worker() for _ in range(workers)]

    @property
    def depth(self) -> int:
        return self._queued_inputs

    async def submit(self, inputs: list[ModelInput], deadline: float | None = None) -> BatchResult:
        """Runs the inputs through the model; outputs come back in input order."""
        if self._closed:
            raise errors.model_not_ready(self.model_id, "it was unloaded by a configuration reload")
        if not inputs:
            return BatchResult([], 0.0, 0.0)
        if self._queued_inputs + len(inputs) > self._max_queued:
            raise errors.queue_full(self.model_id, self._max_queued)
        loop = asyncio.get_running_loop()
        job = _Job(
            inputs,
            loop.create_future(),
            deadline,
            loop.time(),
            outputs=[None] * len(inputs),
            remaining=len(inputs),
            trace=tracing.current(),
        )
        self._jobs.append(job)
        self._set_depth(self._queued_inputs + len(inputs))
        self._wakeup.set()
        timer = loop.call_at(deadline, self._expire, job) if deadline is not None else None
        try:
            return await job.future
        finally:
            if timer is not None:
                timer.cancel()  # a pending timer holds the finished job (inputs and outputs) until its deadline

    async def run_now(self, inputs: list[ModelInput]) -> list[np.ndarray]:
        """Runs inputs outside the queue (warm-up and probes, before the model serves)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._backend.run, inputs, False)

    async def close(self) -> None:
        """Stops the workers, fails what still waits, and returns once no run of this queue is in progress."""
        self._closed = True
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        # Cancelled tasks keep tracebacks whose frames reference this queue: a cycle that would keep the
        # model's session alive until the next full garbage collection.
        self._workers = []
        self._fail(self._take_all(), errors.model_not_ready(self.model_id, "it was unloaded"))
        await asyncio.to_thread(self._executor.shutdown, True, cancel_futures=True)

    def _expire(self, job: _Job) -> None:
        if not job.future.done():
            job.future.set_exception(errors.deadline_exceeded(f"model {self.model_id!r} scored the request"))

    def _start_worker(self) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(self._work(), name=f"infer-{self.model_id}")
        task.add_done_callback(self._worker_ended)
        return task

    def _worker_ended(self, task: asyncio.Task) -> None:
        """A worker ends only when the queue closes; any other end must not leave requests waiting forever."""
        if self._closed:
            return
        log.error(
            "an inference worker of model %s stopped unexpectedly (%s); failing the queued requests",
            self.model_id,
            "cancelled" if task.cancelled() else repr(task.exception()),
        )
        self._fail(self._take_all(), errors.model_not_ready(self.model_id, "its inference worker stopped"))

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch: Batch = []
            try:
                batch = self._next_batch(loop.time())
                if not batch:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await self._run(loop, batch)
            except Exception as err:  # noqa: BLE001 - supervision: fail the work in hand, keep the worker
                log.exception("inference worker of model %s failed; failing the requests concerned", self.model_id)
                metrics.INFERENCE_FAILURES.labels(self.model_id).inc()
                # A failure while picking a batch may have left the queue inconsistent: fail all of it.
                self._fail([job for job, _ in batch] if batch else self._take_all(), err)

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: Batch) -> None:
        started, started_ns = time.perf_counter(), time.time_ns()
        if tracing.enabled():
            self._trace_queue_waits(batch, loop.time(), started_ns)
        for job, _ in batch:
            job.started_at = job.started_at or loop.time()
            job.first_run = job.first_run or started
        outputs = await loop.run_in_executor(self._executor, self._run_batch, batch)
        if tracing.enabled():
            self._trace_batch(batch, started_ns, time.time_ns())
        self._deliver(batch, outputs, time.perf_counter())

    def _trace_queue_waits(self, batch: Batch, now: float, now_ns: int) -> None:
        """A "queue wait" span for each request whose first input runs in this batch."""
        for job in {id(job): job for job, _ in batch if job.started_at is None}.values():
            waited_ns = int((now - job.enqueued_at) * 1e9)
            tracing.record(
                job.trace, "queue wait", now_ns - waited_ns, now_ns, model=self.model_id, inputs=len(job.inputs)
            )

    def _trace_batch(self, batch: Batch, start_ns: int, end_ns: int) -> None:
        """An "inference batch" span under each request that has inputs in the batch (batches mix requests)."""
        tokens = sum(len(job.inputs[index]) for job, index in batch)
        for trace in tracing.distinct(job.trace for job, _ in batch):
            mine = [job.inputs[index] for job, index in batch if job.trace is trace]
            tracing.record(
                trace,
                "inference batch",
                start_ns,
                end_ns,
                model=self.model_id,
                batch_inputs=len(batch),
                batch_tokens=tokens,
                inputs=len(mine),
                tokens=sum(map(len, mine)),
                padded=self._backend.batch_invariant_padding,
            )

    def _run_batch(self, batch: Batch) -> list[np.ndarray | None]:
        """Runs a batch on a worker thread, skipping inputs whose request has gone (reading a future's
        done flag from this thread is a benign race: at worst one more input runs). Padded runs take
        the live rows at once; per-sequence runs check before each sequence."""
        outputs: list[np.ndarray | None] = [None] * len(batch)
        if self._backend.batch_invariant_padding:
            live = [n for n, (job, _) in enumerate(batch) if not job.future.done()]
            if live:
                ran = self._backend.run([batch[n][0].inputs[batch[n][1]] for n in live], True)
                for n, output in zip(live, ran, strict=True):
                    outputs[n] = output
        else:
            for n, (job, index) in enumerate(batch):
                if not job.future.done():
                    outputs[n] = self._backend.run([job.inputs[index]], False)[0]
        # asyncio's loop clock is time.monotonic, so deadlines compare with it on this thread too.
        now = time.monotonic()
        metrics.INFERRED_INPUTS.labels(self.model_id).inc(sum(out is not None for out in outputs))
        for (job, _), ran_output in zip(batch, outputs, strict=True):
            if ran_output is None:
                metrics.SKIPPED_INPUTS.labels(self.model_id, job.abandoned(now) or "cancelled").inc()
        metrics.BATCH_SIZE.labels(self.model_id).observe(len(batch))
        return outputs

    def _deliver(self, batch: Batch, outputs: list[np.ndarray | None], finished: float) -> None:
        for job, _ in batch:
            job.last_run = max(job.last_run, finished)
        for (job, index), output in zip(batch, outputs, strict=True):
            if job.future.done():
                continue
            job.outputs[index] = output
            job.remaining -= 1
            if job.remaining == 0 and not job.future.done():
                queue_s = (job.started_at or job.enqueued_at) - job.enqueued_at
                inference_s = job.last_run - (job.first_run or job.last_run)
                # Every input ran (none remains), so no output is None.
                job.future.set_result(BatchResult(cast(list[np.ndarray], job.outputs), queue_s, inference_s))

    def _next_batch(self, now: float) -> Batch:
        """Takes inputs in arrival order until the token budget is spent, dropping abandoned jobs.

        One sequence per run gains nothing from a large batch, so then a worker takes only its share of
        what waits: the other workers run the rest of the same request in parallel."""
        batch: Batch = []
        padded = self._backend.batch_invariant_padding
        real_tokens = widest = 0
        # Half a worker's share, so that whichever worker frees up first takes the next slice.
        share = 2 * len(self._workers) if not padded else 0
        most = max(1, -(-self._queued_inputs // share)) if share else None
        while self._jobs and (most is None or len(batch) < most):
            job = self._jobs[0]
            why = job.abandoned(now)
            if why:
                self._drop(job, why)
                continue
            length = len(job.inputs[job.scheduled])
            cost = charged_tokens(len(batch) + 1, max(widest, length), real_tokens + length, padded)
            if batch and cost > self._max_batch_tokens:
                break
            batch.append((job, job.scheduled))
            real_tokens, widest = real_tokens + length, max(widest, length)
            job.scheduled += 1
            self._set_depth(self._queued_inputs - 1)
            if job.scheduled == len(job.inputs):
                self._jobs.popleft()
        # Length-sorted so that padded runs waste little; per-sequence runs don't care.
        batch.sort(key=lambda item: len(item[0].inputs[item[1]]))
        return batch

    def _drop(self, job: _Job, why: str) -> None:
        self._jobs.popleft()
        unscheduled = len(job.inputs) - job.scheduled
        self._set_depth(self._queued_inputs - unscheduled)
        metrics.SKIPPED_INPUTS.labels(self.model_id, why).inc(unscheduled)
        log.info("model %s: dropped %d queued inputs (%s)", self.model_id, unscheduled, why)

    def _take_all(self) -> list[_Job]:
        """Empties the queue; returns the jobs that waited in it."""
        jobs = list(self._jobs)
        self._jobs.clear()
        self._set_depth(0)
        return jobs

    def _fail(self, jobs: list[_Job], error: Exception) -> None:
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(error)

    def _set_depth(self, depth: int) -> None:
        self._queued_inputs = depth
        metrics.QUEUE_DEPTH.labels(self.model_id).set(depth)
