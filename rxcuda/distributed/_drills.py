"""The fault drills a worker runs on request (``FragmentHost.crash(how)``: tests, ``bench/distributed.py``), each
a death as it comes in production: the process ended at once, SIGKILL, a segfault, host memory running out, an
exception in the frame thread, a lost GPU context.

>>> DRILLS
('exit', 'kill', 'segfault', 'oom', 'frame', 'context')
"""

from __future__ import annotations

import os
import signal
from typing import NoReturn

DRILLS = ("exit", "kill", "segfault", "oom", "frame", "context")  # the faults FragmentHost.crash(how) makes
OOM_DRILL_MIB = 64  # what the "oom" drill allocates (and touches) in its step before the SIGKILL


def crash(host, how: str) -> None:
    """Run drill ``how`` on worker ``host`` (a ``FragmentHost``; see its ``crash``): ``"frame"`` and ``"oom"`` are
    armed for its next step, ``"context"`` makes its next launch lose the context (without a GPU only), the others
    end the process now."""
    if how not in DRILLS:
        raise ValueError(f"'how' must be one of {', '.join(DRILLS)} (got {how!r})")
    if how in ("frame", "oom"):
        host._drill = how
        return
    if how == "context":
        if not host.gpuless or host.engine is None:
            raise ValueError("the 'context' drill runs on a built worker without a GPU (the null driver or the "
                             "CPU device); on a GPU, a kernel that faults loses the context")
        host.engine.device.api.fail("cuGraphLaunch", "CUDA_ERROR_ILLEGAL_ADDRESS", times=1_000)
        return
    if how == "kill":
        os.kill(host.pid, signal.SIGKILL)
    elif how == "segfault":
        import ctypes

        ctypes.string_at(0)
    os._exit(1)


def out_of_memory() -> NoReturn:
    """The "oom" drill: allocate and touch OOM_DRILL_MIB of host memory, then SIGKILL, as the OOM killer ends a
    process that allocates when the host (or its cgroup) has no memory left."""
    held = []
    for _ in range(OOM_DRILL_MIB):
        held.append(bytearray(1 << 20))  # zero-filled: its pages are touched
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)  # not reached: SIGKILL cannot be caught
