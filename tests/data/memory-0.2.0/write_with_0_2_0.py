"""Writes this folder's MEMORY partition files with the 0.2.0 server itself (README.md says how to run it).

Run with PYTHONPATH naming a checkout of 0.2.0's server/src (its generated stubs included): the sidecar started
is that version's, and the calls are the wire API both versions share. Its data folder's `memory/` files are
copied here; the sidecar's config is written per run.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

import ragsidecar
from ragsidecar.v1 import common_pb2, retrieval_pb2_grpc
from ragsidecar.v1 import retrieval_pb2 as pb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # tests/: the harness

from sidecar import MODELS, Sidecar  # noqa: E402 - importable once tests/ is on sys.path

PRINCIPAL = common_pb2.Principal(id="agent-host")
# (tenant, session, source) -> {id: (text, metadata)}: two tenants, a tenant-wide partition, look-alike scopes,
# ids and metadata beyond ASCII.
PARTITIONS: dict[tuple[str, str, str], dict[str, tuple[str, dict[str, str]]]] = {
    ("acme", "s1", "notes"): {
        "pref-1": ("The customer Bob prefers delivery on Saturdays.", {"author": "Zoë", "kind": "preference"}),
        "café-☕": ("The café on the ground floor serves espresso until noon.", {"lang": "fr"}),
        "日本-1": ("The Osaka order ships by sea freight and takes six weeks.", {}),
        "allergy": ("Bob is allergic to peanuts; never send the trail mix hamper.", {"kind": "health"}),
    },
    ("acme", "", "notes"): {
        "policy": ("Refunds are paid back to the original card within five business days.", {"scope": "tenant"}),
        "hours": ("The Leeds warehouse is closed on public holidays.", {}),
    },
    ("acme", "s2", "faq"): {
        "q-ship": ("Express shipping arrives the next business day if ordered before 2pm.", {}),
        "q-warranty": ("Every blender carries a two year warranty covering the motor.", {"product": "Blender X2"}),
    },
    ("globex", "s1", "notes"): {
        "pref-1": ("Globex's buyer Alice wants invoices sent to accounts payable in Zürich.", {"author": "Ülrich"}),
        "ключ": ("The Globex loading dock gate code changes every Monday.", {"kind": "security"}),
    },
    ("a:b", "c", "notes"): {"look-alike": ("Tenant a:b keeps its pallets in aisle seven.", {})},
    ("a", "b:c", "notes"): {"look-alike": ("Tenant a keeps its kayaks in the boathouse.", {})},
}
# Written, then changed, as a host would: replaced once, and one deleted (neither earlier state survives).
SUPERSEDED = {
    ("acme", "s1", "notes"): {
        "pref-1": "The customer Bob prefers delivery on Mondays.",
        "gone": "This note was deleted before the upgrade.",
    }
}


def main() -> None:
    if ragsidecar.__version__ != "0.2.0":
        sys.exit(f"run with 0.2.0 on PYTHONPATH (found {ragsidecar.__version__})")
    # 0.2.0's own default configuration (this one's has sections 0.2.0 does not know).
    checkout = Path(ragsidecar.__file__).resolve().parents[3]
    with tempfile.TemporaryDirectory() as work:
        config = tomllib.loads((checkout / "config" / "ragsidecar.toml").read_text())
        config["paths"]["models_dir"] = str(MODELS)
        config["paths"]["data_dir"] = str(Path(work) / "data")
        config["paths"]["knowledge_roots"] = [work]
        server = Sidecar(Path(work), config).start()
        try:
            write(retrieval_pb2_grpc.RetrievalServiceStub(server.channel()))
        finally:
            server.stop()
        for old in HERE.glob("*.json"):
            old.unlink()
        for file in sorted((Path(work) / "data" / "memory").glob("*.json")):
            shutil.copy(file, HERE / file.name)
    print(f"wrote {len(list(HERE.glob('*.json')))} partition files with ragsidecar {ragsidecar.__version__}")


def write(stub: retrieval_pb2_grpc.RetrievalServiceStub) -> None:
    def upsert(key: tuple[str, str, str], documents: dict[str, tuple[str, dict[str, str]]]) -> None:
        tenant, session, source = key
        stub.UpsertDocuments(
            pb.UpsertDocumentsRequest(
                principal=PRINCIPAL,
                scope=common_pb2.Scope(tenant=tenant, session=session),
                knowledge=source,
                documents=[pb.MemoryDocument(id=i, text=t, metadata=m) for i, (t, m) in documents.items()],
            ),
            timeout=60,
        )

    for key, old in SUPERSEDED.items():
        upsert(key, {i: (t, {}) for i, t in old.items()})
    for key, documents in PARTITIONS.items():
        upsert(key, documents)
    tenant, session, source = ("acme", "s1", "notes")
    stub.DeleteDocuments(
        pb.DeleteDocumentsRequest(
            principal=PRINCIPAL, scope=common_pb2.Scope(tenant=tenant, session=session), knowledge=source, ids=["gone"]
        ),
        timeout=60,
    )


if __name__ == "__main__":
    main()
