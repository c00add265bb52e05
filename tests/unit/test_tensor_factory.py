"""The tensor kernel factory's tiers and fast math, without a GPU: a miss answers with PTX at once and, with
``upgrade=True``, NVRTC builds the tuned C++ kernel of the same IR in the background, swapped in by
``GroupKernel.current`` at a later launch (a failed build keeps the PTX kernel); ``fast_math=True`` kernels are
NVRTC's ``--use_fast_math`` builds, kept apart from the precise ones."""

import numpy as np
import pytest

import rxcuda.tensor as rt
from rxcuda.sources._nvrtc import compile_cuda
from rxcuda.tensor import _codegen as cg
from rxcuda.tensor import _factory, _ir
from rxcuda.tensor._passes import plan


def ir_of(y):
    p = plan([y.node])
    (g,) = [g for g in p.groups if g.kind != "view"]
    return _ir.group_ir(g, p, [np.empty(i.shape, i.dtype) for i in g.inputs])


@pytest.fixture
def exp_ir():
    x = rt.tensor(np.ones((8, 33), np.float32))
    return ir_of(rt.exp(x * 1.5) + 0.25)


def test_a_miss_is_ptx_and_the_cpp_build_replaces_it(exp_ir):
    factory = _factory.KernelFactory(upgrade=True)
    kernel = factory.get(exp_ir)
    loaded = []

    def load(code):
        loaded.append(code)
        return "module", f"function of {code.entry}"

    kernel.function = "ptx function"
    assert kernel.code.cached == "ptx" and kernel.pending is None
    assert kernel.current(load) == "ptx function" and kernel.pending is None  # a first launch builds nothing
    kernel.current(load)  # the second starts the build (done at once when NVRTC's disk cache has it)
    assert kernel.pending is not None or factory.upgrades == 1
    assert factory.wait(timeout=120) == 0
    assert kernel.current(load) == f"function of {cg.ENTRY}"
    assert loaded[0].image[:4] == b"\x7fELF"  # a cubin: the tuned C++ build
    assert "extern \"C\" __global__" in kernel.source and factory.upgrades == 1 and kernel.pending is None
    assert kernel.current(load) == f"function of {cg.ENTRY}" and len(loaded) == 1  # swapped once


def test_a_failed_background_build_keeps_the_first_kernel(exp_ir):
    factory = _factory.KernelFactory(upgrade=True)
    kernel = factory.get(exp_ir)
    kernel.function = "ptx function"

    def load(code):
        raise RuntimeError("no device")

    kernel.current(load)
    kernel.current(load)
    factory.wait(timeout=120)

    assert kernel.current(load) == "ptx function"
    assert isinstance(kernel.failed, RuntimeError) and factory.upgrades == 0 and kernel.pending is None


def test_without_upgrade_nothing_is_built_in_the_background(exp_ir):
    factory = _factory.KernelFactory()
    kernel = factory.get(exp_ir)
    kernel.function = "ptx function"
    for _ in range(3):
        assert kernel.current(lambda code: None) == "ptx function"
    assert kernel.pending is None and factory.wait() == 0


def test_fast_math_kernels_are_nvrtc_builds_kept_apart(exp_ir):
    factory = _factory.KernelFactory()
    precise = factory.get(exp_ir)
    fast = factory.get(exp_ir, fast_math=True)
    assert fast is not precise and factory.get(exp_ir, fast_math=True) is fast
    assert precise.code.cached == "ptx" and fast.code.image[:4] == b"\x7fELF"
    assert factory.ptx_misses == 1 and factory.nvrtc_misses == 1
    # what --use_fast_math does to this kernel: denormals flushed everywhere, exp without the accurate sequence
    src = cg.generate(exp_ir)
    fast_ptx = compile_cuda(src, entry=cg.ENTRY, name="f.cu", target="ptx", options={"use_fast_math": True})
    precise_ptx = compile_cuda(src, entry=cg.ENTRY, name="p.cu", target="ptx")
    assert b"mul.ftz.f32" in fast_ptx.image and b"mul.ftz.f32" not in precise_ptx.image
    assert len(fast_ptx.image) < 0.8 * len(precise_ptx.image)


def test_fast_math_is_a_pass_setting_shown_by_explain():
    x = rt.tensor(np.ones(4, np.float32))
    assert "fast math: on" in rt.explain(rt.exp(x), passes=rt.Passes(fast_math=True))
    assert "fast math" not in rt.explain(rt.exp(x))
    np.testing.assert_allclose(rt.exp(x).numpy(passes=rt.Passes(fast_math=True)), np.exp(np.ones(4)), rtol=1e-6)


def test_a_first_tier_is_emitted_without_unrolling(exp_ir):
    """Each unrolled copy of the body costs the driver's JIT time, and a first tier that runs twice is replaced:
    the tiered factory emits one element a thread per trip, a PTX-only factory the unrolled kernel."""
    from rxcuda.tensor import _ptx

    tiered = _factory.KernelFactory(upgrade=True).get(exp_ir).source
    alone = _factory.KernelFactory().get(exp_ir).source
    assert tiered == _ptx.emit(exp_ir, unroll=1) and alone == _ptx.emit(exp_ir)
    assert len(tiered) < len(alone)
