"""Defects a new user hit when trying rxcuda (issue "One house for the next rounds"), each pinned by a test on the
null driver: the error a user gets names the thing and the fix, and the engine is left as it was."""

from __future__ import annotations

import numpy as np
import pytest
from _pipeline import add, mul

import rxcuda
from rxcuda import BlockBuilder, Follow, Reduce
from rxcuda.model._errors import NotAPortError, RxcudaError, ValidationError

ROWSUM = r'''
extern "C" __global__ void rowsum(const float* x, float* s, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) { float acc = 0.0f; for (int c = 0; c < cols; ++c) acc += x[r * cols + c]; s[r] = acc; }
}'''


def _composite():
    c = rxcuda.Composite("pair")
    c.add(mul(64, name="m1"), "m1")
    c.expose("x", c.members["m1"]["x"])
    c.expose("out", c.members["m1"]["out"])
    return c


# 1 and 2: a block or a composite instance given whole where a port belongs
@pytest.mark.parametrize("side", ["src", "dst"])
def test_connect_a_whole_block_is_a_not_a_port_error_naming_its_ports(engine, side):
    a, m = engine.add(add(64)), engine.add(mul(64))
    args = (a, m["x"]) if side == "src" else (a["out"], m)
    with pytest.raises(NotAPortError, match=r"name one of its ports, e\.g\. (add\['a'\]|mul\['x'\]) \(ports: ") as e:
        engine.connect(*args)
    assert isinstance(e.value, TypeError)
    assert engine.connections == ()


@pytest.mark.parametrize("side", ["src", "dst"])
def test_connect_a_whole_composite_instance_is_a_not_a_port_error(engine, side):
    a, inst = engine.add(add(64)), engine.add(_composite())
    args = (a["out"], inst) if side == "dst" else (inst, a["a"])
    with pytest.raises(NotAPortError, match=r"e\.g\. pair\['x'\] \(ports: x, out\)"):
        engine.connect(*args)
    engine.connect(a["out"], inst["x"])  # the port itself connects
    assert len(engine.connections) == 1


# 3: a Follow() input takes the shape that feeds it, also when the element count differs
def _rowsum(rule):
    b = BlockBuilder("rowsum")
    k = b.add_kernel(rxcuda.compile_cuda(ROWSUM, arch="sm_90"), over="s", block=64)
    b.input("x", k["x"], shape=(480, 640), rule=rule)
    b.output("s", k["s"], shape=Reduce("x", axis=1))
    b.scalar("rows", k["rows"], size_of=("x", 0))
    b.scalar("cols", k["cols"], size_of=("x", 1))
    return b.build()


def test_a_follow_input_declared_with_another_size_takes_what_feeds_it(engine):
    src, dst = engine.add(add(128)), engine.add(mul(64))  # from_kernel's first input follows
    engine.connect(src["out"], dst["x"])  # 128 elements into a port declared with 64
    rng = np.random.default_rng()
    engine.write(src["a"], rng.standard_normal(128).astype(np.float32))
    engine.write(src["b"], rng.standard_normal(128).astype(np.float32))
    assert engine.tick().state == "ok", engine.diagnostic_log
    assert engine.shape(dst["x"]) == (128,) and engine.shape(dst["out"]) == (128,)


def test_a_follow_input_of_two_axes_takes_a_2d_shape_of_another_count(engine):
    src = BlockBuilder("src")
    k = src.add_kernel(rxcuda.compile_cuda(ROWSUM, arch="sm_90"), over="s", block=64)
    src.input("x", k["x"], shape=(100, 6))
    src.output("s", k["s"], shape=(100,))
    src.scalar("rows", k["rows"], size_of=("x", 0))
    src.scalar("cols", k["cols"], size_of=("x", 1))
    producer = engine.add(src.build())
    rowsum = engine.add(_rowsum(Follow()))
    engine.connect(producer["s"], rowsum["x"])  # 100 elements into a port declared (480, 640)
    assert engine.connections[-1].dst.name == "x"


def test_a_fixed_input_of_another_size_is_still_refused(engine):
    src = engine.add(add(128))
    rowsum = engine.add(_rowsum(None))
    with pytest.raises(ValidationError, match="sizes differ"):
        engine.connect(src["out"], rowsum["x"])
    assert engine.connections == ()


# 7: the diagnostic log is a sequence
def test_diagnostic_log_can_be_sliced(engine):
    engine.add(add(64, name="v"))
    engine.tick()  # v.a and v.b are fed by nothing: a warning names them
    log = engine.diagnostic_log
    assert isinstance(log, tuple)
    assert log[-1:] == (log[-1],) and log[:0] == ()


# 9: a parameter's declared range is read-only
def test_parameter_range_is_read_only():
    b = rxcuda.Block.from_kernel(_scalar_mul(), size=64, ranges={"scale": (0.0, 10.0)})
    p = b.params["scale"]
    assert (p.min, p.max) == (0.0, 10.0)
    for attr in ("min", "max", "step"):
        with pytest.raises(AttributeError):
            setattr(p, attr, 100.0)
    with pytest.raises(ValueError, match="scale"):
        p.value = 50.0
    assert p.value == 1.0


def _scalar_mul():
    from _pipeline import MUL

    return MUL


# 8 is the tensor package's; the base class is the one users catch
def test_validation_errors_are_rxcuda_errors():
    assert issubclass(NotAPortError, RxcudaError) and issubclass(NotAPortError, TypeError)


# 10: a replacement that would read host-written bytes as another element type
def test_replace_refuses_a_host_written_input_of_another_element_type(engine):
    from _pipeline import IMUL, MUL

    old = engine.add(rxcuda.Block.from_kernel(MUL, size=64, name="m"))
    data = np.random.default_rng().standard_normal(64).astype(np.float32)
    engine.write(old["x"], data)
    engine.tick()
    new = rxcuda.Block.from_kernel(IMUL, size=64, name="m2")
    with pytest.raises(ValidationError, match=r"'x' holds data written from the host as f32, but m2\.x is i32.*"
                                              r"engine\.write\(m2\['x'\], array\.astype"):
        engine.replace(old, new)
    assert engine.blocks == (old,) and new._engine is None  # nothing changed
    assert engine.tick().state == "ok"
    same_type = rxcuda.Block.from_kernel(MUL, size=64, name="m3", scale=2.0)
    engine.replace(old, same_type)  # an f32 replacement takes the written data as it is
    assert engine.blocks == (same_type,)
