"""knowledge/watch.py in process, on real inotify: a watch counts the changes under its folder, the cap releases the
least recently used, and folders on file systems that others change without an event here are not watched."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ragsidecar.knowledge import watch
from ragsidecar.knowledge.watch import SourceWatches, events_arrive


def moved(watches: SourceWatches, identity: str, before: watch.Changes, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while watches.changes(identity) == before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_watch_counts_writes_in_subfolders_but_not_reads(tmp_path: Path) -> None:
    (tmp_path / "docs" / "deep").mkdir(parents=True)
    (tmp_path / "docs" / "a.txt").write_text("a")
    watches = SourceWatches(enabled=True, max_sources=4)
    try:
        before = watches.watch("docs", tmp_path / "docs")
        assert before is not None and watches.watched() == {"docs"}
        (tmp_path / "docs" / "a.txt").read_text()
        (tmp_path / "docs" / "a.txt").stat()
        time.sleep(0.3)
        assert watches.changes("docs") == before  # reading and stat'ing are not changes
        (tmp_path / "docs" / "deep" / "b.md").write_text("b")
        assert moved(watches, "docs", before)
        watches.release("docs")
        assert watches.changes("docs") is None and watches.watched() == set()
        again = watches.watch("docs", tmp_path / "docs")
        assert again is not None and again[0] != before[0]  # a new watch never matches an old one's count
    finally:
        watches.close()


def test_the_cap_releases_the_least_recently_used_watch(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    watches = SourceWatches(enabled=True, max_sources=2)
    try:
        watches.watch("a", tmp_path / "a")
        watches.watch("b", tmp_path / "b")
        watches.changes("a")  # a used more recently than b
        watches.watch("c", tmp_path / "c")
        assert watches.watched() == {"a", "c"}
    finally:
        watches.close()


def test_nothing_is_watched_when_watching_is_off_or_there_is_no_folder(tmp_path: Path) -> None:
    off = SourceWatches(enabled=False, max_sources=2)
    assert off.watch("a", tmp_path) is None and off.watched() == set()
    on = SourceWatches(enabled=True, max_sources=2)
    try:
        assert on.watch("a", None) is None and on.watched() == set()
    finally:
        on.close()


@pytest.mark.parametrize(
    ("folder", "arrive"),
    [
        ("/data/knowledge", True),
        ("/mnt/share/docs", False),
        ("/mnt/share/local/docs", True),
        ("/mnt/my docs/x", False),
        ("/host", False),
    ],
)
def test_folders_on_network_and_shared_file_systems_get_no_events(tmp_path, monkeypatch, folder, arrive) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "overlay / overlay rw 0 0\n"
        "server:/export /mnt/share nfs4 rw 0 0\n"
        "/dev/sdb1 /mnt/share/local ext4 rw 0 0\n"
        "//nas/docs /mnt/my\\040docs cifs rw 0 0\n"
        "hostshare /host 9p rw 0 0\n"
    )
    monkeypatch.setattr(watch, "_MOUNTS", mounts)
    assert events_arrive(Path(folder)) is arrive


def test_a_folder_that_cannot_be_watched_is_left_unwatched_and_logged_once(tmp_path: Path, caplog) -> None:
    watches = SourceWatches(enabled=True, max_sources=4)
    try:
        assert watches.watch("a", tmp_path / "gone") is None  # inotify refuses it, as at its watch limit
        assert watches.watch("b", tmp_path / "gone too") is None
        assert watches.watched() == set()
        assert watches.watch("c", tmp_path) is not None  # others are still watched
    finally:
        watches.close()
    warnings = [r for r in caplog.records if r.name == "ragsidecar.knowledge.watch"]
    assert len(warnings) == 1 and "rescan_interval_s" in warnings[0].getMessage()
