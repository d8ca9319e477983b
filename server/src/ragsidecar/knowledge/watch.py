"""Change detection for DIRECTORY sources: a file watcher on each source's folder (inotify, through watchdog), so
that a Search of an unchanged source reads no file state at all, whatever its number of files.

A watch counts the events under its folder; a scan of the source (every file listed and stat'ed, the index key
computed) records the watch's count from before it began, and the key stays current until the count moves. A
watch is scheduled before the scan it serves (watchdog adds the inotify watches before `schedule` returns), so a
change made while the scan runs is an event and the next Search scans again.

Watches are bounded (retrieval.max_watched_sources, the least recently used released for a new one, visible as
ragsidecar_watched_sources) and released with their source's index. Where no watch covers a source (watching
off, a file system whose changes made elsewhere raise no event here, the cap, or the watcher failed: logged once),
the catalog scans it again once its last scan is older than retrieval.rescan_interval_s. The observer's threads
only bump counters under a lock: they never touch the event loop.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from ragsidecar import metrics

log = logging.getLogger(__name__)

# File system types (of /proc/self/mounts) whose files other machines change without an inotify event here:
# network file systems, and the host folders Docker Desktop, WSL and VMs share (9p, virtiofs). Prefixes.
_EVENTLESS_FILE_SYSTEMS = ("nfs", "cifs", "smb", "9p", "virtiofs", "ceph", "glusterfs", "lustre", "fuse.")
_MOUNTS = Path("/proc/self/mounts")

# The events that may change a source's files or their sizes and modification times (attrib: `touch`); not
# opens and reads, so that reading the files (a build) does not count as a change.
_CHANGES: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileClosedEvent,
    FileAttribEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]

# What a scan records: the serial of the watch it was made under and that watch's event count before it began.
Changes = tuple[int, int]


@dataclass
class _Watch:
    serial: int  # unique per watch ever made, so a count of a released watch never matches a new one's
    folder: Path
    observed: ObservedWatch
    events: int = 0


class _Counter(FileSystemEventHandler):
    def __init__(self, watches: SourceWatches, identity: str) -> None:
        self._watches = watches
        self._identity = identity

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._watches.count(self._identity)


class SourceWatches:
    """The watched folders of DIRECTORY sources, by source identity (thread-safe: scans run on worker threads)."""

    def __init__(self, enabled: bool, max_sources: int) -> None:
        self._enabled = enabled
        self._max_sources = max_sources
        self._lock = threading.Lock()
        self._watches: collections.OrderedDict[str, _Watch] = collections.OrderedDict()
        self._serials = itertools.count(1)
        self._observer: BaseObserver | None = None
        self._failure_logged = False
        metrics.WATCHED_SOURCES.set_function(lambda: len(self._watches))

    def changes(self, identity: str) -> Changes | None:
        """The source's watch and its event count so far; None when no watch covers it."""
        with self._lock:
            watch = self._watches.get(identity)
            if watch is None:
                return None
            self._watches.move_to_end(identity)
            return watch.serial, watch.events

    def watch(self, identity: str, folder: Path | None) -> Changes | None:
        """Watches the folder for the source (before a scan of it: blocking, call it off the event loop) and
        returns `changes`; None when it is not watched (no folder, watching off, a file system without events
        from elsewhere, or the watcher failed)."""
        with self._lock:
            held = self._watches.get(identity)
            if held is not None and held.folder == folder:
                self._watches.move_to_end(identity)
                return held.serial, held.events
        self.release(identity)
        if folder is None or not self._enabled or not events_arrive(folder):
            return None
        try:
            observed = self._observing().schedule(
                _Counter(self, identity), str(folder), recursive=True, event_filter=_CHANGES
            )
        except OSError as err:  # inotify's watch or instance limit, or the folder gone
            self._failed(folder, err)
            return None
        watch = _Watch(next(self._serials), folder, observed)
        with self._lock:
            self._watches[identity] = watch
            over = len(self._watches) - self._max_sources
            released = [self._watches.popitem(last=False)[1] for _ in range(max(over, 0))]
        for old in released:
            self._unschedule(old)
        return watch.serial, watch.events

    def count(self, identity: str) -> None:
        with self._lock:
            if (watch := self._watches.get(identity)) is not None:
                watch.events += 1

    def release(self, identity: str) -> None:
        """Stops watching the source's folder (its index evicted or forgotten)."""
        with self._lock:
            watch = self._watches.pop(identity, None)
        if watch is not None:
            self._unschedule(watch)

    def watched(self) -> set[str]:
        with self._lock:
            return set(self._watches)

    def close(self) -> None:
        with self._lock:
            observer, self._observer = self._observer, None
            self._watches.clear()
        if observer is not None:
            observer.stop()
            observer.join()

    def _observing(self) -> BaseObserver:
        with self._lock:
            if self._observer is None:
                self._observer = Observer()
                self._observer.daemon = True
                self._observer.start()
            return self._observer

    def _unschedule(self, watch: _Watch) -> None:
        observer = self._observer
        if observer is not None:
            try:
                observer.unschedule(watch.observed)
            except (KeyError, OSError):  # its folder removed: the watch is gone already
                pass

    def _failed(self, folder: Path, err: OSError) -> None:
        """Logs the first failure to watch (the sources then rescan at retrieval.rescan_interval_s)."""
        metrics.WATCH_FAILURES.inc()
        if not self._failure_logged:
            self._failure_logged = True
            log.warning(
                "cannot watch knowledge folders for changes (%s; first at %s): DIRECTORY sources not watched are "
                "scanned again at most every retrieval.rescan_interval_s; raise fs.inotify.max_user_watches "
                "or max_user_instances to watch more",
                err.strerror or err,
                folder.name,
            )


def events_arrive(folder: Path) -> bool:
    """Whether changes under the folder raise inotify events here: not on the network and shared file systems
    (_EVENTLESS_FILE_SYSTEMS), which other machines change silently. Unknown (no /proc): assumed they do."""
    try:
        mounts = _MOUNTS.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return True
    best, kind = "", ""
    resolved = os.path.realpath(folder)
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return not kind.startswith(_EVENTLESS_FILE_SYSTEMS)
