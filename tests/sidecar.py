"""Test harness: the real sidecar as a subprocess on loopback, with a config written per test."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

import grpc
import tomli_w
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from ragsidecar.v1 import reranker_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "models"
DEFAULT_CONFIG = REPO / "config" / "ragsidecar.toml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_config(packaged: bool = False) -> dict[str, Any]:
    """The repository's config with a relative data folder. Its models are the tiny ones the tests build, under the
    packaged models' ids (tests/tiny_models.py); `packaged`: the real packaged models, for a test about what a
    model does (ranking quality, tokenization limits, vector sizes)."""
    config = tomllib.loads(DEFAULT_CONFIG.read_text())
    config["paths"]["models_dir"] = str(MODELS if packaged else tiny_models_dir())
    config["paths"]["data_dir"] = "data"
    return config


@functools.cache
def tiny_models_dir() -> Path:
    """The tiny models, built once into .cache/tiny-models/<digest of their builder> and reused by every later
    session and xdist worker (a build lands under its final name whole, so concurrent builders never see half)."""
    builder = Path(__file__).with_name("tiny_models.py")
    folder = REPO / ".cache" / "tiny-models" / hashlib.sha256(builder.read_bytes()).hexdigest()[:16]
    if not folder.is_dir():
        from tiny_models import build

        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix="partial-", dir=folder.parent))
        build(partial)
        try:
            partial.rename(folder)
        except OSError:  # another worker finished first: its build is the same model
            shutil.rmtree(partial, ignore_errors=True)
    return folder


# A test config (a dict of tables) as TOML text.
to_toml = tomli_w.dumps


class Sidecar:
    """One sidecar process. Start it with `start()`; `stop()` always kills it."""

    def __init__(
        self,
        workdir: Path,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        unix_socket: bool = False,
    ) -> None:
        self.workdir = workdir
        self.config = config if config is not None else default_config()
        self.config.setdefault("server", {})["port"] = 0
        self.config["server"].setdefault("config_poll_s", 0.0)
        self.metrics_port = free_port()
        self.config.setdefault("metrics", {})["port"] = self.metrics_port
        if unix_socket:
            self.config["server"]["unix_socket"] = str(workdir / "sidecar.sock")
        self.config_path = workdir / "ragsidecar.toml"
        self.env = {**os.environ, "RAGSIDECAR_TOKEN": "", **(env or {})}
        self.process: subprocess.Popen[str] | None = None
        self.address = ""
        self.unix_address = ""
        # The HTTP API's base URL, when [http] port is set.
        self.http_url = ""
        self.output: list[str] = []
        self._listening = threading.Event()

    def write_config(self, config: dict[str, Any] | None = None) -> None:
        if config is not None:
            self.config = config
        self.config_path.write_text(to_toml(self.config))

    def start(self, wait_serving: bool = True, timeout: float = 90.0) -> Sidecar:
        self.write_config()
        command = [sys.executable, "-m", "ragsidecar", "serve", "--config", str(self.config_path)]
        self.process = subprocess.Popen(
            command, cwd=self.workdir, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._read_output, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._listening.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("sidecar did not start:\n" + self.log())
        if wait_serving:
            self.wait_health(health_pb2.HealthCheckResponse.SERVING, timeout=deadline - time.monotonic())
        return self

    def _read_output(self) -> None:
        assert self.process and self.process.stdout
        for line in self.process.stdout:
            self.output.append(line)
            match = re.match(r"ragsidecar listening on (\S+)", line)
            if match and match.group(1).startswith("unix:"):
                self.unix_address = match.group(1)
            elif match:
                self.address = match.group(1)
            if line.startswith("ragsidecar http on "):
                self.http_url = line.split()[-1]
            if line.startswith("ragsidecar metrics on") or (match and not self.config.get("metrics", {}).get("port")):
                self._listening.set()

    def log(self) -> str:
        return "".join(self.output)

    def channel(self, target: str | None = None, **options: Any) -> grpc.Channel:
        return grpc.insecure_channel(target or self.address, options=list(options.items()))

    def reranker(self, channel: grpc.Channel | None = None) -> reranker_pb2_grpc.RerankerServiceStub:
        return reranker_pb2_grpc.RerankerServiceStub(channel or self.channel())

    def health(self, service: str = "") -> int:
        stub = health_pb2_grpc.HealthStub(self.channel())
        try:
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            raise

    def wait_health(self, status: int, service: str = "", timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.health(service) != status:
            if time.monotonic() > deadline or (self.process and self.process.poll() is not None):
                raise RuntimeError(f"health of {service!r} never became {status}:\n{self.log()}")
            time.sleep(0.1)

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include the given ones."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def rss_mib(self) -> int:
        """The process's resident memory (VmRSS), in MiB."""
        assert self.process
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) // 1024

    def signal(self, signum: int) -> None:
        assert self.process
        self.process.send_signal(signum)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(20)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        return self.process.returncode


def error_details(err: grpc.RpcError) -> tuple[error_details_pb2.ErrorInfo | None, list[tuple[str, str]]]:
    """The ErrorInfo and the (field, description) violations a status carries."""
    status = rpc_status.from_call(err)
    info, violations = None, []
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations += [(v.field, v.description) for v in bad.field_violations]
    return info, violations


def status_wire_bytes(err: grpc.RpcError) -> int:
    """grpc-message (percent-encoded) plus grpc-status-details-bin (base64), as they travel in the trailers."""
    details_bin = dict(err.trailing_metadata() or ()).get("grpc-status-details-bin", b"")
    message = urllib.parse.quote(err.details() or "", safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
    return len(message) + len(base64.b64encode(details_bin))
