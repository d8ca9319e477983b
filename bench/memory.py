"""Retrieval quality on conversational memory: the development half of LoCoMo through the Search RPC.

LoCoMo (Maharana, Lee, Tulyakov, Bansal, Barbieri, Fang: "Evaluating Very Long-Term Conversational Memory of LLM
Agents", ACL 2024; snap-research/LoCoMo, CC BY-NC 4.0) is read from a path given on the command line (default
../shared/data/memory/locomo beside the checkout); nothing of it enters the repository or the product.

Each conversation is written as a host would: one MEMORY partition per conversation (tenant = its sample id),
one document per turn through UpsertDocuments, id the turn's `dia_id`, text "Speaker: text" (plus
" [shared a photo: caption]" when the turn shares one), metadata `speaker` (the name) and `time` (its session's
date and time, ISO 8601). Each question is one Search of its conversation's partition at top_k 10, in three
retrieval modes: LEXICAL (the sidecar's BM25 list), DENSE (its dense list) and the default (HYBRID). Beside
them, the reference: stemmed BM25 as bench/beir.py computes it (bm25s, k1 0.9, b 0.4, knowledge/lexical.py's
"english" analysis) over the same texts.

Score: evidence recall@k (the share of a question's evidence turns among the first k hits) at k 5 and 10, per
category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial) and over every question; the 4
evidence ids that name no turn stay in their questions' denominators. Search p50: the default's Search over
every question (one caller, result caches as configured). Upsert p50: one new turn per UpsertDocuments call,
`--upserts` of them into the first conversation's partition after the searches.

The leave-one-conversation-out (LOCO) table (--loco): over LOCO_GRID (retrieval.memory_neighbour_weight 0, 0.3,
0.5 and 0.7 under memory_fusion "minmax", and 0.5 under "adaptive", at memory_dense_weight 0.45; the fusion and
dense weight were chosen in-process, docs/retrieval.md), each fold picks the setting with the best
R@5 + R@10 of the default over the other four conversations, from the default's lists through the Search RPC of
a sidecar per setting (the configured one reuses the main run; lists cached under bench/results/memory-*.json,
keyed by the product's code, config, settings and data), and is scored on the conversation it did not see; the
table pools the held-out questions. The lexical and dense lists do not depend on the setting. Turn context
(knowledge/conversation.py) is not a tuned setting: with and without it were compared once (docs/retrieval.md).

    .venv/bin/python bench/memory.py [--data ../shared/data/memory/locomo] [--upserts 20]
                                     [--set retrieval.KEY=VALUE ...] [--loco]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from ragsidecar.knowledge import lexical
from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from sidecar import Sidecar, default_config  # noqa: E402 - importable once tests/ is on sys.path

RESULTS = REPO / "bench" / "results"
DEFAULT_DATA = REPO.parent / "shared" / "data" / "memory" / "locomo"
SOURCE = "conversation"
PRINCIPAL = common_pb2.Principal(id="memory-bench")
TOP_K = 10
KS = (5, 10)
UPSERT_BATCH = 200  # documents per UpsertDocuments call of the bulk load
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
MODES = {
    "lexical": pb.RETRIEVAL_MODE_LEXICAL,
    "dense": pb.RETRIEVAL_MODE_DENSE,
    "default": pb.RETRIEVAL_MODE_HYBRID,
}
MARGIN = 0.08  # the default over the best single list, R@5 and R@10
CATEGORY_SLACK = 0.01  # no category below stemmed BM25 by more than this
P50_LIMIT_MS = 20.0


# ---- data ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Turn:
    id: str
    speaker: str
    text: str  # "Speaker: text", as a host writes it
    time: str  # ISO 8601: its session's date and time


@dataclasses.dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Conversation:
    id: str
    turns: list[Turn]
    questions: list[Question]


def session_time(value: str) -> str:
    """LoCoMo's "1:56 pm on 8 May, 2023" as ISO 8601 ("2023-05-08T13:56:00")."""
    return dt.datetime.strptime(value.strip(), "%I:%M %p on %d %B, %Y").isoformat()


def turn_text(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    caption = turn.get("blip_caption")
    return f"{text} [shared a photo: {caption}]" if caption else text


def read_conversations(folder: Path) -> list[Conversation]:
    """The release's samples as conversations of turns; questions without evidence are left out (two of the 999)."""
    samples = json.loads((folder / "locomo-dev.json").read_text(encoding="utf-8"))
    conversations = []
    for sample in samples:
        talk = sample["conversation"]
        sessions = sorted(
            (int(k.removeprefix("session_")) for k in talk if k.startswith("session_") and k[8:].isdigit()),
        )
        turns = [
            Turn(t["dia_id"], t["speaker"], turn_text(t), session_time(talk[f"session_{n}_date_time"]))
            for n in sessions
            for t in talk[f"session_{n}"]
        ]
        questions = [
            Question(q["question"], int(q["category"]), tuple(q["evidence"])) for q in sample["qa"] if q["evidence"]
        ]
        conversations.append(Conversation(sample["sample_id"], turns, questions))
    return conversations


# ---- metrics ---------------------------------------------------------------------------------------------

Run = dict[str, list[list[str]]]  # conversation id -> per question, its ranked turn ids


def recall(ranking: list[str], evidence: tuple[str, ...], k: int) -> float:
    return len(set(evidence).intersection(ranking[:k])) / len(evidence)


def scores(conversations: list[Conversation], run: Run) -> dict[str, float]:
    """R@5 and R@10 over all questions ("all@5", "all@10") and per category ("<name>@k")."""
    per: dict[str, list[float]] = {}
    for conversation in conversations:
        for question, ranking in zip(conversation.questions, run[conversation.id], strict=True):
            for k in KS:
                value = recall(ranking, question.evidence, k)
                per.setdefault(f"all@{k}", []).append(value)
                per.setdefault(f"{CATEGORIES[question.category]}@{k}", []).append(value)
    return {key: statistics.fmean(values) for key, values in per.items()}


def reference_bm25(conversations: list[Conversation]) -> Run:
    """Stemmed BM25 as bench/beir.py's reference: bm25s k1 0.9 b 0.4 over knowledge/lexical.py's "english" terms."""
    run: Run = {}
    for conversation in conversations:
        index = bm25s.BM25(k1=0.9, b=0.4)
        index.index(lexical.terms([t.text for t in conversation.turns], "english"), show_progress=False)
        ranked = []
        for terms in lexical.terms([q.text for q in conversation.questions], "english"):
            found = index.get_scores(terms)
            ranked.append([conversation.turns[i].id for i in np.argsort(-found, kind="stable")[:TOP_K]])
        run[conversation.id] = ranked
    return run


# ---- through the sidecar ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Measured:
    runs: dict[str, Run]  # mode -> run
    search_ms: list[float]  # the default's Search latencies
    upsert_ms: list[float]  # one-document upserts


def memory_entry() -> pb.KnowledgeEntry:
    return pb.KnowledgeEntry(name=SOURCE, type=pb.KNOWLEDGE_TYPE_MEMORY, use=pb.KNOWLEDGE_USE_SEARCH)


def scope_of(conversation: Conversation) -> common_pb2.Scope:
    return common_pb2.Scope(tenant=conversation.id)


def document(turn: Turn, suffix: str = "") -> pb.MemoryDocument:
    return pb.MemoryDocument(id=turn.id + suffix, text=turn.text, metadata={"speaker": turn.speaker, "time": turn.time})


def upsert(stub, conversation: Conversation, documents: list[pb.MemoryDocument]) -> None:
    stub.UpsertDocuments(
        pb.UpsertDocumentsRequest(
            principal=PRINCIPAL, scope=scope_of(conversation), knowledge=SOURCE, documents=documents
        ),
        timeout=600,
    )


def search(stub, conversation: Conversation, query: str, mode: int) -> list[str]:
    request = pb.SearchRequest(
        principal=PRINCIPAL,
        scope=scope_of(conversation),
        target=pb.Target(name="memory.bench.Agent", knowledge=[memory_entry()]),
        query=query,
        top_k=TOP_K,
        search=pb.SearchOptions(group_by_document=True, retrieval_mode=mode),  # type: ignore[arg-type]
    )
    return [h.provenance.document_id for h in stub.Search(request, timeout=120).hits]


def through_rpc(
    conversations: list[Conversation], overrides: dict[str, Any], upserts: int, modes: tuple[str, ...]
) -> Measured:
    """Every conversation written to its partition of a fresh sidecar and every question searched in `modes`."""
    config = default_config(packaged=True)
    config["inference"].update(workers=2, intra_op_threads=1)
    config["retrieval"].update(overrides)
    with tempfile.TemporaryDirectory(prefix="memory-", dir=RESULTS) as workdir:
        config["paths"]["data_dir"] = str(Path(workdir) / "data")
        started = time.perf_counter()
        server = Sidecar(Path(workdir), config).start(timeout=300)
        try:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(server.channel())
            print(f"  sidecar serving after {time.perf_counter() - started:.1f} s", flush=True)
            started = time.perf_counter()
            for conversation in conversations:
                documents = [document(t) for t in conversation.turns]
                for i in range(0, len(documents), UPSERT_BATCH):
                    upsert(stub, conversation, documents[i : i + UPSERT_BATCH])
            print(
                f"  wrote {sum(len(c.turns) for c in conversations)} turns in {time.perf_counter() - started:.0f} s",
                flush=True,
            )
            runs: dict[str, Run] = {mode: {} for mode in modes}
            search_ms: list[float] = []
            for conversation in conversations:
                search(stub, conversation, "warm-up", MODES["default"])
                for mode in modes:
                    ranked = []
                    for question in conversation.questions:
                        began = time.perf_counter()
                        ranked.append(search(stub, conversation, question.text, MODES[mode]))
                        if mode == "default":
                            search_ms.append(1000 * (time.perf_counter() - began))
                    runs[mode][conversation.id] = ranked
            upsert_ms = []
            first = conversations[0]
            for i, turn in enumerate(first.turns[:upserts]):
                began = time.perf_counter()
                upsert(stub, first, [document(turn, f"#again-{i}")])
                upsert_ms.append(1000 * (time.perf_counter() - began))
        finally:
            server.stop()
    return Measured(runs, search_ms, upsert_ms)


def cached_rpc(
    conversations: list[Conversation],
    overrides: dict[str, Any],
    upserts: int,
    fresh: bool,
    modes: tuple[str, ...] = tuple(MODES),
) -> Measured:
    """`through_rpc`, from bench/results/memory-<key>.json when a run with the same product code, config,
    overrides and data already measured it (--fresh measures again)."""
    path = RESULTS / f"memory-{cache_key(conversations, overrides, upserts, modes)}.json"
    if path.is_file() and not fresh:
        return Measured(**json.loads(path.read_text()))
    measured = through_rpc(conversations, overrides, upserts, modes)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(measured)))
    return measured


def cache_key(
    conversations: list[Conversation], overrides: dict[str, Any], upserts: int, modes: tuple[str, ...]
) -> str:
    digest = hashlib.sha256()
    for path in sorted((REPO / "server" / "src" / "ragsidecar").rglob("*.py")):
        if "/v1/" not in str(path):
            digest.update(path.read_bytes())
    digest.update((REPO / "config" / "ragsidecar.toml").read_bytes())
    digest.update(json.dumps([overrides, upserts, modes, [dataclasses.asdict(c) for c in conversations]]).encode())
    return digest.hexdigest()[:16]


# ---- report ----------------------------------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def out(self, *lines: str) -> None:
        for line in lines:
            print(line, flush=True)
            self.lines.append(line)

    def table(self, title: str, rows: dict[str, dict[str, float]]) -> None:
        names = list(CATEGORIES.values())
        self.out(
            "",
            title,
            "",
            "| list | " + " | ".join(names) + " | all R@5 | all R@10 |",
            "|---|" + "---|" * (len(names) + 2),
        )
        for label, s in rows.items():
            self.out(
                f"| {label} | "
                + " | ".join(f"{s[f'{n}@5']:.3f} / {s[f'{n}@10']:.3f}" for n in names)
                + f" | {s['all@5']:.3f} | {s['all@10']:.3f} |"
            )

    def checks(self, rows: dict[str, dict[str, float]]) -> bool:
        """The issue's done-when margins over the rows "stemmed BM25", "sidecar lexical", "sidecar dense" and
        "sidecar default"."""
        singles = ("stemmed BM25", "sidecar lexical", "sidecar dense")
        default, bm25 = rows["sidecar default"], rows["stemmed BM25"]
        passed = True
        for k in KS:
            best = max(rows[s][f"all@{k}"] for s in singles)
            ok = default[f"all@{k}"] >= best + MARGIN
            passed &= ok
            self.out(
                f"- R@{k}: default {default[f'all@{k}']:.3f} vs best single list {best:.3f} + {MARGIN}: "
                f"{'PASS' if ok else 'FAIL'}"
            )
        for name in CATEGORIES.values():
            worst = min(default[f"{name}@{k}"] - bm25[f"{name}@{k}"] for k in KS)
            ok = worst >= -CATEGORY_SLACK
            passed &= ok
            self.out(
                f"- {name}: default - stemmed BM25 at worst {worst:+.3f} (>= -{CATEGORY_SLACK}): "
                f"{'PASS' if ok else 'FAIL'}"
            )
        return passed


def rows_of(conversations: list[Conversation], measured: Measured, reference: Run) -> dict[str, dict[str, float]]:
    return {
        "stemmed BM25": scores(conversations, reference),
        "sidecar lexical": scores(conversations, measured.runs["lexical"]),
        "sidecar dense": scores(conversations, measured.runs["dense"]),
        "sidecar default": scores(conversations, measured.runs["default"]),
    }


def trained(conversations: list[Conversation], measured: Measured) -> float:
    """The default's R@5 + R@10 over these conversations."""
    s = scores(conversations, measured.runs["default"])
    return s["all@5"] + s["all@10"]


def loco(
    report: Report,
    conversations: list[Conversation],
    reference: Run,
    grid: dict[str, dict[str, Any]],
    measured: dict[str, Measured],
    lists: Measured,
) -> None:
    """Leave one conversation out: each fold picks, among the grid's settings, the best mean R@5 + R@10 of the
    default on the other conversations and is scored on the held-out one; the held-out runs are pooled. The
    lexical and dense lists (`lists`) do not depend on the settings tuned."""
    held: dict[str, Run] = {"lexical": lists.runs["lexical"], "dense": lists.runs["dense"], "default": {}}
    report.out("", "Leave-one-conversation-out picks:", "")
    for out in conversations:
        train = [c for c in conversations if c is not out]

        pick = max(grid, key=lambda label, train=train: trained(train, measured[label]))
        report.out(f"- held out {out.id}: {pick} ({grid[pick]})")
        held["default"][out.id] = measured[pick].runs["default"][out.id]
    rows = rows_of(conversations, Measured(held, [], []), reference)
    report.table("## Leave-one-conversation-out (pooled held-out questions), R@5 / R@10 per category", rows)
    report.out("", "Done-when checks on the held-out figures:", "")
    report.checks(rows)


# ---- main ------------------------------------------------------------------------------------------------


def parse_overrides(items: list[str]) -> dict[str, Any]:
    overrides = {}
    for item in items:
        key, _, value = item.partition("=")
        if not key.startswith("retrieval.") or not value:
            raise SystemExit(f"--set takes retrieval.KEY=VALUE, got {item!r}")
        overrides[key.removeprefix("retrieval.")] = tomllib.loads(f"v = {value}")["v"]
    return overrides


# The settings the LOCO stage chooses among (each a sidecar of its own searching the default only, lists cached):
# the conversation-neighbour weight (retrieval.memory_neighbour_weight; 0: off) under written documents' fusion
# (retrieval.memory_fusion; "adaptive" is fusion's) at retrieval.memory_dense_weight 0.45.
LOCO_GRID: dict[str, dict[str, Any]] = {
    f"{fusion} 0.45, neighbours {n}": {
        "memory_fusion": fusion,
        "memory_dense_weight": 0.45,
        "memory_neighbour_weight": n,
    }
    for fusion, n in (("minmax", 0.0), ("minmax", 0.3), ("minmax", 0.5), ("minmax", 0.7), ("adaptive", 0.5))
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the folder holding locomo-dev.json")
    parser.add_argument("--upserts", type=int, default=20, help="one-document upserts timed after the searches")
    parser.add_argument("--set", action="append", default=[], metavar="retrieval.KEY=VALUE")
    parser.add_argument("--loco", action="store_true", help="leave-one-conversation-out over the tuned settings")
    parser.add_argument("--fresh", action="store_true", help="measure again even when cached lists match")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still stops its sidecar
    RESULTS.mkdir(parents=True, exist_ok=True)
    overall = time.perf_counter()
    conversations = read_conversations(args.data)
    overrides = parse_overrides(args.set)
    report = Report()
    report.out(
        f"# Conversational memory: LoCoMo development half ({len(conversations)} conversations, "
        f"{sum(len(c.turns) for c in conversations)} turns, {sum(len(c.questions) for c in conversations)} "
        f"questions; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})",
        "",
        "Source: LoCoMo (Maharana et al., ACL 2024), CC BY-NC 4.0; read from " + str(args.data),
    )
    reference = reference_bm25(conversations)
    measured = cached_rpc(conversations, overrides, args.upserts, args.fresh)
    rows = rows_of(conversations, measured, reference)
    report.table("## Through the Search RPC (top_k 10): R@5 / R@10 per category", rows)
    report.out("", "Done-when checks:", "")
    report.checks(rows)
    search_p50, upsert_p50 = statistics.median(measured.search_ms), statistics.median(measured.upsert_ms)
    report.out(
        "",
        f"Search p50 (default, top_k 10, {len(measured.search_ms)} queries): {search_p50:.1f} ms "
        f"(<= {P50_LIMIT_MS:.0f} ms: {'PASS' if search_p50 <= P50_LIMIT_MS else 'FAIL'}); one-document upsert p50 "
        f"({len(measured.upsert_ms)} calls): {upsert_p50:.1f} ms",
    )
    if args.loco:
        grid = {label: {**overrides, **settings} for label, settings in LOCO_GRID.items()}
        configured = {**default_config(packaged=True)["retrieval"], **overrides}
        tuned = {
            label: measured  # the configuration measured above
            if all(configured.get(k) == v for k, v in settings.items())
            else cached_rpc(conversations, settings, 0, False, ("default",))
            for label, settings in grid.items()
        }
        loco(report, conversations, reference, grid, tuned, measured)
    report.out("", f"Total {time.perf_counter() - overall:.0f} s.")
    (RESULTS / "memory.md").write_text("\n".join(report.lines) + "\n")


if __name__ == "__main__":
    main()
