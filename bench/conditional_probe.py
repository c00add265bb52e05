"""Probe: what CUDA allows in and around conditional graph nodes on this GPU (facts the region design rests on).

Run on a GPU: ``python bench/conditional_probe.py``. Each line says what was tried and what happened; the
numbers are checked against what the kernels must have computed. Uses raw cuda.bindings and the condition
kernels rxcuda ships (rxcuda/cuda/_conditions.fatbin), so it needs no toolkit.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from cuda.bindings import driver as drv
from cuda.core import Device, Program, ProgramOptions

SRC = r"""
extern "C" __global__ void addv(float* x, float v, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += v; }
extern "C" __global__ void mulv(float* x, float v, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= v; }
extern "C" __global__ void tiny(float* x) { if (threadIdx.x == 0) x[0] += 1.0f; }
"""


def check(result, what=""):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


class Args:
    """Kernel arguments as 8-byte slots plus the pointer array the driver reads."""

    def __init__(self, *vals):
        self.words = np.zeros(max(len(vals), 1), dtype=np.uint64)
        for i, v in enumerate(vals):
            if isinstance(v, float):
                self.words[i:i + 1].view(np.float32)[0] = v
            else:
                self.words[i] = int(v)
        self.ptrs = (np.arange(len(vals), dtype=np.uint64) * np.uint64(8)
                     + np.uint64(self.words.ctypes.data)) if vals else np.zeros(1, np.uint64)

    @property
    def ptr(self):
        return self.ptrs.ctypes.data


def kparams(func, args: Args, grid=1, block=256):
    p = drv.CUDA_KERNEL_NODE_PARAMS()
    p.func = func
    p.gridDimX, p.gridDimY, p.gridDimZ = grid, 1, 1
    p.blockDimX, p.blockDimY, p.blockDimZ = block, 1, 1
    p.sharedMemBytes = 0
    p.kernelParams = args.ptr
    return p


def add_kernel(graph, deps, func, args, grid=1, block=256):
    p = kparams(func, args, grid, block)
    return check(drv.cuGraphAddKernelNode(graph, deps, len(deps), p), "cuGraphAddKernelNode"), p


def add_conditional(graph, deps, ctx, kind, size=1, default=0, flags=0):
    h = check(drv.cuGraphConditionalHandleCreate(graph, ctx, default, flags), "cuGraphConditionalHandleCreate")
    params = drv.CUgraphNodeParams()
    params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle = h
    params.conditional.type = kind
    params.conditional.size = size
    params.conditional.ctx = ctx
    node = check(drv.cuGraphAddNode(graph, deps, None, len(deps), params), "cuGraphAddNode(conditional)")
    bodies = [params.conditional.phGraph_out[i] for i in range(size)]
    return node, h, bodies


def main():
    dev = Device()
    dev.set_current()
    ctx = check(drv.cuCtxGetCurrent())
    stream = check(drv.cuStreamCreate(0))
    arch = "".join(map(str, dev.compute_capability))
    prog = Program(SRC, code_type="c++", options=ProgramOptions(arch=f"sm_{arch}"))
    mod = check(drv.cuModuleLoadData(prog.compile("cubin").code), "cuModuleLoadData")
    addv = check(drv.cuModuleGetFunction(mod, b"addv"))
    mulv = check(drv.cuModuleGetFunction(mod, b"mulv"))
    tiny = check(drv.cuModuleGetFunction(mod, b"tiny"))
    fat = (Path(__file__).resolve().parents[1] / "rxcuda" / "cuda" / "_conditions.fatbin").read_bytes()
    cmod = check(drv.cuModuleLoadData(fat), "cuModuleLoadData(conditions)")
    cond_set = check(drv.cuModuleGetFunction(cmod, b"rx_cond_set"))
    loop_init = check(drv.cuModuleGetFunction(cmod, b"rx_loop_init"))
    loop_step = check(drv.cuModuleGetFunction(cmod, b"rx_loop_step"))
    print(f"device {dev.name}, sm_{arch}")
    T = drv.CUgraphConditionalNodeType
    n = 1024
    rng = np.random.default_rng(1)

    def alloc(nbytes):
        return int(check(drv.cuMemAlloc(nbytes), "cuMemAlloc"))

    def upload(ptr, host):
        check(drv.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def download(ptr, host):
        check(drv.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes), "cuMemcpyDtoH")
        return host

    x = alloc(4 * n)
    flag = alloc(8)
    counter = alloc(8)
    keep = []

    def run(graph_exec):
        check(drv.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch")
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")

    # 1. IF region: condition from a device u32; body adds 2.5
    g = check(drv.cuGraphCreate(0))
    a_set = Args(0, flag, 4, 0)
    setter, _ = add_kernel(g, [], cond_set, a_set, 1, 1)
    node, h, (body,) = add_conditional(g, [setter], ctx, T.CU_GRAPH_COND_TYPE_IF)
    a_set.words[0] = int(h)
    check(drv.cuGraphKernelNodeSetParams(setter, kparams(cond_set, a_set, 1, 1)), "set the handle argument")
    a_body = Args(x, 2.5, n)
    bnode, bparams = add_kernel(body, [], addv, a_body, 4, 256)
    ge = check(drv.cuGraphInstantiate(g, 0), "cuGraphInstantiate(IF)")
    for f in (0, 1):
        host = rng.standard_normal(n).astype(np.float32)
        upload(x, host)
        upload(flag, np.array([f, 0], np.uint32))
        run(ge)
        got = download(x, np.empty(n, np.float32))
        want = host + np.float32(2.5) if f else host
        print(f"IF flag={f}: {'ok' if np.array_equal(got, want) else 'WRONG'}")
    # 2. hot update of a kernel node inside the body (exec-node update with the body node's handle)
    a_body.words[1:2].view(np.float32)[0] = 7.0
    err = drv.cuGraphExecKernelNodeSetParams(ge, bnode, kparams(addv, a_body, 4, 256))[0]
    host = rng.standard_normal(n).astype(np.float32)
    upload(x, host)
    upload(flag, np.array([1, 0], np.uint32))
    if err == drv.CUresult.CUDA_SUCCESS:
        run(ge)
        got = download(x, np.empty(n, np.float32))
        print(f"exec-node scalar update inside an IF body: {err.name}, "
              f"{'ok' if np.array_equal(got, host + np.float32(7.0)) else 'WRONG'}")
    else:
        print(f"exec-node scalar update inside an IF body: REFUSED {err}")
    # 3. function swap inside the body
    err = drv.cuGraphExecKernelNodeSetParams(ge, bnode, kparams(mulv, a_body, 4, 256))[0]
    host = rng.standard_normal(n).astype(np.float32)
    upload(x, host)
    if err == drv.CUresult.CUDA_SUCCESS:
        run(ge)
        got = download(x, np.empty(n, np.float32))
        print(f"function swap inside an IF body: {err.name}, "
              f"{'ok' if np.array_equal(got, host * np.float32(7.0)) else 'WRONG'}")
    else:
        print(f"function swap inside an IF body: REFUSED {err}")
    keep += [a_set, a_body, bparams]

    # 4. WHILE region run n times by the loop kernels (For)
    def for_graph(iters, extra=None):
        g = check(drv.cuGraphCreate(0))
        a_init = Args(0, counter, iters, 0, 4, 0)
        init, _ = add_kernel(g, [], loop_init, a_init, 1, 1)
        node, h, (body,) = add_conditional(g, [init], ctx, T.CU_GRAPH_COND_TYPE_WHILE)
        a_init.words[0] = int(h)
        check(drv.cuGraphKernelNodeSetParams(init, kparams(loop_init, a_init, 1, 1)))
        a_b = Args(x, 1.0, n)
        b, _ = add_kernel(body, [], addv, a_b, 4, 256)
        last = [b]
        if extra is not None:
            last = [extra(body, b)]
        a_step = Args(int(h), counter, 0, 4, 0)
        add_kernel(body, last, loop_step, a_step, 1, 1)
        keep.extend([a_init, a_b, a_step])
        return g

    for iters in (0, 1, 5, 100):
        g = for_graph(iters)
        ge = check(drv.cuGraphInstantiate(g, 0), "cuGraphInstantiate(WHILE)")
        host = rng.standard_normal(n).astype(np.float32)
        upload(x, host)
        run(ge)
        got = download(x, np.empty(n, np.float32))
        want = host.copy()
        for _ in range(iters):
            want += np.float32(1.0)
        print(f"FOR {iters}: {'ok' if np.array_equal(got, want) else 'WRONG'}"
              + (f" (note: 0 iterations still ran the body once: {np.array_equal(got, host + 1)})"
                 if iters == 0 and not np.array_equal(got, want) else ""))

    # 5. node kinds inside a body: memcpy, memset, child graph, event record, nested conditional
    def try_body(label, add):
        g = check(drv.cuGraphCreate(0))
        node, h, (body,) = add_conditional(g, [], ctx, T.CU_GRAPH_COND_TYPE_IF, default=1,
                                           flags=drv.CU_GRAPH_COND_ASSIGN_DEFAULT)
        try:
            add(body)
        except RuntimeError as e:
            print(f"{label} inside an IF body: add refused ({e})")
            return
        err, ge = drv.cuGraphInstantiate(g, 0)
        if err != drv.CUresult.CUDA_SUCCESS:
            print(f"{label} inside an IF body: instantiate refused ({err})")
            return
        err = drv.cuGraphLaunch(ge, stream)[0]
        err2 = drv.cuStreamSynchronize(stream)[0]
        print(f"{label} inside an IF body: {'ok' if not err and not err2 else f'launch {err} {err2}'}")

    y = alloc(4 * n)

    def memcpy(body):
        p = drv.CUDA_MEMCPY3D()
        p.srcMemoryType = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.srcDevice = x
        p.dstMemoryType = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.dstDevice = y
        p.WidthInBytes = 4 * n
        p.Height = 1
        p.Depth = 1
        check(drv.cuGraphAddMemcpyNode(body, [], 0, p, ctx), "cuGraphAddMemcpyNode")

    def memset(body):
        p = drv.CUDA_MEMSET_NODE_PARAMS()
        p.dst = y
        p.value = 0
        p.elementSize = 4
        p.width = n
        p.height = 1
        check(drv.cuGraphAddMemsetNode(body, [], 0, p, ctx), "cuGraphAddMemsetNode")

    def child(body):
        c = check(drv.cuGraphCreate(0))
        a = Args(x, 1.0, n)
        keep.append(a)
        add_kernel(c, [], addv, a, 4, 256)
        check(drv.cuGraphAddChildGraphNode(body, [], 0, c), "cuGraphAddChildGraphNode")

    def captured(body):
        s2 = check(drv.cuStreamCreate(0))
        check(drv.cuStreamBeginCapture(s2, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        a = Args(x, 1.0, n)
        keep.append(a)
        check(drv.cuLaunchKernel(addv, 4, 1, 1, 256, 1, 1, 0, s2, a.ptr, 0), "cuLaunchKernel in capture")
        c = check(drv.cuStreamEndCapture(s2), "cuStreamEndCapture")
        check(drv.cuGraphAddChildGraphNode(body, [], 0, c), "cuGraphAddChildGraphNode(captured)")

    def event(body):
        ev = check(drv.cuEventCreate(0))
        check(drv.cuGraphAddEventRecordNode(body, [], 0, ev), "cuGraphAddEventRecordNode")

    def nested(body):
        _, h2, (b2,) = add_conditional(body, [], ctx, T.CU_GRAPH_COND_TYPE_IF, default=1,
                                       flags=drv.CU_GRAPH_COND_ASSIGN_DEFAULT)
        a = Args(x, 1.0, n)
        keep.append(a)
        add_kernel(b2, [], addv, a, 4, 256)

    for label, add in (("memcpy node", memcpy), ("memset node", memset), ("child graph node", child),
                       ("captured child graph", captured), ("event record node", event),
                       ("nested IF", nested)):
        try_body(label, add)

    # 6. IF with two bodies (else)
    g = check(drv.cuGraphCreate(0))
    a_set = Args(0, flag, 4, 0)
    setter, _ = add_kernel(g, [], cond_set, a_set, 1, 1)
    try:
        node, h, (then, other) = add_conditional(g, [setter], ctx, T.CU_GRAPH_COND_TYPE_IF, size=2)
        a_set.words[0] = int(h)
        check(drv.cuGraphKernelNodeSetParams(setter, kparams(cond_set, a_set, 1, 1)))
        a_then, a_else = Args(x, 1.0, n), Args(x, -1.0, n)
        add_kernel(then, [], addv, a_then, 4, 256)
        add_kernel(other, [], addv, a_else, 4, 256)
        ge = check(drv.cuGraphInstantiate(g, 0))
        ok = True
        for f in (0, 1):
            host = rng.standard_normal(n).astype(np.float32)
            upload(x, host)
            upload(flag, np.array([f, 0], np.uint32))
            run(ge)
            got = download(x, np.empty(n, np.float32))
            ok &= np.array_equal(got, host + np.float32(1.0 if f else -1.0))
        print(f"IF/ELSE (size 2): {'ok' if ok else 'WRONG'}")
        keep += [a_set, a_then, a_else]
    except RuntimeError as e:
        print(f"IF/ELSE (size 2): refused ({e})")

    # 7. cost of event-record nodes around the kernels of a 100-kernel chain (GPU time per frame)
    def chain(k, events_every):
        g = check(drv.cuGraphCreate(0))
        a = Args(x)
        keep.append(a)
        prev = []
        evs = []
        for i in range(k):
            if events_every and i % events_every == 0:
                ev = check(drv.cuEventCreate(0))
                evs.append(ev)
                prev = [check(drv.cuGraphAddEventRecordNode(g, prev, len(prev), ev))]
            node, _ = add_kernel(g, prev, tiny, a, 1, 32)
            prev = [node]
        if events_every:
            ev = check(drv.cuEventCreate(0))
            evs.append(ev)
            check(drv.cuGraphAddEventRecordNode(g, prev, len(prev), ev))
        return check(drv.cuGraphInstantiate(g, 0)), evs

    def frame_us(ge, reps=300):
        for _ in range(20):
            run(ge)
        t0 = time.perf_counter()
        for _ in range(reps):
            check(drv.cuGraphLaunch(ge, stream))
        check(drv.cuStreamSynchronize(stream))
        return (time.perf_counter() - t0) / reps * 1e6

    base, _ = chain(100, 0)
    ev1, evs = chain(100, 1)
    ev10, _ = chain(100, 10)
    for _ in range(2):
        b, e1, e10 = frame_us(base), frame_us(ev1), frame_us(ev10)
    print(f"100-kernel chain, back-to-back launches: {b:.1f} us/frame; with an event node before every kernel "
          f"{e1:.1f} us (+{(e1 / b - 1) * 100:.1f} %); every 10th kernel {e10:.1f} us (+{(e10 / b - 1) * 100:.1f} %)")
    t = check(drv.cuEventElapsedTime(evs[0], evs[-1]))
    print(f"  elapsed first..last event: {t * 1000:.1f} us")
    # 8. exec-node event swap cost (cuGraphExecEventRecordNodeSetEvent)
    g = check(drv.cuGraphCreate(0))
    e_a, e_b = check(drv.cuEventCreate(0)), check(drv.cuEventCreate(0))
    en = check(drv.cuGraphAddEventRecordNode(g, [], 0, e_a))
    ge = check(drv.cuGraphInstantiate(g, 0))
    t0 = time.perf_counter()
    for i in range(2000):
        check(drv.cuGraphExecEventRecordNodeSetEvent(ge, en, e_b if i & 1 else e_a))
    print(f"cuGraphExecEventRecordNodeSetEvent: {(time.perf_counter() - t0) / 2000 * 1e6:.2f} us")


if __name__ == "__main__":
    main()
