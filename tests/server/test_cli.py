"""The command line around serving: `ragsidecar config` and `ragsidecar health`, and the built-in defaults."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from sidecar import REPO, Sidecar, default_config, free_port, to_toml

from ragsidecar.config import ConfigError
from ragsidecar.config_loading import load_config


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGSIDECAR_")}
    return subprocess.run(
        [sys.executable, "-m", "ragsidecar", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
    )


def test_config_without_a_file_prints_the_defaults_under_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    shown = cli("config", cwd=tmp_path, RAGSIDECAR_HOME=str(home), RAGSIDECAR_PORT="6123")
    assert shown.returncode == 0, shown.stderr
    config = tomllib.loads(shown.stdout)
    assert config["paths"] == {
        "models_dir": str(home / "models"),
        "data_dir": str(home / "data"),
        "knowledge_roots": [str(home / "knowledge")],
    }
    assert config["server"]["port"] == 6123  # environment overrides apply
    assert [m["id"] for m in config["models"]] == ["ms-marco-MiniLM-L-12-v2", "bge-small-en-v1.5"]
    assert list(tmp_path.iterdir()) == []  # showing the configuration creates nothing


def test_a_printed_config_loads_back_to_the_same_settings_wherever_it_is_saved(tmp_path: Path) -> None:
    original = tmp_path / "a" / "ragsidecar.toml"
    original.parent.mkdir()
    config = default_config()
    config["paths"]["knowledge_roots"] = ["docs", "../other docs"]
    original.write_text(to_toml(config) + '\n[retrieval.model_windows]\n"acme/llm \\"x\\"" = 4096\n')
    first = cli("config", "--config", str(original), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    saved = tmp_path / "b" / "c" / "copy.toml"
    saved.parent.mkdir(parents=True)
    saved.write_text(first.stdout)
    second = cli("config", "--config", str(saved), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    shown = tomllib.loads(first.stdout)
    assert shown["paths"]["knowledge_roots"] == [str(tmp_path / "a" / "docs"), str(tmp_path / "other docs")]
    assert shown["retrieval"]["model_windows"] == {'acme/llm "x"': 4096}


def test_health_exits_zero_only_when_serving(sidecar: Sidecar, tmp_path: Path) -> None:
    serving = cli("health", "--address", sidecar.address, cwd=tmp_path)
    assert (serving.returncode, serving.stdout.split()[-1]) == (0, "SERVING")
    unknown = cli("health", "--address", sidecar.address, "--service", "no.such.Service", cwd=tmp_path)
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    closed = cli("health", "--address", f"127.0.0.1:{free_port()}", "--timeout", "2", cwd=tmp_path)
    assert closed.returncode == 1 and "UNAVAILABLE" in closed.stderr


def test_health_finds_the_configured_listener(make_sidecar, tmp_path: Path) -> None:
    server = make_sidecar(unix_socket=True).start()
    served = cli("health", "--config", str(server.config_path), cwd=tmp_path)
    assert served.returncode == 0, served.stderr
    assert served.stdout.startswith(f"unix:{server.workdir / 'sidecar.sock'} ")
    port_zero = cli("health", "--config", str(server.config_path), cwd=tmp_path, RAGSIDECAR_UNIX_SOCKET="")
    assert port_zero.returncode == 2 and "--address" in port_zero.stderr


def test_the_kubernetes_example_config_is_valid(tmp_path: Path) -> None:
    manifest = (REPO / "deploy" / "kubernetes" / "configmap.yaml").read_text()
    block = manifest.split("ragsidecar.toml: |\n", 1)[1]
    config_file = tmp_path / "ragsidecar.toml"
    config_file.write_text(textwrap.dedent(block))
    shown = cli("config", "--config", str(config_file), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    config = tomllib.loads(shown.stdout)
    assert config["server"]["unix_socket"] == "/run/ragsidecar/sidecar.sock"
    assert config["paths"]["models_dir"] == "/opt/ragsidecar/models"
    # It listens beyond loopback (for the kubelet's probes), so it serves only with the Secret's token.
    protected = load_config(config_file, check_files=False)
    with pytest.MonkeyPatch.context() as env:
        env.delenv("RAGSIDECAR_TOKEN", raising=False)
        with pytest.raises(ConfigError, match="server.host: '0.0.0.0' is reachable beyond this machine"):
            protected.check_listener_protected()
        env.setenv("RAGSIDECAR_TOKEN", "from-the-secret")
        protected.check_listener_protected()
