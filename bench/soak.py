"""Soak: mixed traffic through the real gRPC server for a long while, with model reloads; memory and latency.

Several client threads loop over Rerank, Search, UpsertDocuments and GroundTurn (each in its own scope, with
its own chat binding) while another one reloads the models every few seconds (SIGHUP after flipping an
[inference] setting, so every reload really replaces both models). The server is a fresh sidecar on a temp
data folder. Reports the server's RSS at start (after set-up, before traffic), once warm (after a tenth of
the run), peak and end, the calls that failed by status, and p50/p95 latency per RPC.

Data: SciFact abstracts and claims from $RAGSIDECAR_IR_DATA (or ../shared/data/ir beside the checkout);
without them, a generated corpus (said in the report).

    .venv/bin/python bench/soak.py [--minutes 30] [--clients 4] [--reload-every 30]
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import ir_collections
import psutil

from ragsidecar.v1 import chat_knowledge_pb2 as cpb
from ragsidecar.v1 import chat_knowledge_pb2_grpc, common_pb2, reranker_pb2, reranker_pb2_grpc, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from retrieval_helpers import PRINCIPAL, entry, llm, target  # noqa: E402 - importable once tests/ is on sys.path
from sidecar import Sidecar, default_config  # noqa: E402 - importable once tests/ is on sys.path

FILE_DOCUMENTS = 400  # documents of the FILE source every Search also searches
BINDING_DOCUMENTS = 100  # each client's chat binding corpus
MEMORY_IDS = 300  # upserts cycle over these ids, so each client's MEMORY partition stays bounded
RERANK_DOCUMENTS = 30
CALL_TIMEOUT_S = 120
# Relative frequency of each RPC in a client's loop.
MIX = {"Rerank": 4, "Search": 3, "UpsertDocuments": 2, "GroundTurn": 2}


@dataclass
class Data:
    texts: list[str]
    queries: list[str]
    source: str


def load_data(seed: int) -> Data:
    scifact = ir_collections.IR_ROOT / "scifact"
    if (scifact / "corpus.jsonl.gz").is_file():
        return Data(
            list(ir_collections.corpus("scifact").values()),
            list(ir_collections.queries("scifact").values()),
            f"SciFact from {scifact}",
        )
    rng = random.Random(seed)
    words = [
        f"{a}{b}"
        for a in ("pro", "re", "in", "con", "de", "ex", "sub", "trans")
        for b in ("tein", "ceptor", "flux", "dition", "sign", "pression", "strate", "port", "cell", "gene")
    ]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(80, 250))) + "." for _ in range(5000)]
    queries = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(1000)]
    return Data(texts, queries, "a generated corpus (no SciFact found at $RAGSIDECAR_IR_DATA or ../shared/data/ir)")


@dataclass
class Tally:
    """Latencies of successful calls and counts of failed ones, per RPC; shared by the client threads."""

    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    failures: collections.Counter = field(default_factory=collections.Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def timed(self, rpc: str, call: Callable[[], object]) -> None:
        started = time.perf_counter()
        try:
            call()
        except grpc.RpcError as err:
            with self.lock:
                self.failures[(rpc, err.code().name)] += 1
            return
        with self.lock:
            self.latencies_ms[rpc].append((time.perf_counter() - started) * 1000)


class Client:
    """One client's scope, binding and request builders."""

    def __init__(self, number: int, server: Sidecar, data: Data, file_entry: pb.KnowledgeEntry) -> None:
        self.rng = random.Random(number)
        self.data = data
        self.scope = common_pb2.Scope(tenant=f"tenant-{number}", session="soak")
        self.owner = f"owner-{number}"
        channel = server.channel(**{"grpc.use_local_subchannel_pool": 1})
        self.reranker = reranker_pb2_grpc.RerankerServiceStub(channel)
        self.retrieval = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        self.chat = chat_knowledge_pb2_grpc.ChatKnowledgeServiceStub(channel)
        self.file_entry = file_entry
        self.owner_knowledge = [
            entry("log", "MEMORY", "SEARCH", top_k=5),
            entry(
                "persona",
                "INLINE",
                "DIRECT",
                max_tokens=60,
                inline_text=f"You are reviewer {number}; cite the abstracts you use.",
            ),
        ]
        opened = self.chat.OpenBinding(
            cpb.OpenBindingRequest(
                principal=PRINCIPAL, scope=self.scope, source="log", owner_id=self.owner, top_k=5, declared=True
            ),
            timeout=CALL_TIMEOUT_S,
        )
        self.binding = cpb.TurnBinding(
            binding_id=opened.binding_id, owner_id=self.owner, binding_handle=opened.binding_handle
        )
        documents = [pb.MemoryDocument(id=f"b{i}", text=t) for i, t in enumerate(self.sample(BINDING_DOCUMENTS))]
        self.chat.AppendToBinding(
            cpb.AppendToBindingRequest(
                principal=PRINCIPAL,
                scope=self.scope,
                binding_id=opened.binding_id,
                owner_id=self.owner,
                binding_handle=opened.binding_handle,
                documents=documents,
            ),
            timeout=CALL_TIMEOUT_S,
        )

    def sample(self, count: int) -> list[str]:
        return self.rng.sample(self.data.texts, count)

    def query(self) -> str:
        return self.rng.choice(self.data.queries)

    def call(self, rpc: str) -> Callable[[], object]:
        return getattr(self, rpc.lower())

    def rerank(self) -> object:
        texts = self.sample(RERANK_DOCUMENTS)
        documents = [reranker_pb2.RerankDocument(id=str(i), text=t) for i, t in enumerate(texts)]
        return self.reranker.Rerank(
            reranker_pb2.RerankRequest(query=self.query(), documents=documents, top_n=5), timeout=CALL_TIMEOUT_S
        )

    def search(self) -> object:
        notes = entry("notes", "MEMORY", "SEARCH")
        request = pb.SearchRequest(
            principal=PRINCIPAL, scope=self.scope, target=target([self.file_entry, notes]), query=self.query(), top_k=5
        )
        return self.retrieval.Search(request, timeout=CALL_TIMEOUT_S)

    def upsertdocuments(self) -> object:
        documents = [pb.MemoryDocument(id=f"n{self.rng.randrange(MEMORY_IDS)}", text=t) for t in self.sample(5)]
        documents = list({d.id: d for d in documents}.values())
        request = pb.UpsertDocumentsRequest(
            principal=PRINCIPAL, scope=self.scope, knowledge="notes", documents=documents
        )
        return self.retrieval.UpsertDocuments(request, timeout=CALL_TIMEOUT_S)

    def groundturn(self) -> object:
        conversation = [
            cpb.ChatMessage(role="system", content="You review scientific claims."),
            cpb.ChatMessage(role="user", content=self.query()),
        ]
        request = cpb.GroundTurnRequest(
            principal=PRINCIPAL,
            conversation=conversation,
            llm=llm(window=128_000),
            bindings=[self.binding],
            owners=[cpb.ChatOwner(owner_id=self.owner, knowledge=self.owner_knowledge, state_text="## State\n- on")],
            context=cpb.ChatRetrievalContext(scope=self.scope),
        )
        return self.chat.GroundTurn(request, timeout=CALL_TIMEOUT_S)


def write_file_source(root: Path, data: Data) -> pb.KnowledgeEntry:
    with (root / "abstracts.jsonl").open("w") as f:
        for i, text in enumerate(data.texts[:FILE_DOCUMENTS]):
            f.write(json.dumps({"id": f"a{i}", "text": text}) + "\n")
    return entry("abstracts", "FILE", "SEARCH", "abstracts.jsonl")


class RssSampler(threading.Thread):
    """The server's RSS every half second: at start, once warm (after a tenth of the run), peak and end."""

    def __init__(self, pid: int, warm_after_s: float) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.start_rss = self.peak = self.now()
        self.warm = 0
        self.warm_at = time.monotonic() + warm_after_s
        self.stop = threading.Event()

    def now(self) -> int:
        return self.process.memory_info().rss

    def run(self) -> None:
        while not self.stop.wait(0.5):
            rss = self.now()
            self.peak = max(self.peak, rss)
            if not self.warm and time.monotonic() >= self.warm_at:
                self.warm = rss

    def figures(self) -> dict[str, int]:
        end = self.now()
        return {"start": self.start_rss, "warm": self.warm or end, "peak": max(self.peak, end), "end": end}


def reload_models(server: Sidecar, every_s: float, stop: threading.Event) -> collections.Counter:
    """Flips [inference] max_queued_pairs and sends SIGHUP, every `every_s`, waiting for each reload to end;
    returns how many were done and how many failed (by their error)."""
    models = reranker_pb2_grpc.RerankerServiceStub(server.channel())
    outcomes: collections.Counter = collections.Counter()
    while not stop.wait(every_s):
        before = models.ListModels(reranker_pb2.ListModelsRequest(), timeout=CALL_TIMEOUT_S)
        server.config["inference"]["max_queued_pairs"] ^= 1
        server.write_config()
        server.signal(signal.SIGHUP)
        while not stop.is_set():
            listed = models.ListModels(reranker_pb2.ListModelsRequest(), timeout=CALL_TIMEOUT_S)
            if listed.generation > before.generation:
                outcomes["done"] += 1
                break
            if listed.last_reload_error and listed.last_reload_error != before.last_reload_error:
                outcomes[f"failed: {listed.last_reload_error}"] += 1
                break
            time.sleep(0.2)
    return outcomes


def drive(client: Client, tally: Tally, until: float) -> None:
    rpcs, weights = list(MIX), list(MIX.values())
    while time.monotonic() < until:
        rpc = client.rng.choices(rpcs, weights)[0]
        tally.timed(rpc, client.call(rpc))


def percentile(ordered: list[float], share: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return ordered[max(math.ceil(share * len(ordered)) - 1, 0)]


def report(
    tally: Tally, rss: dict[str, int], reloads: collections.Counter, minutes: float, clients: int, data: Data
) -> str:
    mib = {name: value / 2**20 for name, value in rss.items()}
    load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
    reloaded = ", ".join(f"{n} {outcome}" for outcome, n in reloads.items()) or "none"
    lines = [
        f"Soak: {minutes:g} min, {clients} clients, model reloads: {reloaded}; data: {data.source}",
        f"Machine: {psutil.cpu_count()} CPUs, load average at the end {load} (1, 5, 15 min)",
        "",
        "| RSS | MiB | vs start | vs warm |",
        "|---|---|---|---|",
        *(
            f"| {name} | {value:.0f} | {value / mib['start'] - 1:+.1%} | {value / mib['warm'] - 1:+.1%} |"
            for name, value in mib.items()
        ),
        "",
        "(warm: after the first tenth of the run; caches and indexes fill during it in a long run)",
        "",
        "| RPC | ok calls | failed | p50 ms | p95 ms |",
        "|---|---|---|---|---|",
    ]
    for rpc in MIX:
        ordered = sorted(tally.latencies_ms[rpc])
        failed = sum(n for (name, _), n in tally.failures.items() if name == rpc)
        p50, p95 = (f"{percentile(ordered, 0.5):.1f}", f"{percentile(ordered, 0.95):.1f}") if ordered else ("-", "-")
        lines.append(f"| {rpc} | {len(ordered)} | {failed} | {p50} | {p95} |")
    lines += [
        "",
        "Failed calls by status: "
        + (", ".join(f"{rpc} {code}: {n}" for (rpc, code), n in sorted(tally.failures.items())) or "none"),
    ]
    return "\n".join(lines)


def measure(
    server: Sidecar, clients: list[Client], minutes: float, reload_every: float
) -> tuple[Tally, dict[str, int], collections.Counter]:
    """Runs the clients (and the reloads) for `minutes`; the tally, the RSS figures and the reloads done."""
    assert server.process
    sampler = RssSampler(server.process.pid, warm_after_s=minutes * 6)
    sampler.start()
    tally, stop, reloads = Tally(), threading.Event(), collections.Counter()
    until = time.monotonic() + minutes * 60
    drivers = [threading.Thread(target=drive, args=(c, tally, until)) for c in clients]
    reloader = threading.Thread(target=lambda: reloads.update(reload_models(server, reload_every, stop)))
    for thread in drivers + ([reloader] if reload_every > 0 else []):
        thread.start()
    for thread in drivers:
        thread.join()
    stop.set()
    if reloader.is_alive():
        reloader.join()
    sampler.stop.set()
    return tally, sampler.figures(), reloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--reload-every",
        type=float,
        default=30.0,
        help="seconds between model reloads; 0 reloads none (to tell their memory from the rest)",
    )
    args = parser.parse_args()
    data = load_data(seed=7)
    with tempfile.TemporaryDirectory(prefix="ragsidecar-soak-") as temp:
        root, knowledge = Path(temp), Path(temp) / "knowledge"
        knowledge.mkdir()
        config = default_config(packaged=True)
        config["paths"]["data_dir"] = str(root / "data")
        config["paths"]["knowledge_roots"] = [str(knowledge)]
        file_entry = write_file_source(knowledge, data)
        server = Sidecar(root, config).start()
        try:
            clients = [Client(n, server, data, file_entry) for n in range(args.clients)]
            for client in clients:  # index the FILE source, the MEMORY sources and the bindings before measuring
                client.upsertdocuments()
                client.search()
                client.groundturn()
            print(f"set up; measuring for {args.minutes:g} min", file=sys.stderr)
            tally, rss, reloads = measure(server, clients, args.minutes, args.reload_every)
            print(report(tally, rss, reloads, args.minutes, args.clients, data))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
