"""Host functions: work the CPU device runs as a step of a graph, in the graph's order with its kernels.

On the CPU device, library calls (cuBLAS, cuFFT, cuRAND, cuSPARSE, cuSOLVER) compute with NumPy. They are captured
as the GPU's are: the engine begins a capture on its capture stream, the call issues its work, and the captured
graph becomes a child-graph node. What a call issues on the CPU device is a *host function*
(``cuLaunchHostFunc``, which a capture records as a host node, as CUDA does): the CPU driver runs it when the
graph reaches that node, after the kernels before it and before those after it.

Which driver a thread works with is the one whose context it made current last (:meth:`Device.make_current`
notes it here): library code asks :func:`current` whether that is the CPU device, and issues its kernels,
copies and host functions through it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..model._errors import CudaError
from ._driver import check

_local = threading.local()


def note_current(api) -> None:
    """``api``'s context was made current on this thread: remember it where it is the CPU device's driver."""
    _local.api = api if getattr(api, "on_host", False) else None


def current():
    """The CPU device's driver when its context is the one current on this thread, else None."""
    return getattr(_local, "api", None)


def launch_host(stream: int, fn: Callable[[], None], what: str) -> None:
    """Issue ``fn()`` on ``stream`` of the CPU device (a host node where the stream captures, run now where it
    does not). ``what`` names the work for errors."""
    api = current()
    if api is None:
        raise CudaError("cuLaunchHostFunc", "CUDA_ERROR_INVALID_CONTEXT",
                        f"{what}: host functions are issued on the CPU device, whose context is not current on this "
                        "thread")
    check(api.cuLaunchHostFunc(stream, lambda _data: fn(), None), f"cuLaunchHostFunc ({what})")
