"""Past one process and one machine, on Ray: a pipeline's blocks placed on workers (Ray actors holding one
rxcuda Engine each), their connections carried every frame, and their streams brought back as Observables.

The pipeline is described once as data and each worker builds its fragment (the blocks placed on it).
Connections between workers go through CUDA IPC between GPU workers of one host (exported device memory and
interprocess events, no copy through the host; both workers' steps run at once and meet on the link's
shared-memory board) and through Ray's object store otherwise; ``describe()`` and
``to_dot()`` show which. Frames in flight are bounded, parameters cross as their latest value, and a worker
that dies is restarted by Ray and rebuilds its fragment with the last parameter values. Needs Ray
(``pip install '.[ray]'``); importing this package does not.

>>> from rxcuda.distributed import Worker
>>> Worker(num_gpus=0.5).ray_options()["num_gpus"]
0.5

Names: :class:`Engine` (the distributed engine), :class:`Worker` (what a worker asks Ray for),
:class:`FragmentFrame` and :class:`FragmentDiagnostic` (what ``frames`` and ``diagnostics`` emit, tagged with
the worker), :class:`WorkerDownError` (what a read of a port on a worker that is restarting raises),
:class:`DistributedFrame` (what ``tick()`` returns), :class:`DistributedDescription` (what ``describe()`` returns),
:class:`Fragment` and :class:`RemoteLink` (the pipeline cut by :func:`split`).
"""

from ._engine import Engine
from ._faults import WorkerDownError
from ._isolated import Fault, IsolatedEngine, RestartingError
from ._placement import Fragment, RemoteLink, Split, Worker, split
from ._records import DistributedDescription, DistributedFrame, FragmentDiagnostic, FragmentFrame

__all__ = [
    "DistributedDescription",
    "DistributedFrame",
    "Engine",
    "Fault",
    "Fragment",
    "FragmentDiagnostic",
    "FragmentFrame",
    "IsolatedEngine",
    "RemoteLink",
    "RestartingError",
    "Split",
    "Worker",
    "WorkerDownError",
    "split",
]
