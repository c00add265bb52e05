"""rxcuda: a reactive dataflow runtime for CUDA.

Blocks (kernels and library calls) wired into a pipeline; one Engine per GPU compiles it into one CUDA
graph and launches it every frame; every change is applied with the cheapest legal update.

>>> import rxcuda
>>> engine = rxcuda.Engine()
>>> add = engine.add(rxcuda.Block.from_kernel("kernels/vector_add.ptx", size=1024))
"""

from ._errors import (
    CompileError,
    CudaError,
    EngineClosedError,
    KernelFileError,
    NoDeviceError,
    RxcudaError,
    ValidationError,
)
from .engine._blocks import Block, BlockBuilder, Parameter, PortHandle
from .engine._describe import CallSpec, CaptureArgs, KernelCode, KernelParam, KernelSignature, Launch
from .engine._device import device_info
from .engine._driver import probe
from .engine._engine import Diagnostic, Engine, Frame
from .engine._plan import GraphPlan, plan
from .sources._files import load_kernel_file
from .streams._events import Tier

__version__ = "0.1.0"

__all__ = [
    "Block",
    "BlockBuilder",
    "CallSpec",
    "CaptureArgs",
    "CompileError",
    "CudaError",
    "Diagnostic",
    "Engine",
    "EngineClosedError",
    "Frame",
    "GraphPlan",
    "KernelCode",
    "KernelFileError",
    "KernelParam",
    "KernelSignature",
    "Launch",
    "NoDeviceError",
    "Parameter",
    "PortHandle",
    "RxcudaError",
    "Tier",
    "ValidationError",
    "device_info",
    "load_kernel_file",
    "plan",
    "probe",
]
