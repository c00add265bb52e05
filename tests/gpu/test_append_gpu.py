"""Append outputs on a real GPU, against NumPy on fresh random data: two kernels of one block appending to one
buffer, a block that continues another's append buffer, a block launched over the capacity that reads the count
on the device, and the overflow warning with the raw count."""

import numpy as np
import pytest

from rxcuda import BlockBuilder, compile_cuda

# Two appenders: values above +threshold and values below -threshold, into one buffer through one counter.
FILTERS = r"""
extern "C" __global__ void keep_above(const float* values, float* out, RX_COUNTER unsigned int* count,
                                      float threshold, unsigned int capacity, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && values[i] > threshold) {
        unsigned int j = atomicAdd(count, 1u);
        if (j < capacity) out[j] = values[i];
    }
}

extern "C" __global__ void keep_below(const float* values, float* out, RX_COUNTER unsigned int* count,
                                      float threshold, unsigned int capacity, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && values[i] < -threshold) {
        unsigned int j = atomicAdd(count, 1u);
        if (j < capacity) out[j] = values[i];
    }
}
"""

# Launched over the capacity; reads the count on the device and sums the items below it, one partial sum per
# thread block (NumPy adds the partials).
SUM = r"""
extern "C" __global__ void __launch_bounds__(256) sum_items(const float* items, const unsigned int* n,
                                                            float* partial, unsigned int capacity)
{
    __shared__ float s[256];
    unsigned int m = min(*n, capacity);
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < m ? items[i] : 0.0f;
    __syncthreads();
    for (unsigned int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}
"""


def values(rng, n):
    return rng.standard_normal(n).astype(np.float32)


def filters(n, cap, name="split", threshold=1.0):
    """One block, two kernels appending to one port 'kept' (capacity ``cap``) from input 'values' (n)."""
    b = BlockBuilder(name, size=n)
    hi = b.add_kernel(compile_cuda(FILTERS, "keep_above"), name="hi")
    lo = b.add_kernel(compile_cuda(FILTERS, "keep_below"), name="lo")
    b.input("values", [hi["values"], lo["values"]])
    b.output("kept", [hi["out"], lo["out"]], counter=[hi["count"], lo["count"]], count=cap)
    b.scalar("threshold", [hi["threshold"], lo["threshold"]], default=threshold)
    b.scalar("capacity", [hi["capacity"], lo["capacity"]], default=cap)
    b.scalar("n", [hi["n"], lo["n"]], default=n)
    return b.build()


def continuing(n, cap, name="more", threshold=1.0):
    """A block that continues an upstream append buffer through its in/out append port 'kept'."""
    b = BlockBuilder(name, size=n)
    k = b.add_kernel(compile_cuda(FILTERS, "keep_above"))
    b.input("values", k["values"])
    b.append_to("kept", k["out"], counter=k["count"], count=cap)
    b.scalar("threshold", k["threshold"], default=threshold)
    b.scalar("capacity", k["capacity"], default=cap)
    b.scalar("n", k["n"], default=n)
    return b.build()


def summer(cap, name="total"):
    blocks = -(-cap // 256)
    b = BlockBuilder(name, size=cap)
    k = b.add_kernel(compile_cuda(SUM), threads=cap)  # launched over the capacity
    b.input("items", k["items"], count=cap)
    b.input("n", k["n"], count=1)
    b.output("partial", k["partial"], count=blocks)
    b.scalar("capacity", k["capacity"], default=cap)
    return b.build()


def kept(x, t):
    return x[(x > t) | (x < -t)]


def test_two_kernels_append_to_one_buffer_and_the_count_matches_numpy(engine, rng):
    n = 200_003
    split = engine.add(filters(n, cap=n))
    for t in (1.0, 2.0):  # the counter is reset once per frame: the second frame counts afresh
        split.set(threshold=t)
        x = values(rng, n)
        engine.write(split["values"], x)
        engine.tick()
        want = kept(x, t)
        assert engine.count(split["kept"]) == want.size > 0
        np.testing.assert_array_equal(np.sort(engine.read(split["kept"])), np.sort(want))
    engine.tick()  # the same data again: the same count, not twice it
    assert engine.count(split["kept"]) == want.size


def test_a_block_launched_over_the_capacity_sums_the_items_below_the_device_count(engine, rng):
    n = cap = 100_000
    split = engine.add(filters(n, cap))
    total = engine.add(summer(cap))
    engine.connect(split["kept"], total["items"])
    engine.connect(split["kept"].count, total["n"])
    counts = []
    for t in (0.5, 1.5):  # fewer items the second time: stale items above the count must not be summed
        split.set(threshold=t)
        x = values(rng, n)
        engine.write(split["values"], x)
        engine.tick()
        want = kept(x, t)
        counts.append(want.size)
        assert engine.count(split["kept"]) == want.size
        got = engine.read(total["partial"]).astype(np.float64).sum()
        np.testing.assert_allclose(got, want.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
    assert counts[1] < counts[0]


def test_a_continuing_block_appends_to_the_same_buffer_and_counter(engine, rng):
    n, cap = 50_000, 100_000
    first = engine.add(filters(n, cap, name="first", threshold=1.0))
    more = engine.add(continuing(n, cap, threshold=1.5))
    total = engine.add(summer(cap))
    engine.connect(first["kept"], more["kept"])
    engine.connect(more["kept"], total["items"])
    engine.connect(more["kept"].count, total["n"])
    x, y = values(rng, n), values(rng, n)
    engine.write(first["values"], x)
    engine.write(more["values"], y)
    engine.tick()
    want = np.concatenate([kept(x, 1.0), y[y > 1.5]])
    assert engine.count(more["kept"]) == engine.count(first["kept"]) == want.size
    np.testing.assert_array_equal(np.sort(engine.read(more["kept"])), np.sort(want))
    got = engine.read(total["partial"]).astype(np.float64).sum()
    np.testing.assert_allclose(got, want.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
    engine.tick()  # one reset per frame, before the first appender: the same count again
    assert engine.count(more["kept"]) == want.size


@pytest.mark.parametrize("sync", [True, False])
def test_overflow_warns_once_with_the_raw_count_and_the_observed_counts_arrive(engine, rng, sync):
    n, cap = 100_003, 1000
    split = engine.add(filters(n, cap, threshold=0.0))
    x = values(rng, n)
    x[x == 0.0] = 1.0  # every value passes one of the two filters
    engine.write(split["values"], x)
    got: list[int] = []
    engine.observe(split["kept"].count).subscribe(got.append)
    for _ in range(6):
        engine.tick(sync=sync)
    engine.synchronize()
    engine.tick()  # a synced frame delivers every copy still in flight
    assert got == [n] * 7
    warnings = [d for d in engine.diagnostic_log if d.severity == "warning" and "overflowed" in d.message]
    assert len(warnings) == 1
    assert warnings[0].subject == "split.kept"
    assert f"the raw count is {n} but the capacity is {cap}, so {n - cap} items were dropped" in warnings[0].message
    port = split["kept"]
    assert port.overflowed and port.last_count == n
    kept_items = engine.read(port)
    assert kept_items.size == cap and np.isin(kept_items, x).all()
