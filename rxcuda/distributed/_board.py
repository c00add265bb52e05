"""The same-host handshake of an ``ipc`` link: a small shared-memory block (a *board*) per exported port, through
which the producer tells its consumers "frame i is in slot i % depth" without a Ray call per frame.

The driver submits every worker's step of a frame at once, so a consumer's step may start before its producer's
has queued the frame's copy. The consumer waits on the board (spinning briefly, then sleep-polling) until the
producer publishes the frame, and only then enqueues its wait on the slot's event and its copy: ``cuStreamWaitEvent``
waits for the event's most recent record *at the time of the call*, so it must come after the producer recorded
that frame's event, and before the producer records it again (``depth`` frames later, which the driver's bound on
frames in flight prevents).

A board is a file in ``/dev/shm`` (a temporary folder where there is none), mapped by both processes:

- a header: the producer's process id, ``depth`` and the bytes a slot holds, whether the slots carry the bytes
  themselves (the null driver's flavour of the link) or live in device memory (CUDA IPC: the slots' memory and
  event handles are in the board), the first frame this producer serves, the latest frame published or skipped,
  and a state (live, or retired by a producer that replaced it);
- a frame stamp per slot: the frame the slot holds, written after its copy was queued (after ``cuEventRecord``).

A producer that is built again (a restart, a rebuilt fragment) writes a new board under a temporary name, renames it
over the old one and marks the old one retired: a consumer holding the old one sees that and maps the new one. A
frame older than the new board's first frame will never come (it was its predecessor's): the consumer skips it,
keeping its last input, as it does when the producer skipped the frame, when the producer's process is gone, or
when nothing came within the timeout (``LATE``: the caller reports it).

Stores are read by the other process in the order they were made: true of x86-64 (total store order); Python has no
memory fence to give weaker CPUs that guarantee, so on those a consumer relies on the driver calls between the
producer's copy and its stamp. Nothing here imports CUDA or Ray.

>>> import tempfile, os, numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "board")
>>> producer = LinkBoard.create(path, depth=3, nbytes=8, data=True, since=1)
>>> producer.put(1, np.arange(2, dtype=np.float32))
>>> reader = BoardReader(path)
>>> reader.wait(1, timeout=1.0), reader.read(1).view(np.float32).tolist()
('ready', [0.0, 1.0])
>>> producer.skip(2)
>>> reader.wait(2, timeout=1.0)
'skipped'
>>> reader.close(); producer.close(unlink=True)
"""

from __future__ import annotations

import contextlib
import itertools
import math
import mmap
import os
import re
import tempfile
import time
from collections.abc import Callable

import numpy as np

from ..model import _dtypes

MAGIC = 0x72786C696E6B0001  # "rxlink", layout 1
HANDLE_BYTES = 64  # a CUDA IPC handle (memory or event)
LIVE, RETIRED = 1, 2
READY, SKIPPED, GONE, LATE = "ready", "skipped", "gone", "late"
_RETIRED = "retired"
SPIN_S = 0.002  # a consumer polls without sleeping this long (a producer's step is about that), then sleeps
MAX_PAUSE_S = 0.001  # the longest sleep between two polls
# header words
_MAGIC, _STATE, _PID, _DEPTH, _NBYTES, _DATA, _LATEST, _SINCE = range(8)
_HEADER = 8
_tmp = itertools.count()


def board_dir() -> str:
    """Where boards live: ``/dev/shm`` (memory, never a disk) where there is one."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def board_path(session: str, block: int, port: str) -> str:
    """The board of one exported port of one distributed engine (``session``): producer and consumers derive it
    alike, so a restarted producer replaces its predecessor's board and nothing travels per frame."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", port)[:40]
    return os.path.join(board_dir(), f"rxcuda-{session}-{int(block)}-{safe}")


def _align(n: int) -> int:
    return -(-n // 64) * 64


def _layout(depth: int, nbytes: int, data: bool) -> tuple[int, int, int]:
    """(offset of the handles, offset of the slots' data, file size)."""
    handles = _align((_HEADER + 2 * depth) * 8)
    slots = _align(handles + depth * 2 * HANDLE_BYTES)
    return handles, slots, slots + (depth * _align(nbytes) if data else 0)


class LinkBoard:
    """One mapped board. The producer makes it with :meth:`create` and calls :meth:`put` (or :meth:`publish`
    after its device copy) and :meth:`skip` each frame; consumers read it through a :class:`BoardReader`."""

    def __init__(self, path: str, mm: mmap.mmap, ino: int):
        self.path = path
        self._mm = mm
        self._ino = ino
        head = np.frombuffer(mm, np.int64, count=_HEADER)
        if int(head[_MAGIC]) != MAGIC:
            del head
            mm.close()
            raise ValueError(f"{path} is not an rxcuda link board (its header does not match); remove it")
        self.depth, self.nbytes = int(head[_DEPTH]), int(head[_NBYTES])
        self.data, self.pid, self.since = bool(head[_DATA]), int(head[_PID]), int(head[_SINCE])
        self._head = head
        self._stamps = np.frombuffer(mm, np.int64, count=self.depth, offset=_HEADER * 8)
        self._lengths = np.frombuffer(mm, np.int64, count=self.depth, offset=(_HEADER + self.depth) * 8)
        self._handles_at, self._data_at, _size = _layout(self.depth, self.nbytes, self.data)
        self._whole = np.frombuffer(mm, np.uint8)  # the mapping's address, for pinning it (cuMemHostRegister)

    # -- the producer ----------------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str, *, depth: int, nbytes: int, data: bool, since: int,
               handles: list[tuple[bytes, bytes]] | None = None, pid: int | None = None) -> LinkBoard:
        """A new board at ``path`` for a producer serving frames from ``since`` on, replacing (and retiring) any
        board there. ``data``: the slots carry the bytes (else ``handles``: each slot's memory and event handle)."""
        if depth < 1 or nbytes < 0:
            raise ValueError(f"a link board needs depth >= 1 and nbytes >= 0 (got {depth}, {nbytes})")
        if not data and (handles is None or len(handles) != depth):
            raise ValueError(f"a device-memory link board takes one (memory, event) handle pair per slot ({depth})")
        if any(len(m) != HANDLE_BYTES or len(e) != HANDLE_BYTES for m, e in handles or ()):
            raise ValueError(f"an IPC handle is {HANDLE_BYTES} bytes")
        at_handles, _at_data, size = _layout(depth, nbytes, data)
        tmp = f"{path}.{os.getpid()}.{next(_tmp)}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
            ino = os.fstat(fd).st_ino
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        head = np.frombuffer(mm, np.int64, count=_HEADER + 2 * depth)
        head[_STATE], head[_PID], head[_DEPTH], head[_NBYTES] = LIVE, os.getpid() if pid is None else pid, depth, nbytes
        head[_DATA], head[_LATEST], head[_SINCE] = int(data), since - 1, since
        head[_HEADER:] = -1  # no slot holds a frame; no length
        for s, (memory, event) in enumerate(handles or ()):
            at = at_handles + s * 2 * HANDLE_BYTES
            mm[at:at + 2 * HANDLE_BYTES] = memory + event
        head[_MAGIC] = MAGIC
        del head
        old = _open(path)
        os.rename(tmp, path)  # consumers opening the path from now on find this board
        if old is not None:  # and those holding the old one are told to look again
            state = np.frombuffer(old[0], np.int64, count=_HEADER)
            state[_STATE] = RETIRED
            del state
            old[0].close()
        return cls(path, mm, ino)

    def put(self, frame: int, array) -> None:
        """Copy ``array``'s bytes (at most ``nbytes``) into frame ``frame``'s slot and publish it."""
        view = np.ascontiguousarray(array).data.cast("B")
        n = min(len(view), self.nbytes)
        s = frame % self.depth
        at = self._data_at + s * _align(self.nbytes)
        self._mm[at:at + n] = view[:n]
        self.publish(frame, n)

    def publish(self, frame: int, nbytes: int | None = None) -> None:
        """Frame ``frame`` is in its slot (its copy queued, its event recorded): stamp the slot, then the latest."""
        s = frame % self.depth
        self._lengths[s] = self.nbytes if nbytes is None else nbytes
        self._stamps[s] = frame
        if frame > self._head[_LATEST]:
            self._head[_LATEST] = frame

    def skip(self, frame: int) -> None:
        """Frame ``frame`` will not come (the producer's step failed): its consumers stop waiting for it."""
        if frame > self._head[_LATEST]:
            self._head[_LATEST] = frame

    # -- the consumer's side ----------------------------------------------------------------------------------
    def status(self, frame: int) -> str | None:
        """READY, SKIPPED, RETIRED (a new board replaced this one) or None (not yet)."""
        if self._head[_STATE] != LIVE:
            return _RETIRED
        if frame < self.since:
            return SKIPPED  # a frame of the producer this one replaced
        s = frame % self.depth
        if self._stamps[s] == frame:
            return READY
        if self._head[_LATEST] >= frame:  # published after the stamp: a second look at the stamp is conclusive
            return READY if self._stamps[s] == frame else SKIPPED
        return None

    def handles(self, slot: int) -> tuple[bytes, bytes]:
        """The (memory, event) handles of a slot in device memory."""
        at = self._handles_at + slot * 2 * HANDLE_BYTES
        raw = bytes(self._mm[at:at + 2 * HANDLE_BYTES])
        return raw[:HANDLE_BYTES], raw[HANDLE_BYTES:]

    def read(self, frame: int) -> np.ndarray:
        """A copy of the bytes frame ``frame`` holds in its slot; raises if the slot was written again meanwhile
        (more frames in flight than the link has slots: a bug, never a silent stale frame)."""
        s = frame % self.depth
        at = self._data_at + s * _align(self.nbytes)
        out = np.frombuffer(self._mm, np.uint8, count=int(self._lengths[s]), offset=at).copy()
        if self._stamps[s] != frame:
            raise RuntimeError(f"link board {self.path}: slot {s} was written again (frame {int(self._stamps[s])}) "
                               f"while frame {frame} was read from it; more frames were in flight than the link's "
                               f"{self.depth} slots")
        return out

    def length(self, frame: int) -> int:
        return int(self._lengths[frame % self.depth])

    # -- the slots' memory, for device copies straight into and out of it ---------------------------------------
    def region(self) -> tuple[int, int]:
        """(address, bytes) of the whole mapping in this process: what a process pins once (page aligned)."""
        return int(self._whole.ctypes.data), int(self._whole.size)

    def slot_address(self, frame: int) -> int:
        """The address in this process of the bytes of frame ``frame``'s slot (a board that carries them)."""
        return int(self._whole.ctypes.data) + self._data_at + (frame % self.depth) * _align(self.nbytes)

    def check(self, frame: int) -> None:
        """Raise if frame ``frame``'s slot holds another frame now: called after a copy out of it finished, as
        :meth:`read` checks its own copy."""
        s = frame % self.depth
        if self._stamps[s] != frame:
            raise RuntimeError(f"link board {self.path}: slot {s} was written again (frame {int(self._stamps[s])}) "
                               f"while frame {frame} was copied from it; more frames were in flight than the "
                               f"link's {self.depth} slots")

    def close(self, *, unlink: bool = False) -> None:
        """Unmap the board; ``unlink`` (its producer): also retire it (a consumer holding it looks for the next one)
        and remove its file, unless a newer board replaced it there."""
        if self._mm is None:
            return
        if unlink:
            self._head[_STATE] = RETIRED
            try:
                if os.stat(self.path).st_ino == self._ino:
                    os.unlink(self.path)
            except FileNotFoundError:
                pass
        del self._head, self._stamps, self._lengths, self._whole
        self._mm.close()
        self._mm = None  # type: ignore[assignment]


def _open(path: str) -> tuple[mmap.mmap, int] | None:
    """The board file at ``path`` mapped, with its inode; None where there is none."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        return (mmap.mmap(fd, st.st_size), st.st_ino) if st.st_size >= _HEADER * 8 else None
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process by that id: alive
        return True
    return True


class BoardReader:
    """A consumer's view of one producer's board, mapped when first needed and again when the producer replaced
    it."""

    def __init__(self, path: str):
        self.path = path
        self.board: LinkBoard | None = None
        self.generation = 0  # boards mapped so far: a new one (a replaced producer) has new slots and handles
        self.waited = 0  # frames that were not published yet when asked for
        self.on_drop: Callable[[LinkBoard], None] | None = None  # called before a board is unmapped (to unpin it)

    def _attach(self) -> LinkBoard | None:
        opened = _open(self.path)
        if opened is None:
            return None
        self.board = LinkBoard(self.path, *opened)
        self.generation += 1
        return self.board

    def _drop(self) -> None:
        if self.board is not None:
            if self.on_drop is not None:
                self.on_drop(self.board)
            self.board.close()
            self.board = None

    def wait(self, frame: int, timeout: float) -> str:
        """Wait until the producer published ``frame``: READY; SKIPPED (the producer skipped it, or a producer
        built since then serves only later frames); GONE (the producer's process ended); LATE (nothing within
        ``timeout`` seconds)."""
        start = time.monotonic()
        spin_until, deadline, pause, waited = start + SPIN_S, start + timeout, 2e-5, False
        while True:
            board = self.board or self._attach()
            if board is not None:
                st = board.status(frame)
                if st in (READY, SKIPPED):
                    self.waited += waited
                    return st
                if st == _RETIRED:
                    self._drop()
                    continue
            waited = True
            now = time.monotonic()
            if now >= spin_until:
                if board is not None and not _alive(board.pid) and board.status(frame) is None:
                    self.waited += 1
                    return GONE
                if now >= deadline:
                    self.waited += 1
                    return LATE
                time.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE_S)

    def read(self, frame: int) -> np.ndarray:
        assert self.board is not None, "read() follows a wait() that returned READY"
        return self.board.read(frame)

    def handles(self, frame: int) -> tuple[bytes, bytes]:
        assert self.board is not None, "handles() follows a wait() that returned READY"
        return self.board.handles(frame % self.board.depth)

    def close(self) -> None:
        self._drop()


def remove_boards(session: str) -> None:
    """Remove the boards one distributed engine's workers left on this host (a killed producer unlinks nothing)."""
    prefix = f"rxcuda-{session}-"
    try:
        names = [n for n in os.listdir(board_dir()) if n.startswith(prefix)]
    except OSError:
        return
    for n in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(board_dir(), n))


# a host copy of this many bytes or more is split over COPY_THREADS threads (NumPy's copy lets go of the GIL) where
# RXCUDA_COPY_THREADS asks for it; by default one thread: on an H100 host (16 cores) a 4 MiB read into out= took
# 809 us over 4 threads and 458 us on one (bench/faults.py, 99366b3)
COPY_THREADS = int(os.environ.get("RXCUDA_COPY_THREADS", "1"))
PARALLEL_MIN = 1 << 20
_pool: list = []  # [(process id, ThreadPoolExecutor)]: made when first needed, again in a forked process


def copy_into(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """``np.copyto(dst, src)`` of two C-contiguous arrays of one shape and dtype; a large one split over
    :data:`COPY_THREADS` threads, in page-aligned parts."""
    n = dst.nbytes
    if COPY_THREADS <= 1 or n < PARALLEL_MIN:
        np.copyto(dst, src)
        return dst
    from concurrent.futures import ThreadPoolExecutor

    if not _pool or _pool[0][0] != os.getpid():
        _pool[:] = [(os.getpid(), ThreadPoolExecutor(COPY_THREADS - 1, thread_name_prefix="rxcuda-copy"))]
    d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    step = -(-n // COPY_THREADS // mmap.PAGESIZE) * mmap.PAGESIZE
    pool = _pool[0][1]
    parts = [pool.submit(np.copyto, d[i:i + step], s[i:i + step]) for i in range(step, n, step)]
    np.copyto(d[:step], s[:step])
    for p in parts:
        p.result()
    return dst


def copy_out(value: np.ndarray, out) -> np.ndarray:
    """``value`` copied into ``out`` (``read(..., out=out)`` of an engine in another process; ``value`` itself
    where ``out`` is None), checked as a local engine checks it (``_dtypes.check_out``)."""
    if out is None:
        return value
    _dtypes.check_out(out, value.shape, value.dtype)
    return copy_into(out, value)


class SharedArrays:
    """Arrays one process writes into files of :func:`board_dir` (memory) and another copies out: a large read
    crosses between processes as two memory copies instead of being pickled through a pipe. The writer keeps one
    file per name, grown as needed; each side keeps its mappings open."""

    def __init__(self, prefix: str):
        self.prefix = prefix  # rxcuda-<session>-...: remove_boards(session) removes what a killed writer left
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}
        self._paths: dict[str, str] = {}  # name -> its file

    def _map(self, path: str, nbytes: int, create: bool) -> mmap.mmap:
        had = self._maps.get(path)
        if had is not None and had[0] >= nbytes:
            return had[1]
        if had is not None:
            had[1].close()
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
        try:
            size = max(nbytes, 1)
            if create and os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            size = max(os.fstat(fd).st_size, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._maps[path] = (size, mm)
        return mm

    def put(self, name: str, arr: np.ndarray) -> tuple[str, tuple, np.dtype]:
        """Write ``arr`` under ``name``; returns the handle :meth:`take` reads it by."""
        arr = np.ascontiguousarray(arr)
        handle, view = self.slot(name, arr.shape, arr.dtype)
        if arr.nbytes:
            view[...] = arr
        return handle

    def slot(self, name: str, shape: tuple, dtype) -> tuple[tuple[str, tuple, np.dtype], np.ndarray]:
        """(the handle :meth:`take` reads it by, a writable array in the file) for an array of ``shape`` and
        ``dtype`` under ``name``, for the writer to fill in place (a device's copy straight into it). Drop the
        array before the next call for the same name: the file may be mapped anew."""
        dt = np.dtype(dtype)
        count = math.prod(shape)
        path = self._paths.get(name)
        if path is None:
            path = self._paths[name] = os.path.join(board_dir(),
                                                    f"{self.prefix}-{re.sub(r'[^A-Za-z0-9_]', '_', name)[:60]}")
        mm = self._map(path, count * dt.itemsize, True)
        view = np.frombuffer(mm, dt, count).reshape(shape) if count else np.empty(shape, dt)
        return (path, tuple(shape), dt), view  # (the dtype itself: a structured one keeps its fields)

    def take(self, handle: tuple[str, tuple, np.dtype], out: np.ndarray | None = None) -> np.ndarray:
        """A copy of the array a :meth:`put` (in this or another process) wrote; into ``out`` where given (of the
        same shape and dtype)."""
        path, shape, dtype = handle
        dt = np.dtype(dtype)
        count = math.prod(shape)
        if count == 0:
            return np.empty(shape, dt) if out is None else copy_out(np.empty(shape, dt), out)
        mm = self._map(path, count * dt.itemsize, False)
        src = np.frombuffer(mm, dt, count).reshape(shape)
        return copy_into(np.empty(shape, dt), src) if out is None else copy_out(src, out)

    def close(self) -> None:
        for _, mm in self._maps.values():
            with contextlib.suppress(Exception):
                mm.close()
        self._maps.clear()
