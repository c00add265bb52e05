"""NVRTC, the CUDA toolkit's run-time compiler: its version, the architectures it targets, and one compile.

Only the calls into NVRTC live here; what to compile, the options, the caches and the declarations of the
kernels are ``rxcuda.sources``' business. A source NVRTC rejects raises :class:`NvrtcRejected` carrying the
compiler's log, which the caller turns into a :class:`~rxcuda.CompileError` naming the file and line.

>>> from rxcuda.cuda import _nvrtc
>>> major, minor = _nvrtc.version()  # doctest: +SKIP
>>> 90 in _nvrtc.supported_archs()  # doctest: +SKIP
True
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from ..model._errors import CompileError


class NvrtcRejected(Exception):
    """NVRTC rejected the source; ``args[0]`` is its log (the caller turns it into a CompileError)."""


def import_compiler() -> None:
    """Import cuda.core (and its utils, which the compile cache uses) on the calling thread. Its first import is not
    thread-safe: a thread that imports it while another does may see it half made (``ImportError: cannot import
    name 'ProgramOptions'``). Call this before starting a thread that compiles. ImportError without cuda.core."""
    import cuda.core  # noqa: F401
    import cuda.core.utils  # noqa: F401


def _check(err, call: str) -> None:
    from cuda.bindings import nvrtc

    if int(err) != 0:
        _e, msg = nvrtc.nvrtcGetErrorString(err)
        raise CompileError(f"{call} failed: {msg.decode() if isinstance(msg, bytes) else msg}")


def version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library in use."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


def supported_archs() -> tuple[int, ...]:
    """Compute capabilities NVRTC can compile for, e.g. ``(75, 80, 86, ..., 120)``."""
    from cuda.bindings import nvrtc

    err, archs = nvrtc.nvrtcGetSupportedArchs()
    if int(err) != 0:
        raise CompileError(f"nvrtcGetSupportedArchs failed ({err!r}); is the nvidia-cuda-nvrtc wheel installed?")
    return tuple(int(a) for a in archs)


def compile_ptx(source: str, name: str, options: Sequence[bytes]) -> tuple[bytes, str]:
    """NVRTC to PTX through cuda.bindings: (ptx, log). (cuda.core's ``Program.compile('ptx')`` asks the driver
    whether it could load the result, which fails where there is no driver.)"""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), list(options))
        _e, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log_text = buf.rstrip(b"\x00").decode(errors="replace")
        if int(err) != 0:
            raise NvrtcRejected(log_text)
        _e, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(prog, ptx)
        _check(err, "nvrtcGetPTX")
        return ptx.rstrip(b"\x00"), log_text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_cubin(source: str, options) -> tuple[bytes, str]:
    """NVRTC to a cubin through cuda.core's ``Program`` with ``options`` (a ``ProgramOptions``): (cubin, log)."""
    from cuda.core import Program

    logs = io.StringIO()
    try:
        obj = Program(source, "c++", options=options).compile("cubin", logs=logs)
    except Exception as e:
        if type(e).__name__ == "NVRTCError" or "NVRTC_ERROR" in str(e):
            msg = str(e)
            raise NvrtcRejected(msg.split("compilation log:", 1)[1] if "compilation log:" in msg else msg) from None
        raise
    return bytes(obj.code), logs.getvalue().replace("\x00", "")


def compile_source(source: str, name: str, options, target: str) -> tuple[bytes, str]:
    """Compile CUDA C++ ``source`` to ``target`` ("ptx" or "cubin") with ``options`` (a ``ProgramOptions``):
    (image, log). Raises :class:`NvrtcRejected` with the log when NVRTC rejects the source."""
    if target == "ptx":
        return compile_ptx(source, name, list(options.as_bytes("nvrtc", "ptx")))
    return compile_cubin(source, options)
