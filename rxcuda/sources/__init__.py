"""Kernel sources -> KernelCode: PTX/cubin/fatbin files and their JSON sidecars, CUDA C++ through NVRTC
(declarations, headers, cache, compiler), and kernels composed in Python (IR, tracer, lowering).

Modules, one job each: ``_files`` (kernel files), ``_ptx`` (PTX text), ``_sidecar`` (JSON sidecars),
``_cdecl`` (``extern "C"`` declarations), ``_headers`` (included and toolkit headers), ``_cache`` (the
disk cache), ``_arch`` (architectures), ``_diagnostics`` (compiler messages), ``_nvrtc`` (the compiler
and its warm-up), ``_ir`` / ``_trace`` / ``_lower`` / ``_compose`` (composed kernels), ``_load`` (one
entry for every source), ``_build`` (``rxcuda kernels build``).
"""

from ._compose import ComposedKernel, ComposeError, In, InOut, Out, compose, elementwise, kernel
from ._files import find_sidecar, load_kernel_file
from ._load import load_source
from ._nvrtc import CompiledModule, Compiler, compile_cuda, compile_module, warm_up
from ._ptx import PtxParam, check_ptx, parse_ptx, ptx_target, ptx_version, signature_from_ptx
from ._sidecar import Sidecar, merge, parse_sidecar, read_sidecar

__all__ = [
    "CompiledModule",
    "Compiler",
    "ComposeError",
    "ComposedKernel",
    "In",
    "InOut",
    "Out",
    "PtxParam",
    "Sidecar",
    "check_ptx",
    "compile_cuda",
    "compile_module",
    "compose",
    "elementwise",
    "find_sidecar",
    "kernel",
    "load_kernel_file",
    "load_source",
    "merge",
    "parse_ptx",
    "parse_sidecar",
    "ptx_target",
    "ptx_version",
    "read_sidecar",
    "signature_from_ptx",
    "warm_up",
]
