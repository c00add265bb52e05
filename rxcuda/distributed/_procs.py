"""Actors in child processes of this one, with the part of Ray's API the distributed engine uses: the backend of
an engine whose GPU side must survive its own faults (:class:`~rxcuda.distributed.IsolatedEngine`), on one host
and without Ray.

Why processes: after a kernel faults (an illegal address), every CUDA context of the faulting process is lost; a
second context in it, or a reset primary context, fails its next call (measured on an H100, driver 580:
../shared/GPU-FACTS.md, "Faults"). A fault in a child leaves the parent's context and every other process's
working. So the GPU work runs in a child, and this module replaces the child when it dies.

An actor is one child process (``python -c`` importing this module: nothing of the user's ``__main__`` is run
again, unlike ``multiprocessing``'s spawn) that holds one object and runs its methods one at a time, in the
order called, answering through a pipe. ``handle.method.remote(...)`` returns a :class:`Ref` at once;
:func:`get` and :func:`wait` wait for them, as Ray's do. When the child dies, every call in flight fails with
:class:`ActorDiedError` (saying how it died: its exit status or signal, and the last words it sent, such as
the CUDA error that made it exit), and, while restarts are left, the actor continues in a new process: the
*standby*, started beforehand, constructed and warmed (its CUDA context made), so that a restart costs a pipe
message instead of an interpreter start (measured in bench/faults.py). Calls made while no process serves
wait for the next one.

>>> import rxcuda.distributed._procs as procs
>>> actor = procs.remote(dict).options(max_restarts=0, standby=False).remote(k=2)
>>> procs.get(actor.get.remote("k"), timeout=60)
2
>>> procs.stop(actor)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from multiprocessing.connection import Connection
from typing import Any

NODE = f"local:{socket.gethostname()}"  # what get_runtime_context().get_node_id() answers: every actor is here
START_TIMEOUT_S = 120.0  # how long a new process may take to import and construct its object


# -- Ray's exceptions, as far as the engine tells them apart --------------------------------------------------------
class RayError(Exception):
    """Any failure of an actor call."""


class RayActorError(RayError):
    """The actor's process died (or was killed) before the call finished."""

    def __init__(self, message: str = "the actor died", actor_id: str | None = None, *, exit_code: int | None = None,
                 last_words: str | None = None, cause: str | None = None):
        super().__init__(message)
        self.actor_id = actor_id
        self.exit_code = exit_code  # the process's exit status; -N: killed by signal N
        self.last_words = last_words  # what the process said before it ended (a CUDA error, say)
        self.cause = cause  # why this side ended it, if it did ("deadline", "killed")


class ActorDiedError(RayActorError):
    pass


class ActorUnavailableError(RayActorError):
    pass


class GetTimeoutError(RayError, TimeoutError):
    pass


class RayTaskError(RayError):
    """The method raised; :meth:`as_instanceof_cause` is that exception."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause

    def as_instanceof_cause(self) -> BaseException:
        return self.cause


exceptions = types.SimpleNamespace(RayError=RayError, RayActorError=RayActorError, ActorDiedError=ActorDiedError,
                                   ActorUnavailableError=ActorUnavailableError, GetTimeoutError=GetTimeoutError,
                                   RayTaskError=RayTaskError)


# -- results ------------------------------------------------------------------------------------------------------
class Ref:
    """The future result of one actor call."""

    __slots__ = ("_done", "_value", "_error", "actor_id")

    def __init__(self, actor_id: str):
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self.actor_id = actor_id

    def _set(self, value: Any = None, error: BaseException | None = None) -> None:
        if not self._done.is_set():
            self._value, self._error = value, error
            self._done.set()

    def ready(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        if not self._done.wait(timeout):
            raise GetTimeoutError(f"the call did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value


def get(refs, timeout: float | None = None):
    """The value of a :class:`Ref` (or a list of values), raising what the call raised, as ``ray.get``."""
    if isinstance(refs, Ref):
        return refs.result(timeout)
    end = None if timeout is None else time.monotonic() + timeout
    return [r.result(None if end is None else max(0.0, end - time.monotonic())) for r in refs]


def wait(refs: list, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
    """(the first ``num_returns`` finished refs, the others), waiting at most ``timeout`` seconds, as ``ray.wait``."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        ready = [r for r in refs if r.ready()]
        if len(ready) >= num_returns or (end is not None and time.monotonic() >= end):
            ready = ready[:num_returns]
            return ready, [r for r in refs if r not in ready]
        pending = next(r for r in refs if not r.ready())
        pending._done.wait(0.05 if end is None else max(0.0, min(0.05, end - time.monotonic())))


# -- the child's side -----------------------------------------------------------------------------------------------
_served: tuple[Connection, threading.Lock] | None = None  # in a child: its pipe and the lock on sending


def last_words(text: str) -> None:
    """Send ``text`` to the parent as the reason this process is about to end (a no-op outside an actor's
    process). The parent attaches it to the :class:`ActorDiedError` of the calls in flight."""
    if _served is None:
        return
    conn, lock = _served
    with contextlib.suppress(Exception), lock:
        conn.send(("died", str(text)))
        conn.close()  # the parent hears of it now, not once the driver has torn the process's context down


def serve(fd: int) -> None:
    """The child's loop: construct the object the first message names, then run calls until the pipe closes."""
    global _served
    conn = Connection(fd)
    lock = threading.Lock()
    _served = (conn, lock)
    module, qualname, args, kwargs = pickle.loads(conn.recv_bytes())
    try:
        obj = _find(module, qualname)(*args, **kwargs)
    except BaseException as e:  # the parent raises it from the handle's constructor
        with lock:
            conn.send(("failed", _picklable(e)))
        return
    with lock:
        conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            break
        if msg is None:
            break
        call, method, a, kw = msg
        try:
            out = ("ok", call, getattr(obj, method)(*a, **kw))
        except BaseException as e:
            out = ("raised", call, _picklable(e))
        with lock:
            try:
                conn.send(out)
            except (pickle.PicklingError, TypeError, AttributeError) as e:  # an answer that does not pickle
                conn.send(("raised", call, RuntimeError(f"{method}'s result could not be sent back: {e}")))
    os._exit(0)  # no interpreter shutdown: threads the object started (a clock) must not hold the process


def _find(module: str, qualname: str):
    import importlib

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _picklable(e: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


# -- the parent's side ----------------------------------------------------------------------------------------------
def _dumps(obj) -> bytes:
    """What goes to a child: pickled by cloudpickle, which also takes the closures library calls carry (their
    capture and setup functions); its output loads with the standard pickle."""
    import cloudpickle

    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _child_env(env: dict[str, str] | None) -> dict[str, str]:
    """The child's environment: this one, with rxcuda importable from where this process imports it."""
    out = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds the rxcuda package
    paths = [here] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    out["PYTHONPATH"] = os.pathsep.join(paths)
    out.update(env or {})
    return out


class _Process:
    """One child process serving an actor (or waiting as its standby)."""

    def __init__(self, actor: _Actor):
        self.actor = actor
        parent, child = socket.socketpair()
        self.conn = Connection(parent.detach())
        cfd = child.detach()
        self.popen = subprocess.Popen(
            [sys.executable, "-c", f"import rxcuda.distributed._procs as p; p.serve({cfd})"],
            pass_fds=(cfd,), env=_child_env(actor.env), close_fds=True, stdin=subprocess.DEVNULL)
        os.close(cfd)
        self.pid = self.popen.pid
        self.pending: dict[int, Ref] = {}
        self.send_lock = threading.Lock()
        self.started = time.perf_counter()
        self.ready = threading.Event()
        self.failed: BaseException | None = None
        self.words: str | None = None
        self.cause: str | None = None  # why this side ended it
        self.dead = False
        self.used = False  # a standby that ran a trial
        self.recorded = threading.Event()  # its death is in the actor's deaths (or trials)
        self.conn.send_bytes(_dumps((actor.module, actor.qualname, actor.args, actor.kwargs)))
        self.reader = threading.Thread(target=self._read, name=f"rxcuda-actor-{actor.name}-{self.pid}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                kind = msg[0]
                if kind == "ok":
                    ref = self.pending.pop(msg[1], None)
                    if ref is not None:
                        ref._set(msg[2])
                elif kind == "raised":
                    ref = self.pending.pop(msg[1], None)
                    if ref is not None:
                        ref._set(error=RayTaskError(msg[2]))
                elif kind == "died":
                    self.words = msg[1]
                elif kind == "ready":
                    self.ready.set()
                elif kind == "failed":
                    self.failed = msg[1]
                    self.ready.set()
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        self._ended()

    def _ended(self) -> None:
        try:  # a process that said why it ends has closed its pipe and exits: no need to wait for its teardown
            self.popen.wait(timeout=0.05 if self.words else 5)
        except subprocess.TimeoutExpired:
            threading.Thread(target=self.popen.wait, name=f"rxcuda-reap-{self.pid}", daemon=True).start()
        self.dead = True
        self.ready.set()
        code = self.popen.returncode
        self.actor._died(self, code)

    def send(self, call: int, method: str, args, kwargs, ref: Ref) -> None:
        self.pending[call] = ref
        try:
            data = _dumps((call, method, args, kwargs))
            with self.send_lock:
                self.conn.send_bytes(data)
        except (OSError, ValueError):  # the pipe closed: the reader fails the call
            pass
        if self.dead:  # it ended before the call reached the pending table the reader emptied
            self.pending.pop(call, None)
            ref._set(error=self.actor._death(self))

    def kill(self, cause: str) -> None:
        self.cause = self.cause or cause
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        with contextlib.suppress(Exception), self.send_lock:
            self.conn.send_bytes(pickle.dumps(None))
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill("stopped")
        with contextlib.suppress(Exception):
            self.conn.close()


class _Actor:
    """An actor's state in the parent: the process serving it, its standby, and the restarts left."""

    _ids = itertools.count(1)

    def __init__(self, cls: type, args: tuple, kwargs: dict, *, max_restarts: int, standby: bool,
                 warm: str | None, env: dict[str, str] | None, name: str):
        self.module, self.qualname = cls.__module__, cls.__qualname__
        self.args, self.kwargs = args, kwargs
        self.max_restarts = max_restarts
        self.restarts = 0
        self.use_standby = standby
        self.warm = warm  # a method the standby runs once constructed (its CUDA context made, say)
        self.env = env
        self.name = name
        self.actor_id = f"{name}-{next(self._ids)}"
        self._calls = itertools.count(1)
        self._cond = threading.Condition()
        self.killed = False
        self.deaths: list[dict] = []  # how each serving process ended: pid, exit code, last words, cause, when
        self.trials: list[dict] = []  # how each standby process ended: the same (a trial that faulted, say)
        self.current: _Process | None = _Process(self)
        self.standby: _Process | None = None
        self._check_started(self.current)
        self._spare()

    def _check_started(self, p: _Process) -> None:
        if not p.ready.wait(START_TIMEOUT_S):
            p.kill("start")
            raise RuntimeError(f"actor {self.name}'s process {p.pid} did not start within {START_TIMEOUT_S:g} s")
        if p.failed is not None:
            raise p.failed
        if p.dead:
            raise RuntimeError(f"actor {self.name}'s process {p.pid} ended while it started (exit status "
                               f"{p.popen.returncode}); its output above says why")

    def _spare(self) -> None:
        """Start a standby process (constructed, then warmed) if restarts are left for it to serve."""
        if not self.use_standby or self.killed or self.restarts >= self.max_restarts or self.standby is not None:
            return
        p = self.standby = _Process(self)
        if self.warm:
            self._warm(p)

    def _warm(self, p: _Process) -> None:
        method = self.warm
        if not method:
            return

        def run() -> None:
            if p.ready.wait(START_TIMEOUT_S) and not p.dead and p.failed is None:
                p.send(0, method, (), {}, Ref(self.actor_id))

        threading.Thread(target=run, name=f"rxcuda-warm-{self.name}", daemon=True).start()

    def call(self, method: str, args: tuple, kwargs: dict) -> Ref:
        ref = Ref(self.actor_id)
        while True:
            with self._cond:
                while self.current is None and not self.killed:
                    self._cond.wait()
                p = self.current
            if p is None or p.popen.poll() is None:
                break
            p.reader.join(START_TIMEOUT_S)  # it ended: its reader hands the actor to the next process first
        if p is None or self.killed:
            ref._set(error=ActorDiedError(f"actor {self.name} was killed", self.actor_id))
            return ref
        p.send(next(self._calls), method, args, kwargs, ref)
        return ref

    def _death(self, p: _Process) -> ActorDiedError:
        code = p.popen.returncode
        how = (f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}")
        if p.cause:
            how = f"{p.cause}; {how}"
        words = f": {p.words}" if p.words else ""
        return ActorDiedError(f"actor {self.name}'s process {p.pid} ended ({how}){words}", self.actor_id,
                              exit_code=code, last_words=p.words, cause=p.cause)

    def call_standby(self, method: str, args: tuple, kwargs: dict, timeout: float = START_TIMEOUT_S) -> Ref | None:
        """Call ``method`` on the standby process (a trial: its failure costs the spare, not the actor), once it is
        ready; None where there is no standby. A standby that dies this way is replaced by a new one."""
        p = self.standby
        if p is None or not p.ready.wait(timeout) or p.dead or p.failed is not None:
            return None
        p.used = True
        ref = Ref(self.actor_id)
        p.send(next(self._calls), method, args, kwargs, ref)
        return ref

    def kill_standby(self, cause: str) -> None:
        p = self.standby
        if p is not None:
            p.kill(cause)

    def _died(self, p: _Process, code: int | None) -> None:
        err: RayActorError = self._death(p)
        if p is self.current and not self.killed and self.restarts < self.max_restarts:
            # as Ray says of calls that reached an actor being restarted: the caller may ask again
            err = ActorUnavailableError(str(err), self.actor_id, exit_code=err.exit_code, last_words=err.last_words,
                                        cause=err.cause)
        for ref in list(p.pending.values()):
            ref._set(error=err)
        p.pending.clear()
        with self._cond:
            standby = p is self.standby
            if standby:
                self.standby = None
                if self.killed:
                    return
                self.trials.append({"pid": p.pid, "exit": code, "words": p.words, "cause": p.cause})
                p.recorded.set()
                if not p.used:  # it died starting: no new one (it would die the same way)
                    return
        if not standby and self._serving_died(p, code) is None:
            return
        self._spare()  # a new spare: for the next restart, or for the next trial

    def _serving_died(self, p: _Process, code: int | None):
        with self._cond:
            if p is not self.current:
                return None
            self.deaths.append({"pid": p.pid, "exit": code, "words": p.words, "cause": p.cause,
                                "at": time.perf_counter()})
            p.recorded.set()
            self.current = None
            if self.killed or self.restarts >= self.max_restarts:
                self.killed = True
                self._cond.notify_all()
                return None
            self.restarts += 1
            nxt, self.standby = self.standby, None
        if nxt is None or nxt.dead or nxt.failed is not None:
            try:
                nxt = _Process(self)
                self._check_started(nxt)
            except BaseException:
                with self._cond:
                    self.killed = True
                    self._cond.notify_all()
                return None
        with self._cond:
            self.current = nxt
            self._cond.notify_all()
        return nxt

    def settle(self, timeout: float = 2.0) -> None:
        """Wait until the death of the process serving now, which the caller saw coming (its clock's pipe hung
        up), is recorded: its exit status and last words are then in :attr:`deaths`."""
        p = self.current
        if p is not None:
            p.recorded.wait(timeout)

    def pid(self) -> int | None:
        p = self.current
        return p.pid if p is not None else None

    def kill(self, no_restart: bool = True, cause: str = "killed") -> None:
        with self._cond:
            if no_restart:
                self.killed = True
            p, s = self.current, self.standby
            if no_restart:
                self.standby = None
        if p is not None:
            p.kill(cause)
        if no_restart and s is not None:
            s.kill(cause)

    def stop(self) -> None:
        with self._cond:
            self.killed = True
            p, s = self.current, self.standby
            self.standby = None
            self._cond.notify_all()
        for q in (s, p):
            if q is not None:
                q.stop()


class _Method:
    __slots__ = ("_actor", "_name")

    def __init__(self, actor: _Actor, name: str):
        self._actor, self._name = actor, name

    def remote(self, *args, **kwargs) -> Ref:
        return self._actor.call(self._name, args, kwargs)

    def options(self, **opts) -> _Method:
        if opts.get("num_returns", 1) != 1:
            raise NotImplementedError("actors in child processes return one object a call (no host links: they "
                                      "are Ray's)")
        return self


class ActorHandle:
    """What :meth:`ActorClass.remote` returns: ``handle.method.remote(*args)`` calls the method in the child."""

    def __init__(self, actor: _Actor):
        self._actor = actor

    @property
    def _actor_id(self):
        return types.SimpleNamespace(hex=lambda: self._actor.actor_id)

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Method(self._actor, name)


class ActorClass:
    def __init__(self, cls: type, opts: dict | None = None):
        self._cls = cls
        self._opts = opts or {}

    def options(self, **opts) -> ActorClass:
        return ActorClass(self._cls, {**self._opts, **opts})

    def remote(self, *args, **kwargs) -> ActorHandle:
        o = self._opts
        actor = _Actor(self._cls, args, kwargs, max_restarts=int(o.get("max_restarts", 0)),
                       standby=bool(o.get("standby", True)), warm=o.get("warm"), env=o.get("env"),
                       name=str(o.get("name") or self._cls.__name__))
        _live.add(actor)
        return ActorHandle(actor)


_live: set[_Actor] = set()


def remote(cls: type) -> ActorClass:
    """``cls`` as an actor class: ``remote(cls).options(max_restarts=3).remote(*args)`` starts its process.
    Options: ``max_restarts``, ``standby`` (keep a constructed spare process: a restart takes it at once),
    ``warm`` (a method the spare runs once constructed), ``env`` (variables for the processes), ``name``;
    Ray's resource options are accepted and ignored (every actor runs on this host)."""
    return ActorClass(cls)


def options(name: str, ray_options: dict) -> dict:
    """A distributed engine worker's actor options (``Worker.ray_options()``) for a child process: named, its
    standby warmed by ``prewarm``, its host's node id for the worker to report (clocks step it: same host)."""
    out = {k: v for k, v in ray_options.items() if k != "node_id"}
    out.update(name=name, warm="prewarm", env={"RXCUDA_WORKER_NODE": NODE})
    return out


def kill(handle: ActorHandle, no_restart: bool = True, cause: str = "killed") -> None:
    """End the actor's process (SIGKILL); with ``no_restart=False`` it continues in a new one, as a crash would."""
    handle._actor.kill(no_restart, cause)
    if no_restart:
        _live.discard(handle._actor)


def stop(handle: ActorHandle) -> None:
    """Close the actor's pipe and let its process end (its standby's too)."""
    handle._actor.stop()
    _live.discard(handle._actor)


def actor_of(handle: ActorHandle) -> _Actor:
    return handle._actor


# what the distributed engine asks of Ray besides actors
def is_initialized() -> bool:
    return True


def init(*args, **kwargs) -> None:
    return None


def shutdown() -> None:
    for a in list(_live):
        a.stop()
    _live.clear()


def available_resources() -> dict:
    return {}


def get_runtime_context():
    return types.SimpleNamespace(get_node_id=lambda: NODE)
