"""The PTX emitter (rxcuda/tensor/_ptx.py) without a GPU: PTX for a battery of groups made from real tensor
programs, each assembled by ptxas (skipped where the CUDA toolkit's ptxas is absent); what it leaves to NVRTC;
that emitting is fast; the kernel factory's two paths; the float32 exp/log/division/tanh sequences interpreted
instruction by instruction in NumPy (the exact PTX text emitted) against float64 NumPy over millions of
values, special values included; and whole kernels run on a PTX simulator (_ptxsim.py: threads, warp shuffles,
barriers, bounds-checked memory) against the CPU backend, with their launch shape and with odd grids and blocks
(one thread, partial warps)."""

import os
import shutil
import subprocess
import time
from fractions import Fraction

import _ptxsim
import numpy as np
import pytest
from _tensor_irs import irs

import rxcuda.tensor as rt
from rxcuda.sources import _nvrtc as nv
from rxcuda.tensor import _codegen as cg
from rxcuda.tensor import _factory, _ir, _ptx, _ptxmath, _ptxwriter
from rxcuda.tensor._cpu import leaf_value
from rxcuda.tensor._passes import plan


def _find_ptxas() -> str | None:
    for candidate in (shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


PTXAS = _find_ptxas()


@pytest.fixture(autouse=True)
def compiler(tmp_path):
    prev = nv.set_default_compiler(nv.Compiler(tmp_path / "cache"))
    yield
    nv.set_default_compiler(prev)


@pytest.fixture
def ptxas(tmp_path):
    """assemble(text): ptxas -arch=sm_90 on the PTX (AssertionError with ptxas's message if it fails)."""
    if PTXAS is None:
        pytest.skip("ptxas not found (neither on PATH nor /usr/local/cuda/bin): install the CUDA toolkit to "
                    "assemble the emitted PTX")

    def assemble(text: str) -> None:
        path = tmp_path / "k.ptx"
        path.write_text(text)
        r = subprocess.run([PTXAS, "-arch=sm_90", str(path), "-o", str(tmp_path / "k.cubin")], capture_output=True,
                           text=True)
        assert r.returncode == 0, f"ptxas failed:\n{r.stderr}\n{text}"

    return assemble


def fused(*tensors):
    out = [ir for kind, ir in irs(*tensors) if kind in ("elementwise", "reduce")]
    assert out and all(ir is not None for ir in out)
    return out


def data(*shape, dtype=np.float32):
    a = np.random.default_rng(0).random(shape) * 4 - 2
    return rt.tensor(a.astype(dtype))


# -- a battery of groups, each emitted and assembled ----------------------------------------------------------
INTS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
ELEMENTWISE = {
    "f32 chain": lambda: rt.sqrt(rt.abs(data(4, 5) * 2.0 - data(5)) / 3.0) + rt.maximum(data(4, 5), -data(4, 5)),
    "f64 chain": lambda: rt.minimum(data(4, 5, dtype=np.float64), 0.5) / (rt.abs(data(5, dtype=np.float64)) + 1),
    "exp log f32": lambda: rt.log(rt.exp(data(4, 5)) + 1.0) - rt.exp(-data(4, 5)),
    "tanh f32": lambda: rt.tanh(data(7, 3) * 1.5 + 0.25) / 3.0,
    "where": lambda: rt.where(data(6) > 0.0, data(6), data(6, dtype=np.float64)),
    "where bool": lambda: rt.where(data(6) > 0.0, data(6) < 1.0, data(6) < -1.0),
    "compare mixed": lambda: (data(6).astype("int64") == data(6).astype("uint32")) + (data(6) <= data(6) * 2),
    "compare bool": lambda: (data(6) > 0) < (data(6) > 1),
    "bool ops": lambda: rt.maximum((data(5) > 0.5) + (data(5) < 0.2), (data(5) > 1) * (data(5) < 2)),
    "casts": lambda: data(5, dtype=np.float64).astype("uint8").astype("float32") + data(5).astype(np.int16),
    "bool casts": lambda: (data(5) > 0).astype("float64") + (data(5) > 0).astype("int8") + data(5).astype(bool),
    "transposed": lambda: data(4, 5).T + 1.0,
    "a view's result": lambda: data(9)[::-2] * 2.0,
    "broadcast 3d": lambda: data(3, 1, 5) * data(4, 1) - data(5),
    "big f32": lambda: rt.exp(data(300, 1000)) * 2.0 + data(1000),
    "int division": lambda: data(5).astype("int32") / data(5).astype("int32"),
}
for _t in INTS:
    ELEMENTWISE[f"{_t} ops"] = lambda t=_t: (rt.maximum(data(5).astype(t) * 3, data(5).astype(t)) - 1,
                                             -rt.abs(data(5).astype(t)) + rt.minimum(data(5).astype(t), 1))

REDUCE = {
    "sum axis 0": lambda: data(2, 3, 4, dtype=np.float64).sum(axis=0),
    "mean keepdims": lambda: data(2, 3, 4, dtype=np.float64).mean(axis=(0, 2), keepdims=True),
    "max all": lambda: data(2, 3, 4).max(),
    "softmax short rows": lambda: rt.softmax(data(4096, 10), axis=-1),
    "softmax long rows": lambda: rt.softmax(data(64, 20000), axis=-1),
    "softmax axis 0": lambda: rt.softmax(data(300, 7), axis=0),
    "logsumexp": lambda: rt.logsumexp(data(50, 30), axis=1),
    "layernorm f64": lambda: (lambda x: (x - x.mean(-1, keepdims=True)) / rt.sqrt(
        ((x - x.mean(-1, keepdims=True)) * (x - x.mean(-1, keepdims=True))).mean(-1, keepdims=True) + 1e-5))(
        data(100, 300, dtype=np.float64)),
    "int sum of compare": lambda: (data(2, 3, 4).astype("int32") * 3 > 1).sum(axis=1),
    "where min": lambda: rt.where(data(2, 3, 4) > 0.5, data(2, 3, 4), -data(2, 3, 4)).min(axis=-1),
    "bool max short": lambda: (data(300, 20) > 0.5).max(axis=1),
    "bool min long": lambda: (data(30, 2000) > 0.5).min(axis=1),
    "int64 sum": lambda: data(300, 20).astype(np.int64).sum(axis=0),
    "uint8 max": lambda: data(40, 50).astype(np.uint8).max(axis=1) + 1,
    "int mean": lambda: data(40, 50).astype(np.int16).mean(axis=0),
    "two reductions": lambda: data(8, 100).max(axis=1) - data(8, 100).min(axis=1),
}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise_groups_emit_and_assemble(name, ptxas):
    out = ELEMENTWISE[name]()
    for ir in fused(*(out if isinstance(out, tuple) else (out,))):
        assert ir[0] == "elementwise"
        text = _ptx.emit(ir)
        assert text.startswith(f".version {_ptx.VERSION}\n.target {_ptx.TARGET}\n") and ".entry rx_group(" in text
        ptxas(text)


@pytest.mark.parametrize("name", list(REDUCE))
def test_reduce_groups_emit_and_assemble(name, ptxas):
    irs_ = [ir for ir in fused(REDUCE[name]()) if ir[0] == "reduce"]
    assert irs_
    for ir in irs_:
        ptxas(_ptx.emit(ir))


def _one(t):
    (ir,) = fused(t)
    return ir


def test_the_signature_is_the_cpp_one():
    """One parameter per input in order (a scalar by value, a bool scalar as one byte, an array as a pointer),
    then one pointer per output: the launch passes the same arguments to either kernel."""
    x = data(4, 5)
    ir = _one(rt.where(x > 0.5, x * 2.0, -1.0) + ((x > 0) + True))
    assert {i[1] for i in ir[3] if i[0] == "scalar"} >= {"|b1", "<f4"}
    text = _ptx.emit(ir)
    params = [line.split()[1][1:] for line in text.splitlines() if line.startswith("\t.param")]
    want = ["u64" if i[0] == "array" else "u8" if i[1] == "|b1" else _ptxwriter._MEM[i[1][1:]] for i in ir[3]]
    assert params == [*want, *["u64"] * len(ir[5])]


def test_arithmetic_is_not_contracted_and_division_and_sqrt_are_ieee():
    x = data(8, 8)
    text = _ptx.emit(_one(rt.sqrt(x * 2.0 + 1.0) - x))
    assert "mul.rn.f32" in text and "add.rn.f32" in text and "sqrt.rn.f32" in text
    assert "fma" not in text and "approx" not in text
    text = _ptx.emit(_one(x / 3.0))
    assert "div.rn" not in text and "fma.rn.f64" in text  # float32 division: straight-line, in float64
    text = _ptx.emit(_one(x.astype(np.float64) / 3.0))
    assert "div.rn.f64" in text


def test_exp_is_cudas_short_sequence_one_ex2_of_a_reduced_fraction():
    """CUDA's expf shape (8 instructions where the old polynomial took 24): the fraction reduced with two fmas
    (log2 e in two parts), one ex2.approx.ftz, one scaling by 2**k; no conversion, no polynomial."""
    text = _ptx.emit(_one(rt.exp(data(8))))
    assert text.count("ex2.approx.ftz.f32") == 1 and "fma.rn.sat.f32" in text and "fma.rm.f32" in text
    assert "0f3FB8AA3B" in text and "0f32A57060" in text and "cvt.rni" not in text
    ir = _one(rt.exp(data(8)))
    fn = _ptxwriter._Fn(ir, _ir.Layout(ir))
    _ptxmath.expf(fn, fn.reg("f"))
    assert len(fn.lines) == 10  # 8 SASS: two movs between float and integer registers are free


def test_an_unrolled_elementwise_kernel_loads_every_element_before_computing():
    """The launch shape gives 4 elements a thread: 4 loads per input, the later 3 predicated on the bound."""
    ir = _one(data(300, 1000) * 2.0 + 1.0)
    blocks, threads = cg.launch_shape(ir)
    unroll = min(4, -(-300_000 // (blocks * threads)))
    text = _ptx.emit(ir)
    assert text.count("ld.global.nc.f32") == unroll and text.count("st.global.f32") == unroll
    assert text.count("@%p") >= 2 * (unroll - 1) + 1
    first_math = text.index("mul.rn.f32")
    assert all(m < first_math for m in _positions(text, "ld.global.nc.f32"))


def _positions(text: str, word: str) -> list[int]:
    out, at = [], text.find(word)
    while at >= 0:
        out.append(at)
        at = text.find(word, at + 1)
    return out


def test_short_rows_fold_in_lane_groups_and_long_rows_across_the_block():
    short = _ptx.emit(_one(rt.softmax(data(4096, 10), axis=-1)))
    assert "shfl.sync.bfly" in short and "bar.sync" not in short and "rx_sh" not in short
    long = _ptx.emit(_one(rt.softmax(data(64, 20000), axis=-1)))
    assert "shfl.sync.down" in long and long.count("bar.sync") == 4 and ".shared" in long


def _ew(space, inputs, nodes, outputs=(None,), axes=None):
    outputs = tuple(len(nodes) - 1 if o is None else o for o in outputs)
    return ("elementwise", space, axes, tuple(inputs), tuple(nodes), outputs)


STRIDED = {
    # a transposed (4, 5) operand: element strides (1, 4)
    "transposed": _ew((4, 5), [("array", (4, 5), "<f4", (1, 4))],
                      [("add", (), (4, 5), "<f4", (("i", 0), ("i", 0)))]),
    # a reversed, every-other view: a negative stride
    "reversed": _ew((5,), [("array", (5,), "<f8", (-2,))], [("neg", (), (5,), "<f8", (("i", 0),))]),
    # a row broadcast over a (3, 4, 5) space, and a (4, 1) column
    "broadcast": _ew((3, 4, 5), [("array", (3, 4, 5), "<f4", (20, 5, 1)), ("array", (5,), "<f4", (1,)),
                                 ("array", (4, 1), "<i4", (1, 1))],
                     [("mul", (), (3, 4, 5), "<f4", (("i", 0), ("i", 1))),
                      ("add", (), (3, 4, 5), "<f8", (("n", 0), ("i", 2)))]),
    # a per-row output (the reduced axis kept at 1) written once per row, beside a per-element one
    "per-row output": _ew((6, 7), [("array", (6, 7), "<f4", (7, 1)), ("array", (6, 1), "<f4", (1, 1))],
                          [("mul", (), (6, 7), "<f4", (("i", 0), ("i", 0))),
                           ("add", (), (6, 1), "<f4", (("i", 1), ("i", 1)))], outputs=(0, 1), axes=(1,)),
    # more than 2**31 elements: 64-bit coordinates
    "huge": _ew((3, 2**30), [("array", (3, 2**30), "<f4", (2**30, 1)), ("array", (2**30,), "<f4", (1,))],
                [("add", (), (3, 2**30), "<f4", (("i", 0), ("i", 1)))]),
}


@pytest.mark.parametrize("name", list(STRIDED))
def test_strided_broadcast_and_per_row_groups(name, ptxas):
    text = _ptx.emit(STRIDED[name])
    ptxas(text)
    if name == "huge":
        assert "div.u64" in text and "div.u32" not in text
    elif name != "reversed":
        assert "div.u32" in text  # these operands need the element's coordinates
    if name == "per-row output":
        assert "setp.eq.u32" in text and text.count("st.global.f32") == 2


def test_an_operand_laid_out_like_the_space_is_read_at_the_linear_index():
    text = _ptx.emit(_one(data(4, 5) * 2.0 + 1.0))
    assert "div." not in text and "shl.b64" in text


@pytest.mark.parametrize("program, why", [
    (lambda x: x ** 2.0, "pow"),
    (lambda x: rt.sin(x) + 1.0, "sin"),
    (lambda x: rt.cos(x) * 2.0, "cos"),
    (lambda x: rt.exp(x.astype(np.float64)), "exp of <f8"),
    (lambda x: rt.log(x.astype(np.float64)), "log of <f8"),
    (lambda x: rt.tanh(x.astype(np.float64)), "tanh of <f8"),
    (lambda x: rt.exp(x.astype(np.int32)), "exp of <f8"),  # int32 -> float64
])
def test_what_has_no_ptx_form_is_unsupported(program, why):
    ir = _one(program(data(4, 5)))
    with pytest.raises(_ir.Unsupported, match=why):
        _ptx.emit(ir)


def test_emitting_a_ten_op_group_is_fast():
    x, b = data(256, 512), data(512)
    y = rt.tanh(rt.exp(-rt.abs(x * 1.5 + b)) * 0.5 - rt.log(rt.sqrt(x * x + 1.0)) / 3.0)
    ir = _one(y)
    assert len(ir[4]) >= 10
    _ptx.emit(ir)
    best = min(_timed(_ptx.emit, ir) for _ in range(5))
    assert best < 0.05, f"emitting a {len(ir[4])}-op group took {best * 1e3:.1f} ms"


def _timed(f, *args) -> float:
    t0 = time.perf_counter()
    f(*args)
    return time.perf_counter() - t0


# -- the factory ----------------------------------------------------------------------------------------------
def test_the_factory_emits_ptx_and_falls_back_to_nvrtc():
    factory = _factory.KernelFactory()
    x = data(4, 5)
    k = factory.get(_one(rt.exp(x) * 2.0 + 1.0))
    assert (factory.ptx_misses, factory.nvrtc_misses) == (1, 0)
    assert k.code.cached == "ptx" and k.code.entry == cg.ENTRY and k.code.image.endswith(b"\0")
    assert k.source == k.code.image[:-1].decode() and ".entry rx_group(" in k.source
    assert factory.get(_one(rt.exp(x) * 2.0 + 1.0)) is k and factory.hits == 1
    pow_kernel = factory.get(_one(x ** 3.0))  # pow: no PTX form, NVRTC compiles the C++
    assert (factory.ptx_misses, factory.nvrtc_misses, factory.misses) == (1, 1, 2)
    assert "extern \"C\" __global__" in pow_kernel.source and pow_kernel.code.image
    factory.get(_one(rt.softmax(x, axis=-1)))
    assert (factory.ptx_misses, factory.nvrtc_misses) == (2, 1)


def test_the_factory_can_be_told_to_use_nvrtc():
    x = data(4, 5)
    never = _factory.KernelFactory(ptx=False)
    k = never.get(_one(x * 2.0))
    assert (never.ptx_misses, never.nvrtc_misses) == (0, 1) and "__global__" in k.source
    only = _factory.KernelFactory(ptx=("elementwise",))
    only.get(_one(x * 2.0))
    only.get(_one(x.sum(axis=1)))
    assert (only.ptx_misses, only.nvrtc_misses) == (1, 1)


# -- exp and log, instruction by instruction -----------------------------------------------------------------
F32 = np.float32


def _fma(a, b, c):
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F32)


def _fma64(a, b, c):
    """float64 FMA, exactly rounded (through Fractions: the product and sum exact, one rounding)."""
    def one(x, y, z):
        if not (np.isfinite(x) and np.isfinite(y) and np.isfinite(z)):
            return x * y + z
        return float(Fraction(x) * Fraction(y) + Fraction(z))

    return np.frompyfunc(one, 3, 1)(a, b, c).astype(np.float64)


def _operand(tok: str, regs: dict, n: int):
    if tok.startswith("%"):
        return regs[tok]
    if tok.startswith("0f"):
        return np.full(n, np.uint32(int(tok[2:], 16)), np.uint32).view(F32)
    if tok.startswith("0d"):
        return np.full(n, np.uint64(int(tok[2:], 16)), np.uint64).view(np.float64)
    return np.full(n, int(tok, 0) & 0xFFFFFFFF, np.uint64).astype(np.uint32).view(np.int32)


def interpret(lines: list[str], regs: dict, n: int) -> dict:
    """Run straight-line PTX of the float32 math sequences over arrays: f32 registers as float32, b32 as int32,
    predicates as bool. FMA is one rounding (the exact product plus c in float64, then to float32: a double
    rounding that can differ from hardware only on rare exact ties). The approximate ex2/rcp are exact here."""
    for line in lines:
        text = line.strip().rstrip(";")
        opcode, _, rest = text.partition(" ")
        ops = [t.strip() for t in rest.split(",")]
        d, src = ops[0], [_operand(t, regs, n) for t in ops[1:]]
        f = [s.view(F32) if s.dtype not in (np.bool_, np.float64) else s for s in src]
        i = [s.view(np.int32) if s.dtype not in (np.bool_, np.float64) else s for s in src]
        with np.errstate(all="ignore"):
            if opcode == "max.f32":
                out = np.fmax(f[0], f[1])
            elif opcode == "min.f32":
                out = np.fmin(f[0], f[1])
            elif opcode == "mul.rn.f32":
                out = (f[0] * f[1]).astype(F32)
            elif opcode == "add.rn.f32":
                out = (f[0] + f[1]).astype(F32)
            elif opcode == "fma.rn.f32":
                out = _fma(f[0], f[1], f[2])
            elif opcode == "fma.rn.sat.f32":  # clamped to [0, 1], NaN to 0 (PTX's .sat)
                out = np.nan_to_num(np.clip(_fma(f[0], f[1], f[2]), 0, 1), nan=0.0)
            elif opcode == "fma.rm.f32":  # rounded down: the float64 sum (exact for exp's use), then toward -inf
                wide = f[0].astype(np.float64) * f[1].astype(np.float64) + f[2].astype(np.float64)
                near = wide.astype(F32)
                out = np.where(near.astype(np.float64) > wide, np.nextafter(near, F32(-np.inf)), near)
            elif opcode == "sub.rn.f32":
                out = (f[0] - f[1]).astype(F32)
            elif opcode == "cvt.rni.f32.f32":
                out = np.rint(f[0])
            elif opcode == "cvt.rzi.s32.f32":
                out = np.trunc(np.nan_to_num(f[0])).astype(np.int64).clip(-2**31, 2**31 - 1).astype(np.int32)
            elif opcode == "cvt.rn.f32.s32":
                out = i[0].astype(F32)
            elif opcode == "shr.s32":
                out = i[0] >> i[1]
            elif opcode == "shl.b32":
                out = np.where(i[1] >= 32, 0, i[0].astype(np.int64) << np.minimum(i[1], 31)).astype(np.int32)
            elif opcode in ("add.s32", "sub.s32", "and.b32"):
                a, b = i[0].astype(np.int64), i[1].astype(np.int64)
                out = {"add.s32": a + b, "sub.s32": a - b, "and.b32": a & b}[opcode]
                out = (out & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
            elif opcode == "mov.b32":
                out = src[0].view(F32) if d.startswith("%f") else src[0].view(np.int32)
            elif opcode == "setp.nan.f32":
                out = np.isnan(f[0]) | np.isnan(f[1])
            elif opcode in ("setp.lt.f32", "setp.eq.f32", "setp.ge.f32"):
                out = {"lt": np.less, "eq": np.equal, "ge": np.greater_equal}[opcode[5:7]](f[0], f[1])
            elif opcode in ("setp.lt.and.f32", "setp.ne.and.f32"):
                out = {"lt": np.less, "ne": np.not_equal}[opcode[5:7]](f[0], f[1]) & src[2]
            elif opcode == "cvt.f64.f32":
                out = f[0].astype(np.float64)
            elif opcode == "cvt.rn.f32.f64":
                out = src[0].astype(F32)
            elif opcode == "neg.f64":
                out = -src[0]
            elif opcode == "setp.eq.f64":
                out = src[0] == src[1]
            elif opcode == "selp.f64":
                out = np.where(src[2], src[0], src[1])
            elif opcode == "mul.rn.f64":
                out = src[0] * src[1]
            elif opcode == "fma.rn.f64":
                out = _fma64(*src)
            elif opcode == "rcp.approx.ftz.f64":  # an approximation: 1/x off by up to 2**-20 (worse than hardware)
                rng = np.random.default_rng(7)
                out = (1.0 / src[0]) * (1 + rng.uniform(-1, 1, n) * 2.0**-20)
            elif opcode == "setp.lt.u32":
                out = src[0].view(np.uint32) < src[1].view(np.uint32)
            elif opcode == "selp.f32":
                out = np.where(src[2], f[0], f[1])
            elif opcode == "abs.f32":
                out = np.abs(f[0])
            elif opcode == "copysign.f32":
                out = np.copysign(f[1], f[0])
            elif opcode == "ex2.approx.ftz.f32":
                out = np.exp2(f[0].astype(np.float64)).astype(F32)
            elif opcode == "rcp.approx.ftz.f32":  # denormal inputs flushed to zero
                b = np.where(np.abs(f[0]) < np.float32(1.17549435e-38), np.copysign(F32(0), f[0]), f[0])
                out = (1.0 / b.astype(np.float64)).astype(F32)
            else:
                raise AssertionError(f"the interpreter has no {opcode}: teach it, or keep the sequence to these")
        regs[d] = out.astype(np.float64) if d.startswith("%fd") else out.astype(F32) if d.startswith("%f") else out
    return regs


def run_math(name: str, *xs: np.ndarray) -> np.ndarray:
    """The PTX that ``_ptxmath.<name>`` emits for float32 registers, run on ``xs``."""
    ir = (("elementwise", (1,), None, (("array", (1,), "<f4", (1,)),), (("exp", (), (1,), "<f4", (("i", 0),)),),
           (0,)))
    fn = _ptxwriter._Fn(ir, _ir.Layout(ir))
    srcs = [fn.reg("f") for _ in xs]
    out = getattr(_ptxmath, name)(fn, *srcs)
    regs = interpret(fn.lines, {r: x.astype(F32) for r, x in zip(srcs, xs, strict=True)}, xs[0].size)
    return regs[out]


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 steps (0 for two NaNs; inf = 1 step past the largest float)."""
    def ordered(v):
        i = v.astype(F32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    d = np.abs(ordered(a) - ordered(b))
    return np.where(np.isnan(a) & np.isnan(b), 0, d)


def _sample(lo: float, hi: float, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, n).astype(F32)


def _every_kth_float(k: int = 997) -> np.ndarray:
    return np.arange(0, 2**32, k, dtype=np.uint64).astype(np.uint32).view(F32)


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 1e-45, -1e-45, 1e-40, 1.17549435e-38,
                    88.72283, 88.7229, 89.0, 1e30, -87.33655, -103.97208, -103.98, -104.0, -1e30, 3.4028235e38,
                    0.5, 2.0, 1e-8], F32)


def _check(name: str, reference, x: np.ndarray, limit: int) -> None:
    with np.errstate(all="ignore"):
        want = reference(x.astype(np.float64)).astype(F32)
    got = run_math(name, x)
    assert np.array_equal(np.isnan(got), np.isnan(want)), x[np.isnan(got) != np.isnan(want)][:5]
    u = ulps(got, want)
    worst = int(np.argmax(u))
    assert u.max() <= limit, f"{name}({x[worst]!r}) = {got[worst]!r}, want {want[worst]!r}: {u.max()} ulp"


@pytest.mark.parametrize("lo, hi", [(-104.0, 89.0), (-1.0, 1.0), (-0.01, 0.01), (-105.0, -85.0), (80.0, 90.0)])
def test_exp_f32_is_within_one_ulp(lo, hi):
    _check("expf", np.exp, _sample(lo, hi, 1_000_000, seed=abs(int(lo * 7 + hi))), 1)


def test_exp_f32_special_values_and_a_sweep_of_every_binade():
    _check("expf", np.exp, SPECIAL, 1)  # 88.72283 (just below overflow) is 1 ulp off, the rest exact
    _check("expf", np.exp, _every_kth_float(), 1)
    got = run_math("expf", SPECIAL)
    assert got[3] == 0 and got[2] == np.inf and np.isnan(got[4]) and np.isnan(got[5]) and got[0] == got[1] == 1
    assert got[8] == got[9] == got[10] == got[11] == 1 and got[13] == got[14] == got[15] == got[21] == np.inf
    assert got[17] == np.float32(1e-45) and got[18] == got[19] == got[20] == 0  # the last denormal, then 0


@pytest.mark.parametrize("lo, hi", [(0.0, 10.0), (0.5, 2.0), (0.9, 1.1), (0.0, 1e-37), (1e30, 3e38)])
def test_log_f32_is_within_one_ulp(lo, hi):
    _check("logf", np.log, _sample(lo, hi, 1_000_000, seed=int(hi)), 1)


def test_log_f32_special_values_and_a_sweep_of_every_binade():
    _check("logf", np.log, SPECIAL, 1)
    _check("logf", np.log, _every_kth_float(), 1)
    got = run_math("logf", SPECIAL)
    assert got[0] == -np.inf and got[1] == -np.inf and got[2] == np.inf and np.isnan(got[3]) and np.isnan(got[7])


def test_tanh_f32_sequence_with_exact_exp2_and_reciprocal():
    """CUDA's tanhf structure (the hardware's approximate ex2/rcp add their own error: the GPU test measures
    that); here with exact ones it is within 2 ulp, and odd, saturating and NaN-propagating."""
    x = np.concatenate([_sample(-10, 10, 500_000, seed=3), _sample(-0.7, 0.7, 500_000, seed=4), SPECIAL])
    _check("tanhf", np.tanh, x, 2)


def test_f32_division_is_correctly_rounded():
    """The straight-line float32 division equals NumPy's (IEEE) a / b bit for bit: random bit patterns, normal
    operands, quotients next to a float32 midpoint (b * m for an odd 25-bit m), denormal quotients, overflow,
    and zeros, infinities and NaNs; with a reciprocal approximation worse than the hardware's."""
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**32, (2, 6000), dtype=np.uint64).astype(np.uint32).view(F32)
    normal = rng.standard_normal((2, 3000)).astype(F32)
    b = (rng.integers(2**23, 2**24, 3000) * 2.0 ** rng.integers(-30, 30, 3000)).astype(F32)
    m = (2 * rng.integers(2**23, 2**24, 3000) + 1) * 2.0**-24
    near = np.stack([(b.astype(np.float64) * m).astype(F32), b])
    tiny = np.stack([(rng.uniform(1, 2, 3000) * 2.0**-120).astype(F32),
                     (rng.uniform(1, 2, 3000) * 2.0 ** rng.integers(5, 40, 3000)).astype(F32)])
    s = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1.0, -2.5, 1e-45, 3e38], F32)
    special = np.stack(np.meshgrid(s, s)).reshape(2, -1)
    a, b = np.concatenate([bits, normal, near, tiny, special], axis=1)
    got = run_math("divf", a, b)
    with np.errstate(all="ignore"):
        want = a / b
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = zip(a[~same], b[~same], got[~same], want[~same], strict=True)
    assert same.all(), [(x, y, g, w) for x, y, g, w in bad][:5]


# -- whole kernels on the PTX simulator (tests/unit/_ptxsim.py) against NumPy -------------------------------
def simulated(*tensors, launches=()):
    """Run each fused group of ``tensors``' program (its inputs: leaves, any strides) as emitted PTX on the
    simulator, with its launch shape and each of ``launches`` (grid, block); yields (outputs, NumPy's outputs
    from the CPU backend, (grid, block)) per group and launch."""
    p = plan([t.node for t in tensors])
    groups = [g for g in p.groups if g.kind in ("elementwise", "reduce")]
    assert groups
    for g in groups:
        assert all(i.op in ("const", "full") for i in g.inputs)
        ir = _ir.group_ir(g, p, [leaf_value(i) for i in g.inputs])
        assert ir is not None
        text = _ptx.emit(ir)
        args = [(np.uint8(bool(i.attrs[0])) if i.dtype == np.bool_ else i.dtype.type(i.attrs[0]))
                if i.op == "full" else leaf_value(i) for i in g.inputs]
        want = [rt.Tensor(o).numpy() for o in g.outputs]
        for grid, block in [cg.launch_shape(ir), *launches]:
            outs = [np.empty(o.shape, o.dtype) for o in g.outputs]
            _ptxsim.run(text, (grid,), (block,), [*args, *outs])
            yield outs, want, (grid, block)


def check_exact(*tensors, launches=()):
    for outs, want, shape in simulated(*tensors, launches=launches):
        for got, w in zip(outs, want, strict=True):
            assert got.dtype == w.dtype and got.shape == w.shape
            if w.dtype.kind == "f":
                same = (got.view(f"u{w.itemsize}") == w.view(f"u{w.itemsize}")) | (np.isnan(got) & np.isnan(w))
                assert same.all(), f"launch {shape}: got {got[~same][:4]}, want {w[~same][:4]}"
            else:
                np.testing.assert_array_equal(got, w, err_msg=f"launch {shape}")


def check_close(*tensors, launches=(), rtol=1e-6, atol=1e-7):
    for outs, want, shape in simulated(*tensors, launches=launches):
        for got, w in zip(outs, want, strict=True):
            assert got.dtype == w.dtype and got.shape == w.shape
            np.testing.assert_allclose(got, w, rtol=rtol, atol=atol, err_msg=f"launch {shape}")


def arr(rng, shape, dtype=np.float32):
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-4, 4, shape))).astype(dtype)


ODD = [(1, 1), (2, 33), (3, 100)]  # one thread; a partial warp; a block of 3 warps and a partial one


def test_sim_float_elementwise_with_strides_broadcasts_and_specials():
    rng = np.random.default_rng(1)
    base = arr(rng, (14, 9))
    base[0, :5] = [np.nan, np.inf, -np.inf, 0.0, 1e-40]
    x = rt.asarray(base[::2, 1:8])  # (7, 7): strided rows and columns
    b, c = rt.asarray(arr(rng, (7,))), rt.asarray(arr(rng, (7, 1)))
    check_exact(rt.maximum(x * 1.5 + b, -x) / (abs(c) + 1.0) - rt.minimum(x, 0.25), launches=ODD)
    y = rt.asarray(arr(rng, (30, 6), np.float64)[::-1].T)  # negative and transposed strides
    check_exact(rt.sqrt(abs(y)) - y / 3.0 + rt.where(y > 0, y, y * 2), launches=[(1, 64)])


def test_sim_unrolled_elementwise_covers_every_element():
    rng = np.random.default_rng(2)
    x = rt.asarray(arr(rng, (41, 53)))  # 2173 elements: several tiles, a ragged last one
    check_exact(x * 2.0 - 1.0, launches=[(1, 32), (5, 7)])


def test_sim_exp_log_tanh():
    rng = np.random.default_rng(3)
    a = arr(rng, (6, 11))
    a[0, :6] = [0.0, -np.inf, np.inf, np.nan, 88.0, -100.0]
    x = rt.asarray(a)
    check_close(rt.exp(x), rt.log(abs(x)), rt.tanh(x), rtol=3e-7, atol=0)


@pytest.mark.parametrize("dtype", INTS + ("bool",))
def test_sim_integer_and_bool_elementwise(dtype):
    rng = np.random.default_rng(4)
    if dtype == "bool":
        a, b = rng.random((5, 6)) > 0.5, rng.random((6,)) > 0.5
        x, y = rt.asarray(a), rt.asarray(b)
        check_exact(x + y, x * y, rt.maximum(x, y), rt.minimum(x, y), x < y, x == y, abs(x),
                    rt.where(x, y, y == x), x.astype(np.float64), x + 1, launches=[(1, 7)])
        return
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (5, 6), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (6,), dtype=dtype, endpoint=True)
    a[0, :2] = [info.min, info.max]
    x, y = rt.asarray(a), rt.asarray(b)
    check_exact(x + y, x - y, x * y, -x, abs(x), rt.maximum(x, y), rt.minimum(x, y), x < y, x >= y,
                rt.where(x > y, x, y), x.astype(np.float32), x.astype(np.int8), x.astype(np.uint32), x.astype(bool),
                x * 3 - 1, launches=[(1, 7)])


def test_sim_mixed_types_and_casts():
    rng = np.random.default_rng(5)
    i = rt.asarray(rng.integers(-1000, 1000, (4, 9)).astype(np.int32))
    u = rt.asarray(rng.integers(0, 2**32, (9,), dtype=np.uint32))
    f = rt.asarray(arr(rng, (4, 1)))
    w = rt.asarray(rng.integers(-(2**40), 2**40, (4, 9), dtype=np.int64))
    check_exact(i + f, i / u, i < u, w == u, (w > 0) + (i < 0), i * 2.5, u - f, (f * 10).astype(np.int16),
                abs(f * 50).astype(np.uint8), w.astype(np.float32))


def test_sim_per_row_output():
    rng = np.random.default_rng(6)
    x, z = rt.asarray(arr(rng, (6, 7))), rt.asarray(arr(rng, (6, 1)))
    row = z + 1.0
    check_exact(x * row, row, launches=ODD)


@pytest.mark.parametrize("program, shape", [
    (lambda x: rt.softmax(x, axis=-1), (9, 10)),          # short rows: lanes of a warp per row
    (lambda x: rt.softmax(x, axis=-1), (3, 150)),         # long rows: a block per row
    (lambda x: rt.softmax(x, axis=0), (40, 3)),           # a strided reduced axis
    (lambda x: rt.logsumexp(x, axis=1), (5, 33)),
    (lambda x: x.astype(np.float64).mean(axis=(0, 2), keepdims=True), (3, 4, 5)),
    (lambda x: (x * 2 - 1).max(axis=(1, 2)) + 1, (3, 4, 5)),
    (lambda x: x.min(), (7, 9)),
    (lambda x: (x - x.mean(-1, keepdims=True)) / rt.sqrt(((x - x.mean(-1, keepdims=True))
                                                           * (x - x.mean(-1, keepdims=True))).mean(-1, keepdims=True)
                                                          + 1e-5), (4, 37)),
])
def test_sim_float_reductions(program, shape):
    rng = np.random.default_rng(7)
    x = rt.asarray(arr(rng, shape))
    check_close(program(x), launches=ODD, rtol=2e-6, atol=1e-6)


def test_sim_integer_and_bool_reductions():
    rng = np.random.default_rng(8)
    i = rt.asarray(rng.integers(-50, 50, (6, 40)).astype(np.int32))
    u = rt.asarray(rng.integers(0, 255, (40, 6)).astype(np.uint8))
    f = rt.asarray(arr(rng, (6, 40)))
    for t in (i.sum(axis=1), i.max(axis=0), u.max(axis=1), (f > 0).max(axis=1), (f > 0).min(axis=1),
              (f > -2).min(axis=0), (f > 0).sum(axis=1), (i * 3 > 1).sum(axis=1), i.mean(axis=1)):
        check_exact(t, launches=[(1, 1), (2, 33)])


def test_sim_two_reductions_at_one_level_and_a_per_element_output():
    rng = np.random.default_rng(9)
    x = rt.asarray(arr(rng, (3, 200)))
    hi, lo = x.max(axis=1, keepdims=True), x.min(axis=1, keepdims=True)
    check_close((x - lo) / (hi - lo), launches=[(1, 1000), (2, 64)])
