"""rxcuda.tensor.block: a tensor program traced into a Block (ports, parameters, kernels, retrace tiers), on the
null driver (kernels compile through NVRTC; nothing runs)."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
import rxcuda.tensor as rt
from rxcuda.cuda import NullDriver
from rxcuda.lowlevel import RegionNodePlan


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
    with pytest.raises(ValueError, match="rxcuda.libraries.gemm"):
        rt.block(lambda a, b: a @ b, a=rt.input((4, 4)), b=rt.input((4, 4)))
    with pytest.raises(ValueError, match="pass it as an input"):
        rt.block(lambda x: x + rt.tensor(np.ones(4, np.float32)).to("cuda"), x=rt.input(4))
    with pytest.raises(ValueError, match="not a value a kernel computes"):
        rt.block(lambda x: (x + 1, x.T), x=rt.input((2, 3)))
    with pytest.raises(ValueError, match="not used"):
        rt.block(lambda x, s: x + 1, x=rt.input(4), s=2.0)
    with pytest.raises(ValueError, match="positive"):
        rt.input((0, 3))
