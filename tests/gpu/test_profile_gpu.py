"""Profiling on the GPU: per-block times against each kernel's own clock, frames that are not waited for
never wait, timings that arrive later on engine.timings, and a low-occupancy warning."""

from __future__ import annotations

import time

import numpy as np
import pytest

import rxcuda as rx

SRC = r"""
// spins for `ns` nanoseconds of the GPU's global timer and reports how long it ran; in/out only order blocks
extern "C" __global__ void spin(const unsigned* in, unsigned* out, unsigned long long* took,
                                unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    *out = *in + 1;
    *took = t - t0;
}
// join: out = a + b
extern "C" __global__ void join(const unsigned* a, const unsigned* b, unsigned* out, unsigned long long* took,
                                unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    *out = *a + *b;
    *took = t - t0;
}
// 40 KiB of shared memory for 64 threads: few blocks fit on an SM
extern "C" __global__ void greedy(const float* x, float* out, unsigned n) {
    __shared__ float tile[10240];
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) out[i] = tile[threadIdx.x] * 2.0f + tile[10239 - threadIdx.x] * 0.0f;
}
"""


@pytest.fixture(scope="module")
def code():
    return {e: rx.compile_cuda(SRC, entry=e) for e in ("spin", "join", "greedy")}


def spin_block(code, name, us):
    b = rx.BlockBuilder(name, size=1)
    k = b.add_kernel(code["spin"], threads=1, block=1)
    b.input("in", k["in"], count=1)
    b.output("out", k["out"], count=1)
    b.output("took", k["took"], count=1)
    b.scalar("ns", k["ns"], default=int(us * 1000))
    return b.build()


def test_per_block_times_match_each_kernels_own_clock(engine, code):
    a, b, c = spin_block(code, "a", 10), spin_block(code, "b", 100), spin_block(code, "c", 1)
    j = rx.BlockBuilder("d", size=1)
    k = j.add_kernel(code["join"], threads=1, block=1)
    j.input("a", k["a"], count=1)
    j.input("b", k["b"], count=1)
    j.output("out", k["out"], count=1)
    j.output("took", k["took"], count=1)
    j.scalar("ns", k["ns"], default=10_000)
    d = j.build()
    for blk in (a, b, c, d):
        engine.add(blk)
    engine.write(a["in"], np.array([1], np.uint32))
    engine.connect(a["out"], b["in"])
    engine.connect(a["out"], c["in"])
    engine.connect(b["out"], d["a"])
    engine.connect(c["out"], d["b"])
    engine.profile = "per_block"
    for _ in range(3):
        engine.tick()
    frames = [engine.tick() for _ in range(20)]
    assert int(engine.read(d["out"])[0]) == 6  # a: 1 -> 2; b, c: 3 each; d = b + c: the diamond computed
    for blk in (a, b, c, d):
        own_us = float(engine.read(blk["took"])[0]) / 1e3  # the kernel's own clock, last frame
        measured = float(np.median([f.blocks[blk.name].gpu_us for f in frames]))
        # a stamp sees the kernel's own run plus the launch of its node (1-2.5 us on an H100): within 10 %,
        # or within 3 us for short kernels
        assert measured >= own_us * 0.97, (blk.name, measured, own_us)
        assert measured - own_us <= max(0.1 * own_us, 3.0), (blk.name, measured, own_us)
    # the frame's GPU time holds the critical path a -> b -> d
    assert np.median([f.gpu_us for f in frames]) >= 120


def test_unsynced_frames_never_wait_and_their_timings_arrive_later(engine, code):
    a = spin_block(code, "slow", 2000)
    engine.add(a)
    engine.write(a["in"], np.array([1], np.uint32))
    engine.profile = "per_block"
    engine.tick()
    got = []
    engine.timings.subscribe(got.append)
    t0 = time.perf_counter()
    frames = [engine.tick(sync=False) for _ in range(3)]
    host_ms = (time.perf_counter() - t0) * 1e3
    assert host_ms < 3.0, f"three unsynced 2 ms frames took {host_ms:.2f} ms of host time: something waited"
    assert all(f.blocks is None for f in frames)  # not done yet when the frame returned
    engine.tick()  # waits; collects every finished frame's timings
    done = {t.frame: t for t in got}
    for f in frames:
        assert f.index in done and done[f.index].blocks["slow"].gpu_us >= 1900


def test_low_occupancy_is_reported_per_kernel(engine, code, rng):
    b = rx.Block.from_kernel(code["greedy"], size=4096, name="greedy", block_size=64)
    engine.add(b)
    x = rng.standard_normal(4096).astype(np.float32)
    engine.write(b["x"], x)
    engine.profile = "per_kernel"
    frame = engine.tick()
    np.testing.assert_array_equal(engine.read(b["out"]), x * np.float32(2.0))
    occ = engine._rt.occupancy[(b.id, "greedy")]
    assert occ < 0.25
    assert any("theoretical occupancy" in d.message and d.subject == "greedy/greedy" for d in engine.diagnostic_log)
    assert b.state == "warning" and frame.kernels["greedy/greedy"].gpu_us > 0
    assert "occupancy of greedy" in str(b)


def test_deep_sync_names_every_kernel_and_keeps_results(engine, code):
    a, b = spin_block(code, "a", 10), spin_block(code, "b", 10)
    engine.add(a)
    engine.add(b)
    engine.write(a["in"], np.array([5], np.uint32))
    engine.connect(a["out"], b["in"])
    engine.profile = "deep_sync"
    frame = engine.tick()
    assert int(engine.read(b["out"])[0]) == 7
    assert set(frame.kernels) == {"a/spin", "b/spin"}
    assert all(t.gpu_us >= 9 for t in frame.kernels.values())


def test_a_profiled_batch_times_its_frames(engine, code):
    a = spin_block(code, "a", 20)
    engine.add(a)
    engine.write(a["in"], np.array([1], np.uint32))
    engine.profile = "per_block"
    engine.tick()
    frame = engine.run_batch(10)
    assert frame.frames == 10 and frame.gpu_us >= 10 * 20  # the batch's GPU time, all ten frames
    assert 19 <= frame.blocks["a"].gpu_us <= 25  # the last frame's block, from the stamp ring
