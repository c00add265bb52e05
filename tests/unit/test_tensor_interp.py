"""The tensor interpreter (rxcuda/tensor/_interp.py) without a GPU: which groups it covers and how they translate,
its C++ (compiled by NVRTC here, its parameter block laid out as the host packs it), its launcher's packing read
back through the ``void**`` a driver would get (the null driver), and the factory's tier choice: interpreter
once it is built, PTX before and for groups it does not cover, the tuned build replacing it, a failed build of
the interpreter turning it off with a warning."""

from __future__ import annotations

import logging
import struct
from concurrent.futures import Future

import numpy as np
import pytest
from _blocks import BlockReading

import rxcuda.tensor as rt
from rxcuda.cuda import NullDriver
from rxcuda.cuda._kernels import load_module
from rxcuda.tensor import _factory, _interp, _ir
from rxcuda.tensor._passes import plan


def ir_of(*ys, arrays=None):
    p = plan([y.node for y in ys])
    (g,) = [g for g in p.groups if g.kind != "view"]
    return _ir.group_ir(g, p, arrays or [np.empty(i.shape, i.dtype) for i in g.inputs])


def t(shape=(8, 33), dtype=np.float32):
    return rt.tensor(np.ones(shape, dtype))


def decode(word: int) -> tuple:
    return _interp.OPS[word & 255], (word >> 8) & 255, (word >> 16) & 255, (word >> 24) & 255, (word >> 32) & 255


def test_an_expression_translates_to_one_instruction_per_node():
    x, y = t(), t()
    ir = ir_of(rt.exp(x * 1.5 + y) / 3.0)
    p = _interp.program(ir)
    assert p is not None and p.dtype == "f4" and p.size == 8 * 33
    assert p.inputs == tuple(i[0] == "array" for i in ir[3])
    nin = len(ir[3])
    ops = [decode(w) for w in p.code]
    assert [o[0] for o in ops] == [n[0] for n in ir[4]]
    assert [o[1] for o in ops] == list(range(nin, nin + len(ir[4])))  # node j writes register nin + j
    for (op, _d, a, b, _), node in zip(ops, ir[4], strict=True):
        regs = [r if w == "i" else nin + r for w, r in node[4]]
        assert [a, b][:len(regs)] == regs, (op, regs)
    assert p.outregs == (nin + ir[5][0],) and p.listing.endswith(f"out0 = r{nin + ir[5][0]}")


def test_comparisons_where_and_float64_translate():
    x, y = t(dtype=np.float64), t(dtype=np.float64)
    p = _interp.program(ir_of(rt.where(x > y, rt.maximum(x, y), -y)))
    assert p is not None and p.dtype == "f8"
    assert {decode(w)[0] for w in p.code} == {"gt", "maximum", "neg", "where"}
    where = [decode(w) for w in p.code if decode(w)[0] == "where"][0]
    gt = [decode(w) for w in p.code if decode(w)[0] == "gt"][0]
    assert where[2] == gt[1]  # the condition is the comparison's register


@pytest.mark.parametrize("why, build", [
    ("a reduction", lambda: ir_of(rt.sum(t() * 2.0, axis=1))),
    ("an integer group", lambda: ir_of(t(dtype=np.int32) + 1)),
    ("a boolean array operand", lambda: ir_of(rt.where(t(dtype=np.bool_), t(), 0.0))),
    ("a mixed-dtype group", lambda: ir_of(t() + t(dtype=np.float64))),
    ("a boolean output", lambda: ir_of(t() > 1.0)),
])
def test_groups_it_does_not_cover_are_left_to_the_ptx_tier(why, build):
    ir = build()
    assert ir is not None and _interp.program(ir) is None, why


def test_contiguous_inputs_are_read_at_the_index_others_through_their_strides():
    x, row, col = t((8, 33)), t((33,)), t((8, 1))
    p = _interp.program(ir_of(x * row + col))
    assert p is not None and p.shape == (8, 33)
    by_shape = {i[1]: s for i, s in zip(ir_of(x * row + col)[3], p.strides, strict=True) if i[0] == "array"}
    assert by_shape == {(8, 33): None, (33,): (0, 1), (8, 1): (1, 0)}
    transposed = np.empty((33, 8), np.float32).T  # element strides (1, 8)
    p = _interp.program(ir_of(rt.exp(x), arrays=[transposed]))
    assert p is not None and p.strides == ((1, 8),)
    odd = np.lib.stride_tricks.as_strided(np.empty((8, 33), np.float32), (8, 1, 33), (132, 4, 4))
    p = _interp.program(ir_of(rt.exp(t((8, 1, 33))), arrays=[odd]))
    assert p is not None and p.strides == (None,)  # a size-1 axis may have any stride


def test_the_static_block_holds_shape_and_strides():
    p = _interp.program(ir_of(t((8, 33)) * t((33,))))
    fields = struct.unpack_from(_interp._STATIC.format, p.static())
    n, nin, nout, ncode, arrays, linear, ndim = fields[:7]
    dims = fields[7 + _interp.MAX_OUTPUTS:7 + _interp.MAX_OUTPUTS + _interp.MAX_DIMS]
    strides = fields[7 + _interp.MAX_OUTPUTS + _interp.MAX_DIMS:][:_interp.MAX_INPUTS * _interp.MAX_DIMS]
    assert (n, nin, nout, ndim, dims[:2], dims[2:]) == (264, 2, 1, 2, (8, 33), (1,) * 4)
    k = p.strides.index((0, 1))
    assert arrays == 0b11 and linear == 0b11 ^ (1 << k)
    assert strides[k * _interp.MAX_DIMS:(k + 1) * _interp.MAX_DIMS] == (0, 1, 0, 0, 0, 0)


def test_too_many_axes_are_not_covered():
    assert _interp.program(ir_of(rt.exp(t((1,) * (_interp.MAX_DIMS + 1))))) is None


def test_too_many_nodes_are_not_covered():
    x = t()
    y = x
    for _ in range(_interp.MAX_NODES + 1):
        y = y * 1.0001
    assert _interp.program(ir_of(y)) is None


def test_the_parameter_block_is_the_size_the_compiled_kernel_takes():
    codes = _interp.compile_interpreter()
    assert set(codes) == {"f4", "f8"}
    for key, code in codes.items():
        (param,) = code.signature.params
        assert code.entry == _interp.ENTRIES[key] and param.size == _interp._SIZE
        assert code.image[:4] == b"\x7fELF"


def test_every_op_has_a_case_in_the_source():
    src = _interp.source()
    for k, op in enumerate(_interp.OPS):
        assert f"case {k}: v = " in src, op
    assert "rx_max<float>" in src and "expf(" in src and "exp((double)" in src


def test_the_launcher_packs_values_then_the_program():
    api = BlockReading(_interp._SIZE)
    function = load_module(b"x", api=api).function("rx_interp_f4")
    p = _interp.program(ir_of(rt.exp(t() * 1.5) + t()))
    assert p is not None and p.inputs.count(False) == 1
    launch = _interp.InterpLauncher(function, p, api=api, sms=4)
    args = [0x7F00_0000_1000 + 256 * k if a else 1.5 for k, a in enumerate(p.inputs)] + [0x7F00_0000_9000]
    launch(None, None, args, stream=0x55)
    (block,) = api.blocks
    values = struct.unpack_from("<" + "".join("Q" if a else "d" for a in p.inputs) + "Q", block, 0)
    assert list(values) == args
    assert block[_interp._STATIC_AT:] == p.static()
    n, nin, nout, ncode, arrays = struct.unpack_from("<q4I", block, _interp._STATIC_AT)
    assert (n, nin, nout, ncode) == (8 * 33, len(p.inputs), 1, len(p.code))
    assert arrays == sum(1 << k for k, a in enumerate(p.inputs) if a)
    ((_, (_, grid, block_dim, shared, stream)),) = [c for c in api.calls if c[0] == "cuLaunchKernel"]
    assert grid == (2, 1, 1) and block_dim == (256, 1, 1) and stream == 0x55  # ceil(264 / 256) blocks, <= 8 per SM


def _ready(codes) -> Future:
    f: Future = Future()
    f.set_result(codes)
    return f


def test_the_factory_answers_with_the_interpreter_once_it_is_built():
    x = t()
    ir = ir_of(rt.exp(x * 1.5 + 0.25) / 3.0)
    factory = _factory.KernelFactory(upgrade=True, interpret=True)
    factory._interpreter.append(Future())  # still building: the miss takes PTX, it does not wait
    assert factory.get(ir).code.cached == "ptx" and factory.ptx_misses == 1 and factory.interp_misses == 0
    factory = _factory.KernelFactory(upgrade=True, interpret=True)
    codes = factory.interpreter(wait=True)
    assert codes is not None
    kernel = factory.get(ir)
    assert factory.interp_misses == 1 and factory.ptx_misses == 0 and kernel.interp is not None
    assert kernel.code is codes["f4"] and "the tensor interpreter's program" in kernel.source
    function = load_module(b"x", api=NullDriver()).function("rx_interp_f4")
    assert isinstance(kernel.launcher(function, ("pointer",)), _interp.InterpLauncher)
    reduction = ir_of(rt.sum(x * 2.0, axis=1))
    assert factory.get(reduction).code.cached == "ptx" and factory.ptx_misses == 1


def test_the_tuned_build_replaces_the_interpreter(monkeypatch):
    ir = ir_of(rt.exp(t() * 1.5 + 0.25) / 3.0)
    factory = _factory.KernelFactory(upgrade=True, interpret=True)
    factory._interpreter.append(_ready(_interp.compile_interpreter()))
    kernel = factory.get(ir)
    kernel.function = "interpreter"
    loaded = []

    def load(code):
        loaded.append(code)
        return "module", "tuned"

    assert kernel.current(load) == "interpreter" and kernel.pending is None
    kernel.current(load)  # the second launch starts the tuned build
    assert factory.wait(120) == 0
    assert kernel.current(load) == "tuned" and kernel.interp is None and factory.upgrades == 1
    assert loaded[0].image[:4] == b"\x7fELF" and loaded[0].entry == _ir.ENTRY
    from rxcuda.cuda._kernels import KernelLauncher

    assert type(kernel.launcher(load_module(b"x", api=NullDriver()).function("k"), ("pointer",))) is KernelLauncher


def test_a_failed_interpreter_build_turns_it_off_with_a_warning(caplog):
    ir = ir_of(rt.exp(t() * 1.5))
    factory = _factory.KernelFactory(interpret=True)
    failed: Future = Future()
    failed.set_exception(RuntimeError("no NVRTC here"))
    factory._interpreter.append(failed)
    with caplog.at_level(logging.WARNING, logger="rxcuda"):
        kernel = factory.get(ir)
    assert kernel.code.cached == "ptx" and not factory.interpret
    assert "could not be built, new kernels take the PTX tier: RuntimeError: no NVRTC here" in caplog.text
    assert factory.interpreter() is None


def test_a_factory_that_does_not_interpret_never_builds_it():
    factory = _factory.KernelFactory(upgrade=True)
    factory.warm()
    assert factory.interpreter() is None and not factory._interpreter


def test_cuda_core_is_imported_on_the_callers_thread_before_the_compile_thread_starts():
    import subprocess
    import sys

    code = """
import sys
import concurrent.futures
from rxcuda.tensor import _factory
assert "cuda.core" not in sys.modules, "imported before: the test cannot tell"
seen = []
def imported():
    return "cuda.core" in sys.modules and "cuda.core.utils" in sys.modules
class Pool:
    def __init__(self, **options):
        seen.append(("made", imported()))
    def submit(self, fn):
        seen.append(("submit", imported()))
concurrent.futures.ThreadPoolExecutor = Pool
_factory.KernelFactory(interpret=True).warm()
print(seen)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('made', True), ('submit', True)]"  # not thread-safe: imported before the thread
