"""The CUDA backend's code generator (rxcuda/tensor/_codegen.py) without a GPU: the source generated for a few
groups, that it compiles with NVRTC, and the kernel factory's keys."""

import numpy as np
import pytest

import rxcuda.tensor as rt
from rxcuda.sources import _nvrtc as nv
from rxcuda.tensor import _codegen as cg
from rxcuda.tensor._cpu import leaf_value
from rxcuda.tensor._passes import plan


@pytest.fixture(autouse=True)
def compiler(tmp_path):
    prev = nv.set_default_compiler(nv.Compiler(tmp_path / "cache"))
    yield
    nv.set_default_compiler(prev)


def irs(*tensors):
    """(group kind, IR) for each group of the plan; inputs that groups compute are contiguous arrays."""
    p = plan([t.node for t in tensors])
    out = []
    for g in p.groups:
        values = [leaf_value(i) if i.op in ("const", "full") else np.empty(i.shape, i.dtype) for i in g.inputs]
        out.append((g.kind, cg.group_ir(g, p, values)))
    return out


def data(*shape, dtype=np.float32):
    return rt.tensor(np.random.default_rng(0).random(shape).astype(dtype))


def test_an_elementwise_chain_with_broadcasting_is_one_kernel():
    x, b = data(4, 5), data(5)
    ((kind, ir),) = irs(rt.tanh(x * 2.0 + b))
    assert kind == "elementwise" and ir[0] == "elementwise" and ir[1] == (4, 5)
    src = cg.generate(ir)
    assert "in2[(c1 * 1)]" in src and "in0[(c0 * 5) + (c1 * 1)]" in src  # b broadcast over rows
    assert "tanhf(" in src and "float s" in src  # float32 math, the weak scalar 2.0 an argument
    code = cg.KernelFactory().get(ir).code
    assert code.entry == "rx_group" and code.image


def test_softmax_is_one_reduce_kernel_with_three_loops():
    ((kind, ir),) = irs(rt.softmax(data(3, 7), axis=-1))
    src = cg.generate(ir)
    assert kind == "reduce" and src.count("for (long long r_") == 3
    assert "rx_max(" in src and "expf(" in src and "__syncthreads()" in src
    cg.KernelFactory().get(ir)  # compiles


@pytest.mark.parametrize("program", [
    lambda x: x.sum(axis=0),
    lambda x: x.mean(axis=(0, 2), keepdims=True),
    lambda x: x.max(),
    lambda x: rt.logsumexp(x, axis=1),
    lambda x: ((x - x.mean(-1, keepdims=True)) / rt.sqrt(((x - x.mean(-1, keepdims=True)) ** 2).mean(-1,
                                                                                              keepdims=True) + 1e-5)),
    lambda x: (x.astype("int32") * 3 > 1).sum(axis=1),
    lambda x: rt.where(x > 0.5, x, -x).min(axis=-1) ** 2,
])
def test_reductions_and_dtypes_compile(program):
    x = data(2, 3, 4, dtype=np.float64)
    fused = [(k, ir) for k, ir in irs(program(x)) if k in ("elementwise", "reduce")]
    assert fused and all(ir is not None for _, ir in fused)
    factory = cg.KernelFactory()
    for _, ir in fused:
        factory.get(ir)


def test_the_factory_hits_for_the_same_structure_and_misses_for_another_shape_or_dtype():
    factory = cg.KernelFactory()

    def ir_of(x):
        ((_, ir),) = irs(rt.exp(x) * 2.0 + 1.0)
        return ir

    a = ir_of(data(4, 5))
    k = factory.get(a)
    assert factory.get(ir_of(data(4, 5))) is k  # new data, same structure: a dict hit
    assert (factory.hits, factory.misses) == (1, 1)
    factory.get(ir_of(data(4, 6)))
    factory.get(ir_of(data(4, 5, dtype=np.float64)))
    assert (factory.hits, factory.misses, len(factory)) == (1, 3, 3)


def test_strides_are_part_of_the_key():
    x = data(4, 5)
    ((_, a),) = irs(x + 1.0)
    ((_, b),) = irs(x.T + 1.0)[1:]  # the transpose is a view group; the add reads it through its strides
    assert a != b


def test_what_the_generator_cannot_express_runs_op_by_op():
    x = data(4, 4)
    # a row sum added along the other axis: the fused operand is not read where it is computed
    kinds = dict(irs(x.sum(axis=1) + x))
    assert kinds["reduce"] is None
    ((_, half),) = irs(data(3, dtype=np.float16) + 1)
    assert half is None  # no CUDA C type for float16 yet: CuPy runs it


@pytest.mark.parametrize("program", [
    lambda x: (x * 2 - 1).sum() + 1,
    lambda x: (x * 2 - 1).max(axis=(1, 2)) + 1,
    lambda x: rt.softmax(x * 3.0, axis=-1) - 0.5,
])
def test_a_reduction_then_a_scalar_still_plans_one_kernel(program):
    """A scalar operand has no shape: reading it after a reduction must not index the scalar's dtype string."""
    x = data(3, 4, 5)
    for kind, ir in irs(program(x)):
        assert ir is not None, kind
        cg.KernelFactory().get(ir)  # compiles
