"""watch_files on a real file system: real watchdog threads, editors' real save sequences, bounded waits.

No fixed sleeps: a test waits (with a deadline) for the change it expects, then for two "barrier" files
written one after the other; raw events are dispatched in order and every path has the same debounce, so
once the second barrier's change is out, any change the save could still cause would already be out.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from reactivex import operators as ops

from rxcuda.streams import FileChanged, file_digest, watch_files

DEADLINE = 5.0
DEBOUNCE = 0.03


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wait_until(predicate: Callable[[], bool], timeout: float = DEADLINE) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


def new_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t not in before and t.is_alive()}


class Watch:
    """A subscription to watch_files that records what arrives, and a barrier to settle on."""

    def __init__(self, targets, directory: Path, **kw) -> None:
        self.dir = directory
        self.changes: list[FileChanged] = []
        self.errors: list[Exception] = []
        self.lock = threading.Lock()
        self._barriers = 0
        self.subscription = watch_files(targets, debounce=DEBOUNCE, **kw).subscribe(
            self._on_next, self.errors.append
        )

    def _on_next(self, change: FileChanged) -> None:
        with self.lock:
            self.changes.append(change)

    def of(self, path: Path) -> list[FileChanged]:
        with self.lock:
            return [c for c in self.changes if c.path == str(path)]

    def wait_for(self, path: Path, count: int = 1) -> list[FileChanged]:
        assert wait_until(lambda: len(self.of(path)) >= count), f"no change of {path} within {DEADLINE}s"
        return self.of(path)

    def settle(self) -> None:
        barrier = self.dir / "zz_barrier.json"
        for _ in range(2):
            self._barriers += 1
            barrier.write_text(f'{{"n": {self._barriers}}}')
            assert wait_until(
                lambda: any(c.digest == file_digest(barrier) for c in self.of(barrier))
            ), "barrier change never arrived"

    def dispose(self) -> None:
        self.subscription.dispose()


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    (tmp_path / "forces.cu").write_bytes(b"__global__ void forces() { /* g = 9.8 */ }\n")
    (tmp_path / "emit.cu").write_bytes(b"__global__ void emit() {}\n")
    return tmp_path


@pytest.fixture
def watch(kernels: Path) -> Iterator[Callable[..., Watch]]:
    """Start watches; on teardown dispose them and require every thread they started to be gone."""
    before = set(threading.enumerate())
    made: list[Watch] = []

    def start(targets=None, **kw) -> Watch:
        w = Watch(kernels if targets is None else targets, kernels, **kw)
        made.append(w)
        return w

    yield start
    for w in made:
        w.dispose()
        assert w.errors == []
    assert wait_until(lambda: not new_threads(before), 2.0), f"threads left: {new_threads(before)}"


# -- editors' save sequences, for real --------------------------------------------------------------


def save_vim(path: Path, content: bytes) -> None:
    probe = path.parent / "4913"  # vim checks it may create files in the directory
    probe.write_bytes(b"")
    probe.unlink()
    backup = path.with_name(path.name + "~")
    os.rename(path, backup)
    with open(path, "wb") as f:
        f.write(content)
    os.unlink(backup)


def save_vscode(path: Path, content: bytes) -> None:
    half = len(content) // 2
    with open(path, "r+b") as f:  # truncate, then write in chunks: several modify events
        f.truncate(0)
        f.write(content[:half])
        f.flush()
        f.write(content[half:])
        f.flush()


def save_jetbrains(path: Path, content: bytes) -> None:
    tmp = path.with_name(path.name + "___jb_tmp___")
    old = path.with_name(path.name + "___jb_old___")
    tmp.write_bytes(content)
    os.rename(path, old)
    os.rename(tmp, path)
    os.unlink(old)


EDITORS = {"vim": save_vim, "vscode": save_vscode, "jetbrains": save_jetbrains}


@pytest.mark.parametrize("editor", sorted(EDITORS))
def test_real_save_is_exactly_one_change(editor, kernels, watch):
    w = watch()
    forces = kernels / "forces.cu"
    new = b"__global__ void forces() { /* g = 1.6 */ }\n"
    EDITORS[editor](forces, new)
    w.wait_for(forces)
    w.settle()
    assert w.of(forces) == [FileChanged(str(forces), sha(new))]
    assert {c.path for c in w.changes} == {str(forces), str(kernels / "zz_barrier.json")}


@pytest.mark.parametrize("editor", sorted(EDITORS))
def test_real_save_without_change_emits_nothing(editor, kernels, watch):
    w = watch()
    forces = kernels / "forces.cu"
    EDITORS[editor](forces, forces.read_bytes())
    w.settle()
    assert w.of(forces) == []


def test_touch_emits_nothing(kernels, watch):
    w = watch()
    forces = kernels / "forces.cu"
    open(forces, "ab").close()  # open for writing and close: a close-after-write event
    os.utime(forces)
    w.settle()
    assert w.of(forces) == []


def test_each_save_is_one_change(kernels, watch):
    w = watch()
    forces = kernels / "forces.cu"
    contents = [b"// v2\n", b"// v3\n", b"// v4\n"]
    for i, (editor, content) in enumerate(zip(sorted(EDITORS), contents, strict=True)):
        EDITORS[editor](forces, content)
        w.wait_for(forces, i + 1)
    w.settle()
    assert [c.digest for c in w.of(forces)] == [sha(c) for c in contents]


def test_two_files_saved_together_each_change_once(kernels, watch):
    w = watch()
    forces, emit = kernels / "forces.cu", kernels / "emit.cu"
    save_vim(forces, b"// forces v2\n")
    save_jetbrains(emit, b"// emit v2\n")
    w.wait_for(forces)
    w.wait_for(emit)
    w.settle()
    assert w.of(forces) == [FileChanged(str(forces), sha(b"// forces v2\n"))]
    assert w.of(emit) == [FileChanged(str(emit), sha(b"// emit v2\n"))]


# -- what is watched -----------------------------------------------------------------------------


def test_directory_watch_filters_by_pattern_and_sees_new_files(kernels, watch):
    w = watch()
    (kernels / "notes.txt").write_text("todo")
    (kernels / ".forces.cu.swp").write_bytes(b"swap")
    fresh = kernels / "wind.ptx"
    fresh.write_text(".version 9.0\n")
    w.wait_for(fresh)
    w.settle()
    assert w.of(fresh) == [FileChanged(str(fresh), sha(b".version 9.0\n"))]
    assert {c.path for c in w.changes} == {str(fresh), str(kernels / "zz_barrier.json")}


def test_named_file_ignores_its_siblings_and_may_not_exist_yet(kernels, watch):
    later = kernels / "later.cu"
    w = watch([kernels / "forces.cu", later, kernels / "zz_barrier.json"])
    save_vscode(kernels / "emit.cu", b"// sibling edit\n")
    later.write_bytes(b"// here now\n")
    w.wait_for(later)
    w.settle()
    assert w.of(kernels / "emit.cu") == []
    assert w.of(later) == [FileChanged(str(later), sha(b"// here now\n"))]


def test_named_file_is_watched_whatever_the_patterns(kernels, watch):
    config = kernels / "params.toml"
    config.write_text("g = 9.8\n")
    w = watch([config, kernels], patterns="*.json")
    save_vim(config, b"g = 1.6\n")
    w.wait_for(config)
    assert w.of(config) == [FileChanged(str(config), sha(b"g = 1.6\n"))]


def test_recursive_watch_sees_nested_files(kernels, watch):
    nested = kernels / "lib" / "math.cuh"
    nested.parent.mkdir()
    w = watch(recursive=True)
    nested.write_bytes(b"#pragma once\n")
    w.wait_for(nested)
    assert w.of(nested) == [FileChanged(str(nested), sha(b"#pragma once\n"))]


def test_paths_come_out_absolute(kernels, watch, monkeypatch):
    monkeypatch.chdir(kernels)
    w = watch(["forces.cu"])
    save_jetbrains(kernels / "forces.cu", b"// abs\n")
    (change,) = w.wait_for(kernels / "forces.cu")
    assert os.path.isabs(change.path)


# -- errors and disposal -------------------------------------------------------------------------


def test_watching_a_missing_directory_fails_at_once(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cannot watch .*nowhere.*does not exist"):
        watch_files(tmp_path / "nowhere" / "forces.cu")


@pytest.mark.parametrize(("kw", "match"), [({"debounce": -1}, "'debounce' must be a non-negative"),
                                           ({"debounce": "50ms"}, "'debounce' must be a non-negative")])
def test_bad_debounce_is_rejected(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        watch_files(tmp_path, **kw)


def test_nothing_to_watch_is_rejected():
    with pytest.raises(ValueError, match="names nothing to watch"):
        watch_files([])


def test_nothing_starts_before_subscribe_and_dispose_joins_every_thread(kernels):
    before = set(threading.enumerate())
    source = watch_files(kernels, debounce=DEBOUNCE)
    assert new_threads(before) == set()
    got: list[FileChanged] = []
    d1 = source.subscribe(got.append)
    d2 = source.subscribe(got.append)  # each subscription has its own observer
    assert new_threads(before)
    forces = kernels / "forces.cu"
    save_vim(forces, b"// v2\n")
    assert wait_until(lambda: len(got) >= 2)
    d1.dispose()
    d2.dispose()
    d2.dispose()
    # the observers are joined inside dispose; at most a finished timer thread may still be exiting
    assert wait_until(lambda: not new_threads(before), 2.0), f"threads left: {new_threads(before)}"
    assert got == [FileChanged(str(forces), sha(b"// v2\n"))] * 2


def test_dispose_with_a_save_in_flight_leaves_no_threads(kernels):
    before = set(threading.enumerate())
    got: list[FileChanged] = []
    d = watch_files(kernels, debounce=10.0).subscribe(got.append)  # the timer will not fire by itself
    forces = kernels / "forces.cu"
    save_vscode(forces, b"// pending\n")
    assert wait_until(lambda: any(isinstance(t, threading.Timer) for t in new_threads(before)))
    d.dispose()
    assert wait_until(lambda: not new_threads(before), 2.0), f"threads left: {new_threads(before)}"
    assert got == []


def test_downstream_may_dispose_from_its_on_next(kernels):
    # take(1) disposes the watch from inside on_next, on the timer thread: no deadlock, no leftovers.
    before = set(threading.enumerate())
    got: list[FileChanged] = []
    done = threading.Event()
    watch_files(kernels, debounce=DEBOUNCE).pipe(ops.take(1)).subscribe(
        got.append, on_completed=done.set
    )
    save_vim(kernels / "forces.cu", b"// once\n")
    save_vim(kernels / "emit.cu", b"// twice\n")
    assert done.wait(DEADLINE)
    assert len(got) == 1
    assert wait_until(lambda: not new_threads(before), 2.0), f"threads left: {new_threads(before)}"


# -- file_digest ---------------------------------------------------------------------------------


def test_file_digest_is_the_sha256_of_the_content(tmp_path):
    f = tmp_path / "k.ptx"
    f.write_bytes(b".version 9.0\n")
    assert file_digest(f) == sha(b".version 9.0\n") == file_digest(str(f))


def test_file_digest_is_none_for_missing_empty_or_directory(tmp_path):
    empty = tmp_path / "empty.cu"
    empty.write_bytes(b"")
    assert file_digest(tmp_path / "missing.cu") is None
    assert file_digest(empty) is None  # editors truncate before they write
    assert file_digest(tmp_path) is None
