"""One entry for every kernel source: a KernelCode, a .ptx/.cubin/.fatbin file, a .cu file, or a composed
kernel. Blocks and hot reload call this, so every source is the same kind of kernel node."""

from __future__ import annotations

import os

from ..model._describe import KernelCode
from ._files import FILE_SUFFIXES, load_kernel_file
from ._paths import shipped_kernel


def load_source(source, entry: str | None = None, *, arch: str | None = None) -> KernelCode:
    """Load or compile ``source`` into a KernelCode. ``.cu`` files compile with NVRTC (cached). A bare name
    such as ``"vector_add"`` (no folder, no suffix, not a file here) is the kernel of that name shipped with
    rxcuda (see ``rxcuda.kernels``)."""
    if isinstance(source, KernelCode):
        return source
    if type(source) is str and source.endswith(FILE_SUFFIXES):  # (never a shipped kernel's bare name)
        # a kernel file by path, as blocks are usually declared (in a loop: the shortest way to the file cache)
        return load_kernel_file(source, entry=entry)
    if hasattr(source, "kernel_code") and callable(source.kernel_code):
        return source.kernel_code(arch=arch)
    if isinstance(source, str | os.PathLike):
        source = shipped_kernel(source) or source
        if os.path.splitext(source)[1] in (".cu", ".cuh"):
            from ._nvrtc import compile_cuda

            return compile_cuda(source, entry, arch=arch)
        return load_kernel_file(source, entry=entry)
    raise TypeError(f"a kernel source must be a KernelCode, a composed kernel, the name of a shipped kernel "
                    f"('vector_add'), or a path to a .ptx/.cubin/.fatbin/.cu file (got {type(source).__name__})")
