"""A null driver: records every driver call the layer makes and succeeds, so the engine runs without a GPU.

It computes nothing: device memory is never written, reads from it give zeros, and kernels never run.
Tests use it to check the engine's *decisions* (which tier ran, which driver operations it chose, that a
failed load keeps the last good graph) by reading :attr:`NullDriver.calls`, never numbers a kernel would
have produced.

>>> from rxcuda.cuda import NullDriver
>>> api = NullDriver()
>>> err, stream = api.cuStreamCreate(0)
>>> int(err), api.count("cuStreamCreate")
(0, 1)
>>> api.fail("cuModuleLoadData", "CUDA_ERROR_INVALID_PTX")
>>> api.cuModuleLoadData(b"")[0].name
'CUDA_ERROR_INVALID_PTX'
"""

from __future__ import annotations

import ctypes
import itertools
from collections import Counter
from collections.abc import Callable

from cuda.bindings import driver as _real

_OK = _real.CUresult.CUDA_SUCCESS


class NullDriver:
    """Stands in for ``cuda.bindings.driver``: ``cu*`` functions succeed and are recorded in ``calls``.

    Struct and enum types (``CUDA_KERNEL_NODE_PARAMS``, ``CUresult``, ...) are cuda.bindings' own: they need
    no driver, so the layer builds exactly the structs it would hand a real one.

    ``fail(name, error, times=1)`` makes the next ``times`` calls of ``name`` return ``error`` (a CUresult
    or its name): that is how tests reach the error paths (a kernel the driver cannot load, a refused
    exec update, a context lost to an illegal address).
    """

    # its kernels never run: the GPU times an engine on it reports and the values read from its ports are zeros,
    # not measurements (what shows numbers says so: the live view; a real driver has no such attribute)
    measures = False
    unmeasured = "the null driver runs nothing on a GPU: its GPU times and port values are zeros, not measurements"

    def __init__(self, *, name: str = "Null Device", compute_capability: tuple[int, int] = (9, 0),
                 devices: int = 1, total_memory: int = 80 << 30):
        self.calls: list[tuple[str, tuple]] = []
        self.name = name
        self.compute_capability = compute_capability
        self.devices = devices
        self.total_memory = total_memory
        self._failures: dict[str, list] = {}
        self._ids = itertools.count(0x1000, 0x100)
        self._counts: Counter[str] = Counter()
        self._host: dict[int, object] = {}
        self._next_ptr = 0x7F00_0000_0000  # the device address space the null driver hands out
        self._bodies: dict[int, list] = {}  # conditional node -> its body graphs
        self.live: dict[str, set[int]] = {}  # handle kind -> live handles (what a test can check for leaks)
        # OpenGL objects a test pretends exist: name -> bytes (a buffer) or (height, width, bytes per texel)
        self.gl_objects: dict[int, int | tuple[int, int, int]] = {}
        self._gl: dict[int, tuple[int, bool]] = {}  # graphics resource -> (GL name, mapped)
        self.peer_access = True  # what cuDeviceCanAccessPeer answers for two distinct devices
        self.lost_streams: set[int] = set()  # streams whose cuStreamQuery says the context is lost
        self.current = 0  # the context made current last
        self._contexts: dict[int, tuple] = {}  # device -> (primary context, references)
        self._peers: set[tuple[int, int]] = set()  # (context, peer context) with peer access enabled
        # graph -> its kernel nodes: node -> (the nodes it depends on, the params struct it was added with, both
        # the layer's own objects, not copies); what a test compares between a grown graph and a fresh one
        self.kernel_nodes: dict[int, dict[int, tuple[object, object]]] = {}

    # -- recording, failures ---------------------------------------------------------------------------
    def fail(self, name: str, error="CUDA_ERROR_UNKNOWN", times: int = 1) -> None:
        """Make the next ``times`` calls of ``name`` return ``error``."""
        code = error if isinstance(error, _real.CUresult) else getattr(_real.CUresult, error)
        self._failures.setdefault(name, []).extend([code] * times)

    def count(self, name: str) -> int:
        """How many times ``name`` was called (successfully or not)."""
        return self._counts[name]

    def names(self) -> list[str]:
        """The names of the calls made, in order."""
        return [n for n, _ in self.calls]

    def since(self, mark: int) -> list[str]:
        """Names of the calls made after ``mark`` (a previous ``len(api.calls)``)."""
        return [n for n, _ in self.calls[mark:]]

    record = True  # whether ``calls`` keeps every call (the CPU device, which runs for hours, keeps counts only)

    def _call(self, name: str, args: tuple, result: Callable[[], tuple] | tuple = ()) -> tuple:
        if self.record:
            self.calls.append((name, args))
        self._counts[name] += 1
        pending = self._failures.get(name)
        if pending:
            code = pending.pop(0)
            return (code,) + (None,) * (len(result) if isinstance(result, tuple) else 1)
        values = result() if callable(result) else result
        return (_OK,) + values

    def _new(self, kind: str, cls):
        h = next(self._ids)
        if kind not in ("function", "node"):  # those die with their module or graph
            self.live.setdefault(kind, set()).add(h)
        return cls(h)

    def leaks(self) -> dict[str, int]:
        """Handles created and never destroyed, by kind (contexts, streams, events, memory, modules,
        graphs, executable graphs)."""
        return {k: len(v) for k, v in self.live.items() if v}

    def _drop(self, kind: str, handle) -> None:
        self.live.get(kind, set()).discard(int(handle))

    def __getattr__(self, name: str):
        if name.startswith("cu"):
            raise AttributeError(f"the null driver does not implement {name}; add it to rxcuda/cuda/_null.py")
        return getattr(_real, name)

    # -- init, device, context -------------------------------------------------------------------------
    def cuInit(self, flags):
        return self._call("cuInit", (flags,))

    def cuDriverGetVersion(self):
        return self._call("cuDriverGetVersion", (), (13000,))

    def cuDeviceGetCount(self):
        return self._call("cuDeviceGetCount", (), (self.devices,))

    def cuDeviceGet(self, ordinal):
        return self._call("cuDeviceGet", (ordinal,), lambda: (_real.CUdevice(ordinal),))

    def cuDeviceGetName(self, length, dev):
        return self._call("cuDeviceGetName", (dev,), (self.name.encode() + b"\0",))

    def cuDeviceGetAttribute(self, attr, dev):
        a = _real.CUdevice_attribute
        value = {a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: self.compute_capability[0],
                 a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: self.compute_capability[1],
                 a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 132,
                 a.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: 2048}.get(attr, 0)
        return self._call("cuDeviceGetAttribute", (attr, dev), (value,))

    def cuDeviceTotalMem(self, dev):
        return self._call("cuDeviceTotalMem", (dev,), (self.total_memory,))

    def cuDevicePrimaryCtxRetain(self, dev):
        """One primary context per device, as the driver keeps it: retained again, the same one."""
        def retain():
            ctx, refs = self._contexts.get(int(dev), (None, 0))
            if ctx is None:
                ctx = self._new("context", _real.CUcontext)
            self._contexts[int(dev)] = (ctx, refs + 1)
            return (ctx,)
        return self._call("cuDevicePrimaryCtxRetain", (dev,), retain)

    def cuDevicePrimaryCtxRelease(self, dev):
        ctx, refs = self._contexts.get(int(dev), (None, 0))
        if ctx is not None:
            if refs <= 1:
                del self._contexts[int(dev)]
                self._drop("context", ctx)
            else:
                self._contexts[int(dev)] = (ctx, refs - 1)
        return self._call("cuDevicePrimaryCtxRelease", (dev,))

    def cuCtxSetCurrent(self, ctx):
        self.current = int(ctx)
        return self._call("cuCtxSetCurrent", (ctx,))

    # -- several devices -------------------------------------------------------------------------------
    def context_of(self, device: int) -> int:
        """The primary context of ``device`` (a test's way to tell devices apart in ``calls``)."""
        return int(self._contexts[device][0])

    def cuDeviceCanAccessPeer(self, dev, peer):
        """``peer_access`` answers for every pair of distinct devices; a device never is its own peer."""
        return self._call("cuDeviceCanAccessPeer", (int(dev), int(peer)),
                          (int(self.peer_access and int(dev) != int(peer)),))

    def cuCtxEnablePeerAccess(self, peer_ctx, flags):
        pair = (self.current, int(peer_ctx))
        if pair in self._peers:
            self.calls.append(("cuCtxEnablePeerAccess", pair))
            self._counts["cuCtxEnablePeerAccess"] += 1
            return (_real.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,)
        self._peers.add(pair)
        return self._call("cuCtxEnablePeerAccess", pair)

    def cuMemcpyPeerAsync(self, dst, dst_ctx, src, src_ctx, nbytes, stream):
        return self._call("cuMemcpyPeerAsync", (int(dst), int(dst_ctx), int(src), int(src_ctx), nbytes, int(stream)))

    def cuGraphAddEventRecordNode(self, graph, deps, n, event):
        return self._call("cuGraphAddEventRecordNode", (int(graph), n, int(event)),
                          lambda: (self._new("node", _real.CUgraphNode),))

    def cuGraphAddEventWaitNode(self, graph, deps, n, event):
        return self._call("cuGraphAddEventWaitNode", (int(graph), n, int(event)),
                          lambda: (self._new("node", _real.CUgraphNode),))

    # -- streams and events ----------------------------------------------------------------------------
    def cuStreamCreate(self, flags):
        return self._call("cuStreamCreate", (flags,), lambda: (self._new("stream", _real.CUstream),))

    def cuStreamDestroy(self, stream):
        self._drop("stream", stream)
        return self._call("cuStreamDestroy", (int(stream),))

    def cuStreamSynchronize(self, stream):
        return self._call("cuStreamSynchronize", (int(stream),))

    def cuStreamQuery(self, stream):
        if int(stream) in self.lost_streams:  # a context lost to a kernel's fault (sticky)
            self.calls.append(("cuStreamQuery", (int(stream),)))
            return (_real.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
        return self._call("cuStreamQuery", (int(stream),))

    def cuStreamWaitEvent(self, stream, event, flags):
        return self._call("cuStreamWaitEvent", (int(stream), int(event), flags))

    def cuEventCreate(self, flags):
        return self._call("cuEventCreate", (flags,), lambda: (self._new("event", _real.CUevent),))

    def cuEventDestroy(self, event):
        self._drop("event", event)
        return self._call("cuEventDestroy", (int(event),))

    def cuEventRecord(self, event, stream):
        return self._call("cuEventRecord", (int(event), int(stream)))

    def cuEventQuery(self, event):
        return self._call("cuEventQuery", (int(event),))

    def cuEventSynchronize(self, event):
        return self._call("cuEventSynchronize", (int(event),))

    def cuEventElapsedTime(self, start, end):
        return self._call("cuEventElapsedTime", (int(start), int(end)), (0.0,))

    # -- memory ----------------------------------------------------------------------------------------
    def cuMemAlloc(self, nbytes):
        # addresses as a driver may hand them out: aligned, never overlapping, and possibly adjacent (so code
        # that treats two allocations as one range is caught)
        def alloc():
            ptr = self._next_ptr
            self._next_ptr += -(-max(int(nbytes), 1) // 4096) * 4096
            self.live.setdefault("memory", set()).add(ptr)
            return (_real.CUdeviceptr(ptr),)

        return self._call("cuMemAlloc", (nbytes,), alloc)

    def cuMemFree(self, ptr):
        self._drop("memory", ptr)
        return self._call("cuMemFree", (int(ptr),))

    def cuMemHostAlloc(self, nbytes, flags):
        # host memory is real (the layer reads and writes it through NumPy views), just not page-locked
        def alloc():
            buf = ctypes.create_string_buffer(max(int(nbytes), 1))
            ptr = ctypes.addressof(buf)
            self._host[ptr] = buf
            self.live.setdefault("host", set()).add(ptr)
            return (ptr,)

        return self._call("cuMemHostAlloc", (nbytes, flags), alloc)

    def cuMemHostGetDevicePointer(self, ptr, flags):
        """Host-mapped memory: the device sees it at the host address (unified addressing)."""
        return self._call("cuMemHostGetDevicePointer", (int(ptr), flags), (int(ptr),))

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, block_size, shared_mem):
        """As many resident blocks as 2048 threads per SM allow (a kernel with no register or shared-memory
        limit)."""
        return self._call("cuOccupancyMaxActiveBlocksPerMultiprocessor", (int(function), block_size, shared_mem),
                          (max(1, 2048 // max(int(block_size), 1)),))

    def cuMemFreeHost(self, ptr):
        self._drop("host", ptr)
        self._host.pop(int(ptr), None)
        return self._call("cuMemFreeHost", (int(ptr),))

    def cuMemHostRegister(self, ptr, nbytes, flags):
        """Host memory pinned in place (nothing to do here: the bytes stay where they are)."""
        def pin():
            self.live.setdefault("registered", set()).add(int(ptr))
            return ()

        return self._call("cuMemHostRegister", (int(ptr), int(nbytes), flags), pin)

    def cuMemHostUnregister(self, ptr):
        self._drop("registered", ptr)
        return self._call("cuMemHostUnregister", (int(ptr),))

    def cuMemsetD8(self, ptr, value, count):
        return self._call("cuMemsetD8", (int(ptr), value, count))

    def cuMemsetD8Async(self, ptr, value, count, stream):
        return self._call("cuMemsetD8Async", (int(ptr), value, count, int(stream)))

    def cuMemsetD32Async(self, ptr, value, count, stream):
        return self._call("cuMemsetD32Async", (int(ptr), value, count, int(stream)))

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        return self._call("cuMemcpyHtoDAsync", (int(dst), nbytes, int(stream)))

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        # device memory holds nothing: a read lands zeros (deterministic, never garbage) in the host buffer
        ctypes.memset(int(dst), 0, int(nbytes))
        return self._call("cuMemcpyDtoHAsync", (int(src), nbytes, int(stream)))

    def cuMemcpyDtoH(self, dst, src, nbytes):
        ctypes.memset(int(dst), 0, int(nbytes))  # device memory holds nothing: zeros
        return self._call("cuMemcpyDtoH", (int(src), nbytes))

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
        return self._call("cuMemcpyDtoDAsync", (int(dst), int(src), nbytes, int(stream)))

    # -- IPC (rxcuda.cuda._ipc): a handle carries the exported pointer and its driver (so handles of two drivers
    # differ, as two processes' do); opening maps it at a new address
    def cuIpcGetMemHandle(self, ptr):
        def get():
            h = _real.CUipcMemHandle()
            ctypes.memmove(h.getPtr(), int(ptr).to_bytes(8, "little") + id(self).to_bytes(8, "little") + bytes(48), 64)
            return (h,)

        return self._call("cuIpcGetMemHandle", (int(ptr),), get)

    def cuIpcOpenMemHandle(self, handle, flags):
        def open_():
            ptr = self._next_ptr
            self._next_ptr += 1 << 20
            self.live.setdefault("ipc", set()).add(ptr)
            return (_real.CUdeviceptr(ptr),)

        return self._call("cuIpcOpenMemHandle", (ctypes.string_at(handle.getPtr(), 8), flags), open_)

    def cuIpcCloseMemHandle(self, ptr):
        self._drop("ipc", ptr)
        return self._call("cuIpcCloseMemHandle", (int(ptr),))

    def cuIpcGetEventHandle(self, event):
        def get():
            h = _real.CUipcEventHandle()
            ctypes.memmove(h.getPtr(), int(event).to_bytes(8, "little") + id(self).to_bytes(8, "little") + bytes(48),
                           64)
            return (h,)

        return self._call("cuIpcGetEventHandle", (int(event),), get)

    def cuIpcOpenEventHandle(self, handle):
        return self._call("cuIpcOpenEventHandle", (ctypes.string_at(handle.getPtr(), 8),),
                          lambda: (self._new("event", _real.CUevent),))

    # -- modules ---------------------------------------------------------------------------------------
    def cuModuleLoadData(self, image):
        return self._call("cuModuleLoadData", (len(image),), lambda: (self._new("module", _real.CUmodule),))

    def cuModuleLoadDataEx(self, image, count, options, values):
        return self._call("cuModuleLoadDataEx", (len(image), tuple(int(o) for o in options), tuple(values)),
                          lambda: (self._new("module", _real.CUmodule),))

    def cuModuleUnload(self, module):
        self._drop("module", module)
        return self._call("cuModuleUnload", (int(module),))

    def cuModuleGetFunction(self, module, name):
        return self._call("cuModuleGetFunction", (int(module), name), lambda: (self._new("function",
                                                                                          _real.CUfunction),))

    def cuFuncGetParamInfo(self, function, index):
        # the null driver cannot read a kernel's real layout: it answers as a driver without this call does,
        # and the module cache then trusts the description (see _modules._check_params)
        self.calls.append(("cuFuncGetParamInfo", (int(function), index)))
        self._counts["cuFuncGetParamInfo"] += 1
        return (_real.CUresult.CUDA_ERROR_NOT_SUPPORTED, None, None)

    def cuFuncSetAttribute(self, function, attr, value):
        return self._call("cuFuncSetAttribute", (int(function), attr, value))

    # -- graphs ----------------------------------------------------------------------------------------
    def cuGraphCreate(self, flags):
        return self._call("cuGraphCreate", (flags,), lambda: (self._new("graph", _real.CUgraph),))

    def cuGraphDestroy(self, graph):
        self._drop("graph", graph)
        self.kernel_nodes.pop(int(graph), None)
        return self._call("cuGraphDestroy", (int(graph),))

    def cuGraphAddKernelNode(self, graph, deps, n, params):
        g = int(graph)
        result = self._call("cuGraphAddKernelNode", (g, n), lambda: (self._new("node", _real.CUgraphNode),))
        if not result[0]:  # (the handles as given: kernel_edges turns them into ints when a test asks)
            nodes = self.kernel_nodes.get(g)
            if nodes is None:
                nodes = self.kernel_nodes[g] = {}
            nodes[int(result[1])] = (deps, params)
        return result

    def kernel_edges(self, graph) -> dict[int, tuple[tuple[int, ...], object]]:
        """The kernel nodes of ``graph`` as this driver holds them: node -> (the nodes it depends on, the
        params struct it was added or last set with)."""
        return {h: (tuple(int(d) for d in deps), params)
                for h, (deps, params) in self.kernel_nodes.get(int(graph), {}).items()}

    def cuGraphKernelNodeSetParams(self, node, params):
        h = int(node)
        for nodes in self.kernel_nodes.values():
            if h in nodes:
                nodes[h] = (nodes[h][0], params)
                break
        return self._call("cuGraphKernelNodeSetParams", (h,))

    def cuGraphDestroyNode(self, node):
        h = int(node)
        for nodes in self.kernel_nodes.values():
            if nodes.pop(h, None) is not None:
                for other, (deps, params) in list(nodes.items()):  # its edges go with it
                    if any(int(d) == h for d in deps):
                        nodes[other] = ([d for d in deps if int(d) != h], params)
                break
        return self._call("cuGraphDestroyNode", (h,))

    def cuGraphAddMemsetNode(self, graph, deps, n, params, ctx):
        return self._call("cuGraphAddMemsetNode", (int(graph), n), lambda: (self._new("node", _real.CUgraphNode),))

    def cuGraphAddMemcpyNode(self, graph, deps, n, params, ctx):
        return self._call("cuGraphAddMemcpyNode", (int(graph), n, int(params.srcDevice), int(params.dstDevice),
                                                   int(params.WidthInBytes)),
                          lambda: (self._new("node", _real.CUgraphNode),))

    def cuGraphAddChildGraphNode(self, graph, deps, n, child):
        return self._call("cuGraphAddChildGraphNode", (int(graph), n),
                          lambda: (self._new("node", _real.CUgraphNode),))

    def cuGraphConditionalHandleCreate(self, graph, ctx, default, flags):
        return self._call("cuGraphConditionalHandleCreate", (int(graph), default, flags),
                          lambda: (next(self._ids),))

    def cuGraphAddNode(self, graph, deps, data, n, params):
        """A node of any type; a conditional node gets body graphs (owned by it: they die with its graph),
        which :meth:`conditional_bodies` hands out as the real driver's out-parameter does."""
        def add():
            node = self._new("node", _real.CUgraphNode)
            if params.type == _real.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL:
                self._bodies[int(node)] = [_real.CUgraph(next(self._ids)) for _ in range(params.conditional.size)]
            return (node,)
        return self._call("cuGraphAddNode", (int(graph), n, int(params.type)), add)

    def conditional_bodies(self, node) -> list:
        """The body graphs of a conditional node this driver added (the real driver fills ``phGraph_out``)."""
        return self._bodies[int(node)]

    def cuGraphGetNodes(self, graph, count):
        return self._call("cuGraphGetNodes", (int(graph), count), ([], 0))

    def cuGraphDebugDotPrint(self, graph, path, flags):
        """Writes a small placeholder DOT file that says it is the null driver's (it keeps no graphs to
        describe); an unwritable path fails as the driver's does, with CUDA_ERROR_OPERATING_SYSTEM."""
        import os

        def write():
            nodes = sum(1 for name, args in self.calls
                        if name.startswith("cuGraphAdd") and args and args[0] == int(graph))
            with open(path, "w", encoding="utf-8") as f:
                f.write(f'digraph "null driver" {{\n  label="rxcuda NullDriver: no CUDA driver ran, so there is no '
                        f'driver picture of graph {int(graph):#x} ({nodes} nodes added)";\n  null_driver '
                        f'[shape=note, label="NullDriver placeholder"];\n}}\n')
            return ()

        try:
            return self._call("cuGraphDebugDotPrint", (int(graph), os.fsdecode(path), int(flags)), write)
        except OSError:
            return (_real.CUresult.CUDA_ERROR_OPERATING_SYSTEM,)

    def cuGraphInstantiate(self, graph, flags):
        return self._call("cuGraphInstantiate", (int(graph), flags), lambda: (self._new("exec", _real.CUgraphExec),))

    def cuGraphExecDestroy(self, graph_exec):
        self._drop("exec", graph_exec)
        return self._call("cuGraphExecDestroy", (int(graph_exec),))

    def cuGraphExecUpdate(self, graph_exec, graph):
        return self._call("cuGraphExecUpdate", (int(graph_exec), int(graph)), (None,))

    def cuGraphUpload(self, graph_exec, stream):
        return self._call("cuGraphUpload", (int(graph_exec), int(stream)))

    def cuGraphLaunch(self, graph_exec, stream):
        return self._call("cuGraphLaunch", (int(graph_exec), int(stream)))

    def cuGraphNodeSetEnabled(self, graph_exec, node, enabled):
        return self._call("cuGraphNodeSetEnabled", (int(graph_exec), int(node), int(enabled)))

    def cuGraphExecKernelNodeSetParams(self, graph_exec, node, params):
        return self._call("cuGraphExecKernelNodeSetParams", (int(graph_exec), int(node)))

    def cuGraphExecMemsetNodeSetParams(self, graph_exec, node, params, ctx):
        return self._call("cuGraphExecMemsetNodeSetParams", (int(graph_exec), int(node)))

    def cuGraphExecMemcpyNodeSetParams(self, graph_exec, node, params, ctx):
        return self._call("cuGraphExecMemcpyNodeSetParams", (int(graph_exec), int(node), int(params.srcDevice),
                                                             int(params.dstDevice), int(params.WidthInBytes)))

    def cuGraphExecChildGraphNodeSetParams(self, graph_exec, node, child):
        return self._call("cuGraphExecChildGraphNodeSetParams", (int(graph_exec), int(node)))

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return self._call("cuLaunchKernel", (int(f), (gx, gy, gz), (bx, by, bz), shared, int(stream)))

    def cuStreamBeginCapture(self, stream, mode):
        return self._call("cuStreamBeginCapture", (int(stream), mode))

    def cuStreamEndCapture(self, stream):
        return self._call("cuStreamEndCapture", (int(stream),), lambda: (self._new("graph", _real.CUgraph),))

    # -- OpenGL interop (the GL objects are what a test put in gl_objects) --------------------------------
    def _gl_register(self, name: str, glo: int, kind: type, args: tuple):
        if not isinstance(self.gl_objects.get(glo), kind):  # no such GL object (of that kind): as a driver says
            self.fail(name, "CUDA_ERROR_INVALID_VALUE")

        def register():
            res = self._new("graphics", _real.CUgraphicsResource)
            self._gl[int(res)] = (glo, False)
            return (res,)

        return self._call(name, args, register)

    def cuGraphicsGLRegisterBuffer(self, glo, flags):
        return self._gl_register("cuGraphicsGLRegisterBuffer", int(glo), int, (int(glo), int(flags)))

    def cuGraphicsGLRegisterImage(self, glo, target, flags):
        return self._gl_register("cuGraphicsGLRegisterImage", int(glo), tuple, (int(glo), int(target), int(flags)))

    def _gl_map(self, name: str, resource, stream, mapped: bool):
        h = int(resource)
        glo, was = self._gl.get(h, (None, None))
        result = self._call(name, (h, int(stream)))
        if result[0] == _OK and (glo is None or was == mapped):
            return (_real.CUresult.CUDA_ERROR_NOT_MAPPED if not mapped else _real.CUresult.CUDA_ERROR_ALREADY_MAPPED,)
        if result[0] == _OK:
            self._gl[h] = (glo, mapped)
        return result

    def cuGraphicsMapResources(self, count, resource, stream):
        return self._gl_map("cuGraphicsMapResources", resource, stream, True)

    def cuGraphicsUnmapResources(self, count, resource, stream):
        return self._gl_map("cuGraphicsUnmapResources", resource, stream, False)

    def cuGraphicsResourceGetMappedPointer(self, resource):
        glo, mapped = self._gl.get(int(resource), (None, False))
        if not mapped:
            return (_real.CUresult.CUDA_ERROR_NOT_MAPPED, None, None)
        # a GL buffer's device address: stable while the buffer lives, as on a real driver
        return self._call("cuGraphicsResourceGetMappedPointer", (int(resource),),
                          (_real.CUdeviceptr(0x7E00_0000_0000 + glo * 0x100_0000), self.gl_objects[glo]))

    def cuGraphicsSubResourceGetMappedArray(self, resource, index, level):
        glo, mapped = self._gl.get(int(resource), (None, False))
        if not mapped:
            return (_real.CUresult.CUDA_ERROR_NOT_MAPPED, None)
        return self._call("cuGraphicsSubResourceGetMappedArray", (int(resource), index, level),
                          (_real.CUarray(0x7D00_0000 + glo),))

    def cuArrayGetDescriptor(self, array):
        h, w, texel = self.gl_objects[int(array) - 0x7D00_0000]
        desc = _real.CUDA_ARRAY_DESCRIPTOR()
        desc.Height, desc.Width, desc.NumChannels = h, w, texel // 4 if texel % 4 == 0 else texel
        desc.Format = _real.CUarray_format.CU_AD_FORMAT_FLOAT if texel % 4 == 0 else \
            _real.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
        return self._call("cuArrayGetDescriptor", (int(array),), (desc,))

    def cuMemcpy2DAsync(self, params, stream):
        return self._call("cuMemcpy2DAsync", (int(params.srcDevice), int(params.dstArray), int(params.WidthInBytes),
                                              int(params.Height), int(stream)))

    def cuGraphicsUnregisterResource(self, resource):
        self._drop("graphics", resource)
        self._gl.pop(int(resource), None)
        return self._call("cuGraphicsUnregisterResource", (int(resource),))

    def __repr__(self) -> str:
        return f"<NullDriver {len(self.calls)} calls>"
