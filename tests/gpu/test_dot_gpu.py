"""Pictures of the graph on a GPU: the CUDA driver's own DOT of the graph the engine runs
(cuGraphDebugDotPrint) names its kernels, with regions (conditional nodes) too; the pipeline's picture after
a real run; rendering to SVG where Graphviz is installed (skipped, with the reason, where it is not)."""

import numpy as np
import pytest

import rxcuda
from rxcuda import Block, For

N = 10_000


def chain(engine, kernels):
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=N))
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=2.0))
    engine.connect(add["out"], mul["x"])
    engine.write(add["a"], np.ones(N, np.float32))
    engine.write(add["b"], np.ones(N, np.float32))
    return add, mul


def test_the_drivers_picture_names_the_kernels_of_the_running_graph(engine, kernels, tmp_path):
    _add, mul = chain(engine, kernels)
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), 4.0)
    out = engine.save_driver_graph(tmp_path / "driver.dot")
    text = out.read_text()
    assert text.lstrip().startswith("digraph")
    assert "vector_add" in text and "scalar_mul" in text
    verbose = engine.save_driver_graph(tmp_path / "verbose.dot", verbose=True).read_text()
    assert "vector_add" in verbose and len(verbose) > len(text)  # every node's parameters and handles too


def test_the_drivers_picture_of_a_graph_with_a_conditional_node(engine, kernels, tmp_path):
    src = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="src"))
    body = Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="body", scale=2.0)
    engine.add(For(3, [body]))
    engine.connect(src["out"], body["x"])
    engine.write(src["x"], np.ones(N, np.float32))
    engine.tick()
    text = engine.save_driver_graph(tmp_path / "driver.dot").read_text()
    assert text.lstrip().startswith("digraph")
    assert "rx_loop_init" in text  # the loop's setter runs in the top-level graph, before the conditional node
    assert "scalar_mul" in text


def test_the_pipeline_picture_after_a_run_shows_every_block_ok(engine, kernels):
    add, mul = chain(engine, kernels)
    engine.tick()
    text = engine.to_dot()
    ok = rxcuda.view._dot.STATE_COLOURS["ok"][1]
    assert text.count(f'<TD COLSPAN="2" BGCOLOR="{ok}">') == 2
    assert f"b{add.id}:o_out -> b{mul.id}:i_x" in text
    assert "kernel vector_add | ok" in text
    assert engine.plan.to_dot().count("grid ") == 2


def test_save_graph_renders_svg_where_graphviz_is_installed(engine, kernels, tmp_path):
    gv = pytest.importorskip("graphviz", reason="the graphviz Python package is not installed (pip install graphviz)")
    try:
        gv.version()
    except Exception as e:  # the package is there, Graphviz's dot program is not
        pytest.skip(f"Graphviz's dot program is not usable: {e} (apt install graphviz)")
    chain(engine, kernels)
    engine.tick()
    svg = engine.save_graph(tmp_path / "pipeline.svg").read_text()
    assert "<svg" in svg and "vector_add" in svg and "scalar_mul" in svg
