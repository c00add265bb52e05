"""A parameter that follows a shape (``Parameter.follows``: ``n`` of ``Block.from_kernel(..., size=)``, a scalar
declared with ``size_of``) reads the value the running graph passes, not a declared one that does not run; back
at the declared shape it reads its own value again (docs/shapes.md, docs/parameters.md)."""

from __future__ import annotations

import numpy as np

import rxcuda
from rxcuda import Block, BlockBuilder, Follow, Reduce
from rxcuda.cuda import NullDriver

ROWSUM = r'''
extern "C" __global__ void rowsum(const float* x, float* s, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) { float acc = 0.0f; for (int c = 0; c < cols; ++c) acc += x[r * cols + c]; s[r] = acc; }
}'''


def _passed(engine, block, name):
    """The value the running graph's kernel node passes for ``block.name``."""
    return [a.value for node in engine.plan.nodes for a in getattr(node, "args", ())
            if getattr(a, "block", None) == block.id and getattr(a, "name", None) == name]


def _small_fed_by_1024(engine):
    add = engine.add(Block.from_kernel("vector_add", size=1024))
    small = engine.add(Block.from_kernel("scalar_mul", size=512, name="small"))
    engine.connect(add["out"], small["x"])
    engine.write(add["a"], np.ones(1024, np.float32))
    engine.write(add["b"], np.ones(1024, np.float32))
    return add, small


def test_a_size_that_follows_its_input_reads_what_the_graph_runs(engine):
    add, small = _small_fed_by_1024(engine)
    n = small.params["n"]
    assert n.follows == ("x", None) and n.value == 512  # declared: nothing is built yet
    assert engine.tick().state == "ok"
    assert engine.shape(small["out"]) == (1024,) and _passed(engine, small, "n") == [1024]
    assert n.value == 1024 and small.values()["n"] == 1024
    assert engine.describe().blocks[1].values["n"] == 512  # the pipeline as data keeps the block's own value
    assert [d for d in engine.diagnostic_log if d.severity != "info"] == []


def test_back_at_its_declared_shape_it_reads_its_own_value_and_warns_of_nothing(engine):
    add, small = _small_fed_by_1024(engine)
    engine.tick()
    engine.disconnect(add["out"], small["x"])
    engine.write(small["x"], np.ones(512, np.float32))
    assert engine.tick().state == "ok"
    assert small.params["n"].value == 512 and _passed(engine, small, "n") == [512]
    assert [d.message for d in engine.diagnostic_log if d.severity == "warning"] == []


def test_a_value_set_while_it_follows_is_passed_and_read(engine):
    add, small = _small_fed_by_1024(engine)
    engine.tick()
    small.set(n=100)  # fewer elements than the port holds: a hot update of the running graph
    assert engine.tick().tiers == ("parameters",)
    assert small.params["n"].value == 100


def test_a_parameter_following_an_axis_reads_the_resized_length():
    b = BlockBuilder("rowsum")
    k = b.add_kernel(rxcuda.compile_cuda(ROWSUM, arch="sm_90"), over="s", block=64)
    b.input("x", k["x"], shape=(480, 640), rule=Follow())
    b.output("s", k["s"], shape=Reduce("x", axis=1))
    b.scalar("rows", k["rows"], size_of=("x", 0))
    b.scalar("cols", k["cols"], size_of=("x", 1))
    rowsum = b.build()
    with rxcuda.Engine(driver=NullDriver()) as engine:
        engine.add(rowsum)
        engine.resize(rowsum["x"], (1000, 3))
        engine.tick()
        assert (rowsum.params["rows"].value, rowsum.params["cols"].value) == (1000, 3)
        assert rowsum.params["rows"].follows == ("x", 0) and rowsum.params["cols"].follows == ("x", 1)
        engine.resize(rowsum["x"], (480, 640))
        engine.tick()
        assert (rowsum.params["rows"].value, rowsum.params["cols"].value) == (480, 640)


def test_a_parameter_that_follows_nothing_says_so():
    assert Block.from_kernel("scalar_mul", size=16).params["scale"].follows is None
