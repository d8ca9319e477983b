"""Builders for RetrievalService requests, a knowledge folder of real files (SciFact abstracts and more), and the
calls and metric labels the retrieval tests share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import ir_data
import pytest
from google.protobuf import struct_pb2
from sidecar import Sidecar, default_config

from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

PRINCIPAL = common_pb2.Principal(id="agent-host")
SCOPE = common_pb2.Scope(tenant="acme", session="s1")
SCIFACT_DOCS = 240


def retrieval_config(root: Path, data: Path, packaged: bool = False) -> dict:
    """default_config() with `root` as the only knowledge root and `data` as the data folder."""
    config = default_config(packaged)
    config["paths"]["knowledge_roots"] = [str(root)]
    config["paths"]["data_dir"] = str(data)
    return config


def scifact_queries(count: int) -> list[tuple[str, str]]:
    """(claim, relevant abstract id) for judged test queries whose abstract is in the knowledge folder."""
    chosen = set(scifact_ids())
    judged, queries = ir_data.qrels("scifact"), ir_data.queries("scifact")
    pairs = [(queries[q], d) for q in sorted(judged) for d in judged[q] if d in chosen]
    return pairs[:count]


def scifact_ids() -> list[str]:
    judged = ir_data.qrels("scifact")
    relevant = sorted({d for q in sorted(judged)[:60] for d in judged[q]})
    others = [d for d in sorted(ir_data.corpus("scifact")) if d not in relevant]
    return relevant + others[: SCIFACT_DOCS - len(relevant)]


def build_knowledge(root: Path) -> None:
    """A knowledge folder of real files in every supported format."""
    corpus = ir_data.corpus("scifact")
    science = root / "science"
    science.mkdir(parents=True)
    with (science / "abstracts.jsonl").open("w") as f:
        for doc_id in scifact_ids():
            f.write(json.dumps({"id": doc_id, "text": corpus[doc_id]}) + "\n")
    guide = root / "guide"
    guide.mkdir()
    (guide / "returns.md").write_text(
        "# Returns policy\n\nItems can be returned within 30 days of delivery.\n"
        "Refunds go back to the original payment method within 5 business days.\n"
    )
    (guide / "shipping.txt").write_text(
        "Standard shipping takes 3 to 5 business days.\nExpress shipping arrives the next business day.\n"
    )
    (guide / "warranty.html").write_text(
        "<html><head><title>x</title><style>p{}</style></head><body><h1>Warranty</h1>"
        "<p>Every blender carries a two year warranty covering the motor.</p><script>var x=1;</script></body></html>"
    )
    (guide / "faq.csv").write_text(
        "id,question,answer\nq1,Do you ship abroad?,Yes to 40 countries.\n"
        "q2,Can I change my order?,Within one hour of ordering.\n"
    )
    (guide / "catalog.json").write_text(
        json.dumps(
            [
                {"title": "Blender X2", "text": "A 900 watt blender with six speeds."},
                {"title": "Kettle K1", "text": "A 1.7 litre kettle that boils in three minutes."},
            ]
        )
    )
    (root / "persona.md").write_text("You are Ada, a support agent for Acme Kitchen. Be brief and friendly.\n")
    (root / "steps.jsonl").write_text(
        "\n".join(
            json.dumps({"id": f"step{i}", "text": f"Step {i}: {t}"})
            for i, t in enumerate(
                ["Greet the customer.", "Ask for the order number.", "Check the order status.", "Offer a solution."], 1
            )
        )
        + "\n"
    )


def write_documents(folder: Path, documents: dict[str, str]) -> None:
    """Each document a file of `folder` (made when missing): its name, its text and a newline."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in documents.items():
        (folder / name).write_text(text + "\n", encoding="utf-8")


def entry(name: str, type_: str, use: str, path: str = "", **fields: Any) -> pb.KnowledgeEntry:
    search = fields.pop("search", None)
    message = pb.KnowledgeEntry(
        name=name,
        type=pb.KnowledgeType.Value(f"KNOWLEDGE_TYPE_{type_}"),
        use=pb.KnowledgeUse.Value(f"KNOWLEDGE_USE_{use}"),
        path=path,
        **fields,
    )
    if search is not None:
        message.search.CopyFrom(search)
    return message


def target(
    entries: list[pb.KnowledgeEntry],
    actions: dict[str, list[str]] | None = None,
    query_parameter: dict[str, str] | None = None,
) -> pb.Target:
    query_parameter = query_parameter or {}
    return pb.Target(
        name="com.acme.SupportRole",
        knowledge=entries,
        actions=[
            pb.Action(
                name=a, knowledge=names, **({"query_parameter": query_parameter[a]} if a in query_parameter else {})
            )
            for a, names in (actions or {}).items()
        ],
    )


def params(**values: Any) -> list[pb.Param]:
    out = []
    for name, value in values.items():
        proto = struct_pb2.Value()
        if isinstance(value, str):
            proto.string_value = value
        else:
            proto.number_value = value
        out.append(pb.Param(name=name, value=proto))
    return out


def llm(window: int | None = 8000, model: str = "test-model") -> pb.Llm:
    return pb.Llm(model=model, input_window_tokens=window) if window else pb.Llm(model=model)


def stub(server: Sidecar) -> retrieval_pb2_grpc.RetrievalServiceStub:
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel())


def raised(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


BUILT = {"how": "built"}


DISK = {"how": "disk"}


def write_abstracts(folder: Path, files: int, per_file: int) -> None:
    corpus = ir_data.corpus("scifact")
    ids = scifact_ids()
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with (folder / f"part{f}.jsonl").open("w") as out:
            for doc_id in ids[f * per_file : (f + 1) * per_file]:
                out.write(json.dumps({"id": doc_id, "text": corpus[doc_id]}) + "\n")


def load(server, names=("science",), entries=None) -> pb.RequireLoadedResponse:
    entries = entries or [entry("science", "DIRECTORY", "SEARCH", "science")]
    request = pb.RequireLoadedRequest(principal=PRINCIPAL, scope=SCOPE, target=target(entries), names=list(names))
    return retrieval_pb2_grpc.RetrievalServiceStub(server.channel()).RequireLoaded(request, timeout=300)
