"""`ragsidecar health`, the container's health check, stays light: it reads the config to find the address, but
loads none of the inference and search stack (onnxruntime, bm25s, the stemmers, numpy, usearch, tokenizers), nor
the model hub's client."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import Stemmer

from ragsidecar.knowledge.languages import STEMMERS

HEAVY = {"onnxruntime", "bm25s", "Stemmer", "numpy", "usearch", "tokenizers", "pypdf", "psycopg"}
EMBEDDER = '[[models]]\nid = "bge-small-en-v1.5"\nkind = "bi-encoder"\n'


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


def modules_health_imports(tmp_path: Path, config_text: str) -> set[str]:
    """The modules `ragsidecar health` imports with this config, checking a port where nothing listens."""
    config = tmp_path / "ragsidecar.toml"
    config.write_text(f"[server]\nport = {closed_port()}\n{config_text}", encoding="utf-8")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAGSIDECAR_")}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ragsidecar", "health", "--config", str(config), "--timeout", "5"],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
    )
    assert done.returncode == 1 and "health check of 127.0.0.1:" in done.stderr  # it ran: nothing listens there
    return {m.strip() for m in re.findall(r"^import time:.*\|(.*)$", done.stderr, re.MULTILINE)}


def test_health_imports_neither_onnxruntime_nor_bm25s_nor_the_stemmers(tmp_path: Path) -> None:
    imported = modules_health_imports(tmp_path, EMBEDDER)
    assert "ragsidecar.config" in imported and "grpc" in imported
    assert sorted(imported & HEAVY) == []


def test_health_with_a_hub_entry_leaves_huggingface_hub_unloaded(tmp_path: Path) -> None:
    """Only `models install` and loading a hub entry fetch; checking the entry's id needs no hub client."""
    hub_entry = '[retrieval]\nembedder = ""\n\n[[models]]\nid = "r"\nkind = "cross-encoder"\n'
    hub_entry += 'hub = "BAAI/bge-reranker-base@main"\n'
    imported = modules_health_imports(tmp_path, hub_entry)
    assert "ragsidecar.hub_models" in imported and "huggingface_hub" not in imported


def test_the_languages_the_config_accepts_are_the_stemmers_pystemmer_holds() -> None:
    assert STEMMERS == tuple(sorted(Stemmer.algorithms()))
