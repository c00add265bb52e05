"""No parameter, binding or launch can make a kernel index past its buffers, on a real GPU: each refused case
(set, Parameter.value, set_launch, bind, an append capacity, a negative count, a value that reaches the engine
past the running buffers) is refused, and the frames after it are exact against NumPy on fresh random inputs,
so the CUDA context is intact (a kernel past its buffer would have lost it: DeviceLostError)."""

import numpy as np
import pytest
from reactivex.subject import Subject

from rxcuda import Block, BoundsError

N = 1024

# No count parameter: nothing tells rxcuda where this kernel stops, so its launch is what keeps it inside.
UNGUARDED = r"""
extern "C" __global__ void twice(const float* x, float* out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = 2.0f * x[i];
}
"""


def rand(rng, n):
    return rng.standard_normal(n).astype(np.float32)


def frame_is_exact(engine, mul, rng, scale):
    x = rand(rng, N)
    engine.write(mul["x"], x)
    frame = engine.tick()
    assert frame.state == "ok" and frame.launched
    np.testing.assert_allclose(engine.read(mul["out"]), scale * x, rtol=1e-6)


def test_refused_counts_change_nothing_and_the_frames_stay_exact(engine, rng, kernels):
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=2.0))
    frame_is_exact(engine, mul, rng, 2.0)
    for bad in (50_000_000, N + 1, -5):
        with pytest.raises(BoundsError, match=r"scalar_mul\.n = "):
            mul.set(n=bad)
        with pytest.raises(BoundsError):
            mul.params["n"].value = bad
    with pytest.raises(BoundsError):
        mul.set(scale=3.0, n=50_000_000)  # checked together: the scale is not stored either
    assert mul.values() == {"scale": 2.0, "n": N}
    frame_is_exact(engine, mul, rng, 2.0)
    frame_is_exact(engine, mul, rng, 2.0)

    mul.set(n=N // 2)  # the README's mul.set(n=n // 2): the first half only
    x = rand(rng, N)
    engine.write(mul["x"], x)
    engine.write(mul["out"], np.full(N, -7.0, np.float32))
    engine.tick()
    out = engine.read(mul["out"])
    np.testing.assert_allclose(out[: N // 2], 2.0 * x[: N // 2], rtol=1e-6)
    assert np.all(out[N // 2:] == -7.0)
    mul.set(n=N)
    frame_is_exact(engine, mul, rng, 2.0)


def test_a_guarded_kernel_takes_more_threads_and_an_unguarded_one_is_refused(engine, rng, kernels):
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=3.0))
    mul.set_launch(threads=50_000_000)  # n is tied and checked: the extra threads find i >= n and do nothing
    frame_is_exact(engine, mul, rng, 3.0)
    mul.set_launch(threads=N)

    blk = engine.add(Block.from_cuda(UNGUARDED, size=N))
    x = rand(rng, N)
    engine.write(blk["x"], x)
    engine.tick()
    np.testing.assert_allclose(engine.read(blk["out"]), 2.0 * x, rtol=1e-6)
    with pytest.raises(BoundsError, match=r"twice\.twice: a launch of 50000128 threads is more than port 'x' holds "
                                          r"\(1024 elements; 1024 threads cover it\)"):
        blk.set_launch(threads=50_000_000)
    with pytest.raises(BoundsError, match=r"a launch of 2048 threads"):
        blk.set_launch(grid=(8,))
    assert blk.launch().threads == N
    for _ in range(3):
        x = rand(rng, N)
        engine.write(blk["x"], x)
        assert engine.tick().state == "ok"
        np.testing.assert_allclose(engine.read(blk["out"]), 2.0 * x, rtol=1e-6)
    frame_is_exact(engine, mul, rng, 3.0)


def test_a_bound_observable_past_the_buffer_is_dropped_with_an_error(engine, rng, kernels):
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=0.5))
    frame_is_exact(engine, mul, rng, 0.5)
    seen = []
    engine.diagnostics.subscribe(seen.append)
    knob = Subject()
    mul.params["n"].bind(knob)
    for bad in (50_000_000, -5):
        knob.on_next(bad)
    assert mul.params["n"].value == N
    assert [d.severity for d in seen] == ["error", "error"] and all(d.subject == "scalar_mul.n" for d in seen)
    frame_is_exact(engine, mul, rng, 0.5)
    knob.on_next(N)  # the binding is alive
    frame_is_exact(engine, mul, rng, 0.5)


def test_a_value_past_the_running_buffers_never_reaches_the_gpu(engine, rng, kernels):
    # what a set racing a resize would leave pending: the engine's own check drops it before the exec update
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=4.0))
    frame_is_exact(engine, mul, rng, 4.0)
    seen = []
    engine.diagnostics.subscribe(seen.append)
    engine._rt.pending.set_parameter(mul.id, "n", 50_000_000)
    frame_is_exact(engine, mul, rng, 4.0)
    assert seen and seen[0].severity == "error" and "the value was not applied" in seen[0].message
    frame_is_exact(engine, mul, rng, 4.0)


def test_an_append_capacity_is_tied_to_its_buffer(engine, rng, kernels):
    cap = 256
    with pytest.raises(BoundsError, match=r"append_above\.capacity = 1024 is more than port 'out' holds \(256"):
        Block.from_kernel(kernels / "append_above.ptx", size=N, counts={"out": cap})
    emit = engine.add(Block.from_kernel(kernels / "append_above.ptx", size=N, counts={"out": cap}, capacity=cap,
                                        threshold=1.5))
    for bad in (cap + 1, 1_000_000_000):
        with pytest.raises(BoundsError, match=r"capacity = \d+ is more than port 'out' holds \(256 elements\)"):
            emit.set(capacity=bad)
    with pytest.raises(ValueError):  # a u32 is never negative: refused by its type
        emit.set(capacity=-1)
    with pytest.raises(BoundsError, match=r"append_above\.n = -5 is negative"):
        emit.set(n=-5)
    with pytest.raises(BoundsError, match=r"append_above\.n = 100000000 is more than port 'values' holds"):
        emit.set(n=100_000_000)
    for _ in range(3):
        x = rand(rng, N)
        engine.write(emit["values"], x)
        assert engine.tick().state == "ok"
        want = np.sort(x[x > 1.5])
        assert len(want) < cap  # about 7 % of 1024 standard normal values
        np.testing.assert_array_equal(np.sort(engine.read(emit["out"])), want)
        assert engine.count(emit["out"]) == len(want)
