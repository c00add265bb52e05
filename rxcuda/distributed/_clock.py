"""Frames of same-host workers stepped through named pipes, not a Ray call each: a worker's *clock*.

When every worker of a distributed engine runs on the driver's host, the driver steps each one by writing a small
fixed record, "step frame *i* once the control messages up to *n* are applied", into the worker's **go** pipe (a
FIFO in ``/dev/shm``), and a frame thread in the worker, blocked reading that pipe, runs the step and writes back
"frame *i* done: state, tiers, host time, whether there is more" into its **done** pipe, which the driver polls
for all its workers at once. A pipe both wakes the other process (a blocking read, no spinning) and carries the
record (a write of at most ``PIPE_BUF`` bytes arrives whole), so there is no shared-memory block to order.

What does not fit a fixed record crosses beside it, and only when there is some: parameters, writes and the
observed ports changed since the last frame follow the request in the go pipe, pickled, when they are small
(``INLINE_MAX``), else go with a ``post(generation, seq, ...)`` call the driver does not wait for (the frame's
record names the ``seq`` the worker must have applied first, so a change made between two frames lands in the next
one). Each end polls its pipe for ``SPIN_S`` (``RXCUDA_CLOCK_SPIN_US``; 300 µs on hosts of 8 cores or more, else
0) before it sleeps in the kernel: a frame of small kernels ends sooner than a sleeping thread is woken; observed
values, diagnostics, a profiled frame or a step's error come back through ``collect(index)`` when the record says
so. A worker's death is its done pipe hanging up (or, polled every ``CHECK_S``, its process gone): the driver
never blocks on a dead worker. A restarted worker gets a new clock (new pipes, a new generation).

Nothing here imports Ray or CUDA.

>>> rec = encode(7, DONE, 0, _frame(3, 12.5, ("parameters",), "ok", True, None, 1))
>>> decode(rec)[:3], decode(rec)[3].tiers
((7, 'done', 0), ('parameters',))
"""

from __future__ import annotations

import contextlib
import itertools
import math
import mmap
import os
import pickle
import platform
import queue
import select
import struct
import threading
import time
from collections.abc import Callable, Mapping

from ..engine._records import Frame
from ..model._events import Tier
from ._board import _alive, board_dir

# frame index (STOP: end the frame thread), control messages to apply first, bytes of the last one following inline
REQUEST = struct.Struct("<qqq")
INLINE_MAX = 16 << 10  # a control message this small travels in the go pipe after its request (no Ray call)
# each end polls its pipe this long before it sleeps: on hosts of 8 cores or more (two spinning ends on a small
# machine take the cores the frame needs: 2 cores, null driver, 100 kernels: 125 us a frame without, 1483 with)
SPIN_S = float(os.environ.get("RXCUDA_CLOCK_SPIN_US", "300" if (os.cpu_count() or 1) >= 8 else "0")) * 1e-6
RECORD = struct.Struct("<qqqqqqdd")  # index, status, flags, engine frame, tiers, state | launched << 8 | frames << 16,
#                                      host_us, gpu_us (nan: none)
STOP = -1
READ = -2  # a request index at or below this is a read between frames (READ - n: the driver's n-th), not a frame
DONE, FAILED = 0, 1
STATUS = {DONE: "done", FAILED: "failed"}
MORE = 1  # flag: collect() has more for this frame (observed values, diagnostics, a profiled frame, an error)
CHECK_S = 0.2  # the driver checks a silent worker's process this often
POST_TIMEOUT_S = 30.0  # how long a frame waits for the control messages its record names
_TIERS = (Tier.STRUCTURE, Tier.CODE, Tier.RECAPTURE, Tier.PARAMETERS)
_STATES = ("ok", "error", "idle")
_count = itertools.count()


def _frame(index, host_us, tiers, state, launched, gpu_us, frames) -> Frame:
    return Frame(index, host_us, tuple(Tier(t) for t in tiers), state, launched, gpu_us, frames)


_TIER_CODE = {t: k + 1 for k, t in enumerate(_TIERS)}
_STATE_CODE = {s: k for k, s in enumerate(_STATES)}
_new = tuple.__new__  # a Frame made from its 11 fields without NamedTuple's keyword handling (the frame path)


def encode(index: int, status: int, flags: int, frame: Frame | None) -> bytes:
    """One worker's answer for frame ``index``; a frame that does not fit (profiling, an unknown state, loops at
    their bound) sets ``MORE`` and travels whole through ``collect`` (the record's flags: ``record[16] & MORE``)."""
    if frame is None:
        return RECORD.pack(index, status, flags | MORE, 0, 0, 0, 0.0, math.nan)
    tiers = 0
    if frame.tiers:
        for k, t in enumerate(frame.tiers):
            tiers |= _TIER_CODE[t] << (4 * k)
    state = _STATE_CODE.get(frame.state)
    fits = state is not None and len(frame.tiers) <= 8 and frame.blocks is None and frame.kernels is None \
        and frame.phases is None and not frame.loops_at_bound
    gpu_us = frame.gpu_us
    return RECORD.pack(index, status, flags if fits else flags | MORE, frame.index, tiers,
                       (state or 0) | int(frame.launched) << 8 | frame.frames << 16, frame.host_us,
                       math.nan if gpu_us is None else gpu_us)


def _fields(fidx: int, tiers: int, state: int, host_us: float, gpu_us: float) -> Frame:
    """The Frame a record holds (its index ``fidx``)."""
    ts: tuple = ()
    if tiers:
        ts_list = []
        while tiers:
            ts_list.append(_TIERS[(tiers & 15) - 1])
            tiers >>= 4
        ts = tuple(ts_list)
    return _new(Frame, (fidx, host_us, ts, _STATES[state & 255], bool(state >> 8 & 255),
                        None if gpu_us != gpu_us else gpu_us, state >> 16, None, None, None, ()))


def decode(raw: bytes) -> tuple[int, str, int, Frame]:
    """(index, status, flags, the frame as far as the record holds it)."""
    index, status, flags, fidx, tiers, state, host_us, gpu_us = RECORD.unpack(raw)
    return index, STATUS[status], flags, _fields(fidx, tiers, state, host_us, gpu_us)


def reindexed(frame: Frame, index: int) -> Frame:
    """``frame`` with ``index`` (``frame._replace(index=index)`` at a quarter of its cost: the frame path)."""
    return _new(Frame, (index, *frame[1:]))


# each clock's doorbell: a small shared file beside its pipes. Its first two counters are bumped by the writer
# after each record it writes into the go (GO_BELL) or done (DONE_BELL) pipe; a reader that spins polls its counter
# (a load from memory) instead of failing reads of its pipe (a system call and an exception each).
#
# Beyond them, the *mailbox*: the common frame's request (no control message with it) and its answer travel in the
# page itself, with no system call, when nothing else is awaited of the worker (IsolatedEngine's frame when idle):
# the driver writes the request slot, then bumps M_GO; the worker writes the answer record, then bumps M_DONE. A side
# about to sleep in its pipe (after its spin) raises its *_SLEEPS flag, fences, and looks again; a side that posts
# fences after its post and, seeing the other's flag, writes a WAKE record into the pipe: one of the two sees the
# other (Dekker's handshake), so no post is missed. Used where the ends spin (SPIN_S) on x86-64, whose stores are seen
# in program order (the slot before its counter); elsewhere every request and answer takes the pipes.
BELL = struct.Struct("<qq")
GO_BELL, DONE_BELL = 0, 1
M_GO, M_DONE, CHILD_SLEEPS, DRIVER_SLEEPS = 2, 3, 4, 5  # (int64 indices)
M_REQUEST = 8  # the request slot: frame index, control messages to apply first, bytes of the last one inline
M_ANSWER_AT = 128  # the answer record's byte offset
M_INLINE_AT = 256  # a mailed request's control message (pickled), when it has one
MAIL_INLINE_MAX = 3 << 10  # a control message this small goes in the mailbox with its request
WAKE = -(1 << 62)  # a request or record that only wakes a sleeping reader (dropped)
_X86 = platform.machine().lower() in ("x86_64", "amd64")
_fence_lock = threading.Lock()


def _fence() -> None:
    """A full memory barrier between this thread's store before and load after (a locked instruction: a lock taken
    and given back)."""
    _fence_lock.acquire()
    _fence_lock.release()


def _map_bell(path: str, create: bool) -> tuple[mmap.mmap, memoryview] | None:
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    except OSError:
        return None  # (a clock made by other code, without a bell: its ends poll their pipes as before)
    try:
        if create:
            os.ftruncate(fd, mmap.PAGESIZE)
        m = mmap.mmap(fd, mmap.PAGESIZE)
    finally:
        os.close(fd)
    return m, memoryview(m).cast("q")


# -- the driver's end --------------------------------------------------------------------------------------------
class Clock:
    """The driver's end of one worker's clock: its two pipes, made here (``/dev/shm``, named after the engine's
    session), and the control messages posted so far."""

    def __init__(self, session: str, worker: str, pid: int):
        self.worker, self.pid = worker, pid
        self.generation = next(_count)
        base = os.path.join(board_dir(), f"rxcuda-{session}-clock-{os.getpid()}-{self.generation}")
        self.go_path, self.done_path, self.bell_path = f"{base}-go", f"{base}-done", f"{base}-bell"
        self.go = self.done = -1
        self._bell: tuple[mmap.mmap, memoryview] | None = None
        self.bell: memoryview | None = None  # the doorbell's counters (GO_BELL bumped here, DONE_BELL by the worker)
        self.seq = 0  # control messages posted
        self.observed: object = None  # the observed-ports table last posted (tables are replaced, never changed)
        self.reads = 0  # reads asked through this clock
        self.mailed = 0  # requests sent through the mailbox
        try:
            os.mkfifo(self.go_path, 0o600)
            os.mkfifo(self.done_path, 0o600)
            self.go = os.open(self.go_path, os.O_RDWR)  # never blocks, and a dead reader is no EPIPE here
            self.done = os.open(self.done_path, os.O_RDONLY | os.O_NONBLOCK)  # hangs up when the worker's end dies
            self._bell = _map_bell(self.bell_path, create=True)
            self.bell = self._bell[1] if self._bell is not None else None
        except BaseException:
            self.close()
            raise

    def step(self, index: int, inline: bytes = b"") -> None:
        """Request frame ``index``; ``inline``: the control message numbered ``seq`` (pickled), sent with it."""
        os.write(self.go, REQUEST.pack(index, self.seq, len(inline)) + inline)
        if self.bell is not None:
            self.bell[GO_BELL] += 1

    @property
    def can_mail(self) -> bool:
        """Whether :meth:`mail` may carry a request: the ends spin (``SPIN_S``) on x86-64, with a bell."""
        return self.bell is not None and SPIN_S > 0 and _X86

    def mail(self, index: int, inline: bytes = b"") -> None:
        """Request frame ``index`` through the mailbox, with ``inline`` (the control message numbered ``seq``, at
        most ``MAIL_INLINE_MAX`` bytes) where there is one; only when no other request of this clock is unanswered,
        and only where :attr:`can_mail`. :func:`answer_mail` waits for its answer."""
        b, mm = self.bell, self._bell
        assert b is not None and mm is not None and len(inline) <= MAIL_INLINE_MAX
        if inline:
            mm[0][M_INLINE_AT:M_INLINE_AT + len(inline)] = inline
        b[M_REQUEST] = index
        b[M_REQUEST + 1] = self.seq
        b[M_REQUEST + 2] = len(inline)
        self.mailed += 1
        b[M_GO] = self.mailed
        _fence()
        if b[CHILD_SLEEPS]:
            os.write(self.go, REQUEST.pack(WAKE, 0, 0))

    def read(self, what) -> int:
        """Ask the frame thread for ``read(what)`` between frames (after the frames requested so far); returns the
        request's index, whose answer :func:`answer` waits for."""
        self.reads += 1
        payload = pickle.dumps(what, pickle.HIGHEST_PROTOCOL)
        os.write(self.go, REQUEST.pack(READ - self.reads, self.seq, len(payload)) + payload)
        if self.bell is not None:
            self.bell[GO_BELL] += 1
        return READ - self.reads

    def close(self) -> None:
        """Tell the frame thread to end, close the pipes and remove them."""
        if self.go >= 0:
            with contextlib.suppress(OSError):
                os.write(self.go, REQUEST.pack(STOP, 0, 0))
        for fd in (self.go, self.done):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.go = self.done = -1
        self.bell = self._bell = None  # unmapped once no thread still waiting on it holds it (not here: no races)
        for p in (self.go_path, self.done_path, self.bell_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)


def wait(clocks: Mapping[str, Clock], index: int, on_silence: Callable[[str, float], None] | None = None,
         first: bool = False) -> dict[str, tuple | str]:
    """Each clock's answer for frame ``index``: (status, flags, frame) as :func:`decode` gives them, or "dead"
    (its pipe hung up, or its process is gone). Waits as long as a worker lives; ``on_silence(worker, seconds)``
    is called each ``CHECK_S`` a live worker stays silent. ``first``: return once one or more answered (the others'
    answers stay in their pipes for a later wait)."""
    got: dict[str, tuple | str] = {}
    left = {c.done: (w, c) for w, c in clocks.items()}
    poller = select.poll()
    for fd in left:
        poller.register(fd, select.POLLIN)
    start = time.monotonic()
    spin = start + SPIN_S
    while left and not (first and got) and time.monotonic() < spin:  # often within microseconds: no sleep then
        for fd, (w, _c) in list(left.items()):
            answer = _read(fd, index)
            if answer is not None:
                got[w] = answer
                poller.unregister(fd)
                del left[fd]
    while left and not (first and got):
        events = poller.poll(CHECK_S * 1000)
        for fd, ev in events:
            w, c = left[fd]
            answer = _read(fd, index) if ev & select.POLLIN else None
            if answer is None and not ev & select.POLLHUP:
                continue  # an older frame's answer, read and dropped
            got[w] = answer if answer is not None else "dead"
            poller.unregister(fd)
            del left[fd]
        if not events:
            for fd, (w, c) in list(left.items()):
                if not _alive(c.pid):
                    got[w] = "dead"
                    poller.unregister(fd)
                    del left[fd]
                elif on_silence is not None:
                    on_silence(w, time.monotonic() - start)
    return got


def answer(clock: Clock, index: int, on_silence: Callable[[str, float], None] | None = None):
    """The answer to read request ``index`` (:meth:`Clock.read`): (True, the value) or (False, the exception it
    raised); to frame ``index`` of this one clock, (status, flags, frame) as :func:`wait` gives it; or "dead" (the
    pipe hung up, or the process is gone). ``on_silence`` as for :func:`wait`."""
    start = time.monotonic()
    spin = start + SPIN_S
    poller = None  # made once the spin is over (most answers come before)
    bell = clock.bell
    while True:
        mark = bell[DONE_BELL] if bell is not None else 0
        got = _read(clock.done, index)
        if got is not None:
            return got
        if bell is not None:  # the spin: a load from shared memory until the worker has written another record
            while bell[DONE_BELL] == mark and time.monotonic() < spin:
                pass
            if bell[DONE_BELL] != mark:
                continue
        elif time.monotonic() < spin:
            continue
        if poller is None:
            poller = select.poll()
            poller.register(clock.done, select.POLLIN)
        events = poller.poll(CHECK_S * 1000)
        if not events:
            if not _alive(clock.pid):
                return "dead"
            if on_silence is not None:
                on_silence(clock.worker, time.monotonic() - start)
        elif not events[0][1] & select.POLLIN:  # hung up, nothing left to read
            return "dead"


def answer_mail(clock: Clock, index: int, on_silence: Callable[[str, float], None] | None = None):
    """The answer to frame ``index``, requested by :meth:`Clock.mail`, as :func:`answer` gives it: (status, flags,
    frame), or "dead". Spins on the mailbox for ``SPIN_S``, then sleeps in the done pipe (a WAKE record, the worker's
    hang-up, or each ``CHECK_S`` to check its process)."""
    b, mm = clock.bell, clock._bell
    assert b is not None and mm is not None
    want = clock.mailed
    if b[M_DONE] != want:
        spin = time.monotonic() + SPIN_S
        while b[M_DONE] != want and time.monotonic() < spin:
            pass
    start = time.monotonic()
    poller = None
    while b[M_DONE] != want:
        b[DRIVER_SLEEPS] = 1
        _fence()
        if b[M_DONE] == want:
            break
        if poller is None:
            poller = select.poll()
            poller.register(clock.done, select.POLLIN)
        events = poller.poll(CHECK_S * 1000)
        if events:
            if events[0][1] & select.POLLIN:
                _read(clock.done, WAKE)  # drops the wake-ups (and any answer nobody waits for)
            elif b[M_DONE] != want:  # hung up, nothing left to read
                b[DRIVER_SLEEPS] = 0
                return "dead"
        elif not _alive(clock.pid):
            b[DRIVER_SLEEPS] = 0
            return "dead"
        elif on_silence is not None:
            on_silence(clock.worker, time.monotonic() - start)
    b[DRIVER_SLEEPS] = 0
    i, status, flags, fidx, tiers, state, host_us, gpu_us = RECORD.unpack_from(mm[0], M_ANSWER_AT)
    if i != index:
        raise RuntimeError(f"clock {clock.generation}: frame {i} answered in the mailbox while frame {index} was "
                           "awaited")
    return STATUS[status], flags, _fields(fidx, tiers, state, host_us, gpu_us)


def _read(fd: int, index: int) -> tuple | None:
    """The answer for frame ``index`` (or read request ``index``) from a done pipe, dropping older ones; None if
    it is not there yet."""
    while True:
        try:
            raw = os.read(fd, RECORD.size)
        except BlockingIOError:
            return None
        if len(raw) < RECORD.size:
            return None  # hung up (nothing), or a writer died mid-record: the caller sees the hang-up
        i, status, flags, length, tiers, state, host_us, gpu_us = RECORD.unpack(raw)
        if i == WAKE:
            continue  # (a wake-up of a mailbox's answer: nothing to read)
        if i <= READ:  # a read's answer: its pickled (ok, value) follows the record (written with it; length)
            payload = _read_exact(fd, length)
            if payload is None:
                return None  # hung up mid-answer: the caller sees the hang-up
            if i != index:
                continue
            try:
                return pickle.loads(payload)
            except Exception as e:  # (an exception type this process cannot make)
                return False, RuntimeError(f"the worker's answer could not be read here: {type(e).__name__}: {e}")
        if index <= READ:
            continue  # a frame's answer nobody waits for any more
        if i == index:
            return STATUS[status], flags, _fields(length, tiers, state, host_us, gpu_us)
        if i > index:
            raise RuntimeError(f"clock pipe {fd}: frame {i} answered while frame {index} was awaited")


# -- the worker's end --------------------------------------------------------------------------------------------
class ClockHand:
    """The worker's end: a daemon thread that reads the go pipe, applies the control messages the request names
    (``apply(messages)``), runs ``step(index)`` and writes the answer. ``step`` returns (frame, (observed values,
    diagnostics) or None when there are none); it raising is a FAILED answer. What does not fit the answer waits in
    ``more[index]`` as (frame, observed values, diagnostics, error) for the driver's ``collect``."""

    def __init__(self, go_path: str, done_path: str, generation: int, step: Callable, apply: Callable,
                 read: Callable | None = None):
        self.generation = generation
        self._step, self._apply, self._read = step, apply, read
        self._posted: queue.SimpleQueue = queue.SimpleQueue()
        self._applied = 0
        self.more: dict[int, object] = {}  # frame -> what collect() gives for it
        self.frames = 0  # frames stepped through this clock
        self._go = os.open(go_path, os.O_RDONLY | os.O_NONBLOCK)  # the driver holds it open: no wait
        self._done = os.open(done_path, os.O_WRONLY)
        self._bell = _map_bell(go_path[:-3] + "-bell", create=False) if go_path.endswith("-go") else None
        self.bell = self._bell[1] if self._bell is not None else None
        self._mail_seen = 0  # mailbox requests taken
        self.thread = threading.Thread(target=self._run, name=f"rxcuda-clock-{generation}", daemon=True)
        self.thread.start()

    def post(self, seq: int, message) -> None:
        self._posted.put((seq, message))

    def _take(self, upto: int, inline: object = None) -> None:
        """Apply the control messages up to ``upto``: posted ones (Ray calls), then ``inline`` (numbered
        ``upto``, read from the go pipe) when there is one."""
        if inline is None and self._applied >= upto:
            return  # the common frame: nothing to apply
        messages = []
        if inline is not None:
            upto -= 1
        deadline = time.monotonic() + POST_TIMEOUT_S
        while self._applied < upto:
            try:
                seq, m = self._posted.get(timeout=max(deadline - time.monotonic(), 1e-3))
            except queue.Empty:
                raise RuntimeError(f"control message {upto} of clock {self.generation} did not arrive within "
                                   f"{POST_TIMEOUT_S:g} s (message {self._applied} did)") from None
            self._applied = seq
            messages.append(m)
        if inline is not None:
            self._applied = upto + 1
            messages.append(inline)
        if messages:
            self._apply(messages)

    def _run(self) -> None:
        bell = self.bell
        while True:
            got = self._next_request()
            if got is None:
                break  # the driver's end is gone
            index, upto, nbytes, mailed = got
            if index == STOP:
                break
            if index <= READ:
                if not self._answer_read(index, nbytes):
                    break
                continue
            inline = None
            if nbytes and mailed:  # (the driver writes the mailbox again only once this request is answered)
                assert self._bell is not None
                inline = pickle.loads(self._bell[0][M_INLINE_AT:M_INLINE_AT + nbytes])
            elif nbytes:
                payload = _read_exact(self._go, nbytes)
                if payload is None:
                    break
                inline = pickle.loads(payload)
            try:
                self._take(upto, inline)
                frame, extra = self._step(index)  # extra: (observed values, diagnostics) or None
                self.frames += 1
                status, more = DONE, (frame, *extra, None) if extra is not None else None
            except BaseException as e:  # the answer says so; the error is collected
                frame, status, more = None, FAILED, (None, {}, (), f"{type(e).__name__}: {e}")
            rec = encode(index, status, MORE if more is not None else 0, frame)
            if rec[16] & MORE:  # (the flags' lowest byte)
                self.more[index] = more if more is not None else (frame, {}, (), None)
                for old in [i for i in self.more if i < index - 64]:  # never collected: the driver is gone
                    del self.more[old]
            if mailed:  # the answer in the mailbox; a WAKE record where the driver sleeps
                assert bell is not None and self._bell is not None
                self._bell[0][M_ANSWER_AT:M_ANSWER_AT + RECORD.size] = rec
                bell[M_DONE] += 1
                _fence()
                if not bell[DRIVER_SLEEPS]:
                    continue
                rec = RECORD.pack(WAKE, DONE, 0, 0, 0, 0, 0.0, math.nan)
            try:
                os.write(self._done, rec)
            except OSError:
                break
            if bell is not None:
                bell[DONE_BELL] += 1
        for fd in (self._go, self._done):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _next_request(self) -> tuple[int, int, int, bool] | None:
        """The next request (index, control messages to apply first, bytes following inline, whether it came by
        the mailbox): the mailbox first, then the go pipe; spins ``SPIN_S`` on the bell's counters, then sleeps in
        the pipe (raising CHILD_SLEEPS so that a mailed request writes a WAKE record). None once the driver's end
        is gone."""
        b = self.bell
        if b is None:
            raw = _read_exact(self._go, REQUEST.size, SPIN_S)
            return None if raw is None else (*REQUEST.unpack(raw), False)
        end = time.monotonic() + SPIN_S
        while True:
            if b[M_GO] != self._mail_seen:
                self._mail_seen += 1
                return b[M_REQUEST], b[M_REQUEST + 1], b[M_REQUEST + 2], True
            mark = b[GO_BELL]
            try:
                part = os.read(self._go, REQUEST.size)
            except BlockingIOError:
                part = None
            except OSError:
                return None
            if part is not None:
                if not part:
                    return None  # hung up
                raw = part if len(part) == REQUEST.size else _read_exact(self._go, REQUEST.size - len(part))
                if raw is None:
                    return None
                if len(part) < REQUEST.size:
                    raw = part + raw
                index, upto, nbytes = REQUEST.unpack(raw)
                if index == WAKE:
                    continue
                return index, upto, nbytes, False
            while b[M_GO] == self._mail_seen and b[GO_BELL] == mark and time.monotonic() < end:
                pass
            if b[M_GO] != self._mail_seen or b[GO_BELL] != mark:
                continue
            b[CHILD_SLEEPS] = 1
            _fence()
            if b[M_GO] == self._mail_seen:
                select.select([self._go], [], [])
            b[CHILD_SLEEPS] = 0

    def _answer_read(self, index: int, nbytes: int) -> bool:
        """Run read request ``index`` (its argument follows in the go pipe) and write its answer; False once
        either pipe is gone."""
        payload = _read_exact(self._go, nbytes) if nbytes else b""
        if payload is None:
            return False
        try:
            if self._read is None:
                raise RuntimeError("this worker's clock takes no reads")
            result: tuple = (True, self._read(pickle.loads(payload)))
        except Exception as e:
            result = (False, e)
        try:
            data = pickle.dumps(result, pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # an exception that does not pickle: its message
            data = pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")), pickle.HIGHEST_PROTOCOL)
        try:  # one write (a pipe keeps a write of up to PIPE_BUF bytes whole): the reader finds it all at once
            os.write(self._done, RECORD.pack(index, DONE, 0, len(data), 0, 0, 0.0, math.nan) + data)
        except OSError:
            return False
        if self.bell is not None:
            self.bell[DONE_BELL] += 1
        return True

    def stop(self, timeout: float = 5.0) -> None:
        self.thread.join(timeout)

    def hang_up(self) -> None:
        """Close this end's pipes now (the process is about to end): the driver sees the hang-up at once."""
        for fd in (self._go, self._done):
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_exact(fd: int, n: int, spin: float = 0.0) -> bytes | None:
    """``n`` bytes from the (non-blocking) pipe ``fd``, polling it for ``spin`` seconds before sleeping in
    ``select``; None once the other end is gone."""
    buf = b""
    end = time.monotonic() + spin
    while len(buf) < n:
        try:
            part = os.read(fd, n - len(buf))
        except BlockingIOError:
            if time.monotonic() >= end:
                select.select([fd], [], [])
            continue
        except OSError:
            return None
        if not part:
            return None
        buf += part
    return buf
