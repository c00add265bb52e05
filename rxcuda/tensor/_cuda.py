"""The CUDA backend: CuPy arrays on one stream, one generated kernel per fused group (``_codegen``).

It runs the same plan as the CPU backend, group by group (``_program.Program`` walks the plan for both): an
elementwise or reduce group becomes one kernel from the :class:`~._factory.KernelFactory` (PTX written from
the IR at once, replaced by the tuned C++ build from a background NVRTC compile at a later launch); ``matmul`` is
``cupy.matmul`` (cuBLAS); views are CuPy views; ``copy`` moves data between host and device. A group the
generator cannot express runs op by op through CuPy (the CPU backend's own op table, on CuPy arrays).
"""

from __future__ import annotations

import numpy as np

from ..cuda._kernels import load_module
from ..model._errors import RxcudaError
from ._cache import STATS
from ._factory import KernelFactory
from ._graph import Node
from ._ir import group_ir
from ._tuning import launch_shape

FACTORY = KernelFactory(upgrade=True, stats=STATS, interpret=True)
"""The process's kernels: the interpreter (or PTX, where it does not cover a group) answers a miss, the tuned C++
build replaces it when NVRTC has made it."""
_BACKEND: list[Backend] = []


class CudaUnavailableError(RxcudaError, RuntimeError):
    """A program has nodes on ``cuda`` but this process cannot run them (no CuPy, or no CUDA device); an
    :class:`~rxcuda.RxcudaError`, and a RuntimeError."""


def backend(node: Node) -> Backend:
    """The process's CUDA backend (made on first use); CudaUnavailableError naming ``node`` if there is none."""
    if not _BACKEND:
        try:
            import cupy
        except ImportError as e:
            raise _unavailable(node, f"CuPy is not installed ({e}; pip install cupy-cuda12x)") from None
        from ..cuda._driver import probe

        ok, why = probe()
        if not ok:
            raise _unavailable(node, f"no CUDA device: {why}")
        _BACKEND.append(Backend(cupy))
    return _BACKEND[0]


def _unavailable(node: Node, why: str) -> CudaUnavailableError:
    return CudaUnavailableError(
        f"this program has a {node.op} node {node.shape} on 'cuda', but the CUDA backend cannot run here: {why}. "
        "Build the program on 'cpu' (the default) or move it with .to('cpu') to run it on the CPU backend")


class _Fill:
    """A ``full`` leaf on cuda: a kernel takes its value as an argument; anything else gets an array."""

    __slots__ = ("node",)

    def __init__(self, node: Node):
        self.node = node


class Backend:
    """One CuPy stream; every kernel, cuBLAS call and copy of the backend runs on it (a blocking stream, so
    work on the legacy default stream stays ordered with it)."""

    def __init__(self, cupy):
        self.cp = cupy
        self.stream = cupy.cuda.Stream()
        self.capturing = False  # rxcuda.tensor.function captures a run into a CUDA graph (_replay.py)
        self._gemm = None
        self._fills: dict[int, tuple] = {}  # the device value of each fill a captured program reads whole
        self._interpreter: dict[str, tuple] = {}  # entry -> (module, function): the interpreter, loaded once
        self._sms = 0
        FACTORY.warm()  # the interpreter builds in the background (a disk-cache read after the first time)

    def gemm(self, a, b, node: Node):
        """``a @ b`` through rxcuda's own cuBLAS call (``_gemm.Gemm``), which a stream capture records."""
        if self._gemm is None:
            from ._gemm import Gemm

            self._gemm = Gemm(self.cp, self.stream)
        return self._gemm(a, b, node)

    def leaf_value(self, node: Node):
        if node.op == "const":
            return self.cp.asarray(node.attrs[0].array)  # CuPy as it is; PyTorch and others zero-copy
        return _Fill(node)

    def array(self, value):
        """``value`` as a CuPy array (a fill becomes a broadcast 0-d array)."""
        if isinstance(value, _Fill):
            n = value.node
            if self.capturing:  # made before the capture (a host-to-device copy cannot be captured), then reused
                kept = self._fills.get(id(value))
                if kept is None:
                    with self.stream:
                        kept = self._fills[id(value)] = (value, self.cp.asarray(n.attrs[0], dtype=n.dtype))
                return self.cp.broadcast_to(kept[1], n.shape)
            with self.stream:
                return self.cp.broadcast_to(self.cp.asarray(n.attrs[0], dtype=n.dtype), n.shape)
        return value

    def compile_group(self, group, plan):
        """A function running ``group`` on the stream: its inputs' values in, its outputs' arrays out."""
        if group.kind == "copy":
            return lambda inputs: [self.copy(group.nodes[0], inputs[0])]
        array, stream = self.array, self.stream
        if group.kind in ("view", "matmul", "op"):  # CuPy's views, cupy.matmul (cuBLAS) and the ops of _numpy
            from ._cpu import compile_group

            ops = compile_group(group, plan, xp=self.cp)
            if group.kind == "view":
                return lambda inputs: ops([array(v) for v in inputs])  # no device work: no stream

            def run_matmul(inputs: list) -> list:
                with stream:
                    if self.capturing and group.kind == "matmul":  # CuPy refuses cuBLAS under capture
                        return [self.gemm(array(inputs[0]), array(inputs[1]), group.nodes[0])]
                    return ops([array(v) for v in inputs])

            return run_matmul

        memo: list = []  # (strides of the array inputs, the prepared launch) of the first run

        def run(inputs: list) -> list:
            strides = tuple(None if isinstance(v, _Fill) else v.strides for v in inputs)
            if memo and memo[0] == strides:  # a repeat of a Program: the same layouts, the same kernel
                return memo[1](inputs)
            ir = group_ir(group, plan, [v if isinstance(v, _Fill) else self.array(v) for v in inputs])
            if ir is None:
                from ._cpu import compile_group

                ops = compile_group(group, plan, xp=self.cp)

                def launch(ins: list) -> list:
                    with stream:
                        return ops([array(v) for v in ins])
            else:
                launch = self.prepare(ir, group, plan.passes.fast_math)
            memo[:] = [strides, launch]
            return launch(inputs)

        return run

    def prepare(self, ir: tuple, group, fast_math: bool = False):
        """A function launching ``ir``'s kernel (compiled and loaded now) for ``group``: its inputs' values in,
        its outputs' new arrays out. Everything that does not change between launches is decided here: the
        launch shape, the fills' values, the argument kinds (a launcher packs them, see
        ``rxcuda.cuda._kernels.KernelLauncher``). The kernel runs on the backend's stream, as the arrays do."""
        cp = self.cp
        kernel = FACTORY.get(ir, fast_math=fast_math)
        if kernel.function is None:
            kernel.module, kernel.function = (self.load_interpreter(kernel.code) if kernel.interp is not None
                                              else self.load(kernel.code))
        load, current, launcher = self.load, kernel.current, kernel.launcher
        sms = self.sms() if kernel.interp is not None else 0  # the interpreter's grid (only it asks)
        grid, block = launch_shape(ir)
        outs = [(n.shape, n.dtype) for n in group.outputs]
        fills = {k: (np.uint8(bool(n.attrs[0])) if n.dtype == np.bool_ else n.dtype.type(n.attrs[0]))
                 for k, n in enumerate(group.inputs) if n.op == "full"}
        kinds = [(np.dtype(np.uint8) if n.dtype == np.bool_ else n.dtype) if k in fills else "pointer"
                 for k, n in enumerate(group.inputs)] + ["pointer"] * len(outs)
        arrays = [k for k in range(len(group.inputs)) if k not in fills]
        template = [fills.get(k, 0) for k in range(len(group.inputs))]
        stream, empty = self.stream, cp.empty
        launched: list = [None, None]  # the function launched last and its launcher (the tuned build swaps in)

        def launch(inputs: list) -> list:
            with stream:  # the pool hands out memory ordered on this stream
                results = [empty(shape, dtype) for shape, dtype in outs]
            if grid == 0:
                return results
            function = current(load)  # the C++ build once it is ready
            if function is not launched[0]:
                launched[:] = [function, launcher(function, kinds, sms)]
            args = template.copy()
            for k in arrays:
                args[k] = inputs[k].data.ptr
            launched[1](grid, block, (*args, *(r.data.ptr for r in results)), stream.ptr)
            return results

        return launch

    def load(self, code):
        """``code`` (a cubin, or PTX the driver JITs) loaded on this device through rxcuda's CUDA layer:
        (``KernelModule``, ``KernelFunction``).

        PTX (the first tier of a new kernel, see ``KernelFactory``) is JIT-compiled at optimisation level 0:
        on the H100 host that takes ~10 ms where the default level takes ~15 ms, and a kernel launched twice is
        replaced by its tuned NVRTC build anyway."""
        self.cp.cuda.runtime.free(0)  # cudaFree(0): CuPy's context is current on this thread, the driver loads there
        first = getattr(code, "cached", None) == "ptx"  # the PTX tier (an NVRTC build is a KernelCode)
        origin = ("a generated tensor kernel's PTX (the text is in GroupKernel.source; "
                  "rxcuda.tensor._factory.KernelFactory(ptx=False) builds with NVRTC instead)" if first
                  else "a generated tensor kernel's NVRTC build")
        module = load_module(code.image, ptx=code.format == "ptx", optimization_level=0 if first else None,
                             origin=origin)
        return module, module.function(code.entry)

    def load_interpreter(self, code):
        """The tensor interpreter's entry ``code.entry`` (see ``_interp``), loaded once on this device."""
        loaded = self._interpreter.get(code.entry)
        if loaded is None:
            loaded = self._interpreter[code.entry] = self.load(code)
        return loaded

    def sms(self) -> int:
        """The device's multiprocessor count (the interpreter's grid), asked once."""
        if not self._sms:
            self._sms = int(self.cp.cuda.Device().attributes["MultiProcessorCount"])
        return self._sms

    def copy(self, node: Node, value):
        """A ``copy`` node: host -> device gives a CuPy array, device -> host a NumPy array."""
        if node.device == "cuda":
            if isinstance(value, np.ndarray):
                with self.stream:
                    return self.cp.asarray(value)
            return value
        if isinstance(value, _Fill):
            value = self.array(value)
        if isinstance(value, np.ndarray):
            return value
        out = self.cp.asarray(value).get(stream=self.stream)
        self.stream.synchronize()
        return out


def to_host(value):
    """A result as a NumPy array (a CuPy array is copied from the device)."""
    if isinstance(value, np.ndarray):
        return value
    be = _BACKEND[0] if _BACKEND else None
    if be is None:  # pragma: no cover - a device value exists only once the backend does
        return value.get()
    return be.copy(Node("copy", (), ("cpu",), tuple(value.shape), np.dtype(value.dtype), "cpu"), value)
