"""Models by hub id: `ragsidecar models install ORG/NAME[@REVISION]`, its lock file, `hub =` config entries, and
the reranker export layouts the loader takes. Offline: every test reads a hub cache it lays out itself (from the
packaged model files and tiny exports it builds), with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hub_fixtures import LAYOUTS, Layout, commit_sha, lay_out_repo, sha256, write_export
from sidecar import MODELS, REPO, default_config

from ragsidecar.v1 import reranker_pb2

PACKAGED = MODELS / "ms-marco-MiniLM-L-12-v2"
REPO_ID = "acme/ms-marco-MiniLM-L-12-v2"
OLD, NEW = commit_sha("old"), commit_sha("new")
DOCS = REPO / "docs" / "reranker.md"
# The repository the docs' examples name, laid out from the packaged reranker's files.
DOCS_REPO = "cross-encoder/ms-marco-MiniLM-L6-v2"


def hub_env(tmp_path: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1"}


def cli(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAGSIDECAR_", "HF_"))}
    return subprocess.run(
        [sys.executable, "-m", "ragsidecar", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**clean, **hub_env(tmp_path), **env},
        timeout=120,
    )


@pytest.fixture
def hub(tmp_path: Path) -> Path:
    """A hub cache holding REPO_ID at two commits: OLD (tag v1, a tiny export) and NEW (main, the packaged
    reranker, with a quantized variant beside it)."""
    tiny = write_export(tmp_path / "tiny", LAYOUTS[0])
    cache = tmp_path / "hub"
    lay_out_repo(
        cache,
        REPO_ID,
        OLD,
        {"onnx/model.onnx": tiny / "model.onnx", "tokenizer.json": tiny / "tokenizer.json"},
        refs=("v1",),
    )
    lay_out_repo(
        cache,
        REPO_ID,
        NEW,
        {
            "onnx/model.onnx": PACKAGED / "model.onnx",
            "onnx/model_quantized.onnx": tiny / "model.onnx",
            "tokenizer.json": PACKAGED / "tokenizer.json",
        },
        refs=("main",),
    )
    return cache


def lock_of(models: Path) -> dict:
    return json.loads((models / "models.lock").read_text())


def test_install_by_hub_id_at_a_revision_at_the_default_ref_and_quantized(hub: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    tiny = tmp_path / "tiny"
    for args in (
        ["--id", "tagged", f"{REPO_ID}@v1"],
        ["--id", "pinned", f"{REPO_ID}@{OLD}"],
        [REPO_ID],
        ["--id", "quantized", "--quantized", REPO_ID],
    ):
        done = cli("models", "install", "--models-dir", str(models), *args, tmp_path=tmp_path)
        assert done.returncode == 0, done.stderr
        assert re.fullmatch(r"installed \S+\n", done.stdout)

    files = {
        "model.onnx": ("onnx/model.onnx", tiny / "model.onnx"),
        "tokenizer.json": ("tokenizer.json", tiny / "tokenizer.json"),
    }
    packaged = {name: (source, PACKAGED / name) for name, (source, _) in files.items()}
    quantized = {
        "model.onnx": ("onnx/model_quantized.onnx", tiny / "model.onnx"),
        "tokenizer.json": ("tokenizer.json", PACKAGED / "tokenizer.json"),
    }
    expected = {
        "tagged": ("v1", OLD, files),
        "pinned": (OLD, OLD, files),
        "ms-marco-MiniLM-L-12-v2": ("main", NEW, packaged),
        "quantized": ("main", NEW, quantized),
    }
    assert lock_of(models) == {
        "lock_version": 1,
        "models": {
            model_id: {
                "repo": REPO_ID,
                "ref": ref,
                "revision": revision,
                "files": {name: {"source": source, "sha256": sha256(origin)} for name, (source, origin) in f.items()},
            }
            for model_id, (ref, revision, f) in expected.items()
        },
    }
    for model_id, (_, _, f) in expected.items():
        for name, (_, origin) in f.items():
            installed = models / model_id / name
            assert not installed.is_symlink() and installed.read_bytes() == origin.read_bytes()


def test_the_lock_reproduces_the_install_byte_for_byte_in_a_fresh_models_folder(hub: Path, tmp_path: Path) -> None:
    first, fresh = tmp_path / "first", tmp_path / "fresh"
    for args in ([f"{REPO_ID}@v1", "--id", "old"], [REPO_ID, "--quantized"]):
        assert cli("models", "install", "--models-dir", str(first), *args, tmp_path=tmp_path).returncode == 0
    copied = shutil.copy(first / "models.lock", tmp_path / "copied.lock")

    done = cli("models", "install", "--models-dir", str(fresh), "--lock", str(copied), tmp_path=tmp_path)

    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == sorted(
        ["installed", str(fresh / "old"), "installed", str(fresh / "ms-marco-MiniLM-L-12-v2")]
    )
    assert lock_of(fresh) == lock_of(first)
    for model_id in ("old", "ms-marco-MiniLM-L-12-v2"):
        for name in ("model.onnx", "tokenizer.json"):
            assert (fresh / model_id / name).read_bytes() == (first / model_id / name).read_bytes()


def test_a_file_whose_bytes_differ_from_the_lock_is_refused(hub: Path, tmp_path: Path) -> None:
    first, fresh = tmp_path / "first", tmp_path / "fresh"
    assert cli("models", "install", "--models-dir", str(first), REPO_ID, tmp_path=tmp_path).returncode == 0
    locked = lock_of(first)["models"]["ms-marco-MiniLM-L-12-v2"]["files"]["model.onnx"]
    # The hub (here its cache) now serves other bytes under the locked commit.
    blob = hub / f"models--{REPO_ID.replace('/', '--')}" / "blobs" / locked["sha256"]
    blob.write_bytes(blob.read_bytes() + b"tampered")

    done = cli("models", "install", "--models-dir", str(fresh), "--lock", str(first / "models.lock"), tmp_path=tmp_path)

    assert done.returncode == 1
    assert f"ms-marco-MiniLM-L-12-v2/model.onnx (onnx/model.onnx of {REPO_ID}@{NEW}) has sha256 " in done.stderr
    assert f"the lock records {locked['sha256']}; refusing to install it" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (fresh / "ms-marco-MiniLM-L-12-v2" / "model.onnx").exists()


def test_a_lock_whose_ids_lead_out_of_the_models_folder_is_refused(hub: Path, tmp_path: Path) -> None:
    first = tmp_path / "first"
    assert cli("models", "install", "--models-dir", str(first), REPO_ID, tmp_path=tmp_path).returncode == 0
    lock = lock_of(first)
    lock["models"]["../outside"] = lock["models"].pop("ms-marco-MiniLM-L-12-v2")
    (tmp_path / "hostile.lock").write_text(json.dumps(lock))

    done = cli(
        "models",
        "install",
        "--models-dir",
        str(tmp_path / "fresh"),
        "--lock",
        str(tmp_path / "hostile.lock"),
        tmp_path=tmp_path,
    )

    assert done.returncode == 1
    assert "hostile.lock: model id '../outside': it names an entry inside the models folder" in done.stderr
    assert not (tmp_path / "outside").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nobody/nothing"], "nobody/nothing is not in the local hub cache and HF_HUB_OFFLINE is set"),
        ([f"{REPO_ID}@v2"], f"{REPO_ID}@v2 is not in the local hub cache"),
        (
            [f"{REPO_ID}@v1", "--quantized"],
            f"{REPO_ID}@{OLD} has no quantized graph; it has onnx/model.onnx: name one with --onnx-file",
        ),
        ([REPO_ID, "--onnx-file", "onnx/model_O4.onnx"], f"{REPO_ID}@{NEW} has no file onnx/model_O4.onnx"),
        ([REPO_ID, "--id", "../elsewhere"], "model id '../elsewhere': it names an entry inside the models folder"),
    ],
)
def test_install_errors_say_what_is_missing(hub: Path, tmp_path: Path, args: list[str], message: str) -> None:
    done = cli("models", "install", "--models-dir", str(tmp_path / "models"), *args, tmp_path=tmp_path)
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_repository_without_an_onnx_export_says_how_to_make_one(tmp_path: Path) -> None:
    lay_out_repo(
        tmp_path / "hub", "acme/pytorch-only", OLD, {"tokenizer.json": PACKAGED / "tokenizer.json"}, refs=("main",)
    )
    done = cli("models", "install", "--models-dir", str(tmp_path / "models"), "acme/pytorch-only", tmp_path=tmp_path)
    assert done.returncode == 1 and "has no ONNX export; export one (e.g. `optimum-cli export onnx" in done.stderr


def test_options_that_do_not_fit_together_are_refused(tmp_path: Path) -> None:
    done = cli("models", "install", "--quantized", str(PACKAGED), tmp_path=tmp_path)
    assert done.returncode == 2 and "apply to a hub model id" in done.stderr
    done = cli("models", "install", "--lock", "models.lock", REPO_ID, tmp_path=tmp_path)
    assert done.returncode == 2 and "--lock installs what the lock file records" in done.stderr


def test_a_hub_entry_that_is_not_a_hub_id_is_a_configuration_error(tmp_path: Path) -> None:
    config = tmp_path / "ragsidecar.toml"
    config.write_text(
        '[retrieval]\nembedder = ""\n\n[[models]]\nid = "x"\nkind = "cross-encoder"\n'
        'hub = "https://example.org/model"\n'
    )
    done = cli("serve", "--config", str(config), tmp_path=tmp_path)
    assert done.returncode == 2
    assert "invalid configuration: models[0].hub: 'https://example.org/model' is not a hub model id" in done.stderr


# --- Export layouts and `hub =` entries, served ---


def docs_section() -> str:
    return DOCS.read_text().split("## Any reranker from a model hub", 1)[1].split("\n## ", 1)[0]


def docs_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", docs_section(), re.S)


def lay_out_docs_repo(cache: Path) -> None:
    lay_out_repo(
        cache,
        DOCS_REPO,
        NEW,
        {
            "onnx/model.onnx": PACKAGED / "model.onnx",
            "onnx/model_quint8_avx2.onnx": PACKAGED / "model.onnx",
            "tokenizer.json": PACKAGED / "tokenizer.json",
        },
        refs=("main",),
    )


def test_the_docs_install_commands_run_offline_from_a_hub_cache(tmp_path: Path) -> None:
    lay_out_docs_repo(tmp_path / "hub")
    (block,) = docs_blocks("sh")
    models = tmp_path / "models"
    venv_bin = str(Path(sys.executable).parent)
    shell = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{block}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            **hub_env(tmp_path),
            "RAGSIDECAR_MODELS_DIR": str(models),
            "PATH": f"{venv_bin}:{os.environ['PATH']}",
        },
    )
    assert shell.returncode == 0, shell.stderr
    assert set(lock_of(models)["models"]) == {"ms-marco-MiniLM-L6-v2", "ms-marco-L6-int8"}
    assert (
        lock_of(models)["models"]["ms-marco-L6-int8"]["files"]["model.onnx"]["source"] == "onnx/model_quint8_avx2.onnx"
    )
    reproduced = tmp_path / "fresh" / "ms-marco-L6-int8" / "model.onnx"
    assert reproduced.read_bytes() == (PACKAGED / "model.onnx").read_bytes()


def test_hub_entries_of_each_export_layout_rerank_in_order_through_the_server(make_sidecar, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    lay_out_docs_repo(cache)
    for layout in LAYOUTS:
        export = write_export(tmp_path / "exports" / layout.name, layout)
        lay_out_repo(
            cache,
            f"tiny/{layout.name}",
            commit_sha(layout.name),
            {"onnx/model.onnx": export / "model.onnx", "tokenizer.json": export / "tokenizer.json"},
            refs=("main",),
        )
    config = default_config()
    config["paths"]["models_dir"] = str(tmp_path / "models")
    config["retrieval"]["embedder"] = ""
    (docs_entry,) = [tomllib.loads(block)["models"][0] for block in docs_blocks("toml")]
    config["models"] = [docs_entry] + [
        {"id": layout.name, "kind": "cross-encoder", "max_length": 256, "hub": f"tiny/{layout.name}@main"}
        for layout in LAYOUTS
    ]
    server = make_sidecar(config, env=hub_env(tmp_path)).start()

    documents = ["dog dog", "the cat sat on the mat with a cat and a cat", "a dog and a cat"]
    for layout in LAYOUTS:
        answer = server.reranker().Rerank(
            reranker_pb2.RerankRequest(
                query="Which pet purrs?",
                model=layout.name,
                documents=[reranker_pb2.RerankDocument(text=t) for t in documents],
            ),
            timeout=60,
        )
        assert [r.index for r in answer.results] == [1, 2, 0], layout
        assert [r.raw_score for r in answer.results] == [3.0, 1.0, 0.0], layout
    answer = server.reranker().Rerank(
        reranker_pb2.RerankRequest(
            query="how many people live in berlin",
            model=docs_entry["id"],
            documents=[
                reranker_pb2.RerankDocument(text=t)
                for t in (
                    "New York City is famous for the Metropolitan Museum of Art.",
                    "Berlin has a population of 3,520,031 registered inhabitants "
                    "in an area of 891.82 square kilometers.",
                )
            ],
        ),
        timeout=60,
    )
    assert [r.index for r in answer.results] == [1, 0]
    locked = lock_of(tmp_path / "models")["models"]
    assert locked["bert-b1"]["revision"] == commit_sha("bert-b1") and locked["xlmr-b2"]["ref"] == "main"
    assert locked[docs_entry["id"]]["files"]["model.onnx"]["sha256"] == sha256(PACKAGED / "model.onnx")

    # Later starts find the models through the lock: the hub (here its cache) is not needed any more.
    server.stop()
    shutil.rmtree(cache)
    restarted = make_sidecar(config, env=hub_env(tmp_path)).start()
    answer = restarted.reranker().Rerank(
        reranker_pb2.RerankRequest(
            query="Which pet purrs?",
            model="xlmr-b2",
            documents=[reranker_pb2.RerankDocument(text=t) for t in documents],
        ),
        timeout=60,
    )
    assert [r.index for r in answer.results] == [1, 2, 0]


@pytest.mark.parametrize(
    ("layout", "pair_template", "message"),
    [
        (
            Layout("nli", "bert", type_ids=True, logits="[B,3]"),
            True,
            "a cross-encoder's first output must be logits shaped [B], [B,1] or [B,2]; "
            "this one has rank 2, last axis 3",
        ),
        (
            Layout("per-token", "bert", type_ids=True, logits="[B,T]"),
            True,
            "model 'odd': a cross-encoder gives one or two logits per pair ([B], [B,1] or [B,2]); this graph gives ",
        ),
        (LAYOUTS[1], False, "tokenizer.json has no post-processor: a query and a document would be joined without"),
    ],
)
def test_an_export_the_loader_cannot_score_with_is_refused_at_start(
    make_sidecar, tmp_path: Path, layout: Layout, pair_template: bool, message: str
) -> None:
    export = write_export(tmp_path / "export", layout, pair_template)
    config = default_config()
    config["retrieval"]["embedder"] = ""
    config["models"] = [{"id": "odd", "kind": "cross-encoder", "path": str(export)}]
    server = make_sidecar(config).start(wait_serving=False)
    assert server.process.wait(60) == 1
    assert message in server.log()
