"""A private NVIDIA Multi-Process Service daemon for a distributed engine's own workers (``Engine(share_gpu="mps")``).

Two workers on one GPU are two processes with a context each; without MPS the GPU time-slices between the
contexts, and each frame of one waits for the other's slice (``_sharing``). Under MPS their kernels and copies run
at once. The engine starts ``nvidia-cuda-mps-control -d`` with a pipe and a log directory of its own (a new
temporary folder: ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``), before any worker; its workers on the
driver's host set those two variables before their first CUDA call (``FragmentHost(env=...)``: no Ray
``runtime_env``, which needs Ray's agent), so their CUDA contexts are that daemon's clients (the MPS server starts
with the first one); the engine's close ends the workers, then tells the daemon ``quit`` and removes the
folder. Nothing else on the host uses that daemon, and an MPS the user started is left alone (a worker started
under it keeps the user's variables: rxcuda starts no daemon then). Where ``nvidia-cuda-mps-control`` is missing or
fails to start, a warning says so and the workers run without MPS.

Only workers on the driver's host can reach the daemon (its pipes are local files); on other hosts start MPS with
the host (docs/distributed.md, "Several workers on one GPU").

>>> check_share_gpu("mps")
'mps'
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Mapping

SHARE_GPU = ("off", "mps")
BINARY = "nvidia-cuda-mps-control"
PIPE, LOG = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
START_S = 10.0  # how long the daemon may take to make its control pipe


def check_share_gpu(value) -> str:
    if value not in SHARE_GPU:
        raise ValueError(f"'share_gpu' must be one of {', '.join(SHARE_GPU)} (got {value!r})")
    return value


class MpsDaemon:
    """One private control daemon: its folder, the variables that make a process its client (``env``)."""

    def __init__(self, binary: str):
        self.binary = binary
        self.root = tempfile.mkdtemp(prefix="rxcuda-mps-")
        self.env = {PIPE: os.path.join(self.root, "pipe"), LOG: os.path.join(self.root, "log")}
        for d in self.env.values():
            os.mkdir(d, 0o700)

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
            control = os.path.join(self.env[PIPE], "control")
            deadline = time.monotonic() + START_S
            while not os.path.exists(control):
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
        if os.path.exists(os.path.join(self.env[PIPE], "control")):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self._run([], stdin="quit\n")
                deadline = time.monotonic() + START_S
                while os.path.exists(os.path.join(self.env[PIPE], "control")) and time.monotonic() < deadline:
                    time.sleep(0.01)
        shutil.rmtree(self.root, ignore_errors=True)


def start_for(share_gpu: str, workers: Mapping, binary: str = BINARY) -> MpsDaemon | None:
    """The daemon for ``Engine(share_gpu=...)``: None for ``"off"``, where no worker holds a GPU, where
    MPS is set up already (``CUDA_MPS_PIPE_DIRECTORY`` in this environment), or (with a warning) where the daemon
    cannot start."""
    if check_share_gpu(share_gpu) == "off" or all(w.gpuless for w in workers.values()):
        return None
    if os.environ.get(PIPE):
        return None  # the user's MPS: its workers inherit it
    found = shutil.which(binary)
    if found is None:
        warnings.warn(f"share_gpu='mps': {binary} is not on PATH (it comes with NVIDIA's driver utilities); the "
                      "workers run without MPS, so workers sharing a GPU take turns on it", RuntimeWarning,
                      stacklevel=3)
        return None
    daemon = MpsDaemon(found)
    try:
        daemon.start()
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        warnings.warn(f"share_gpu='mps': the private MPS daemon did not start ({e}); the workers run without MPS",
                      RuntimeWarning, stacklevel=3)
        return None
    return daemon

