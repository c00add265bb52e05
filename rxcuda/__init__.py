"""rxcuda: a reactive dataflow runtime for CUDA.

Blocks (kernels and library calls) wired into a pipeline; one Engine per GPU compiles it into one CUDA
graph and launches it every frame; every change is applied with the cheapest legal update.

>>> import rxcuda
>>> add = rxcuda.Block.from_kernel("vector_add", size=1024)   # a kernel shipped with rxcuda
>>> add["out"], add.params["n"].value
(<port vector_add.out>, 1024)
>>> engine = rxcuda.Engine(driver=rxcuda.cuda.NullDriver())   # rxcuda.Engine() on a GPU
>>> engine.add(add).state
'not built'
>>> engine.close()

Subpackages: ``rxcuda.lang`` (compose kernels in Python), ``rxcuda.libraries`` (cuBLAS, cuFFT, cuRAND,
cuSPARSE, cuSOLVER calls as blocks), ``rxcuda.streams`` (events and Rx operators), ``rxcuda.lowlevel``
(the pipeline as data: descriptions and the planner), ``rxcuda.view`` (pictures of the graph: ``to_dot``,
``engine.save_graph``; traces: ``engine.trace``, ``plot_frames``), ``rxcuda.kernels`` (the kernels shipped with
rxcuda: ``Block.from_kernel("vector_add")`` loads one by name), ``rxcuda.examples`` (runnable pipelines:
``python -m rxcuda.examples``), ``rxcuda.distributed`` (a pipeline's blocks on
several processes and machines, as Ray actors: ``rxcuda.distributed.Engine``; needs the ``ray`` extra).
"""

import importlib as _importlib
import importlib.util as _importlib_util
import logging as _logging
import os as _os
import sys as _sys

from .blocks._appendstate import AppendState
from .blocks._blocks import Block, BlockBuilder, Parameter, PortHandle
from .blocks._composite import Composite, CompositeInstance
from .blocks._regions import For, If, IfElse, Region, While
from .cuda._device import device_info
from .cuda._driver import probe
from .distributed._isolated import Fault, IsolatedEngine  # the GPU side in a supervised child process
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
from .view._dot import GraphvizNotFoundError, save_graph, to_dot  # importing view provides engine.to_dot & co.
from .view._plot import MatplotlibNotFoundError, plot_frames
from .view._serve import LiveView, LiveViewError  # engine.serve() makes one
from .view._trace import Trace  # engine.trace(path) makes one

# rxcuda.kernels and rxcuda.examples are the repository's top-level kernels/ and examples/ folders, mapped into
# the package by pyproject.toml (a wheel carries them as rxcuda/kernels and rxcuda/examples; an editable install
# maps them with its own finder). A checkout used without installing (PYTHONPATH=<checkout>, as the GPU batch
# does) finds exactly these two beside this folder.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "pyproject.toml")) and _os.path.isfile(
        _os.path.join(_checkout, "kernels", "__init__.py")):

    class _CheckoutPackages:
        """A meta path finder for rxcuda.kernels and rxcuda.examples in a checkout."""

        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname not in (f"{__name__}.kernels", f"{__name__}.examples"):
                return None
            folder = _os.path.join(_checkout, fullname.rpartition(".")[2])
            return _importlib_util.spec_from_file_location(fullname, _os.path.join(folder, "__init__.py"),
                                                          submodule_search_locations=[folder])

    _sys.meta_path.append(_CheckoutPackages)
kernels = _importlib.import_module(f"{__name__}.kernels")  # rxcuda.kernels.path(name) after a plain import rxcuda

# a library logs, the application decides where it goes (nothing is printed unless it configures logging)
_logging.getLogger("rxcuda").addHandler(_logging.NullHandler())


def _version() -> str:
    """The installed distribution's version (pyproject.toml's), or ``0+unknown`` for a source tree that was
    never installed (imported straight from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rxcuda")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()

__all__ = [
    "AppendState",
    "AppliedUpdate",
    "Block",
    "BlockBuilder",
    "BoundsError",
    "Broadcast",
    "BufferStats",
    "CallSpec",
    "CaptureArgs",
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
    "Fault",
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
    "IsolatedEngine",
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
