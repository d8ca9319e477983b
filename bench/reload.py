"""Memory across model reloads: RSS of a sidecar hot-swapping its models, idle and under Rerank load.

Each reload alternates between two model sets that differ in every model (the cross-encoder's window,
and the bi-encoder's files and pooling), so both models really load, warm up and retire each time.
After a warm-up of a few reloads (allocators and caches reach their steady state), the bench reports
RSS at the start, after every 10 reloads and at the end, and the ratio end / start.

    .venv/bin/python bench/reload.py [--reloads 50] [--clients 4] [--phases idle,load]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import psutil

from ragsidecar.v1 import reranker_pb2

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from sidecar import Sidecar, default_config  # noqa: E402 - importable once tests/ is on sys.path

MIB = 1024 * 1024


def model_sets() -> tuple[dict, dict]:
    first = default_config(packaged=True)
    first["inference"]["cache_bytes"] = 0
    first["server"]["config_poll_s"] = 0.0  # SIGHUP alone reloads
    second = copy.deepcopy(first)
    cross, bi = second["models"]
    cross["max_length"] = 384
    bi.update(path="all-MiniLM-L6-v2", pooling="mean", max_length=256)
    return first, second


def generation(server: Sidecar) -> int:
    return server.reranker().ListModels(reranker_pb2.ListModelsRequest(), timeout=30).generation


def reload(server: Sidecar, config: dict) -> None:
    """Writes the config, sends SIGHUP and waits for the new generation to serve."""
    before = generation(server)
    server.write_config(config)
    server.signal(1)  # SIGHUP
    deadline = time.monotonic() + 120
    while generation(server) <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("reload did not finish:\n" + server.log()[-4000:])
        time.sleep(0.05)


class Load:
    """Client threads sending small Rerank calls until stopped; counts outcomes."""

    def __init__(self, server: Sidecar, clients: int) -> None:
        self._server = server
        self._stop = threading.Event()
        self.outcomes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self, client: int) -> None:
        stub = self._server.reranker()
        i = 0
        while not self._stop.is_set():
            i += 1
            documents = [
                reranker_pb2.RerankDocument(id=str(d), text=f"client {client} document {d} of call {i} " * 8)
                for d in range(8)
            ]
            try:
                stub.Rerank(reranker_pb2.RerankRequest(query=f"query {i}", documents=documents), timeout=60)
                outcome = "OK"
            except grpc.RpcError as err:
                outcome = err.code().name
            with self._lock:
                self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def settled_rss(server: Sidecar, process: psutil.Process, models: int) -> float:
    """RSS once every replaced model has closed (its last request done, its session released)."""
    deadline = time.monotonic() + 120
    while server.metric("ragsidecar_loaded_model_instances") > models:
        if time.monotonic() > deadline:
            raise RuntimeError("replaced models were never closed:\n" + server.log()[-4000:])
        time.sleep(0.05)
    return rss(process)


def rss(process: psutil.Process) -> float:
    return process.memory_info().rss / MIB


def soak(server: Sidecar, configs: tuple[dict, dict], reloads: int, warmup: int, every: int, label: str) -> dict:
    process = psutil.Process(server.process.pid)
    models = len(configs[0]["models"])
    for i in range(warmup):
        reload(server, configs[i % 2])
    start = settled_rss(server, process, models)
    marks = []
    for i in range(reloads):
        reload(server, configs[(warmup + i) % 2])
        if (i + 1) % every == 0:
            marks.append(round(settled_rss(server, process, models)))
    end = settled_rss(server, process, models)
    print(
        f"{label}: RSS start {start:.0f} MiB, after each {every} reloads {marks} MiB, end {end:.0f} MiB, "
        f"end/start {end / start:.3f}",
        flush=True,
    )
    return {"start": start, "marks": marks, "end": end, "ratio": end / start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reloads", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=4, help="reloads before the start figure")
    parser.add_argument("--every", type=int, default=10, help="RSS reported after every this many reloads (even)")
    parser.add_argument("--clients", type=int, default=4, help="Rerank client threads in the load phase")
    parser.add_argument("--phases", default="idle,load", help="comma-separated: idle, load")
    args = parser.parse_args()
    configs = model_sets()
    with tempfile.TemporaryDirectory() as workdir:
        server = Sidecar(Path(workdir), copy.deepcopy(configs[0])).start()
        try:
            print(f"sidecar serving, RSS {rss(psutil.Process(server.process.pid)):.0f} MiB", flush=True)
            for phase in args.phases.split(","):
                if phase == "idle":
                    soak(server, configs, args.reloads, args.warmup, args.every, "idle")
                elif phase == "load":
                    with Load(server, args.clients) as load:
                        soak(server, configs, args.reloads, args.warmup, args.every, f"load ({args.clients} clients)")
                    print(f"load outcomes: {load.outcomes}", flush=True)
                else:
                    parser.error(f"unknown phase {phase!r}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
