"""Kernel sources: PTX/cubin/fatbin files and their JSON sidecars (NVRTC and generated kernels come later)."""

from ._files import find_sidecar, load_kernel_file
from ._ptx import PtxParam, parse_ptx, ptx_target, ptx_version, signature_from_ptx
from ._sidecar import Sidecar, merge, parse_sidecar, read_sidecar

__all__ = [
    "PtxParam",
    "Sidecar",
    "find_sidecar",
    "load_kernel_file",
    "merge",
    "parse_ptx",
    "parse_sidecar",
    "ptx_target",
    "ptx_version",
    "read_sidecar",
    "signature_from_ptx",
]
