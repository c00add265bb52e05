"""The CUDA backend's code generator (rxcuda/tensor/_codegen.py) without a GPU: the source generated for a few
groups, that it compiles with NVRTC, and the kernel factory's keys."""

import concurrent.futures
import importlib.util
import math
import pathlib
import re

import numpy as np
import pytest
from _tensor_irs import irs

import rxcuda.tensor as rt
from rxcuda.sources import _nvrtc as nv
from rxcuda.tensor import _codegen as cg
from rxcuda.tensor import _factory, _ir
from rxcuda.tensor._cpu import leaf_value
from rxcuda.tensor._passes import plan


@pytest.fixture(autouse=True)
def compiler(tmp_path):
    prev = nv.set_default_compiler(nv.Compiler(tmp_path / "cache"))
    yield
    nv.set_default_compiler(prev)


@pytest.fixture(autouse=True)
def plain_tuning():
    """The source checks below read plain loads and stores (``in0[i]``): they run under ``Tuning()``, not the
    process default (which adds cache hints, see test_the_default_tuning_adds_cache_hints)."""
    previous = cg.set_tuning(cg.Tuning())
    yield
    cg.set_tuning(previous)


def test_the_default_tuning_adds_cache_hints(plain_tuning):
    cg.set_tuning(cg.Tuning(loads="ldcs", stores="stcs"))
    x = rt.tensor(np.ones((64, 64), np.float32))
    p = plan([(rt.exp(x) + 1).node])
    (g,) = p.groups
    src = cg.generate(_ir.group_ir(g, p, [leaf_value(i) for i in g.inputs]))
    assert "__ldcs(" in src and "__stcs(" in src
    compiled(_ir.group_ir(g, p, [leaf_value(i) for i in g.inputs]))


def compiled(ir):
    """The generated C++ of ``ir`` compiled by NVRTC (whichever way the kernel factory would make it)."""
    return nv.compile_cuda(cg.generate(ir), entry=cg.ENTRY, name="rx_group.cu")


def data(*shape, dtype=np.float32):
    return rt.tensor(np.random.default_rng(0).random(shape).astype(dtype))


def test_an_elementwise_chain_with_broadcasting_is_one_kernel():
    x, b = data(4, 5), data(5)
    ((kind, ir),) = irs(rt.tanh(x * 2.0 + b))
    assert kind == "elementwise" and ir[0] == "elementwise" and ir[1] == (4, 5)
    src = cg.generate(ir)
    assert "in2[(c1 * 1)]" in src and "in0[i]" in src  # b broadcast over rows; x laid out like the space
    assert "tanhf(" in src and "float s" in src  # float32 math, the weak scalar 2.0 an argument
    code = compiled(ir)
    assert code.entry == "rx_group" and code.image


def test_elementwise_reads_contiguous_inputs_at_the_linear_index_with_32_bit_indices():
    x, y = data(64, 33), data(64, 33)
    ((_, ir),) = irs(rt.exp(x) * y + 1.0)
    src = cg.generate(ir)
    assert "in0[i]" in src and "in1[i]" in src and "t_ = i" not in src  # no coordinates formed at all
    assert "const int i = b + u * 256" in src and "long long b" not in src and "long long i" not in src
    assert "reinterpret_cast<const float4*>(in0)[c]" in src  # and a float4 path where aligned
    assert cg.launch_shape(ir) == (-(-64 * 33 // 4096), 256)  # 4 float4 a thread
    ir = ("elementwise", (33, 64), None, (("array", (33, 64), "<f4", (1, 33)), ("scalar", "<f4")),
          (("mul", (), (33, 64), "<f4", (("i", 0), ("i", 1))),), (0,))  # a transposed view: strided
    src = cg.generate(ir)
    assert "const int c0 = t_ % 33" in src and "in0[(c0 * 1) + (c1 * 33)]" in src and "out0[i]" in src
    compiled(ir)


def test_a_division_by_a_scalar_multiplies_by_its_reciprocal_and_by_an_array_stays_ieee():
    x, y = data(64, 33), data(64, 33)
    ((_, ir),) = irs(x / 3.0 + x / y)
    src = cg.generate(ir)
    # two copies of the body under one test: times the reciprocal, and IEEE division where 1/s is not normal
    assert "if (rx_rcp_ok(s1)) {" in src and "__frcp_rn(s)" in src
    times, ieee = "rx_div_r((float)(w0.x), (float)(s1))", "rx_div_ieee((float)(w0.x), (float)(s1))"
    assert src.count(times) == src.count(ieee) == 1
    assert "rx_div_r((float)(in0[i]), (float)(s1))" in src and "rx_div_ieee((float)(in0[i]), (float)(s1))" in src
    assert "rx_div_s((" not in src  # no per-element choice
    assert "((float)(w0.x) / (float)(w1.x))" in src and "((float)(in0[i]) / (float)(in2[i]))" in src  # x / y: IEEE
    compiled(ir)
    ((_, ir),) = irs(data(8, dtype=np.float64) / 3.0)
    assert "rx_div_r((double)(" in cg.generate(ir)
    compiled(ir)
    ((kind, ir),) = irs(rt.softmax(data(64, 4096), axis=-1) / 3.0)  # shared memory: the per-element choice
    assert kind == "reduce" and "rx_div_s((float)(" in cg.generate(ir) and "if (rx_rcp_ok(s" not in cg.generate(ir)
    compiled(ir)
    ((_, ir),) = irs(x * 2.0 + y)
    assert "rx_div_s" not in cg.generate(ir)  # no helper where nothing divides by a scalar


def test_a_compute_bound_body_gets_one_element_a_thread():
    x = data(1 << 16)
    light = rt.exp(x) * 2.0 + rt.sqrt(x)  # two math ops: memory-bound, vectors and 4 units a thread
    heavy = x
    for _ in range(4):  # 4 x (exp, log): 8 math ops, the threshold
        heavy = rt.log(rt.exp(heavy) + 1.0)
    ((_, ir_light),) = irs(light)
    ((_, ir_heavy),) = irs(heavy)
    assert cg._planned(ir_light)[1].vec == 4 and cg._planned(ir_light)[1].tuning.ew_unroll == 4
    shape = cg._planned(ir_heavy)[1]
    assert (shape.vec, shape.tuning.ew_unroll, shape.tuning.ew_vector) == (1, 1, False)
    assert cg.launch_shape(ir_heavy) == ((1 << 16) // 256, 256)
    compiled(ir_heavy)


def test_elementwise_indices_are_64_bit_past_2_to_the_31():
    big = 5 << 30
    ir = ("elementwise", (big,), None, (("array", (big,), "<f4", (1,)),),
          (("exp", (), (big,), "<f4", (("i", 0),)),), (0,))
    src = cg.generate(ir)
    assert f"long long b = (long long)blockIdx.x * 1024; b < {big}LL" in src and "in0[i]" in src
    assert f"long long b = (long long)blockIdx.x * 1024; b < {big // 4}LL" in src  # float4s
    assert cg.launch_shape(ir) == (1 << 20, 256)  # the grid is capped; the loop strides over the rest
    compiled(ir)


def layernorm(x):
    mu = x.mean(-1, keepdims=True)
    d = x - mu
    return d / rt.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)


def row_kernel(program, *shape, dtype=np.float32):
    ((kind, ir),) = [(k, ir) for k, ir in irs(program(data(*shape, dtype=dtype))) if k == "reduce"]
    return ir, cg.generate(ir), cg._planned(ir)[1]


def test_softmax_holds_the_row_in_registers_and_reads_it_once():
    ir, src, shape = row_kernel(lambda x: rt.softmax(x, axis=-1), 4096, 4096)
    assert (shape.mode, shape.threads, shape.group, shape.vec) == ("rows", 256, 256, 4)
    assert cg.launch_shape(ir) == (4096, 256)  # a block a row
    assert "for (long long r_" not in src  # no strided loops over the row
    # signature, alignment check, the vector load and its element-wise twin (unaligned pointers): nothing else
    assert src.count("in0") == 4 and "reinterpret_cast<const float4*>(in0 + rb0)[c]" in src
    assert "in0[rb0 + r]" in src and "const bool vec = (((unsigned long long)in0 | (unsigned long long)out0)" in src
    assert "float x0[16];" in src and "reinterpret_cast<float4*>(out0 + ob)[c] = v_" in src
    assert src.count("__shfl_xor_sync") == 10 and "__shared__ float sh0[8];" in src  # 2 x 5 steps, 8 warps
    assert "for (int base = (int)blockIdx.x * 1; base < 4096;" in src and "const int rb0 = c0 * 4096;" in src
    assert "expf(" in src and "double" not in src
    compiled(ir)


def test_layernorm_reads_the_row_once_and_folds_two_means():
    ir, src, shape = row_kernel(layernorm, 64, 1000)
    assert shape.mode == "rows" and shape.vec == 4 and shape.threads * shape.per * 4 >= 1000
    assert src.count("in0") == 4 and "sqrtf(" in src and "/ (float)1000" in src
    assert src.count("__syncthreads()") == 2  # one per reduction level: the two means
    compiled(ir)


def test_short_rows_share_a_block_a_few_lanes_each():
    ir, src, shape = row_kernel(lambda x: rt.log(rt.softmax(x, axis=-1)), 4096, 10)
    assert shape.mode == "rows" and shape.group == 4 and shape.per == 3 and shape.vec == 1
    blocks, threads = cg.launch_shape(ir)
    assert blocks * (threads // 4) >= 4096 and blocks < 4096  # several rows per block
    assert "__syncthreads" not in src and "__shared__" not in src  # a row lives in one warp: shuffles only
    assert "__shfl_xor_sync(0xffffffffu, a0, 2)" in src and "a0, 4)" not in src  # a butterfly over 4 lanes
    assert "in0[rb0 + r]" in src and "const int lane = (int)(threadIdx.x & 3u);" in src
    compiled(ir)


def restrided(ir, k, strides):
    """``ir`` with input ``k`` read through ``strides`` (a view of other memory)."""
    inputs = list(ir[3])
    inputs[k] = (*inputs[k][:3], strides)
    return (*ir[:3], tuple(inputs), *ir[4:])


def test_unaligned_views_fall_back_to_element_loads_but_keep_vector_stores():
    ir, _, _ = row_kernel(lambda x: rt.softmax(x, axis=-1), 64, 4096)
    src = cg.generate(restrided(ir, 0, (4097, 1)))  # x[:, 1:] of a (64, 4097) array: rows not 16-byte aligned
    assert "reinterpret_cast<const float4*>(in0" not in src and "in0[rb0 + r]" in src
    assert "reinterpret_cast<float4*>(out0" in src and "(((unsigned long long)out0) & 15ULL)" in src
    compiled(restrided(ir, 0, (4097, 1)))
    src = cg.generate(restrided(ir, 0, (1, 64)))  # a transposed row: elements 64 apart
    assert "in0[rb0 + r * 64]" in src and "const int rb0 = c0 * 1;" in src
    assert "reinterpret_cast<const float4*>(in0" not in src
    compiled(restrided(ir, 0, (1, 64)))


def test_long_rows_fall_back_to_strided_loops():
    ir, src, shape = row_kernel(lambda x: rt.softmax(x, axis=-1), 8, 20000)
    assert shape.mode == "loop" and cg.launch_shape(ir) == (8, 256)
    assert src.count("for (long long r_") == 3 and "rx_max(" in src and "expf(" in src
    compiled(ir)
    _, _, shape = row_kernel(lambda x: rt.softmax(x, axis=-1), 8, 16384)
    assert shape.mode == "rows" and shape.threads == 1024  # 16 floats a thread
    _, _, shape = row_kernel(lambda x: rt.softmax(x, axis=-1), 8, 16384, dtype=np.float64)
    assert shape.mode == "loop"  # 8-byte values: 8192 at most


PROGRAMS = {
    "softmax": lambda x: rt.softmax(x, axis=-1),
    "logsumexp": lambda x: rt.logsumexp(x, axis=-1),
    "layernorm": layernorm,
    "sum": lambda x: x.sum(axis=-1),
    "max_keepdims": lambda x: x.max(axis=-1, keepdims=True) + 1,
    "min_of_where": lambda x: rt.where(x > 0.5, x, -x).min(axis=-1) ** 2,
    "mean_axis0": lambda x: x.mean(axis=0),
    "softmax_axis0": lambda x: rt.softmax(x, axis=0),
    "int_sum": lambda x: (x.astype("int32") * 3 > 1).sum(axis=-1),
    "bool_max": lambda x: (x > 0.5).max(axis=-1),
    "int_min": lambda x: (x * 100).astype("int64").min(axis=-1),
    "sum_and_softmax": lambda x: (x.sum(axis=-1), rt.softmax(x, axis=-1)),
    "all": lambda x: (x * 2).sum(),
}


@pytest.mark.parametrize("cols", [1, 3, 10, 33, 257, 4096, 5000, 20000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_reduce_kernel_compiles(cols, dtype):
    x = data(5, cols, dtype=dtype)
    for name, program in PROGRAMS.items():
        out = program(x)
        fused = [ir for kind, ir in irs(*(out if isinstance(out, tuple) else (out,))) if kind == "reduce"]
        assert fused and None not in fused, name
        for ir in fused:
            assert compiled(ir).image


@pytest.mark.parametrize("axis,keepdims", [((0, 2), False), ((0, 2), True), ((1, 2), True), (1, False), (None, False)])
def test_several_reduced_axes_compile_in_registers(axis, keepdims):
    x = data(7, 30, 5)
    for op in ("sum", "max", "min", "mean"):
        ((kind, ir),) = irs(getattr(x * 2 - 1, op)(axis=axis, keepdims=keepdims))
        assert kind == "reduce" and cg._planned(ir)[1].mode == "rows"
        src = cg.generate(ir)
        assert "x0[" in src and "for (long long r_" not in src
        compiled(ir)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_f32_kernels_do_no_double_math(dtype):
    """PTX of float32 kernels has no .f64 instruction (a literal or function promoted to double would add one)."""
    x = data(6, 1000, dtype=dtype)
    found = set()
    for program in (PROGRAMS["softmax"], PROGRAMS["layernorm"], PROGRAMS["logsumexp"],
                    lambda x: rt.tanh(x * 0.1) ** 2.0 + rt.sqrt(rt.abs(x)) / 3.0):
        for kind, ir in irs(program(x)):
            if kind in ("elementwise", "reduce"):
                code = nv.compile_cuda(cg.generate(ir), entry=cg.ENTRY, name="t.cu", target="ptx")
                ptx = code.image.decode() if isinstance(code.image, bytes) else code.image
                found |= set(re.findall(r"\b[a-z]+(?:\.[a-z]+)*\.f64\b", ptx))
    assert bool(found) == (dtype == np.float64), sorted(found)


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
    for _, ir in fused:
        compiled(ir)


def test_the_factory_hits_for_the_same_structure_and_misses_for_another_shape_or_dtype():
    factory = _factory.KernelFactory()

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
        compiled(ir)  # compiles


# -- tuning -------------------------------------------------------------------------------------------------------
ROOT = pathlib.Path(__file__).resolve().parents[2]


def sweep_module():
    """bench/kernel_sweep.py (importable without a GPU): its CANDIDATES, WORKLOADS and programs."""
    spec = importlib.util.spec_from_file_location("kernel_sweep", ROOT / "bench" / "kernel_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tuned():
    """Set a tuning for one test (``tuned(**fields)``); the previous one comes back after it."""
    previous = cg.set_tuning()  # the tuning in force (set again as it is)
    yield lambda tuning=None, **fields: cg.set_tuning(tuning, **fields)
    cg.set_tuning(previous)


def test_the_tuning_is_in_the_source_and_changes_the_plan(tuned):
    ir, src, shape = row_kernel(lambda x: rt.softmax(x, axis=-1), 4096, 4096)
    assert "// tuning: default\n" in src and shape.tuning == cg.Tuning()
    tuned(row_elems=4, row_occupancy=2048, loads="ldcs", stores="stcs")
    src, shape = cg.generate(ir), cg._planned(ir)[1]
    assert (shape.threads, shape.per, shape.vec) == (1024, 1, 4)  # 1024 threads of one float4 each
    assert "// tuning: row_elems=4, row_occupancy=2048, loads='ldcs', stores='stcs'\n" in src
    assert "__launch_bounds__(1024, 2)" in src and "__ldcs(reinterpret_cast<const float4*>(in0 + rb0) + (c))" in src
    assert "__stcs(reinterpret_cast<float4*>(out0 + ob) + (c), v_)" in src and "__ldcs(in0 + (rb0 + r))" in src
    compiled(ir)
    tuned(cg.Tuning())
    assert cg._planned(ir)[1].threads == 256  # set_tuning forgets the plans made with another tuning
    with pytest.raises(ValueError, match="loads"):
        cg.Tuning(loads="ldx")


def test_several_long_rows_share_a_block(tuned):
    tuned(row_block_threads=512)
    ir, src, shape = row_kernel(lambda x: rt.softmax(x, axis=-1), 4096, 1024)
    assert (shape.threads, shape.group) == (512, 64) and cg.launch_shape(ir) == (512, 512)  # 8 rows a block
    assert "__shared__ float sh0[16];" in src and "const unsigned int w0 = (threadIdx.x / 64u) * 2u;" in src
    assert "a0 = sh0[w0 + 0];" in src and "base + (int)(threadIdx.x / 64u)" in src
    compiled(ir)
    ir, _, shape = row_kernel(lambda x: rt.softmax(x, axis=-1), 40, 1024)
    assert shape.threads == 64  # too few rows to share blocks: the grid keeps its blocks


def test_late_loads_read_a_weight_after_the_reductions(tuned):
    def ln(x, g, b):
        return layernorm(x) * g + b

    def kernel():
        tensors = data(64, 1000), data(1000), data(1000)
        ((_, ir),) = [(k, ir) for k, ir in irs(ln(*tensors)) if k == "reduce"]
        return cg.generate(ir)

    early = kernel()
    assert early.index("float x1[") < early.index("__syncthreads()")  # gamma held across both reductions
    tuned(late_loads=True)
    late = kernel()
    assert late.index("float x1[") > late.rindex("__syncthreads()")  # gamma: after the second reduction
    assert late.index("float x0[") < late.index("a0 = sh0[")  # x: before the first


@pytest.mark.parametrize("dtype,vector", [(np.float32, "float4"), (np.float64, "double2"), (np.int32, "int4")])
def test_elementwise_vectors_behind_an_alignment_check_with_a_scalar_tail(dtype, vector):
    x, y = data(37, 33, dtype=dtype), data(33, dtype=dtype)
    ((_, ir),) = irs(x * 2 + y)
    src = cg.generate(ir)
    v = 16 // np.dtype(dtype).itemsize
    assert f"& 15ULL) == 0ULL) {{  // 16-byte aligned: vectors of {v}" in src
    assert f"reinterpret_cast<const {vector}*>(in0)[c]" in src and f"reinterpret_cast<{vector}*>(out0)[c] = o0;" in src
    assert "in2[(c1 * 1)]" in src  # the broadcast row: read at its coordinates, element by element
    assert f"const int i = c * {v} + {v - 1};" in src  # each element of a vector finds its own coordinates
    if 37 * 33 % v:
        assert f"threadIdx.x < {37 * 33 % v}u" in src  # the last elements, past the whole vectors
    assert "} else {" in src and "in0[i]" in src  # the scalar path, for misaligned pointers
    compiled(ir)


def test_elementwise_without_vectors():
    x = data(64, 33)
    ((_, ir),) = irs(x.T * 2.0)[1:]  # read through a transpose: no operand at the linear index, but the output
    assert cg._planned(ir)[1].vec == 4 and "reinterpret_cast<float4*>(out0)[c] = o0;" in cg.generate(ir)
    compiled(ir)
    ((_, ir),) = irs((x > 0.5) == (x < 0.1))
    assert cg._planned(ir)[1].vec == 1 and "reinterpret_cast" not in cg.generate(ir)  # 1-byte outputs
    ((_, ir),) = irs(x.astype("float64") + 1)
    assert cg._planned(ir)[1].vec == 1  # mixed item sizes


def test_every_sweep_tuning_compiles(tuned):
    """Every candidate of bench/kernel_sweep.py, for the sweep's workloads and rows of 1..5000 (short rows, a
    block a row, the strided loops), and elementwise kernels over strided, broadcast and odd-sized operands."""
    sweep = sweep_module()

    def z(*shape):
        return rt.tensor(np.zeros(shape, np.float32))

    groups = []
    for name, shape in sweep.WORKLOADS:
        groups += irs(sweep._program(name, rt, z(*shape), z(shape[1]), z(shape[1])))
    for cols in (1, 3, 33, 1000, 5000, 20000):
        for name in ("softmax", "layernorm", "x * a + b"):
            groups += irs(sweep._program(name, rt, z(37, cols), z(cols), z(cols)))
    x = data(37, 33)
    groups += irs(x.T * 2 + 1) + irs(x + data(37, 1)) + irs(rt.exp(x[:, 1:]) + x[:, :1])
    fused = [ir for kind, ir in groups if kind in ("elementwise", "reduce")]
    assert None not in fused and len(fused) >= 20
    sources, shapes = set(), set()
    for tuning in sweep.CANDIDATES:
        tuned(tuning)
        for ir in fused:
            shape = cg._planned(ir)[1]
            assert 32 <= shape.threads <= 1024 and shape.blocks >= 1 and shape.tuning == tuning
            if shape.mode == "rows":
                nred = math.prod(ir[1][a] for a in ir[2])
                assert shape.group * shape.per * shape.vec >= nred and shape.threads % shape.group == 0
            shapes.add((ir, shape.threads, shape.blocks, shape.group, shape.per, shape.vec))
            sources.add(re.sub(r"// tuning: .*\n", "", cg.generate(ir)))  # the same code under other knobs
    assert len(shapes) > 2 * len(fused)  # the knobs do move the plans
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        images = list(ex.map(lambda s: nv.compile_cuda(s, entry=cg.ENTRY, name="rx_group.cu").image, sources))
    assert all(images)


def test_long_libdevice_functions_get_a_plain_elementwise_kernel():
    """sin/cos/pow (and float64 exp/log/tanh) are compute-bound and long: one element a thread, no vector path,
    so NVRTC compiles them in a fraction of the time (it took ~0.5 s unrolled and vectorized on the H100 host)."""
    x = rt.tensor(np.ones((64, 128), np.float32))
    for y, heavy in ((rt.sin(x * 2), True), (rt.exp(x * 2), False),
                     (rt.exp(x.astype(np.float64)), True), (x ** 2.0, True)):
        p = plan([y.node])
        g = [g for g in p.groups if g.kind != "view"][-1]
        ir = _ir.group_ir(g, p, [leaf_value(i) for i in g.inputs])
        blocks, threads = cg.launch_shape(ir)
        assert (blocks * threads >= 64 * 128) == heavy  # a thread an element, or several a thread
        assert ("float4" in cg.generate(ir)) != heavy
