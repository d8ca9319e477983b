"""Path security for FILE and DIRECTORY sources: every knowledge path, and every file it lists, must resolve
inside a configured knowledge root, after symlinks; and no error names the server's own folders."""

from __future__ import annotations

import errno
import glob
import os
from pathlib import Path

from ragsidecar.errors import ErrorKind, SidecarError, Violation, invalid
from ragsidecar.knowledge.declarations import Entry, SourceType
from ragsidecar.knowledge.sources.files import list_files
from ragsidecar.knowledge.sources.units import SOURCE_UNREADABLE, SourceError

# Longest knowledge path, and longest folder or file name in one, in UTF-8 bytes (Linux's PATH_MAX - 1, NAME_MAX).
MAX_PATH_BYTES = 4095
MAX_NAME_BYTES = 255


class KnowledgeRoots:
    """The configured knowledge roots, and the checks that keep every knowledge path inside them."""

    def __init__(self, roots: list[Path]) -> None:
        self._roots = roots

    def resolve_path(self, path: str) -> Path:
        """The path, made absolute against the first root, that must resolve inside a root."""
        if "\x00" in path:
            raise invalid([Violation("path", f"knowledge path {path[:200]!r} contains a NUL character")])
        if too_long := _length_problem(path):
            raise invalid([Violation("path", f"knowledge path {path[:200]!r} is too long: {too_long}")])
        if not self._roots:
            raise _outside(path, "no knowledge roots are configured")
        try:
            candidate = Path(path).expanduser()
        except RuntimeError:  # "~nosuchuser/...": a home that does not exist cannot be inside a root
            raise _outside(path, "its home directory is unknown") from None
        if not candidate.is_absolute():
            candidate = self._roots[0] / candidate
        prefix = _glob_prefix(candidate)
        self._check_inside(_resolved(prefix, path), path)
        return candidate

    def files_of(self, entry: Entry) -> list[Path]:
        """The files a FILE or DIRECTORY entry reads; every one checked inside the roots after symlinks."""
        location = self.resolve_path(entry.path)
        try:
            if entry.type is SourceType.FILE and not location.is_file():
                raise FileNotFoundError(entry.path)
            files = [location] if entry.type is SourceType.FILE else list_files(location)
        except OSError as err:
            raise _unreadable(entry.path, err) from None
        inside = [str(root.resolve()).rstrip("/") + "/" for root in self._roots]
        folders: dict[Path, str] = {}  # each listed folder after symlinks: its files' paths then cost one lstat
        for file in files:
            if not any(f"{self._real_file(file, folders)}/".startswith(root) for root in inside):
                raise _outside(self.shown(file), "it resolves outside the configured knowledge roots")
        return files

    def _real_file(self, file: Path, folders: dict[Path, str]) -> str:
        """The file's path after symlinks: a file that is no symlink is its folder's (resolved once per folder)."""
        if os.path.islink(file):
            return str(_resolved(file, self.shown(file)))
        if (folder := folders.get(file.parent)) is None:
            folder = folders[file.parent] = str(_resolved(file.parent, self.shown(file)))
        return os.path.join(folder, file.name)

    def folder_of(self, entry: Entry) -> Path | None:
        """The folder, after symlinks, whose tree holds every file a DIRECTORY entry lists (a glob's folder for a
        glob); None when its location is not a folder."""
        folder = _resolved(_glob_prefix(self.resolve_path(entry.path)), entry.path)
        return folder if folder.is_dir() else None

    def root_of(self, file: Path) -> Path:
        """The resolved root a listed file lies in (the one its provenance path is relative to)."""
        resolved = _resolved(file, self.shown(file))
        return next(r for r in self._roots if resolved.is_relative_to(r.resolve())).resolve()

    def shown(self, file: Path) -> str:
        """How errors name a file: relative to the knowledge root holding it (never the server's own folders), else
        as the caller sent it (an absolute path of theirs)."""
        return next(
            (file.relative_to(root).as_posix() for root in self._roots if file.is_relative_to(root)), file.as_posix()
        )

    def stat(self, file: Path) -> os.stat_result:
        try:
            return file.stat()
        except OSError as err:  # a file listed a moment ago, removed or made unreadable since
            raise _unreadable(self.shown(file), err) from None

    def _check_inside(self, resolved: Path, shown: str) -> None:
        if not any(resolved == root.resolve() or resolved.is_relative_to(root.resolve()) for root in self._roots):
            raise _outside(shown, "it resolves outside the configured knowledge roots")


def _resolved(path: Path, shown: str) -> Path:
    """The path after symlinks; a symlink loop (or a path the system cannot resolve) is unreadable."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as err:  # Python 3.11 raises RuntimeError on a loop, later ones OSError
        why = (
            "a symlink loop"
            if isinstance(err, RuntimeError) or getattr(err, "errno", None) == errno.ELOOP
            else f"it cannot be resolved ({err.strerror})"
        )
        raise SidecarError(
            ErrorKind.FAILED_PRECONDITION,
            "SOURCE_UNREADABLE",
            f"knowledge path {shown[:200]!r} is unreadable: {why}",
            metadata={"path": shown[:200]},
        ) from err


def _length_problem(path: str) -> str:
    """Why a path is longer than file systems take (PATH_MAX, NAME_MAX: Linux's, the widest in use), or "".
    Checked before any use, so the system's own error, naming the absolute path tried, never arises."""
    if len(encoded := path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"{len(encoded)} bytes, over the limit of {MAX_PATH_BYTES}"
    longest = max(
        (len(part.encode("utf-8", "surrogatepass")) for part in path.split("/") if not glob.has_magic(part)), default=0
    )
    return f"a name of {longest} bytes, over the limit of {MAX_NAME_BYTES}" if longest > MAX_NAME_BYTES else ""


def _unreadable(shown: str, err: OSError) -> OSError | SourceError:
    """An OSError as sources report it, naming the path as shown: the system's own message names the absolute
    path it tried, which would reveal the server's folders. A missing file stays a FileNotFoundError."""
    if isinstance(err, FileNotFoundError):
        return FileNotFoundError(shown)
    why = "a symlink loop" if err.errno == errno.ELOOP else (err.strerror or type(err).__name__)
    return SourceError(SOURCE_UNREADABLE, f"{shown}: cannot read: {why}")


def _glob_prefix(path: Path) -> Path:
    """The part of a path before its first glob component (the folder a glob searches)."""
    parts = []
    for part in path.parts:
        if glob.has_magic(part):
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def _outside(path: str, why: str) -> SidecarError:
    return SidecarError(
        ErrorKind.PERMISSION_DENIED,
        "PATH_OUTSIDE_ROOTS",
        f"knowledge path {path!r} refused: {why}",
        metadata={"path": path},
    )
