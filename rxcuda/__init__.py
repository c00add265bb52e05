"""rxcuda: a reactive dataflow runtime for CUDA.

Blocks (kernels and library calls) wired into a pipeline; one Engine per GPU compiles it into one CUDA
graph and launches it every frame; every change is applied with the cheapest legal update.

>>> import rxcuda
>>> add = rxcuda.Block.from_kernel("kernels/vector_add.ptx", size=1024)
>>> add["out"], add.params["n"].value
(<port vector_add.out>, 1024)
>>> engine = rxcuda.Engine(driver=rxcuda.cuda.NullDriver())   # rxcuda.Engine() on a GPU
>>> engine.add(add).state
'not built'
>>> engine.close()

Subpackages: ``rxcuda.lang`` (compose kernels in Python), ``rxcuda.libraries`` (cuBLAS, cuFFT, cuRAND,
cuSPARSE, cuSOLVER calls as blocks), ``rxcuda.streams`` (events and Rx operators), ``rxcuda.lowlevel``
(the pipeline as data: descriptions and the planner), ``rxcuda.view`` (pictures of the graph: ``to_dot``,
``engine.save_graph``; traces: ``engine.trace``, ``plot_frames``), ``rxcuda.distributed`` (a pipeline's blocks on
several processes and machines, as Ray actors: ``rxcuda.distributed.Engine``; needs ``rxcuda[ray]``).
"""

import logging as _logging

from .blocks._appendstate import AppendState
from .blocks._blocks import Block, BlockBuilder, Parameter, PortHandle
from .blocks._composite import Composite, CompositeInstance
from .blocks._regions import For, If, IfElse, Region, While
from .cuda._device import device_info
from .cuda._driver import probe
from .engine._engine import AppliedUpdate, Diagnostic, Engine, EngineStream, Frame
from .model._describe import CallSpec, CaptureArgs, KernelCode, KernelParam, KernelSignature, Launch
from .model._dtypes import numpy_dtype, struct
from .model._errors import (
    BoundsError,
    CompileError,
    CudaError,
    DeviceLostError,
    EngineClosedError,
    ForeignBlockError,
    KernelFileError,
    NoDeviceError,
    NotAPortError,
    Problem,
    RxcudaError,
    UnknownPortError,
    ValidationError,
)
from .model._events import Tier
from .model._shapes import Broadcast, Follow, Like, Reduce, ShapeError
from .plan._liveness import BufferStats
from .plan._plan import GraphPlan, plan
from .sources._compose import ComposeError, In, InOut, Out, compose, elementwise, kernel
from .sources._files import load_kernel_file
from .sources._load import load_source
from .sources._nvrtc import compile_cuda
from .view._dot import GraphvizNotFoundError, save_graph, to_dot  # importing view installs engine.to_dot & co.
from .view._plot import MatplotlibNotFoundError, plot_frames
from .view._serve import LiveView, LiveViewError  # engine.serve() makes one
from .view._trace import Trace  # engine.trace(path) makes one

# a library logs, the application decides where it goes (nothing is printed unless it configures logging)
_logging.getLogger("rxcuda").addHandler(_logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "AppendState",
    "AppliedUpdate",
    "Block",
    "BlockBuilder",
    "Broadcast",
    "BufferStats",
    "CallSpec",
    "CaptureArgs",
    "BoundsError",
    "CompileError",
    "ComposeError",
    "Composite",
    "CompositeInstance",
    "CudaError",
    "DeviceLostError",
    "Diagnostic",
    "Engine",
    "EngineClosedError",
    "EngineStream",
    "Follow",
    "For",
    "ForeignBlockError",
    "Frame",
    "GraphPlan",
    "GraphvizNotFoundError",
    "If",
    "IfElse",
    "In",
    "InOut",
    "KernelCode",
    "KernelFileError",
    "KernelParam",
    "KernelSignature",
    "Launch",
    "Like",
    "LiveView",
    "LiveViewError",
    "MatplotlibNotFoundError",
    "NoDeviceError",
    "NotAPortError",
    "Out",
    "Parameter",
    "PortHandle",
    "Problem",
    "Reduce",
    "Region",
    "RxcudaError",
    "ShapeError",
    "Tier",
    "Trace",
    "UnknownPortError",
    "ValidationError",
    "While",
    "compile_cuda",
    "compose",
    "device_info",
    "elementwise",
    "kernel",
    "load_kernel_file",
    "load_source",
    "numpy_dtype",
    "plan",
    "plot_frames",
    "probe",
    "save_graph",
    "struct",
    "to_dot",
]
