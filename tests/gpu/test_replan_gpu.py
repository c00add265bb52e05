"""Incremental structural work on a GPU: a chain edited block by block (added at the end, removed, inserted in
the middle, a value changed before an edit) computes what NumPy computes after every edit, while the planner
takes over the unchanged blocks' part of the plan; blocks declared by path share one parsed kernel."""

import ctypes
import subprocess
import sys

import numpy as np
from conftest import gpu_subprocess_env

from rxcuda import Block
from rxcuda.cuda._graph import CompiledGraph
from rxcuda.lowlevel import BufferArg

N = 4099  # not a multiple of the block size: the last thread block is partial


def rand(rng, n):
    return rng.standard_normal(n).astype(np.float32) + 0.5


def _mul(kernels, rng, name):
    scale = float(rng.uniform(0.5, 1.5))
    return Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=scale, name=name), scale


def _check(engine, chain, scales, x):
    frame = engine.tick()
    assert frame.state == "ok" and frame.launched, [(b.name, b.message) for b in engine.blocks if b.message]
    want = x * np.float32(np.prod(np.asarray(scales, dtype=np.float64)))
    np.testing.assert_allclose(engine.read(chain[-1]["out"]), want, rtol=2e-5)


def _prod(scales) -> np.float32:
    return np.float32(np.prod(np.asarray(scales, dtype=np.float64)))


def _chain(engine, rng, kernels, n):
    """A chain of ``n`` scalar_mul blocks with random scales on a random input, checked against NumPy once:
    (blocks, scales, input)."""
    chain, scales = [], []
    for i in range(n):
        b, s = _mul(kernels, rng, f"m{i}")
        chain.append(engine.add(b))
        scales.append(s)
        if i:
            engine.connect(chain[-2]["out"], chain[-1]["x"])
    x = rand(rng, N)
    engine.write(chain[0]["x"], x)
    _check(engine, chain, scales, x)
    return chain, scales, x


def test_a_chain_edited_block_by_block_matches_numpy(engine, rng, kernels):
    chain, scales, x = _chain(engine, rng, kernels, 24)
    planner = engine._builder.planner
    for step in range(12):
        what = step % 4
        if what == 0:  # a block added at the end
            b, s = _mul(kernels, rng, f"end{step}")
            engine.add(b)
            engine.connect(chain[-1]["out"], b["x"])
            chain.append(b)
            scales.append(s)
        elif what == 1:  # the last block removed
            engine.remove(chain.pop())
            scales.pop()
        elif what == 2:  # a block inserted in the middle
            at = int(rng.integers(1, len(chain) - 1))
            b, s = _mul(kernels, rng, f"mid{step}")
            engine.add(b)
            engine.disconnect(chain[at - 1]["out"], chain[at]["x"])
            engine.connect(chain[at - 1]["out"], b["x"])
            engine.connect(b["out"], chain[at]["x"])
            chain.insert(at, b)
            scales.insert(at, s)
        else:  # a value changed, then a block in the middle removed
            at = int(rng.integers(1, len(chain) - 1))
            scales[0] = float(rng.uniform(0.5, 1.5))
            chain[0].set(scale=scales[0])
            gone = chain.pop(at)
            scales.pop(at)
            engine.remove(gone)
            engine.connect(chain[at - 1]["out"], chain[at]["x"])
        _check(engine, chain, scales, x)
        if what in (0, 1):
            assert planner.reused >= len(chain) - 2  # the unchanged leading blocks were taken over
    x = rand(rng, N)  # fresh input through the edited graph
    engine.write(chain[0]["x"], x)
    _check(engine, chain, scales, x)


def test_blocks_declared_by_path_share_one_parsed_kernel_and_compute(engine, rng, kernels):
    path = kernels / "scalar_mul.ptx"
    chain = [engine.add(Block.from_kernel(path, size=N, scale=1.25, name=f"p{i}")) for i in range(40)]
    assert len({id(b.description.kernels[0].code) for b in chain}) == 1
    for a, b in zip(chain, chain[1:], strict=False):
        engine.connect(a["out"], b["x"])
    x = rand(rng, N)
    engine.write(chain[0]["x"], x)
    _check(engine, chain, [1.25] * 40, x)
    chain[7].set(scale=0.5)
    _check(engine, chain, [1.25] * 7 + [0.5] + [1.25] * 32, x)


def test_an_engine_starts_no_thread_beside_its_first_build(kernels):
    """NVRTC's warm-up thread ran ~200 ms beside the first builds, taking the GIL and a core from them: an
    engine starts none (the first compile pays NVRTC's start-up), and a fresh process builds and computes."""
    code = (
        "import threading, numpy as np, rxcuda\n"
        "e = rxcuda.Engine()\n"
        "assert not any('warm-up' in t.name for t in threading.enumerate()), threading.enumerate()\n"
        f"b = e.add(rxcuda.Block.from_kernel({str(kernels / 'scalar_mul.ptx')!r}, size=1000, scale=3.0))\n"
        "x = np.random.default_rng().standard_normal(1000).astype(np.float32)\n"
        "e.write(b['x'], x); e.tick()\n"
        "np.testing.assert_allclose(e.read(b['out']), x * 3, rtol=1e-6)\n"
        "e.close(); print('OK')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=gpu_subprocess_env(),
                         timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_blocks_added_and_removed_at_the_end_twenty_times_grow_the_graph_in_place(engine, rng, kernels):
    """The common live edit: each block added after the end of the chain takes a spare node of the running
    executable graph over (``_inplace.extend``) or grows its template in place (``_inplace.grow``), each removed
    from the end is disabled in the running executable graph (``_inplace.shrink``: nothing instantiated), and the
    chain computes what NumPy does after every edit, on a fresh input each time (the kept nodes' pointers moved
    when their output became an intermediate that shares memory, and back)."""
    chain, scales, x = _chain(engine, rng, kernels, 64)
    builder = engine._builder
    grown, shrunk, extended = builder.grown, builder.shrunk, builder.extended
    for step in range(20):
        if step % 3 != 2:  # two added, one removed: the chain grows and shrinks at its end
            b, s = _mul(kernels, rng, f"end{step}")
            engine.add(b)
            engine.connect(chain[-1]["out"], b["x"])
            chain.append(b)
            scales.append(s)
        else:
            engine.remove(chain.pop())
            scales.pop()
        x = rand(rng, N)
        engine.write(chain[0]["x"], x)
        _check(engine, chain, scales, x)
        in_place = builder.grown + builder.shrunk + builder.extended
        assert in_place == grown + shrunk + extended + step + 1, "the edit was built anew, not in place"
    assert builder.shrunk == shrunk + 6  # every removal: no instantiation
    assert builder.extended > extended  # blocks added into spare nodes (rxcuda.cuda._inplace.extend): none instantiated
    chain[3].set(scale=0.75)  # a value changed in the grown graph's exec reaches it
    scales[3] = 0.75
    _check(engine, chain, scales, x)


def test_a_block_of_other_code_added_after_two_chains_takes_a_spare_over_and_computes(engine, rng, kernels,
                                                                                       monkeypatch):
    """A block whose kernel is in another module, added after the ends of two chains, takes a spare node over (its
    function and arguments set in the executable graph, then enabled: nothing instantiated), runs after both
    chains, and computes what NumPy does; removed, and then another block of other code added in its place, the
    same. (Spares in graphs of any size here: the engine makes them from CompiledGraph.SPARES_MIN nodes.)"""
    monkeypatch.setattr(CompiledGraph, "SPARES_MIN", 1)
    a, sa, xa = _chain(engine, rng, kernels, 3)
    b, sb, xb = _chain(engine, rng, kernels, 3)
    builder = engine._builder
    assert engine._rt.graph.spares, "the graph was instantiated without spare nodes"
    extended = builder.extended
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=N, name="sum"))
    engine.connect(a[-1]["out"], add["a"])
    engine.connect(b[-1]["out"], add["b"])
    for _ in range(3):  # fresh inputs each frame
        xa, xb = rand(rng, N), rand(rng, N)
        engine.write(a[0]["x"], xa)
        engine.write(b[0]["x"], xb)
        frame = engine.tick()
        assert frame.state == "ok" and frame.launched
        want = xa * _prod(sa) + xb * _prod(sb)
        np.testing.assert_allclose(engine.read(add["out"]), want, rtol=2e-5, atol=1e-6)
    assert builder.extended == extended + 1, "the block was not put into a spare node"
    engine.remove(add)  # (its code ran nowhere else: built without it, with spares after the end again)
    assert engine.tick().state == "ok"
    k = float(rng.uniform(0.5, 1.5))
    sax = engine.add(Block.from_kernel(kernels / "saxpy.ptx", size=N, a=k, name="saxpy"))
    engine.connect(a[-1]["out"], sax["x"])
    engine.connect(b[-1]["out"], sax["y"])
    for _ in range(3):
        xa, xb = rand(rng, N), rand(rng, N)
        engine.write(a[0]["x"], xa)
        engine.write(b[0]["x"], xb)
        frame = engine.tick()
        assert frame.state == "ok" and frame.launched
        want = np.float32(k) * (xa * _prod(sa)) + xb * _prod(sb)
        np.testing.assert_allclose(engine.read(sax["y_out"]), want, rtol=2e-5, atol=1e-6)
    assert builder.extended == extended + 2


def _deps_of(api, node) -> list[int]:
    """The nodes ``node`` depends on in its graph, as the driver says ((err, deps, count) or, with edge data,
    (err, deps, edges, count))."""
    first = api.cuGraphNodeGetDependencies(node, 0)
    assert int(first[0]) == 0, first
    count = first[-1]
    result = api.cuGraphNodeGetDependencies(node, count)
    assert int(result[0]) == 0, result
    return sorted(int(d) for d in result[1][:count])


def test_a_graph_added_in_one_compiled_call_holds_each_nodes_function_launch_arguments_and_edges(engine, rng, kernels):
    """A flat graph of kernel nodes is added in one compiled call (FastDriver.add_kernel_nodes, the structs written by
    ArgStorage.fill): read back from the driver, each node of the template runs its plan's function with its
    plan's launch and its arguments' address, after exactly its plan's dependencies; and the graph computes."""
    a, sa, xa = _chain(engine, rng, kernels, 5)
    b, sb, xb = _chain(engine, rng, kernels, 4)
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=N, name="sum"))
    engine.connect(a[-1]["out"], add["a"])
    engine.connect(b[-1]["out"], add["b"])
    xa, xb = rand(rng, N), rand(rng, N)
    engine.write(a[0]["x"], xa)
    engine.write(b[0]["x"], xb)
    frame = engine.tick()
    assert frame.state == "ok" and frame.launched
    np.testing.assert_allclose(engine.read(add["out"]), xa * _prod(sa) + xb * _prod(sb), rtol=2e-5, atol=1e-6)
    rt = engine._rt
    assert rt.fast.batches, "the compiled batch add is not in use on this machine"
    g = rt.graph
    api = rt.api
    for node in g.nodes:
        err, p = api.cuGraphKernelNodeGetParams(node.handle)
        assert int(err) == 0, err
        plan = node.plan
        assert int(p.func) == int(g.functions[plan.code_key]), plan.label
        assert (p.gridDimX, p.gridDimY, p.gridDimZ) == tuple(plan.launch.grid), plan.label
        assert (p.blockDimX, p.blockDimY, p.blockDimZ) == tuple(plan.launch.block), plan.label
        assert p.sharedMemBytes == plan.launch.shared_mem
        words = ctypes.cast(int(p.kernelParams), ctypes.POINTER(ctypes.c_uint64))  # (the driver's copy or ours)
        for i, arg in enumerate(plan.args):
            if isinstance(arg, BufferArg):
                assert ctypes.c_uint64.from_address(words[i]).value == g.pointers[arg.buffer], (plan.label, i)
            else:
                want = np.array([arg.value], dtype=np.float32 if arg.dtype == "f32" else np.int32)
                assert ctypes.string_at(words[i], 4) == want.tobytes(), (plan.label, i)
        assert _deps_of(api, node.handle) == sorted(g.nodes[d].handle_int for d in g.plan.deps[plan.id]), plan.label
