"""Probe: what timing blocks inside a CUDA graph costs, and how well each way measures (profiling design).

Run on a GPU: ``python bench/profiling_probe.py``. A chain of 100 small kernels, timed per frame (launch +
wait) with nothing added, with an event-record node after every kernel (in the chain, or as a leaf the chain
does not wait for), and with a timestamp kernel (reads %globaltimer into a ring) as such a leaf. Then the
accuracy: spin kernels of 1, 10 and 100 us in a chain, each measured by the leaf events and the leaf stamps,
against the same kernel timed alone with events around a plain launch.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from cuda.bindings import driver as drv
from cuda.core import Device, Program, ProgramOptions

SRC = r"""
extern "C" __global__ void tiny(float* x) { if (threadIdx.x == 0) x[0] += 1.0f; }
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
// a timestamp into slot `index` of the ring; index 0 (the frame's first) also advances the ring
extern "C" __global__ void stamp(unsigned long long* ring, unsigned* cur, unsigned slots, unsigned width,
                                 unsigned index) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    unsigned slot;
    if (index == 0) { slot = (*cur + 1) % slots; *cur = slot; } else { slot = *cur; }
    ring[(unsigned long long)slot * width + index] = t;
}
"""


def check(result, what=""):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


class Args:
    def __init__(self, *vals):
        self.words = np.zeros(max(len(vals), 1), dtype=np.uint64)
        for i, v in enumerate(vals):
            self.words[i] = int(v)
        self.ptrs = np.arange(max(len(vals), 1), dtype=np.uint64) * np.uint64(8) + np.uint64(self.words.ctypes.data)


def kparams(func, args, grid=1, block=32):
    p = drv.CUDA_KERNEL_NODE_PARAMS()
    p.func = func
    p.gridDimX, p.gridDimY, p.gridDimZ = grid, 1, 1
    p.blockDimX, p.blockDimY, p.blockDimZ = block, 1, 1
    p.sharedMemBytes = 0
    p.kernelParams = args.ptrs.ctypes.data
    return p


def main():
    dev = Device()
    dev.set_current()
    arch = "".join(map(str, dev.compute_capability))
    prog = Program(SRC, code_type="c++", options=ProgramOptions(arch=f"sm_{arch}"))
    mod = check(drv.cuModuleLoadData(prog.compile("cubin").code))
    tiny, spin, stamp = (check(drv.cuModuleGetFunction(mod, n)) for n in (b"tiny", b"spin", b"stamp"))
    stream = check(drv.cuStreamCreate(0))
    x = check(drv.cuMemAlloc(64))
    cur = check(drv.cuMemAlloc(8))
    check(drv.cuMemsetD32(cur, 0, 2))
    slots, width = 4, 128
    ring_h = check(drv.cuMemHostAlloc(slots * width * 8, drv.CU_MEMHOSTALLOC_DEVICEMAP))
    ring_d = check(drv.cuMemHostGetDevicePointer(ring_h, 0))
    ring = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint64 * (slots * width)).from_address(int(ring_h)))
    keep = []
    print(f"device {dev.name}")

    def build(kernels, mode):
        """kernels: list of (func, args). mode: none | event_chain | event_leaf | stamp_leaf."""
        g = check(drv.cuGraphCreate(0))
        events = []
        prev = []
        if mode == "stamp_leaf":
            a = Args(ring_d, cur, slots, width, 0)
            keep.append(a)
            prev = [check(drv.cuGraphAddKernelNode(g, [], 0, kparams(stamp, a, 1, 1)))]
        elif mode.startswith("event"):
            ev = check(drv.cuEventCreate(0))
            events.append(ev)
            prev = [check(drv.cuGraphAddEventRecordNode(g, [], 0, ev))]
        for i, (func, args) in enumerate(kernels):
            node = check(drv.cuGraphAddKernelNode(g, prev, len(prev), kparams(func, args)))
            if mode == "event_chain":
                ev = check(drv.cuEventCreate(0))
                events.append(ev)
                node = check(drv.cuGraphAddEventRecordNode(g, [node], 1, ev))
            elif mode == "event_leaf":
                ev = check(drv.cuEventCreate(0))
                events.append(ev)
                check(drv.cuGraphAddEventRecordNode(g, [node], 1, ev))
            elif mode == "stamp_leaf":
                a = Args(ring_d, cur, slots, width, i + 1)
                keep.append(a)
                check(drv.cuGraphAddKernelNode(g, [node], 1, kparams(stamp, a, 1, 1)))
            prev = [node]
        return check(drv.cuGraphInstantiate(g, 0)), events

    def frame_us(ge, reps=200):
        for _ in range(20):
            check(drv.cuGraphLaunch(ge, stream))
        check(drv.cuStreamSynchronize(stream))
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                check(drv.cuGraphLaunch(ge, stream))
                check(drv.cuStreamSynchronize(stream))
            runs.append((time.perf_counter() - t0) / reps * 1e6)
        return statistics.median(runs)

    a = Args(x)
    keep.append(a)
    chain = [(tiny, a)] * 100
    graphs = {m: build(chain, m) for m in ("none", "event_chain", "event_leaf", "stamp_leaf")}
    base = frame_us(graphs["none"][0])
    print("100 tiny kernels in a chain, launch + wait per frame:")
    for m, (ge, _) in graphs.items():
        t = frame_us(ge) if m != "none" else base
        print(f"  {m:12s} {t:8.1f} us  ({(t / base - 1) * 100:+.1f} %)")

    # accuracy: spin kernels of 1, 10 and 100 us, alone and in a chain with leaf events / leaf stamps
    spins = [1_000, 10_000, 100_000]
    alone = {}
    e0, e1 = check(drv.cuEventCreate(0)), check(drv.cuEventCreate(0))
    for ns in spins:
        arg = Args(ns)
        keep.append(arg)
        ts = []
        for _ in range(50):
            check(drv.cuEventRecord(e0, stream))
            check(drv.cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, stream, arg.ptrs.ctypes.data, 0))
            check(drv.cuEventRecord(e1, stream))
            check(drv.cuStreamSynchronize(stream))
            ts.append(check(drv.cuEventElapsedTime(e0, e1)) * 1000)
        alone[ns] = statistics.median(ts)
    kernels = []
    for ns in spins * 3:
        arg = Args(ns)
        keep.append(arg)
        kernels.append((spin, arg))
    ev_graph, events = build(kernels, "event_leaf")
    st_graph, _ = build(kernels, "stamp_leaf")
    ev_t = {ns: [] for ns in spins}
    st_t = {ns: [] for ns in spins}
    for _ in range(30):
        check(drv.cuGraphLaunch(ev_graph, stream))
        check(drv.cuStreamSynchronize(stream))
        for i, (_, arg) in enumerate(kernels):
            ev_t[int(arg.words[0])].append(check(drv.cuEventElapsedTime(events[i], events[i + 1])) * 1000)
    # the stamps: read the slot the last frame used (cur lives on the device)
    cur_h = np.zeros(2, np.uint32)
    for _ in range(30):
        check(drv.cuGraphLaunch(st_graph, stream))
        check(drv.cuStreamSynchronize(stream))
        check(drv.cuMemcpyDtoH(cur_h.ctypes.data, cur, 8))
        row = ring[int(cur_h[0]) * width:int(cur_h[0]) * width + len(kernels) + 1].astype(np.int64)
        for i, (_, arg) in enumerate(kernels):
            st_t[int(arg.words[0])].append((row[i + 1] - row[i]) / 1000)
    print("spin kernels in a chain, per-kernel time: alone (events around a launch) / leaf events / leaf stamps:")
    for ns in spins:
        print(f"  {ns / 1000:6.0f} us: {alone[ns]:8.2f} / {statistics.median(ev_t[ns]):8.2f} / "
              f"{statistics.median(st_t[ns]):8.2f} us")


if __name__ == "__main__":
    main()
