"""The CPU device: a driver that executes. It stands in for ``cuda.bindings.driver`` as the null driver does
(same calls, same structs, same bookkeeping; it is a :class:`~rxcuda.cuda._null.NullDriver` that also computes):
device memory is host memory (NumPy arrays, handed out at their real addresses), kernels run from their PTX
translated to C (``_ptxc``, ``_cpukernel``), graphs keep their nodes and run them in order when launched,
conditional nodes decide on the host from the handle their condition kernel set, and everything is synchronous:
a launch has finished when the call returns (streams and events only keep time). A registered GL buffer gets a host
copy, uploaded into it when unmapped (``_cpugl``).

Everything above ``rxcuda/cuda`` is unchanged: ``rxcuda.Engine(device="cpu")`` is an engine on this driver.

>>> import numpy as np
>>> from rxcuda.cuda._cpu import CpuDriver
>>> api = CpuDriver()
>>> _, ptr = api.cuMemAlloc(16)
>>> host = np.arange(4, dtype=np.float32)
>>> _ = api.cuMemcpyHtoDAsync(ptr, host.ctypes.data, 16, 0)
>>> back = np.zeros(4, dtype=np.float32)
>>> _ = api.cuMemcpyDtoH(back.ctypes.data, ptr, 16)
>>> back.tolist()
[0.0, 1.0, 2.0, 3.0]
"""

from __future__ import annotations

import ctypes
import struct
import time

import numpy as np
from cuda.bindings import driver as _real

from ..model._errors import CudaError
from . import _cpukernel
from ._cpucapture import CaptureMixin
from ._cpugl import GLInteropMixin
from ._null import NullDriver

_OK = _real.CUresult.CUDA_SUCCESS
_R = _real.CUresult
_ALIGN = 256


def _fail(call: str, name: str, text: str) -> CudaError:
    return CudaError(call, name, text, int(getattr(_R, name)))


class _Func:
    """A loaded function: its module and kernel name."""

    __slots__ = ("module", "name", "kernel", "layout", "size", "array")

    def __init__(self, module: _cpukernel.CpuModule, name: str):
        self.module, self.name = module, name
        self.kernel = module.kernels[name]
        self.layout = [(p.offset, p.size) for p in self.kernel.params]  # (read once: a hot update packs them)
        self.size = self.kernel.params_size
        self.array = ctypes.c_void_p * len(self.layout)


class _Node:
    """A node of a graph (template or executable): what it does, and what it depends on."""

    __slots__ = ("kind", "data", "deps", "enabled", "launch", "bodies", "raw")

    def __init__(self, kind: str, data, deps=()):
        self.kind, self.data, self.deps = kind, data, tuple(int(d) for d in deps)
        self.enabled = True
        self.raw = b""  # a kernel node's params struct as last set: the same again is a change of argument values
        self.launch: _cpukernel.Prepared | None = None
        self.bodies: list[int] = []


class CpuDriver(CaptureMixin, GLInteropMixin, NullDriver):
    """The CPU device's driver: :class:`NullDriver`'s bookkeeping, with memory, kernels and graphs that run.

    ``calls`` records every call where ``record=True`` (tests; ``count`` always counts); ``last_fault`` holds the
    last illegal address a kernel made (its message), which the launch raised as ``CUDA_ERROR_ILLEGAL_ADDRESS``."""

    opened = False  # whether a CpuDriver was made in this process (kernels compiled from then on are PTX)
    on_host = True  # what the layers above ask where the CPU device differs (library calls issue host functions)

    def __init__(self, *, name: str = "CPU (rxcuda)", total_memory: int = 8 << 30, record: bool = False, **kwargs):
        if kwargs.get("devices", 1) != 1:
            raise ValueError(f"the CPU device is one device (got devices={kwargs['devices']!r}): an engine's positions "
                             "on it are Engine(devices=['cpu', 'cpu']), each with its own graph and stream")
        super().__init__(name=name, total_memory=total_memory, **kwargs)
        self.record = record  # ``calls`` grows with every frame when True: tests only
        CpuDriver.opened = True
        self.allocations = _cpukernel.Allocations()
        self._memory: dict[int, np.ndarray] = {}
        self._functions: dict[int, _Func] = {}
        self._modules: dict[int, _cpukernel.CpuModule] = {}
        self._graphs: dict[int, list[tuple[int, _Node]]] = {}  # graph -> [(node handle, node)] in the order added
        self._node_graph: dict[int, int] = {}
        self._execs: dict[int, dict[int, _Node]] = {}  # executable graph -> its top-level nodes, in order
        self._index: dict[int, dict[int, _Node]] = {}  # executable graph -> every node it holds, by handle
        self._cond: dict[int, int] = {}  # conditional handle -> its value
        self._events: dict[int, float] = {}
        self._capturing: dict[int, list] = {}
        self._gl_res = {}  # graphics resource -> its GL buffer and host copy (_cpugl)
        self.last_fault = ""
        self._set_cond = _cpukernel.SET_COND(self._on_set_cond)

    def _on_set_cond(self, ctx, handle, value) -> None:
        self._cond[int(handle)] = int(value)

    # -- memory: host arrays at their real addresses -----------------------------------------------------
    def cuMemAlloc(self, nbytes):
        def alloc():
            n = max(int(nbytes), 1)
            raw = np.zeros(n + _ALIGN, dtype=np.uint8)
            off = (-raw.ctypes.data) % _ALIGN
            ptr = raw.ctypes.data + off
            self._memory[ptr] = raw
            self.allocations.add(ptr, n)
            self.live.setdefault("memory", set()).add(ptr)
            return (_real.CUdeviceptr(ptr),)

        return self._call("cuMemAlloc", (nbytes,), alloc)

    def cuMemFree(self, ptr):
        p = int(ptr)
        self._memory.pop(p, None)
        self.allocations.remove(p)
        return super().cuMemFree(ptr)

    def cuMemHostAlloc(self, nbytes, flags):
        result = super().cuMemHostAlloc(nbytes, flags)
        if not result[0]:
            self.allocations.add(int(result[1]), max(int(nbytes), 1))
        return result

    def cuMemFreeHost(self, ptr):
        self.allocations.remove(int(ptr))
        return super().cuMemFreeHost(ptr)

    def cuMemGetInfo(self):
        used = sum(a.nbytes for a in self._memory.values())
        return self._call("cuMemGetInfo", (), (max(self.total_memory - used, 0), self.total_memory))

    def cuIpcGetMemHandle(self, ptr):  # a CPU device's memory is its process's: nothing another can map
        raise _fail("cuIpcGetMemHandle", "CUDA_ERROR_NOT_SUPPORTED", "CUDA IPC maps a GPU's memory into another "
                    "process; the CPU device's memory cannot be: connect its workers with transport='host'")

    def _check_range(self, call: str, ptr: int, nbytes: int) -> None:
        if nbytes <= 0:
            return
        found = self.allocations.find(ptr)
        if found is None or ptr + nbytes > found[0] + found[1]:
            raise _fail(call, "CUDA_ERROR_INVALID_VALUE",
                        f"{nbytes} bytes at {ptr:#x} are not inside one allocation of the CPU device")

    def cuMemsetD8(self, ptr, value, count):
        self._check_range("cuMemsetD8", int(ptr), int(count))
        ctypes.memset(int(ptr), int(value), int(count))
        return super().cuMemsetD8(ptr, value, count)

    def cuMemsetD8Async(self, ptr, value, count, stream):
        self._check_range("cuMemsetD8Async", int(ptr), int(count))
        if not self.captured(stream, "memset", (int(ptr), int(value), 1, int(count), 1, 0)):
            ctypes.memset(int(ptr), int(value), int(count))
        return super().cuMemsetD8Async(ptr, value, count, stream)

    def cuMemsetD32Async(self, ptr, value, count, stream):
        self._check_range("cuMemsetD32Async", int(ptr), 4 * int(count))
        if not self.captured(stream, "memset", (int(ptr), int(value), 4, int(count), 1, 0)):
            _memset32(int(ptr), int(value), int(count))
        return super().cuMemsetD32Async(ptr, value, count, stream)

    def _copy(self, call: str, dst: int, src: int, nbytes: int, device: int, record: tuple) -> tuple:
        """A copy now (everything before it has run); ``device`` is the side that must be an allocation."""
        self._check_range(call, device, nbytes)
        ctypes.memmove(dst, src, nbytes)
        return self._call(call, record)

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        d, n = int(dst), int(nbytes)
        self.refuse_in_capture("cuMemcpyHtoDAsync", stream)
        return self._copy("cuMemcpyHtoDAsync", d, int(src), n, d, (d, n, int(stream)))

    def cuMemcpyHtoD(self, dst, src, nbytes):
        d, n = int(dst), int(nbytes)
        return self._copy("cuMemcpyHtoD", d, int(src), n, d, (d, n))

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        s, n = int(src), int(nbytes)
        self.refuse_in_capture("cuMemcpyDtoHAsync", stream)
        return self._copy("cuMemcpyDtoHAsync", int(dst), s, n, s, (s, n, int(stream)))

    def cuMemcpyDtoH(self, dst, src, nbytes):
        s, n = int(src), int(nbytes)
        return self._copy("cuMemcpyDtoH", int(dst), s, n, s, (s, n))

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
        self._check_range("cuMemcpyDtoDAsync", int(src), int(nbytes))
        self._check_range("cuMemcpyDtoDAsync", int(dst), int(nbytes))
        if not self.captured(stream, "copy", (int(dst), int(src), int(nbytes))):
            ctypes.memmove(int(dst), int(src), int(nbytes))
        return super().cuMemcpyDtoDAsync(dst, src, nbytes, stream)

    def cuMemcpyPeerAsync(self, dst, dst_ctx, src, src_ctx, nbytes, stream):  # (one device: its own memory)
        self._check_range("cuMemcpyPeerAsync", int(src), int(nbytes))
        self._check_range("cuMemcpyPeerAsync", int(dst), int(nbytes))
        if not self.captured(stream, "copy", (int(dst), int(src), int(nbytes))):
            ctypes.memmove(int(dst), int(src), int(nbytes))
        return super().cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, nbytes, stream)

    # -- events keep time (everything before them has run when they are recorded) --------------------------
    def cuEventRecord(self, event, stream):
        self._events[int(event)] = time.perf_counter()
        return super().cuEventRecord(event, stream)

    def cuEventElapsedTime(self, start, end):
        a, b = self._events.get(int(start)), self._events.get(int(end))
        if a is None or b is None:
            self.calls.append(("cuEventElapsedTime", (int(start), int(end))))
            return (_R.CUDA_ERROR_INVALID_HANDLE, None)
        return self._call("cuEventElapsedTime", (int(start), int(end)), ((b - a) * 1e3,))

    # -- modules: PTX translated and compiled ------------------------------------------------------------
    def cuModuleLoadData(self, image):
        return self._load("cuModuleLoadData", bytes(image))

    def cuModuleLoadDataEx(self, image, count, options, values):
        return self._load("cuModuleLoadDataEx", bytes(image))

    def _load(self, call: str, image: bytes):
        try:
            ptx = _cpukernel.ptx_of(image) or _cpukernel.shipped_conditions(image)
        except _cpukernel.CompressedPtx:
            self.calls.append((call, (len(image),)))
            raise _fail(call, "CUDA_ERROR_NO_BINARY_FOR_GPU",
                        "the PTX in this fatbin is compressed (nvcc's default): build it with nvcc --no-compress, "
                        "or install the zstandard package, for the CPU device to read it") from None
        if ptx is None:
            self.calls.append((call, (len(image),)))
            raise _fail(call, "CUDA_ERROR_NO_BINARY_FOR_GPU",
                        "this image carries GPU machine code only (a cubin, or a fatbin without PTX): the CPU device "
                        "runs kernels from their PTX. Build it with PTX (nvcc -ptx, or a fatbin with "
                        "-gencode arch=compute_XX,code=compute_XX), or give the .cu source")
        try:
            module = _cpukernel.load(ptx)
        except _cpukernel.PtxError as e:
            self.calls.append((call, (len(image),)))
            raise _fail(call, "CUDA_ERROR_INVALID_PTX", f"the CPU device cannot run this PTX: {e}") from e
        result = self._call(call, (len(image),), lambda: (self._new("module", _real.CUmodule),))
        if not result[0]:
            self._modules[int(result[1])] = module
        return result

    def cuModuleUnload(self, module):
        self._modules.pop(int(module), None)
        return super().cuModuleUnload(module)

    def cuModuleGetFunction(self, module, name):
        mod = self._modules.get(int(module))
        entry = name.decode() if isinstance(name, bytes) else str(name)
        if mod is None or entry not in mod.kernels:
            self.calls.append(("cuModuleGetFunction", (int(module), name)))
            return (_R.CUDA_ERROR_NOT_FOUND, None)
        result = super().cuModuleGetFunction(module, name)
        self._functions[int(result[1])] = _Func(mod, entry)
        return result

    def cuFuncGetParamInfo(self, function, index):
        f = self._functions.get(int(function))
        if f is None or not 0 <= int(index) < len(f.kernel.params):
            self.calls.append(("cuFuncGetParamInfo", (int(function), index)))
            return (_R.CUDA_ERROR_INVALID_VALUE, None, None)
        p = f.kernel.params[int(index)]
        return self._call("cuFuncGetParamInfo", (int(function), index), (p.offset, p.size))

    # -- launches -------------------------------------------------------------------------------------
    def _pack(self, f: _Func, args_ptr: int) -> bytes:
        """The packed parameter buffer from a ``kernelParams`` array (one pointer per parameter)."""
        buf = bytearray(f.size)
        if not f.layout:
            return bytes(buf)
        at = ctypes.string_at
        for (offset, size), addr in zip(f.layout, f.array.from_address(args_ptr), strict=True):
            buf[offset:offset + size] = at(addr, size)
        return bytes(buf)

    def _prepare(self, func, grid, block, shared, args_ptr) -> _cpukernel.Prepared:
        f = self._functions.get(int(func))
        if f is None:
            raise _fail("cuLaunchKernel", "CUDA_ERROR_INVALID_HANDLE", f"no loaded function {int(func):#x}")
        return f.module.prepare(f.name, grid, block, self._pack(f, int(args_ptr or 0)), int(shared),
                                self.allocations, set_cond=self._set_cond)

    def _run(self, launch: _cpukernel.Prepared, call: str) -> None:
        try:
            launch.run()
        except _cpukernel.IllegalAddress as e:
            self.last_fault = str(e)
            raise _fail(call, "CUDA_ERROR_ILLEGAL_ADDRESS", str(e)) from None

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self._call("cuLaunchKernel", (int(f), (gx, gy, gz), (bx, by, bz), shared, int(stream)))
        args = params if isinstance(params, int) else int(params or 0)
        if self._capturing and int(stream) in self._capturing:  # a kernel node of the capture, its arguments packed
            func = self._functions.get(int(f))
            if func is None:
                raise _fail("cuLaunchKernel", "CUDA_ERROR_INVALID_HANDLE", f"no loaded function {int(f):#x}")
            self.captured(stream, "kernel", (int(f), (gx, gy, gz), (bx, by, bz), shared, self._pack(func, args)))
            return (_OK,)
        self._run(self._prepare(f, (gx, gy, gz), (bx, by, bz), shared, args), "cuLaunchKernel")
        return (_OK,)

    # -- graphs: nodes kept in the order added (an order their dependencies allow) ---------------------
    def cuGraphCreate(self, flags):
        result = super().cuGraphCreate(flags)
        self._graphs[int(result[1])] = []
        return result

    def _add(self, graph, result, kind: str, data, deps):
        if not result[0]:
            h = int(result[1])
            self._graphs.setdefault(int(graph), []).append((h, _Node(kind, data, deps or ())))
            self._node_graph[h] = int(graph)
        return result

    def cuGraphDestroy(self, graph):
        for h, _ in self._graphs.pop(int(graph), []):
            self._node_graph.pop(h, None)
        return super().cuGraphDestroy(graph)

    @staticmethod
    def _kernel_data(params) -> tuple:
        raw = ctypes.string_at(params.getPtr(), 56)
        func, gx, gy, gz, bx, by, bz, shared = struct.unpack_from("<Q7I", raw, 0)
        args = struct.unpack_from("<Q", raw, 40)[0]
        return (func, (gx, gy, gz), (bx, by, bz), shared, args)

    def _kernel_node(self, params) -> tuple:
        func, grid, block, shared, args = self._kernel_data(params)
        f = self._functions.get(func)
        if f is None:
            raise _fail("cuGraphAddKernelNode", "CUDA_ERROR_INVALID_VALUE", f"no loaded function {func:#x}")
        return (func, grid, block, shared, self._pack(f, args))

    def cuGraphAddKernelNode(self, graph, deps, n, params):
        data = self._kernel_node(params)
        return self._add(graph, super().cuGraphAddKernelNode(graph, deps, n, params), "kernel", data, deps)

    def cuGraphKernelNodeSetParams(self, node, params):
        self._template(int(node)).data = self._kernel_node(params)
        return super().cuGraphKernelNodeSetParams(node, params)

    def _template(self, h: int) -> _Node:
        for hh, node in self._graphs.get(self._node_graph.get(h, -1), ()):
            if hh == h:
                return node
        raise _fail("cuGraphKernelNodeSetParams", "CUDA_ERROR_INVALID_VALUE", f"no node {h:#x}")

    def cuGraphDestroyNode(self, node):
        h = int(node)
        g = self._node_graph.pop(h, None)
        if g is not None:
            nodes = self._graphs[g]
            nodes[:] = [(hh, nd) for hh, nd in nodes if hh != h]
            for _, nd in nodes:
                nd.deps = tuple(d for d in nd.deps if d != h)
        return super().cuGraphDestroyNode(node)

    def cuGraphAddMemsetNode(self, graph, deps, n, params, ctx):
        data = (int(params.dst), int(params.value), int(params.elementSize), int(params.width),
                max(int(params.height), 1), int(params.pitch))
        return self._add(graph, super().cuGraphAddMemsetNode(graph, deps, n, params, ctx), "memset", data, deps)

    @staticmethod
    def _copy_data(params) -> tuple:
        host = _real.CUmemorytype.CU_MEMORYTYPE_HOST
        src = int(params.srcHost) if params.srcMemoryType == host else int(params.srcDevice)
        dst = int(params.dstHost) if params.dstMemoryType == host else int(params.dstDevice)
        return (dst, src, int(params.WidthInBytes))

    def cuGraphAddMemcpyNode(self, graph, deps, n, params, ctx):
        data = self._copy_data(params)
        return self._add(graph, super().cuGraphAddMemcpyNode(graph, deps, n, params, ctx), "copy", data, deps)

    def cuGraphAddChildGraphNode(self, graph, deps, n, child):
        data = [(h, _Node(nd.kind, nd.data, nd.deps)) for h, nd in self._graphs.get(int(child), [])]
        return self._add(graph, super().cuGraphAddChildGraphNode(graph, deps, n, child), "child", data, deps)

    def cuGraphAddEventRecordNode(self, graph, deps, n, event):
        return self._add(graph, super().cuGraphAddEventRecordNode(graph, deps, n, event), "event", int(event), deps)

    def cuGraphAddEventWaitNode(self, graph, deps, n, event):
        return self._add(graph, super().cuGraphAddEventWaitNode(graph, deps, n, event), "wait", None, deps)

    def cuGraphConditionalHandleCreate(self, graph, ctx, default, flags):
        result = super().cuGraphConditionalHandleCreate(graph, ctx, default, flags)
        if not result[0]:
            self._cond[int(result[1])] = int(default)
        return result

    def cuGraphAddNode(self, graph, deps, data, n, params):
        result = super().cuGraphAddNode(graph, deps, data, n, params)
        if not result[0] and params.type == _real.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            c = params.conditional
            kind = "while" if c.type == _real.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE else "if"
            bodies = self.conditional_bodies(result[1])
            for body in bodies:
                self._graphs[int(body)] = []
            self._add(graph, result, kind, (int(c.handle), [int(b) for b in bodies]), deps)
        elif not result[0]:
            raise _fail("cuGraphAddNode", "CUDA_ERROR_NOT_SUPPORTED",
                        f"the CPU device does not run graph nodes of type {params.type!r} yet")
        return result

    # -- executable graphs -------------------------------------------------------------------------------
    def _snapshot(self, graph: int) -> dict[int, _Node]:
        out: dict[int, _Node] = {}
        for h, nd in self._graphs.get(graph, []):
            copy = _Node(nd.kind, nd.data, nd.deps)
            if nd.kind in ("if", "while"):
                copy.bodies = nd.data[1]
                copy.data = (nd.data[0], [self._snapshot(b) for b in nd.data[1]])
            elif nd.kind == "child":
                copy.data = {hh: _Node(c.kind, c.data, c.deps) for hh, c in nd.data}
            out[h] = copy
        return out

    def cuGraphInstantiate(self, graph, flags):
        result = super().cuGraphInstantiate(graph, flags)
        if not result[0]:
            ex = self._execs[int(result[1])] = self._snapshot(int(graph))
            self._index[int(result[1])] = self._flatten(ex)
        return result

    @classmethod
    def _flatten(cls, nodes: dict[int, _Node], into: dict[int, _Node] | None = None) -> dict[int, _Node]:
        """Every node of an executable graph by handle, those of conditional bodies and child graphs included."""
        into = {} if into is None else into
        for h, nd in nodes.items():
            into[h] = nd
            if nd.kind in ("if", "while"):
                for body in nd.data[1]:
                    cls._flatten(body, into)
            elif nd.kind == "child":
                cls._flatten(nd.data, into)
        return into

    def cuGraphExecDestroy(self, graph_exec):
        self._execs.pop(int(graph_exec), None)
        self._index.pop(int(graph_exec), None)
        return super().cuGraphExecDestroy(graph_exec)

    def cuGraphExecUpdate(self, graph_exec, graph):
        """Same topology: the executable graph takes the new graph's node parameters, keeping its own nodes."""
        ex = self._execs.get(int(graph_exec))
        new = self._snapshot(int(graph))
        if ex is None or len(ex) != len(new) or any(a.kind != b.kind for a, b in zip(ex.values(), new.values(),
                                                                                      strict=True)):
            self.calls.append(("cuGraphExecUpdate", (int(graph_exec), int(graph))))
            return (_R.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, None)
        for a, b in zip(ex.values(), new.values(), strict=True):
            a.data, a.launch, a.raw = b.data, None, b""
        self._index[int(graph_exec)] = self._flatten(ex)
        return super().cuGraphExecUpdate(graph_exec, graph)

    def _exec_node(self, graph_exec: int, node: int) -> _Node:
        index = self._index.get(graph_exec)
        nd = index.get(node) if index is not None else None
        if nd is None:
            raise _fail("cuGraphExec*SetParams", "CUDA_ERROR_INVALID_VALUE",
                        f"node {node:#x} is not in executable graph {graph_exec:#x}")
        return nd

    def kernel_node_updater(self, graph_exec, node, params_ptr: int, params):
        """``cuGraphExecKernelNodeSetParams(graph_exec, node, params)`` bound once (``rxcuda.cuda._fast``'s hot
        path), returning the CUresult as an int: the same struct again is new argument values, repacked in C;
        anything else takes the full call."""
        graph_exec, node = int(graph_exec), int(node)
        view = (ctypes.c_char * 56).from_address(int(params_ptr))
        index, full = self._index, self.cuGraphExecKernelNodeSetParams

        def update() -> int:
            nodes = index.get(graph_exec)
            nd = nodes.get(node) if nodes is not None else None
            if nd is not None and self._repacked(nd, view.raw):
                return 0
            return int(full(graph_exec, node, params)[0])

        return update

    def _repacked(self, nd: _Node, raw: bytes) -> bool:
        """The Parameters tier's case (the same function, launch and argument array as last set; new values):
        the values repacked in C, counted as the call. False where the full call must run."""
        if raw != nd.raw or nd.launch is None or self._failures:
            return False
        nd.launch.repack(nd.data[5])
        self._counts["cuGraphExecKernelNodeSetParams"] += 1
        return True

    def cuGraphExecKernelNodeSetParams(self, graph_exec, node, params):
        nd = self._exec_node(int(graph_exec), int(node))
        raw = ctypes.string_at(params.getPtr(), 56)
        if self._repacked(nd, raw):
            return (_OK,)
        func, grid, block, shared, args = self._kernel_data(params)
        f = self._functions.get(func)
        if f is None:
            raise _fail("cuGraphExecKernelNodeSetParams", "CUDA_ERROR_INVALID_VALUE", f"no loaded function {func:#x}")
        packed = self._pack(f, args)
        old = nd.data
        nd.data = (func, grid, block, shared, packed, args)
        nd.raw = raw
        if nd.launch is not None and old[:4] == nd.data[:4]:
            nd.launch.set_params(packed)  # a value changed: the launch record stays, its parameters are rewritten
        else:
            nd.launch = None
        return super().cuGraphExecKernelNodeSetParams(graph_exec, node, params)

    def cuGraphExecMemsetNodeSetParams(self, graph_exec, node, params, ctx):
        nd = self._exec_node(int(graph_exec), int(node))
        nd.data = (int(params.dst), int(params.value), int(params.elementSize), int(params.width),
                   max(int(params.height), 1), int(params.pitch))
        return super().cuGraphExecMemsetNodeSetParams(graph_exec, node, params, ctx)

    def cuGraphExecMemcpyNodeSetParams(self, graph_exec, node, params, ctx):
        nd = self._exec_node(int(graph_exec), int(node))
        nd.data = self._copy_data(params)
        return super().cuGraphExecMemcpyNodeSetParams(graph_exec, node, params, ctx)

    def cuGraphExecChildGraphNodeSetParams(self, graph_exec, node, child):
        nd = self._exec_node(int(graph_exec), int(node))
        nd.data = {h: _Node(c.kind, c.data, c.deps) for h, c in self._graphs.get(int(child), [])}
        return super().cuGraphExecChildGraphNodeSetParams(graph_exec, node, child)

    def cuGraphNodeSetEnabled(self, graph_exec, node, enabled):
        nd = self._index.get(int(graph_exec), {}).get(int(node))
        if nd is not None:
            nd.enabled = bool(int(enabled))
        return super().cuGraphNodeSetEnabled(graph_exec, node, enabled)

    def cuGraphLaunch(self, graph_exec, stream):
        result = super().cuGraphLaunch(graph_exec, stream)
        if not result[0]:
            ex = self._execs.get(int(graph_exec))
            if ex is None:
                return (_R.CUDA_ERROR_INVALID_HANDLE,)
            self._run_nodes(ex)
        return result

    def _run_nodes(self, nodes: dict[int, _Node]) -> None:
        for nd in nodes.values():
            if not nd.enabled:
                continue
            kind = nd.kind
            if kind == "kernel":
                if nd.launch is None:
                    func, grid, block, shared, packed = nd.data[:5]
                    f = self._functions[func]
                    nd.launch = f.module.prepare(f.name, grid, block, packed, shared, self.allocations,
                                                 set_cond=self._set_cond)
                self._run(nd.launch, "cuGraphLaunch")
            elif kind == "memset":
                dst, value, size, width, height, pitch = nd.data
                for row in range(height):
                    at = dst + row * pitch
                    if size == 1:
                        ctypes.memset(at, value & 0xFF, width)
                    else:
                        _memset32(at, value, width) if size == 4 else _memset16(at, value, width)
            elif kind == "copy":
                dst, src, nbytes = nd.data
                ctypes.memmove(dst, src, nbytes)
            elif kind == "child":
                self._run_nodes(nd.data)
            elif kind == "host":  # a library call's NumPy work (``_host``), in the graph's order
                fn, data = nd.data
                fn(data)
            elif kind == "event":
                self._events[nd.data] = time.perf_counter()
            elif kind == "if":
                handle, bodies = nd.data
                if self._cond.get(handle, 0) and bodies:
                    self._run_nodes(bodies[0])
                elif len(bodies) > 1 and not self._cond.get(handle, 0):
                    self._run_nodes(bodies[1])
            elif kind == "while":
                handle, bodies = nd.data
                while self._cond.get(handle, 0):
                    self._run_nodes(bodies[0])

    _node = _Node
    _fail = staticmethod(_fail)

    def __repr__(self) -> str:
        return f"<CpuDriver {len(self.calls)} calls>"


def _memset32(ptr: int, value: int, count: int) -> None:
    np.frombuffer((ctypes.c_uint32 * count).from_address(ptr), dtype=np.uint32)[:] = value & 0xFFFFFFFF


def _memset16(ptr: int, value: int, count: int) -> None:
    np.frombuffer((ctypes.c_uint16 * count).from_address(ptr), dtype=np.uint16)[:] = value & 0xFFFF


ENV = "RXCUDA_DEVICE"  # "cpu": every engine on the CPU device; "cuda": never fall back to it


def wants_ptx() -> bool:
    """Whether kernels compiled now should be PTX: a CPU device was opened in this process, ``RXCUDA_DEVICE=cpu``,
    or there is no CUDA device (where engines open the CPU device by default)."""
    import os

    from ._driver import probe

    env = os.environ.get(ENV, "").strip().lower()
    if env == "cuda":
        return False
    if CpuDriver.opened or env == "cpu":
        return True
    global _probed
    if _probed is None:
        _probed = probe()[0]
    return not _probed


_probed: bool | None = None
