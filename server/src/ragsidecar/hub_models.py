"""Installs ONNX exports from a model hub by id (`ORG/NAME[@REVISION]`), and reproduces them from a lock file.

The files are fetched with huggingface_hub (its cache, token, endpoint and HF_HUB_OFFLINE apply as usual) at
one commit, copied into `<models_dir>/<model id>/` as model.onnx and tokenizer.json (plus any external weights
file, under the name the graph refers to), and recorded in `<models_dir>/models.lock`: the repository, the
commit it resolved to and each file's sha256. Installing from the lock fetches that commit again and refuses any
file whose sha256 differs, so a second machine gets the same bytes.

huggingface_hub is imported inside the functions that fetch: commands and servers without hub models never load it.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ragsidecar.model_files import InstallError, ModelFile, install_file, sha256_of

log = logging.getLogger(__name__)

LOCK_NAME = "models.lock"
_LOCK_VERSION = 1
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w.][\w./-]*))?")
# Where exports keep their graphs: Optimum and transformers.js put them under onnx/, older exports at the root.
_ONNX_FOLDERS = ("onnx/", "")
_FULL_PRECISION = ("model.onnx",)
# Quantized variants, most portable first: transformers.js' dynamic int8 ("quantized"), then Optimum's
# per-instruction-set dynamic int8 exports (all run on any CPU; they are tuned for the one they name).
_QUANTIZED = (
    "model_quantized.onnx",
    "model_int8.onnx",
    "model_uint8.onnx",
    "model_quint8_avx2.onnx",
    "model_qint8_avx512.onnx",
    "model_qint8_avx512_vnni.onnx",
    "model_qint8_arm64.onnx",
)


@dataclass(frozen=True)
class HubRef:
    """A hub model id with an optional revision (branch, tag or commit sha)."""

    repo: str
    revision: str | None = None

    @classmethod
    def parse(cls, text: str) -> HubRef:
        match = _HUB_ID.fullmatch(text.strip())
        if match is None or ".." in text:
            raise ValueError(f"{text!r} is not a hub model id: expected ORG/NAME or ORG/NAME@REVISION")
        return cls(match["repo"], match["revision"])

    def __str__(self) -> str:
        return f"{self.repo}@{self.revision}" if self.revision else self.repo


@dataclass(frozen=True)
class LockedModel:
    repo: str
    # What the user asked for (a branch, tag or sha; "main" when nothing), and the commit it resolved to.
    ref: str
    revision: str
    # Installed name -> its path inside the repository, and its sha256.
    files: dict[str, ModelFile]


def is_hub_id(text: str) -> bool:
    try:
        HubRef.parse(text)
    except ValueError:
        return False
    return True


def install_from_hub(
    ref: HubRef, models_dir: Path, model_id: str | None = None, quantized: bool = False, onnx_file: str | None = None
) -> Path:
    """Fetches the export at `ref`, installs it as `<models_dir>/<model id>` and records it in the lock."""
    model_id = _plain_name(model_id or ref.repo.split("/")[1], "model id")
    commit, files = _resolve(ref)
    graph = onnx_file or pick_onnx_file(files, quantized, f"{ref.repo}@{commit}")
    if graph not in files:
        raise InstallError(f"{ref.repo}@{commit} has no file {graph}")
    sources = {"model.onnx": graph, "tokenizer.json": _pick_tokenizer(files, graph, f"{ref.repo}@{commit}")}
    sources.update({Path(data).name: data for data in _external_data(files, graph)})
    files_locked = {}
    for name, source in sources.items():
        fetched = _fetch(ref.repo, source, commit)
        files_locked[name] = ModelFile(source, sha256_of(fetched))
        _copy(fetched, models_dir / model_id / name, files_locked[name])
    locked = LockedModel(ref.repo, ref.revision or "main", commit, files_locked)
    _write_lock(models_dir / LOCK_NAME, {**read_lock(models_dir / LOCK_NAME), model_id: locked})
    log.info("model %s installed from %s@%s (%s)", model_id, ref.repo, commit, graph)
    return models_dir / model_id


def install_from_lock(lock_file: Path, models_dir: Path) -> list[Path]:
    """Installs every model a lock file records, byte for byte: a file whose sha256 differs is refused."""
    locked = read_lock(lock_file)
    for model_id, model in locked.items():
        for name, file in model.files.items():
            fetched = _fetch(model.repo, file.source, model.revision)
            digest = sha256_of(fetched)
            if digest != file.sha256:
                raise InstallError(
                    f"{lock_file}: {model_id}/{name} ({file.source} of {model.repo}@{model.revision}) "
                    f"has sha256 {digest}, the lock records {file.sha256}; refusing to install it"
                )
            _copy(fetched, models_dir / model_id / name, file)
    target_lock = models_dir / LOCK_NAME
    if target_lock.resolve() != lock_file.resolve():
        _write_lock(target_lock, {**read_lock(target_lock), **locked})
    return [models_dir / model_id for model_id in locked]


def ensure_installed(hub: str, folder: Path) -> None:
    """A `hub =` model entry: installs it into `folder` unless the lock beside it already records that
    repository at that revision with every file present (the server then starts without asking the hub)."""
    ref = HubRef.parse(hub)
    locked = read_lock(folder.parent / LOCK_NAME).get(folder.name)
    if (
        locked is not None
        and locked.repo == ref.repo
        and ref.revision in (None, locked.ref, locked.revision)
        and all((folder / name).is_file() for name in locked.files)
    ):
        return
    install_from_hub(ref, folder.parent, folder.name)


def pick_onnx_file(files: list[str], quantized: bool, where: str) -> str:
    """The graph to install: model.onnx, or with `quantized` the first quantized variant the repository has."""
    wanted = _QUANTIZED if quantized else _FULL_PRECISION
    for folder in _ONNX_FOLDERS:
        for name in wanted:
            if folder + name in files:
                return folder + name
    graphs = sorted(f for f in files if f.endswith(".onnx"))
    if not graphs:
        raise InstallError(
            f"{where} has no ONNX export; export one (e.g. `optimum-cli export onnx --model "
            "ORG/NAME --task text-classification DIR`) and install that folder"
        )
    kind = "quantized" if quantized else "full-precision (model.onnx)"
    raise InstallError(f"{where} has no {kind} graph; it has {', '.join(graphs)}: name one with --onnx-file")


def _pick_tokenizer(files: list[str], graph: str, where: str) -> str:
    """tokenizer.json beside the graph, else at the repository's root."""
    beside = str(Path(graph).with_name("tokenizer.json"))
    for candidate in (beside, "tokenizer.json"):
        if candidate in files:
            return candidate
    raise InstallError(f"{where} has no tokenizer.json (the fast tokenizer file the sidecar reads)")


def _external_data(files: list[str], graph: str) -> list[str]:
    """Weights kept outside the graph (exports over 2 GB): `model.onnx_data` or `model.onnx.data` beside it."""
    return [f for f in (graph + "_data", graph + ".data") if f in files]


def read_lock(lock_file: Path) -> dict[str, LockedModel]:
    if not lock_file.is_file():
        return {}
    try:
        raw = json.loads(lock_file.read_text())
        return {_plain_name(model_id, "model id"): _locked_model(m) for model_id, m in raw["models"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise InstallError(f"{lock_file} is not a ragsidecar model lock file: {err!r}") from None
    except InstallError as err:
        raise InstallError(f"{lock_file}: {err}") from None


def _locked_model(raw: dict) -> LockedModel:
    files = {_plain_name(name, "file name"): ModelFile(f["source"], f["sha256"]) for name, f in raw["files"].items()}
    return LockedModel(raw["repo"], raw["ref"], raw["revision"], files)


def _plain_name(name: str, what: str) -> str:
    """A model id or installed file name: one folder entry inside the models folder, never a path out of it."""
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise InstallError(f"{what} {name!r}: it names an entry inside the models folder, so it holds no '/'")
    return name


def _write_lock(lock_file: Path, models: dict[str, LockedModel]) -> None:
    raw = {
        "lock_version": _LOCK_VERSION,
        "models": {
            model_id: {
                "repo": m.repo,
                "ref": m.ref,
                "revision": m.revision,
                "files": {name: {"source": f.source, "sha256": f.sha256} for name, f in sorted(m.files.items())},
            }
            for model_id, m in sorted(models.items())
        },
    }
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    partial = lock_file.with_name(lock_file.name + ".partial")
    partial.write_text(json.dumps(raw, indent=2) + "\n")
    partial.replace(lock_file)


def _resolve(ref: HubRef) -> tuple[str, list[str]]:
    """The commit `ref` names and the repository's files at it: from the hub, or offline from the local cache."""
    from huggingface_hub import HfApi, is_offline_mode, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        if is_offline_mode():
            snapshot = Path(snapshot_download(ref.repo, revision=ref.revision, local_files_only=True))
            return snapshot.name, sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
        info = HfApi().model_info(ref.repo, revision=ref.revision)
        return str(info.sha), sorted(s.rfilename for s in info.siblings or [])
    except LocalEntryNotFoundError:
        raise InstallError(f"{ref} is not in the local hub cache and HF_HUB_OFFLINE is set") from None
    except (HfHubHTTPError, OSError) as err:
        raise InstallError(f"{ref}: the hub could not be asked: {err}") from None


def _fetch(repo: str, source: str, commit: str) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return Path(hf_hub_download(repo, source, revision=commit))
    except (HfHubHTTPError, OSError) as err:
        raise InstallError(f"{source} of {repo}@{commit} could not be fetched: {err}") from None


def _copy(fetched: Path, target: Path, file: ModelFile) -> None:
    """Copies a fetched file into the model folder (a whole copy: the models folder must not depend on the
    hub cache); a file already holding those bytes is left alone."""
    install_file(target, file.sha256, functools.partial(shutil.copyfile, fetched), file.source)
