"""Watching kernel files on disk: watchdog events -> debounced, content-deduplicated FileChanged.

Editors rarely write a file in place. vim writes a ``4913`` probe, renames the file to ``file~``, writes a
new one and deletes the backup; VS Code truncates and writes (several modify events); JetBrains IDEs write
``file___jb_tmp___`` and rename it over the original. So we watch the *directories* (a rename replaces
the inode a per-file watch would hold), map created / modified / closed-after-write / moved-to events to
the path they leave behind, keep the paths we care about, and let :func:`debounce_by_content` turn each
burst into at most one :class:`FileChanged` -- none when the content did not change.
"""

from __future__ import annotations

import fnmatch
import os
import threading
from collections.abc import Callable, Iterable, Mapping

from reactivex import Observable, abc
from reactivex.disposable import Disposable
from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from ..model._events import FileChanged
from ._operators import debounce_by_content, file_digest

__all__ = ["DEFAULT_PATTERNS", "file_digest", "watch_files"]

DEFAULT_PATTERNS: tuple[str, ...] = ("*.ptx", "*.cubin", "*.fatbin", "*.cu", "*.cuh", "*.json")

# Deletions are left out on purpose: a file that disappears mid-save comes back a moment later, and one
# that stays deleted leaves the last good kernel running.
_EVENTS = [FileCreatedEvent, FileModifiedEvent, FileClosedEvent, FileMovedEvent]
_KINDS = frozenset(e.event_type for e in _EVENTS)


def watch_files(
    paths_or_dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    patterns: str | Iterable[str] = DEFAULT_PATTERNS,
    *,
    debounce: float = 0.05,
    scheduler: abc.SchedulerBase | None = None,
    recursive: bool = False,
) -> Observable[FileChanged]:
    """An Observable of :class:`FileChanged`, one per save that changed a watched file's content.

    ``paths_or_dirs`` names files (always watched, whatever ``patterns`` say, and they need not exist
    yet) and directories (their files matching ``patterns`` are watched; subdirectories too when
    ``recursive``). Emitted paths are absolute.

    Each subscription starts its own watchdog observer and takes the digests of the watched files as
    they are then, so only later changes are reported; disposing it stops the observer and joins its
    threads. Items arrive on a timer thread of ``scheduler`` (a ``TimeoutScheduler`` by default) about
    ``debounce`` seconds after a save's last file-system event.

    >>> d = watch_files(["kernels/forces.cu"]).subscribe(print)  # doctest: +SKIP
    >>> # save forces.cu in an editor: one FileChanged(path='/.../kernels/forces.cu', digest='...')
    >>> d.dispose()  # doctest: +SKIP
    """
    files, dirs = _targets(paths_or_dirs)
    patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
    if not isinstance(debounce, int | float) or isinstance(debounce, bool) or debounce < 0:
        raise ValueError(f"'debounce' must be a non-negative number of seconds (got {debounce!r})")

    wanted = _matcher(files, dirs, patterns, recursive)

    def seed() -> Mapping[str, str]:
        known = {}
        for path in (*files, *_existing_files(dirs, recursive)):
            if wanted(path) and (digest := file_digest(path)) is not None:
                known[path] = digest
        return known

    watched = {os.path.dirname(f): False for f in files}
    watched.update(dict.fromkeys(dirs, recursive))
    raw = _raw_paths(watched, wanted)
    return raw.pipe(debounce_by_content(debounce, file_digest, scheduler, initial=seed))


def _matcher(
    files: frozenset[str], dirs: frozenset[str], patterns: tuple[str, ...], recursive: bool
) -> Callable[[str], bool]:
    """Is an absolute path one we watch? Named files always; files in watched dirs by pattern."""

    def wanted(path: str) -> bool:
        if path in files:
            return True
        parent = os.path.dirname(path)
        if not (parent in dirs or (recursive and any(_is_under(parent, d) for d in dirs))):
            return False
        name = os.path.basename(path)
        return any(fnmatch.fnmatch(name, p) for p in patterns)

    return wanted


def _targets(
    paths_or_dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
) -> tuple[frozenset[str], frozenset[str]]:
    if isinstance(paths_or_dirs, str | os.PathLike):
        paths_or_dirs = [paths_or_dirs]
    files, dirs = set(), set()
    for p in paths_or_dirs:
        path = os.path.abspath(os.fspath(p))
        if os.path.isdir(path):
            dirs.add(path)
            continue
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            raise FileNotFoundError(
                f"cannot watch {os.fspath(p)!r}: its directory {parent!r} does not exist"
            )
        files.add(path)
    if not files and not dirs:
        raise ValueError("'paths_or_dirs' names nothing to watch")
    return frozenset(files), frozenset(dirs)


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _existing_files(dirs: Iterable[str], recursive: bool) -> list[str]:
    found: list = []
    for d in dirs:
        for root, subdirs, names in os.walk(d):
            found.extend(os.path.join(root, n) for n in names)
            if not recursive:
                subdirs.clear()
    return found


class _Handler(FileSystemEventHandler):
    """Runs on the observer's dispatch thread: map an event to the path it leaves behind, filter, emit."""

    def __init__(self, observer: abc.ObserverBase[str], wanted: Callable[[str], bool]) -> None:
        self._observer = observer
        self._wanted = wanted

    def dispatch(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in _KINDS:
            return  # the event filter already drops these where the platform supports it
        path = event.dest_path if event.event_type == "moved" else event.src_path
        path = os.fsdecode(path)
        if not path or not self._wanted(path):
            return
        try:
            self._observer.on_next(path)
        except Exception as exc:  # never kill watchdog's dispatch thread
            self._observer.on_error(exc)


def _raw_paths(watched: Mapping[str, bool], wanted: Callable[[str], bool]) -> Observable[str]:
    """Paths of wanted files as the file system reports them, many per save. One observer per subscribe."""

    def subscribe(observer: abc.ObserverBase[str], scheduler: abc.SchedulerBase | None = None):
        fs_observer = Observer()  # the inotify observer starts its reader thread here
        handler = _Handler(observer, wanted)
        lock = threading.Lock()
        closed = False

        def close() -> None:
            nonlocal closed
            with lock:
                if closed:
                    return
                closed = True
            fs_observer.stop()  # stops and joins the emitters (and inotify's reader thread)
            if fs_observer.is_alive() and fs_observer is not threading.current_thread():
                fs_observer.join()

        try:
            for directory, rec in watched.items():
                fs_observer.schedule(handler, directory, recursive=rec, event_filter=_EVENTS)
            fs_observer.start()
        except BaseException:
            close()
            raise
        return Disposable(close)

    return Observable(subscribe)
