"""A private NVIDIA Multi-Process Service daemon for a distributed engine's own workers (``Engine(share_gpu=...)``).

Two workers on one GPU are two processes with a context each; without MPS the GPU time-slices between the
contexts, and each frame of one waits for the other's slice (``_sharing``). Under MPS their kernels and copies run
at once, but a fatal fault in one client's kernel ends every client on that GPU (NVIDIA's MPS documentation: the
server then refuses new clients until all of them have exited), so MPS is not the default: ``share_gpu="off"`` (the
default) keeps the workers' faults apart. ``share_gpu="auto"`` uses MPS exactly where it pays: when two or more of
the engine's GPU workers are placed on one GPU of the driver's host, ``nvidia-cuda-mps-control`` is on PATH and no
MPS serves the user already (``CUDA_MPS_PIPE_DIRECTORY`` set: then the workers inherit theirs); otherwise it is
``"off"``. ``"mps"`` asks for the daemon wherever a GPU worker runs on the driver's host; ``"off"`` never starts one.
``"turns"`` starts none either: the driver steps the workers that share a device one after another, in the links'
order (``_stepping``, ``_sharing.turn_groups``), so only one context has work on the GPU at a time and each
worker's faults stay its own; its workers get :data:`TURNS` (their ``ipc`` exports wait for their copies before
they answer). :func:`choose` makes that choice from its inputs, and says why (``describe().share_gpu``,
``where(w)``, one info diagnostic).

**Before any CUDA context.** The daemon serves a process whose first CUDA call sees ``CUDA_MPS_PIPE_DIRECTORY``
and ``CUDA_MPS_LOG_DIRECTORY`` naming its folders, so the choice precedes every worker's context: the engine
reserves the folders before its actors start and hands their variables to each worker with a *gate*
(``RXCUDA_MPS_GATE``, a file of this engine's), and a worker sets them (:func:`enter`) just before it makes its
first engine, only where the gate exists and the daemon's control pipe is up. Under Ray a worker's GPU is known
once its actor is placed, and its context is made only when it builds, so the engine chooses after placement
(from the GPU ids Ray gave each worker) and opens the gate or not. Child-process workers (``backend="process"``)
make their contexts as they start, all on this host's first GPU: there the choice is made from the workers' specs
before they start.

**One daemon per process, and none left behind.** Engines of one process share one daemon (counted: the last to
close tells it ``quit``), started with ``nvidia-cuda-mps-control -d`` in a new temporary folder
(``rxcuda-mps-*``: ``pipe``, ``log``, ``owner``: this process's id and start time). At exit (``atexit``) a daemon
still running is told ``quit`` and its folder removed; a driver killed before that leaves one, and the next daemon
started on the host ends every ``rxcuda-mps-*`` daemon of the user whose owner process is gone. Only workers on
the driver's host can reach the daemon (its pipes are local files); on other hosts start MPS with the host
(docs/distributed.md, "Several workers on one GPU"). CPU-device and null-driver workers never need it.

>>> check_share_gpu("auto")
'auto'
>>> choose("auto", [("a", "b")], candidates=("a", "b"), user_pipe=None, binary="/usr/bin/x").mode
'mps'
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence

import attrs

SHARE_GPU = ("auto", "off", "mps", "turns")
BINARY = "nvidia-cuda-mps-control"
PIPE, LOG, GATE = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "RXCUDA_MPS_GATE"
TURNS = "RXCUDA_TURNS"  # in a worker's env (not its process's): the driver steps it in turns (``share_gpu="turns"``)
START_S = 10.0  # how long the daemon may take to make its control pipe


def check_share_gpu(value) -> str:
    if value not in SHARE_GPU:
        raise ValueError(f"'share_gpu' must be one of {', '.join(SHARE_GPU)} (got {value!r})")
    return value


@attrs.frozen
class Choice:
    """What ``share_gpu`` came to: ``mode`` ``"mps"`` (this engine's private daemon), ``"theirs"`` (the user's MPS,
    inherited), ``"turns"`` (workers sharing a device stepped one after another) or ``"off"``; ``why``, in words;
    ``warn``: whether it is a problem worth a warning (``"mps"`` asked for and not possible) rather than
    information."""

    asked: str
    mode: str
    why: str
    warn: bool = False

    def __str__(self) -> str:
        return f"share_gpu={self.asked!r} -> {self.mode}: {self.why}"


def choose(share_gpu: str, shared: Sequence[Sequence[str]] | None, *, candidates: Sequence[str],
           user_pipe: str | None, binary: str | None) -> Choice:
    """The choice for ``Engine(share_gpu=...)``. ``candidates``: the GPU workers that may run on the driver's host
    (no null driver, no CPU device); ``shared``: the groups of workers placed on one GPU of the driver's host
    (None: not placed yet, judged from ``candidates``); ``user_pipe``: ``CUDA_MPS_PIPE_DIRECTORY`` of this
    process (an MPS set up by the user); ``binary``: where ``nvidia-cuda-mps-control`` is (None: not on PATH)."""
    asked = check_share_gpu(share_gpu)
    if asked == "off":
        return Choice(asked, "off", "asked for")
    if asked == "turns":
        return Choice(asked, "turns", "asked for: the driver steps the workers that share a device one after another, "
                                      "producers first (one context with work on a GPU at a time, no MPS: each "
                                      "worker's faults stay its own); workers on other devices, or served by an MPS "
                                      "the user set up, at once")
    if not candidates:
        return Choice(asked, "off", "no worker of this engine uses a GPU of the driver's host (null driver, CPU "
                                    "device or another host)")
    if user_pipe:
        return Choice(asked, "theirs", f"an MPS is set up already (CUDA_MPS_PIPE_DIRECTORY={user_pipe}): the "
                                       "workers inherit it, no daemon is started")
    groups = [tuple(g) for g in shared or () if len(g) > 1]
    if asked == "auto" and shared is not None and not groups:
        return Choice(asked, "off", "no two of this engine's workers were placed on one GPU of the driver's host")
    if asked == "auto" and len(candidates) < 2:
        return Choice(asked, "off", "fewer than two GPU workers on the driver's host: none shares a GPU")
    if binary is None:
        return Choice(asked, "off", f"{BINARY} is not on PATH (it comes with NVIDIA's driver utilities), so workers "
                                    "sharing a GPU take turns on it", warn=asked == "mps")
    who = "; ".join(", ".join(repr(w) for w in g) for g in groups) if groups else ", ".join(map(repr, candidates))
    because = "asked for" if asked == "mps" else f"workers {who} share a GPU of the driver's host"
    return Choice(asked, "mps", f"{because}: a private MPS daemon serves them, so their frames run at once")


class MpsDaemon:
    """One private control daemon: its folder, the variables that make a process its client (``env``)."""

    def __init__(self, binary: str):
        self.binary = binary
        self.root = tempfile.mkdtemp(prefix="rxcuda-mps-")
        self.env = {PIPE: os.path.join(self.root, "pipe"), LOG: os.path.join(self.root, "log")}
        for d in (*self.env.values(), os.path.join(self.root, "gates")):
            os.mkdir(d, 0o700)
        with open(os.path.join(self.root, "owner"), "w") as f:
            f.write(_identity(os.getpid()) or str(os.getpid()))

    @property
    def running(self) -> bool:
        return os.path.exists(os.path.join(self.env[PIPE], "control"))

    def _run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary, *args], input=stdin, env={**os.environ, **self.env}, text=True,
                              capture_output=True, timeout=START_S)

    def start(self) -> None:
        """Start the daemon (``-d``: it forks and the call returns) and wait for its control pipe; raises
        RuntimeError saying what failed (the folder removed)."""
        try:
            done = self._run(["-d"])
            if done.returncode != 0:
                raise RuntimeError(f"{self.binary} -d exited with status {done.returncode}: "
                                   f"{(done.stderr or done.stdout).strip() or 'no message'}")
            deadline = time.monotonic() + START_S
            while not self.running:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.binary} -d made no control pipe in {self.env[PIPE]} within "
                                       f"{START_S:g} s (its log: {self.env[LOG]})")
                time.sleep(0.01)
        except (OSError, subprocess.SubprocessError, RuntimeError):
            self.stop()
            raise

    def stop(self) -> None:
        """Tell the daemon ``quit`` (it ends its server once the clients are gone) and remove the folder. Never
        raises."""
        if self.running:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self._run([], stdin="quit\n")
                deadline = time.monotonic() + START_S
                while self.running and time.monotonic() < deadline:
                    time.sleep(0.01)
        shutil.rmtree(self.root, ignore_errors=True)


def _identity(pid: int) -> str | None:
    """``"pid start-time"`` of a live process (its start time tells a reused id apart), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f"{pid} {f.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return str(pid)


def sweep(binary: str, tmp: str | None = None) -> list[str]:
    """End the private daemons whose driver process is gone (killed before its exit handlers ran): each
    ``rxcuda-mps-*`` folder of this user in ``tmp`` whose ``owner`` no longer runs is told ``quit`` and removed.
    Returns the folders ended."""
    ended = []
    for root in glob.glob(os.path.join(tmp or tempfile.gettempdir(), "rxcuda-mps-*")):
        try:
            if os.stat(root).st_uid != os.getuid():
                continue
            with open(os.path.join(root, "owner")) as f:
                owner = f.read().strip()
        except (OSError, ValueError):
            continue
        if not owner or _identity(int(owner.split()[0])) == owner or \
                (" " not in owner and _identity(int(owner)) is not None):
            continue
        old = MpsDaemon.__new__(MpsDaemon)
        old.binary, old.root = binary, root
        old.env = {PIPE: os.path.join(root, "pipe"), LOG: os.path.join(root, "log")}
        old.stop()
        ended.append(root)
    return ended


# -- one daemon per process, shared by its engines -----------------------------------------------------------
_lock = threading.Lock()
_daemon: MpsDaemon | None = None
_users = 0


class Share:
    """An engine's side of the process's daemon: made before its workers start (``env``: what each worker
    gets), :meth:`decide` once the workers are placed, :meth:`close` with the engine."""

    def __init__(self, share_gpu: str, candidates: Sequence[str], *, placed_first: bool):
        global _daemon, _users
        self.asked, self.candidates = check_share_gpu(share_gpu), tuple(candidates)
        self.binary = shutil.which(BINARY)
        self.choice: Choice | None = None
        self.env: dict[str, str] = {}
        self.gate: str | None = None
        self._daemon: MpsDaemon | None = None
        first = choose(self.asked, None, candidates=self.candidates, user_pipe=os.environ.get(PIPE),
                       binary=self.binary)
        if first.mode != "mps":
            self.env = {TURNS: "1"} if first.mode == "turns" else {}
            self._settle(first)
            return
        found = self.binary or BINARY  # on PATH: the choice was "mps"
        with _lock:
            if _daemon is None:
                sweep(found)
                _daemon = MpsDaemon(found)
            self._daemon, _users = _daemon, _users + 1
        self.gate = os.path.join(self._daemon.root, "gates", f"{os.getpid()}-{id(self):x}")
        self.env = {**self._daemon.env, GATE: self.gate}
        if not placed_first:
            self.decide(None)

    def decide(self, shared: Sequence[Sequence[str]] | None) -> Choice:
        """The choice once the workers are placed (``shared``: the groups on one GPU of the driver's host; None:
        from the candidates); starts the daemon where it is the choice, before any worker's first build."""
        if self.choice is not None:
            return self.choice
        choice = choose(self.asked, shared, candidates=self.candidates, user_pipe=os.environ.get(PIPE),
                        binary=self.binary)
        daemon, gate = self._daemon, self.gate
        if choice.mode == "mps" and daemon is not None and gate is not None:
            try:
                with _lock:
                    if not daemon.running:
                        daemon.start()
                open(gate, "w").close()
            except (OSError, subprocess.SubprocessError, RuntimeError) as e:
                choice = Choice(self.asked, "off", f"the private MPS daemon did not start ({e}), so workers sharing "
                                                   "a GPU take turns on it", warn=self.asked == "mps")
                self._release()
        else:
            self._release()
        return self._settle(choice)

    def _settle(self, choice: Choice) -> Choice:
        self.choice = choice
        if choice.warn:
            warnings.warn(f"share_gpu='mps': {choice.why}; the workers run without MPS", RuntimeWarning,
                          stacklevel=4)
        return choice

    @property
    def news(self) -> Choice | None:
        """The choice, where it is worth an info diagnostic: two or more workers could share a GPU, or MPS or turns
        were asked for (an engine of one GPU worker, or of null-driver or CPU-device workers, says nothing)."""
        return self.choice if len(self.candidates) > 1 or self.asked in ("mps", "turns") else None

    @property
    def mode(self) -> str:
        return self.choice.mode if self.choice is not None else "undecided"

    def _release(self) -> None:
        global _daemon, _users
        with _lock:
            if self._daemon is None:
                return
            d, self._daemon = self._daemon, None
            if self.gate:
                with contextlib.suppress(OSError):
                    os.remove(self.gate)
            _users -= 1
            if _users == 0 and d is _daemon:
                _daemon = None
                d.stop()

    def close(self) -> None:
        """This engine is done with the daemon (its workers ended): the last engine's close tells it ``quit``."""
        self._release()


@atexit.register
def _at_exit() -> None:
    """A daemon still running when this process exits (an engine never closed) quits, and its folder goes."""
    global _daemon
    with _lock:
        if _daemon is not None:
            _daemon.stop()
            _daemon = None


def enter(env: Mapping[str, str] | None) -> bool:
    """In a worker, before its first CUDA context: make this process a client of the engine's private daemon
    (set ``env``'s MPS variables) where its gate is open and the daemon's control pipe is up. Returns whether it
    did; a process that is a client already stays one."""
    pipe = (env or {}).get(PIPE)
    if not env or not pipe or os.environ.get(PIPE) == pipe:
        return bool(pipe) and os.environ.get(PIPE) == pipe
    gate = env.get(GATE)
    if (gate and not os.path.exists(gate)) or not os.path.exists(os.path.join(pipe, "control")):
        return False
    os.environ.update({k: v for k, v in env.items() if k in (PIPE, LOG)})
    return True
