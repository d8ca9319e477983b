"""Files and folders that a killed write leaves behind, and how a start-up sweep tells them apart.

Temporary files and folders carry the id of the process writing them (`<pid>-` in their name), so a
sweep removes only those whose writer is gone, or is this very process starting up: a CLI `index` run
beside a serving sidecar on the same data folder never loses a save in flight.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def owner_tag() -> str:
    """The name part marking a temporary file or folder as this process's."""
    return f"{os.getpid()}-"


def orphaned(tagged: str) -> bool:
    """Whether the writer named at the start of `tagged` (`<pid>-...`) is gone; untagged names are orphans."""
    pid_text, dash, _ = tagged.partition("-")
    if not dash or not pid_text.isdigit():
        return True
    pid = int(pid_text)
    if pid == os.getpid():
        return True  # this process is starting: nothing of its own is in flight yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


def remove(path: Path) -> int:
    """Deletes a file or folder; returns the bytes it held (0 when it was already gone)."""
    try:
        if path.is_dir() and not path.is_symlink():
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            shutil.rmtree(path)
        else:
            size = path.stat().st_size
            path.unlink()
    except FileNotFoundError:
        return 0
    return size
