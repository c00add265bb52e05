"""rxcuda.tensor.block: a tensor program traced into a Block (ports, parameters, kernels, GEMM calls, retrace
tiers, in regions and composites), on the null driver (kernels compile through NVRTC; nothing runs; cuBLAS is a
stand-in that notes each GEMM it is asked for)."""

from __future__ import annotations

import types

import numpy as np
import pytest

import rxcuda
import rxcuda.tensor as rt
from rxcuda.cuda import NullDriver
from rxcuda.libraries import _blas
from rxcuda.lowlevel import CallNodePlan, KernelNodePlan, RegionNodePlan
from rxcuda.model._describe import CallSpec


@pytest.fixture
def engine():
    e = rxcuda.Engine(driver=NullDriver())
    yield e
    e.close()


def prog(x, y, scale):
    return rt.softmax(x * scale, axis=-1) + y.T.sum(axis=0, keepdims=True)


def make():
    return rt.block(prog, x=rt.input((8, 16), "f32"), y=np.zeros((16, 8), np.float32), scale=2.0)


def test_ports_parameters_internal_buffers_and_one_kernel_per_fused_group():
    blk = make()
    assert blk.name == "prog"
    assert [p.name for p in blk.inputs] == ["x", "y"] and [p.name for p in blk.outputs] == ["out"]
    assert blk["x"].spec.shape == (8, 16) and blk["y"].spec.shape == (16, 8) and blk["out"].spec.dtype == "f32"
    assert blk.params["scale"].value == 2.0 and blk.params["scale"].dtype == "f32"
    x, y = rt.tensor(np.zeros((8, 16), np.float32)), rt.tensor(np.zeros((16, 8), np.float32))
    groups = [g for g in rt.plan([prog(x, y, rt.full((), 2.0, np.float32)).node]).groups if g.kind != "view"]
    assert blk.kernels == len(groups) == len(blk.description.kernels) == 3
    assert len(blk.description.internals) == 2  # softmax and the column sums feed the last kernel


def test_literals_are_baked_and_parameters_do_not_merge_with_equal_literals():
    blk = rt.block(lambda x, s: x * s + 2.0, x=rt.input(64), s=2.0)
    (k,) = blk.description.kernels
    assert [p.name for p in k.code.signature.params if not p.is_pointer] == ["s1"]
    assert blk.params["s"].value == 2.0


def test_outputs_as_tuple_and_dict():
    blk = rt.block(lambda x: (x + 1, (x * 2).sum()), x=rt.input(32))
    assert [p.name for p in blk.outputs] == ["out0", "out1"] and blk["out1"].spec.count == 1
    blk = rt.block(lambda x: {"a": x + 1, "b": rt.exp(x)}, x=rt.input(32, "f64"))
    assert [p.name for p in blk.outputs] == ["a", "b"] and blk["a"].spec.dtype == "f64"


def test_in_an_engine_hot_update_code_tier_and_structure_tier(engine):
    blk = engine.add(make())
    engine.write(blk["x"], np.ones((8, 16), np.float32))
    engine.write(blk["y"], np.ones((16, 8), np.float32))
    assert engine.tick().state == "ok", engine.diagnostic_log
    rebuilds = engine.rebuilds
    blk.params["scale"].value = 3.0
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == rebuilds
    # a literal edited: same layouts -> the changed kernel's code is swapped in
    assert blk.retrace(lambda x, y, scale: rt.softmax(x * scale, axis=-1) + y.T.sum(axis=0, keepdims=True) * 2) \
        == "code"
    assert blk.last_change == "code of k2"
    assert engine.tick().tiers == ("code",) and engine.rebuilds == rebuilds
    assert blk.retrace(blk.fn) is None  # the same program: nothing to do
    # another program: a kernel more -> the block takes the new description and the engine rebuilds
    assert rt.update(blk, lambda x, y, scale: rt.exp(prog(x, y, scale)).sum(axis=-1) + 0) == "structure"
    assert blk.last_change.startswith("kernels") and blk["out"].spec.shape == (8,)
    frame = engine.tick()
    assert frame.tiers == ("structure",) and engine.rebuilds == rebuilds + 1 and blk.state == "ok"
    assert blk.params["scale"].value == 3.0  # carried over


def test_retrace_out_of_an_engine_changes_the_description_in_place():
    blk = rt.block(lambda x, s: x * s, x=rt.input(16), s=1.5)
    assert blk.retrace(lambda x, s: (x * s).sum()) == "structure" and blk["out"].spec.count == 1
    assert blk.params["s"].value == 1.5


def test_inside_a_for_region(engine):
    blk = rt.block(lambda x, s: x * s + 1, x=rt.input(64), s=0.5)
    loop = engine.add(rxcuda.For(3, [blk]))
    engine.write(blk["x"], np.ones(64, np.float32))
    assert engine.tick().state == "ok", engine.diagnostic_log
    gp = rxcuda.plan(engine.describe())
    region = next(n for n in gp.nodes if isinstance(n, RegionNodePlan))
    k = next(n for n in gp.nodes if n.label.endswith("/k0"))
    assert gp.parents[k.id] == (region.id, 0)
    loop.params["n"].value = 5
    blk.params["s"].value = 2.0
    rebuilds = engine.rebuilds
    engine.tick()
    assert engine.rebuilds == rebuilds


@pytest.mark.parametrize("spec", ["x", [1, 2], None, {"shape": (2,)}])
def test_an_input_spec_that_is_not_a_shape_or_array(spec):
    with pytest.raises(TypeError, match="input spec"):
        rt.block(lambda x: x + 1, x=spec)


def test_a_scalar_argument_of_a_non_number_type():
    with pytest.raises(TypeError, match="bool"):
        rt.block(lambda x, s: x * s, x=rt.input(4), s=True)
    with pytest.raises(TypeError, match="is a complex"):
        rt.block(lambda x, s: x * s, x=rt.input(4), s=1j)


def test_a_program_returning_a_non_tensor():
    with pytest.raises(TypeError, match="returns a Tensor"):
        rt.block(lambda x: 3.0, x=rt.input(4))
    with pytest.raises(TypeError, match="output 'out1' is a int"):
        rt.block(lambda x: (x + 1, 2), x=rt.input(4))


def test_what_is_not_yet_in_blocks_says_so():
    with pytest.raises(ValueError, match="pass it as an input"):
        rt.block(lambda x: x + rt.tensor(np.ones(4, np.float32)).to("cuda"), x=rt.input(4))
    with pytest.raises(ValueError, match="not a value a kernel computes"):
        rt.block(lambda x: (x + 1, x.T), x=rt.input((2, 3)))
    with pytest.raises(ValueError, match="not used"):
        rt.block(lambda x, s: x + 1, x=rt.input(4), s=2.0)
    with pytest.raises(ValueError, match="positive"):
        rt.input((0, 3))


# -- matmul: one cuBLAS GEMM call per matmul -----------------------------------------------------------------------
class FakeCublas:
    """Stands in for nvmath.bindings.cublas under the null driver: notes every gemm_ex with its arguments."""

    def __init__(self):
        self.gemms: list[dict] = []

    def set_stream(self, handle, stream):
        pass

    def set_workspace(self, handle, ptr, nbytes):
        pass

    def set_pointer_mode(self, handle, mode):
        pass

    def gemm_ex(self, h, opb, opa, n, m, k, alpha, b, tb, ldb, a, ta, lda, beta, c, tc, ldc, compute, algo):
        self.gemms.append(dict(opb=opb, opa=opa, n=n, m=m, k=k, ldb=ldb, lda=lda, ldc=ldc, a=a, b=b, c=c,
                               alpha=alpha))


@pytest.fixture
def cublas(monkeypatch):
    """cuBLAS faked for the engine on the null driver: the calls' setup makes no handle or workspace, and the
    captured record issues its gemm_ex to a FakeCublas (which the test reads)."""
    fake = FakeCublas()
    monkeypatch.setattr("rxcuda.libraries._handles.binding", lambda name: fake)
    state = types.SimpleNamespace(extra={"handle": 1, "workspace": types.SimpleNamespace(ptr=0, nbytes=0),
                                         "zero": 0x5EED}, close=lambda: None)
    monkeypatch.setattr(_blas, "_blas_setup", lambda workspace, zero, device: state)
    return fake


def mlp(x, w1, b1, w2, b2):
    return rt.softmax(rt.maximum(x @ w1 + b1, 0) @ w2 + b2, axis=-1)


MLP = dict(x=rt.input((8, 16)), w1=rt.input((16, 32)), b1=rt.input(32), w2=rt.input((32, 4)), b2=rt.input(4))


def write_all(engine, blk, specs=MLP):
    for name, spec in specs.items():
        engine.write(blk[name], np.ones(spec.shape, np.float32))


def steps(blk):
    return [(type(s).__name__, s.name) for s in blk.description.kernels]


def test_each_matmul_is_one_gemm_call_between_the_generated_kernels():
    blk = rt.block(mlp, **MLP)
    assert steps(blk) == [("LibraryCall", "gemm0"), ("KernelSpec", "k0"), ("LibraryCall", "gemm1"),
                          ("KernelSpec", "k1")]
    assert blk.kernels == 2 and blk.calls == 2
    g0, g1 = (blk.description.kernel(n) for n in ("gemm0", "gemm1"))
    # (m, n, k), dtype, no transposes
    assert g0.key[1:4] == (8, 32, 16) and g1.key[1:4] == (8, 4, 32)
    assert g0.key[5:9] == ("f32", "f32", False, False)
    d = blk.description
    assert [(p.name, p.direction, p.shape) for p in d.ports] == [
        ("x", "in", (8, 16)), ("w1", "in", (16, 32)), ("b1", "in", (32,)), ("w2", "in", (32, 4)),
        ("b2", "in", (4,)), ("out", "out", (8, 4))]
    assert [p.pins[0].kernel for p in d.ports] == ["gemm0", "gemm0", "k0", "gemm1", "k1", "k1"]
    # x @ w1 -> k0 (+ b1, relu) -> gemm1 -> k1 (+ b2, softmax)
    assert [(i.name, i.writer.kernel, [r.kernel for r in i.readers], i.count) for i in d.internals] == [
        ("gemm0.c", "gemm0", ["k0"], 8 * 32), ("k0.out0", "k0", ["gemm1"], 8 * 32), ("gemm1.c", "gemm1", ["k1"], 8 * 4)]
    # each GEMM's alpha is a parameter of its own (a device scalar): no user parameter appears uninvited
    assert {n: (blk.params[n].value, blk.params[n].dtype) for n in blk.params} == {
        "gemm0_alpha": (1.0, "f32"), "gemm1_alpha": (1.0, "f32")}


def test_a_transpose_operand_sets_the_op_flag_instead_of_a_copy(engine, cublas):
    ta = rt.block(lambda x, w: x.T @ w, x=rt.input((16, 8)), w=rt.input((16, 4)))
    tb = rt.block(lambda x, w: (x @ w.T) * 2, x=rt.input((8, 16)), w=rt.input((4, 16)))
    assert steps(ta) == [("LibraryCall", "gemm0")]  # no kernel copies the transpose
    assert ta.description.kernel("gemm0").key[1:9] == (8, 4, 16, 1, "f32", "f32", True, False)
    assert tb.description.kernel("gemm0").key[1:9] == (8, 4, 16, 1, "f32", "f32", False, True)
    ta, tb = engine.add(ta), engine.add(tb)
    write_all(engine, ta, {"x": rt.input((16, 8)), "w": rt.input((16, 4))})
    write_all(engine, tb, {"x": rt.input((8, 16)), "w": rt.input((4, 16))})
    assert engine.tick().state == "ok", engine.diagnostic_log
    # row-major C = op(A) @ op(B) issued as column-major C^T = op(B)^T @ op(A)^T: (opb, opa, n, m, k)
    by = {(g["opb"], g["opa"]): g for g in cublas.gemms}
    a_t, b_t = by[(0, 1)], by[(1, 0)]
    assert (a_t["n"], a_t["m"], a_t["k"], a_t["lda"], a_t["ldb"], a_t["ldc"]) == (4, 8, 16, 8, 4, 4)
    assert (b_t["n"], b_t["m"], b_t["k"], b_t["lda"], b_t["ldb"], b_t["ldc"]) == (4, 8, 16, 16, 16, 4)


def test_a_vector_operand_is_a_matrix_of_one_row_or_column():
    cases = [((16,), (16, 4), (1, 4, 16), (4,)), ((3, 16), (16,), (3, 1, 16), (3,)), ((16,), (16,), (1, 1, 16), (1,))]
    for sa, sb, mnk, out in cases:
        blk = rt.block(lambda a, b: a @ b, a=rt.input(sa), b=rt.input(sb))
        assert blk.description.kernel("gemm0").key[1:4] == mnk and blk["out"].spec.shape == out, (sa, sb)


def test_the_same_input_on_both_sides_and_an_input_read_by_a_kernel_too():
    blk = rt.block(lambda x: (x @ x.T) + x.sum(axis=-1, keepdims=True), x=rt.input((8, 8)))
    x = blk.description.port("x")
    assert sorted((p.kernel, p.param) for p in x.pins) == [("gemm0", 0), ("gemm0", 1), ("k0", 0)]
    assert blk.description.kernel("gemm0").key[7:9] == (False, True)


def test_in_an_engine_gemm_alpha_hot_update_code_tier_next_to_a_gemm_and_structure(engine, cublas):
    blk = engine.add(rt.block(mlp, **MLP))
    write_all(engine, blk)
    assert engine.tick().state == "ok", engine.diagnostic_log
    assert [(g["m"], g["n"], g["k"]) for g in cublas.gemms] == [(8, 32, 16), (8, 4, 32)]
    rebuilds, captured = engine.rebuilds, len(cublas.gemms)
    blk.params["gemm1_alpha"].value = 0.5  # a device scalar: a small copy, no recapture
    assert engine.tick().tiers == ("parameters",) and len(cublas.gemms) == captured
    # an edited literal in the kernel after the second GEMM: its code is swapped in, the GEMMs stay
    edited = lambda x, w1, b1, w2, b2: rt.softmax((rt.maximum(x @ w1 + b1, 0) @ w2 + b2) * 0.5, axis=-1)  # noqa: E731
    assert blk.retrace(edited) == "code" and blk.last_change == "code of k1"
    assert engine.tick().tiers == ("code",) and engine.rebuilds == rebuilds and len(cublas.gemms) == captured
    assert blk.retrace(edited) is None
    # the relu's literal, between the two GEMMs: the same
    assert blk.retrace(lambda x, w1, b1, w2, b2: rt.softmax((rt.maximum(x @ w1 + b1, 0.1) @ w2 + b2) * 0.5,
                                                            axis=-1)) == "code"
    assert blk.last_change == "code of k0"
    assert engine.tick().tiers == ("code",) and engine.rebuilds == rebuilds
    # other GEMM shapes (the first 4 rows into the second GEMM): another call, a rebuild
    assert blk.retrace(lambda x, w1, b1, w2, b2: rt.softmax(rt.maximum(x @ w1 + b1, 0)[:4] @ w2 + b2,
                                                            axis=-1)) == "structure"
    assert blk.last_change == "call gemm1: gemm f32->f32 (4x32)@(32x4)" and blk["out"].spec.shape == (4, 4)
    assert engine.tick().tiers == ("structure",) and engine.rebuilds == rebuilds + 1 and blk.state == "ok"
    assert cublas.gemms[-1]["m"] == 4
    assert blk.params["gemm1_alpha"].value == 0.5  # carried over


def test_a_transpose_edited_in_is_another_gemm_call():
    blk = rt.block(lambda x, w: x @ w, x=rt.input((16, 16)), w=rt.input((16, 16)))
    assert blk.retrace(lambda x, w: x.T @ w) == "structure" and blk.last_change.startswith("call gemm0")
    assert blk.description.kernel("gemm0").key[7] is True
    assert blk.retrace(lambda x, w: rt.exp(x.T @ w)) == "structure"
    assert blk.last_change == "kernels gemm0 -> gemm0, k0"


def test_in_a_composite_the_kernels_and_gemms_are_nodes_of_the_frame_graph(engine, cublas):
    head = rxcuda.Composite("head")
    norm = head.add(rt.block(lambda x: x - x.mean(axis=-1, keepdims=True), x=rt.input((8, 16)), name="norm"))
    net = head.add(rt.block(lambda x, w1, b1, w2, b2, t: rt.softmax((rt.maximum(x @ w1 + b1, 0) @ w2 + b2) * t,
                                                                   axis=-1), name="mlp", t=1.0, **MLP))
    head.connect(norm["out"], net["x"])
    head.expose("x", norm["x"])
    head.expose("y", net["out"])
    for name in ("w1", "b1", "w2", "b2"):
        head.expose(name, net[name])
    head.expose_parameter("scale", net.params["gemm1_alpha"], value=2.0)
    head.expose_parameter("t", net.params["t"])
    one = engine.add(head)
    write_all(engine, one)
    assert engine.tick().state == "ok", engine.diagnostic_log
    assert [b.name for b in engine.blocks] == ["head/norm", "head/mlp"]
    gp = rxcuda.plan(engine.describe())
    assert [(type(n).__name__, n.label) for n in gp.nodes if isinstance(n, KernelNodePlan | CallNodePlan)] == [
        ("KernelNodePlan", "head/norm/k0"), ("CallNodePlan", "head/mlp/gemm0"), ("KernelNodePlan", "head/mlp/k0"),
        ("CallNodePlan", "head/mlp/gemm1"), ("KernelNodePlan", "head/mlp/k1")]
    assert one.members["mlp"].params["gemm1_alpha"].value == 2.0
    rebuilds = engine.rebuilds
    one.params["scale"].value = 0.5
    one.params["t"].value = 3.0
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == rebuilds


def test_in_an_if_region_with_its_flag_from_a_tensor_block(engine, cublas):
    flag = engine.add(rt.block(lambda x: x.max() > 0, x=rt.input((8, 16)), name="flag"))
    assert flag["out"].spec.dtype == "u8" and flag["out"].spec.count == 1  # a bool: one byte
    body = rt.block(mlp, **MLP)
    engine.add(rxcuda.If(flag["out"], [body]))
    engine.connect(body["out"], engine.add(rt.block(lambda y: y * 2, y=rt.input((8, 4)), name="after"))["y"])
    write_all(engine, body)
    engine.write(flag["x"], np.ones((8, 16), np.float32))
    assert engine.tick().state == "ok", engine.diagnostic_log
    gp = rxcuda.plan(engine.describe())
    region = next(n for n in gp.nodes if isinstance(n, RegionNodePlan))
    inside = [n.label for n in gp.nodes if gp.parents.get(n.id) == (region.id, 0)]
    assert inside == ["mlp/gemm0", "mlp/k0", "mlp/gemm1", "mlp/k1"]
    rebuilds = engine.rebuilds
    body.params["gemm0_alpha"].value = 2.0
    assert engine.tick().tiers == ("parameters",)
    # a kernel more (x centred before the first GEMM): rebuilt inside the region
    assert body.retrace(lambda x, w1, b1, w2, b2: mlp(x - x.mean(axis=-1, keepdims=True), w1, b1, w2, b2)) \
        == "structure"
    assert body.last_change == "kernels gemm0, k0, gemm1, k1 -> k0, gemm0, k1, gemm1, k2"
    assert engine.tick().tiers == ("structure",) and engine.rebuilds == rebuilds + 1
    # an edited literal in it: a Code-tier swap inside the region
    assert body.retrace(lambda x, w1, b1, w2, b2: mlp(x - x.mean(axis=-1, keepdims=True) * 0.5, w1, b1, w2, b2)) \
        == "code"
    assert engine.tick().tiers == ("code",) and engine.rebuilds == rebuilds + 1 and body.state == "ok"


def test_what_a_matmul_in_a_block_cannot_be_says_so():
    with pytest.raises(ValueError, match=r"matmul \(2, 4, 4\) @ \(4, 4\) .*batched.*reshape.*batch="):
        rt.block(lambda a, b: a @ b, a=rt.input((2, 4, 4)), b=rt.input((4, 4)))
    with pytest.raises(ValueError, match=r"the first operand \(4, 2\) is a view with element strides \(4, 1\).*"
                                         r"x\[:, :k\] \+ 0"):
        rt.block(lambda a, b: a[:, :2] @ b, a=rt.input((4, 4)), b=rt.input((2, 4)))
    with pytest.raises(ValueError, match=r"second operand \(2, 4\) is a view with element strides \(8, 1\)"):
        rt.block(lambda a, b: a @ b[::2], a=rt.input((4, 2)), b=rt.input((4, 4)))
    with pytest.raises(ValueError, match=r"the operands are f32 and f64.*astype"):
        rt.block(lambda a, b: a @ b, a=rt.input((4, 4)), b=rt.input((4, 4), "f64"))
    with pytest.raises(ValueError, match=r"the operands are int32 and int32.*f32, f64, f16"):
        rt.block(lambda a, b: a @ b, a=rt.input((4, 4), "i32"), b=rt.input((4, 4), "i32"))
    with pytest.raises(ValueError, match=r"second operand is a fill.*pass the matrix as an input"):
        rt.block(lambda a: a @ rt.ones((4, 4), np.float32, device="cuda"), a=rt.input((4, 4)))
    with pytest.raises(ValueError, match=r"a transpose of a fill \(4, 3\).*pass the array as an input"):
        rt.block(lambda a: a @ rt.ones((4, 3), np.float32, device="cuda").T, a=rt.input((2, 3)))
    with pytest.raises(ValueError, match="'gemm0_alpha' names the alpha parameter of the block's GEMM gemm0"):
        rt.block(lambda a, gemm0_alpha: a @ a * gemm0_alpha, a=rt.input((4, 4)), gemm0_alpha=2.0)
    with pytest.raises(ValueError, match="also read by a later kernel or GEMM"):
        rt.block(lambda a: (a @ a, (a @ a) @ a), a=rt.input((4, 4)))


def test_a_gemm_call_is_a_call_spec_the_engine_captures():
    blk = rt.block(lambda a, b: a @ b, a=rt.input((4, 8), "f64"), b=rt.input((8, 2), "f64"))
    (g,) = blk.description.kernels
    assert isinstance(g, CallSpec) and g.key[5:7] == ("f64", "f64") and blk.params["gemm0_alpha"].dtype == "f64"
    half = rt.block(lambda a, b: a @ b, a=rt.input((4, 8), "f16"), b=rt.input((8, 2), "f16"))
    assert half["out"].spec.dtype == "f16" and half.params["gemm0_alpha"].dtype == "f32"  # f32 accumulation
