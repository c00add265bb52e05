"""No parameter can make a kernel index past its buffers: count parameters tied to the ports they count, checked
on every way in (set, Parameter.value, bind, a composite, the live view's message, a plan built from data),
set_launch on kernels with and without a tied count, the declarations (sidecar, CUDA C++, builder) and the
inference. The engine runs on the null driver (tests/gpu/test_bounds_gpu.py checks the frames on a GPU)."""

from __future__ import annotations

import json
import pathlib
import shutil

import attrs
import numpy as np
import pytest
from reactivex.subject import Subject

import rxcuda
from rxcuda import Block, BlockBuilder, BoundsError, KernelFileError, ValidationError
from rxcuda.model._describe import KernelCode, KernelParam, KernelSignature
from rxcuda.sources._cdecl import parse_declarations
from rxcuda.sources._sidecar import parse_sidecar

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
N = 1024
MUL = str(KERNELS / "scalar_mul.ptx")


def untied_kernel(tmp_path) -> str:
    """scalar_mul with a sidecar that names its count 'limit' and says nothing of what it counts."""
    shutil.copy(KERNELS / "scalar_mul.ptx", tmp_path / "mul_limit.ptx")
    side = json.loads((KERNELS / "scalar_mul.json").read_text())
    side["params"][3] = {"name": "limit", "type": "i32", "default": "size"}
    (tmp_path / "mul_limit.json").write_text(json.dumps(side))
    return str(tmp_path / "mul_limit.ptx")


def code(*params: KernelParam, entry: str = "k") -> KernelCode:
    """KernelCode with a hand-written signature (nothing is loaded: for declarations only)."""
    return KernelCode(entry, b"// " + entry.encode(), "ptx", KernelSignature(entry, params))


def ptr(name, direction="in"):
    return KernelParam(name, "pointer", 8, "f32", direction)


def scalar(name, dtype="i32", default="size", counts=()):
    return KernelParam(name, "scalar", 4, dtype, "in", default, counts=counts)


# -- declarations ----------------------------------------------------------------------------------------
def test_every_shipped_kernel_declares_what_its_counts_count():
    expected = {"vector_add": {"n": ("a", "b", "out")}, "vector_sub": {"n": ("a", "b", "out")},
                "vector_add3": {"n": ("a", "b", "c", "out")}, "saxpy": {"n": ("x", "y", "y_out")},
                "scalar_mul": {"n": ("x", "out")}, "append_above": {"capacity": ("out",), "n": ("values",)}}
    for name, counts in expected.items():
        side = {p.name: p.counts for p in parse_sidecar((KERNELS / f"{name}.json").read_text()).params}
        decl = {p.name: p.counts for p in parse_declarations((KERNELS / f"{name}.cu").read_text())[name].params}
        for scalar_name, ports in counts.items():
            assert side[scalar_name] == ports and decl[scalar_name] == ports, name


def test_the_sidecar_spelling_reaches_the_kernel_signature():
    code = rxcuda.load_kernel_file(MUL)
    assert {p.name: p.counts for p in code.signature.params}["n"] == ("x", "out")


@pytest.mark.parametrize(("param", "match"), [
    ({"name": "s", "type": "f32", "counts": ["x"]}, r"params\[1\] \('s'\): 'counts' belongs on an integer scalar"),
    ({"name": "p", "type": "f32*", "counts": ["x"]}, r"'counts' belongs on an integer scalar .*'f32\*'"),
    ({"name": "n", "type": "i32", "counts": "x"}, r"'counts' must be a non-empty list of pointer parameter names"),
    ({"name": "n", "type": "i32", "counts": []}, r"'counts' must be a non-empty list"),
    ({"name": "n", "type": "i32", "counts": ["xx"]}, r"'counts' names 'xx', which is not a pointer parameter "
                                                     r"\(did you mean 'x'\?\); the pointers are x"),
])
def test_the_sidecar_refuses_a_counts_that_cannot_be_meant(param, match):
    text = json.dumps({"params": [{"name": "x", "type": "f32*"}, param]})
    with pytest.raises(KernelFileError, match=match):
        parse_sidecar(text, "k.json")


def test_cuda_declarations_say_counts_with_a_macro_or_a_comment():
    src = ('extern "C" __global__ void k(const float* a, float* b, int n RX_COUNTS(a, b), '
           'unsigned m /*counts b*/, int rows) {}')
    params = {p.name: p for p in parse_declarations(src)["k"].params}
    assert params["n"].counts == ("a", "b") and params["m"].counts == ("b",) and params["rows"].counts == ()
    assert parse_declarations(src)["k"].signature().params[2].counts == ("a", "b")


@pytest.mark.parametrize(("decl", "match"), [
    ("float* a RX_COUNTS(b), float* b", r"'a' is a pointer; RX_COUNTS belongs on the integer scalar"),
    ("float* a, float s RX_COUNTS(a)", r"'s' counts a, so it needs an integer type"),
    ("float* a, int n RX_COUNTS(c)", r"'n' of kernel 'k' counts 'c', which is not a pointer parameter \(pointers: a\)"),
    ("float* a, int n RX_COUNTS(1x)", r"RX_COUNTS\(1x\) must name pointer parameters"),
])
def test_cuda_declarations_refuse_a_counts_that_cannot_be_meant(decl, match):
    with pytest.raises(rxcuda.CompileError, match=match):
        parse_declarations(f'extern "C" __global__ void k({decl}) {{}}')


def test_the_annotation_macro_takes_any_number_of_names():
    from rxcuda.sources._cdecl import ANNOTATION_FLAGS, ANNOTATION_MACROS

    assert ("RX_COUNTS(...)", "") in ANNOTATION_MACROS and "-DRX_COUNTS(...)=" in ANNOTATION_FLAGS


# -- ties on a block: declared, inferred, refused ------------------------------------------------------------
def test_from_kernel_ties_each_count_to_its_ports():
    mul = Block.from_kernel(MUL, size=N)
    assert mul.params["n"].counts == ("x", "out") and mul.params["scale"].counts == ()
    emit = Block.from_kernel(str(KERNELS / "append_above.ptx"), size=N)
    assert emit.params["capacity"].counts == ("out",) and emit.params["n"].counts == ("values",)


def test_a_count_named_like_one_is_inferred_from_its_default():
    k = code(ptr("a"), ptr("out", "out"), scalar("n"), scalar("rows"), scalar("count", "f32", 1.0))
    b = Block.from_kernel(k, size=64)
    assert b.params["n"].counts == ("a", "out")
    assert b.params["rows"].counts == ()  # not named like a count: the user's to keep
    assert b.params["count"].counts == ()  # a float counts nothing


def test_inference_ties_only_the_buffers_whose_size_the_default_equals():
    k = code(ptr("a"), ptr("lut"), ptr("out", "out"), scalar("n"))
    b = Block.from_kernel(k, size=64, counts={"lut": 16})
    assert b.params["n"].counts == ("a", "out")


def test_a_declared_tie_wins_over_inference():
    k = code(ptr("a"), ptr("out", "out"), scalar("n", counts=("out",)))
    assert Block.from_kernel(k, size=64).params["n"].counts == ("out",)


def test_capacity_counts_the_append_buffer_of_its_kernel():
    k = code(ptr("v"), ptr("out", "out"), KernelParam("c", "pointer", 8, "u32", "counter"), scalar("capacity", "u32"),
             scalar("n"))
    b = Block.from_kernel(k, size=64)
    assert b.params["capacity"].counts == ("out",) and b.params["n"].counts == ("v",)


def test_builder_counts_names_ports_and_internal_buffers():
    b = BlockBuilder("scaled_sum", size=N)
    add, mul = b.add_kernel(str(KERNELS / "vector_add.ptx")), b.add_kernel(MUL)
    b.input("a", add["a"])
    b.input("b", add["b"])
    b.connect(add["out"], mul["x"])
    b.output("out", mul["out"])
    b.scalar("scale", mul["scale"], default=3.0)
    b.scalar("n", [add["n"], mul["n"]])  # the kernels' own declarations, mapped to the block's buffers
    block = b.build()
    assert block.params["n"].counts == ("a", "b", "vector_add.out", "out")
    with pytest.raises(BoundsError, match=r"scaled_sum.n = 1025 is more than port 'a' holds \(1024 elements\)"):
        block.set(n=N + 1)


def test_builder_refuses_a_counts_that_names_nothing_or_a_float():
    b = BlockBuilder("blk", size=N)
    k = b.add_kernel(MUL)
    b.input("x", k["x"])
    b.output("out", k["out"])
    with pytest.raises(ValidationError, match=r"blk: parameter 'scale' is f32; only an integer parameter can count"):
        b.scalar("scale", k["scale"], counts=["x"])
    with pytest.raises(ValueError, match=r"'counts' of parameter 'n' names ports"):
        b.scalar("n", k["n"], counts=[3])
    b.scalar("scale", k["scale"])
    b.scalar("n", k["n"], counts=["y"])
    with pytest.raises(ValidationError, match=r"blk: parameter 'n' counts 'y', which is not a port or internal buffer "
                                              r"of the block \(x, out\)"):
        b.build()


def test_a_default_that_does_not_fit_is_refused_where_the_block_is_declared():
    with pytest.raises(BoundsError, match=r"append_above.capacity = 1024 is more than port 'out' holds \(100 elements\)"
                                          r".*give the block 'capacity' a value that fits, e.g. capacity=100"):
        Block.from_kernel(str(KERNELS / "append_above.ptx"), size=N, counts={"out": 100})
    emit = Block.from_kernel(str(KERNELS / "append_above.ptx"), size=N, counts={"out": 100}, capacity=100)
    with pytest.raises(BoundsError, match=r"capacity = 101 is more than port 'out' holds \(100 elements\).*an append "
                                          r"buffer's capacity is fixed"):
        emit.set(capacity=101)


# -- set and Parameter.value --------------------------------------------------------------------------------
def test_set_refuses_a_count_past_its_ports_and_a_negative_one():
    mul = Block.from_kernel(MUL, size=N)
    mul.set(n=N // 2)  # what the README teaches
    with pytest.raises(BoundsError, match=r"scalar_mul.n = 50000000 is more than port 'x' holds \(1024 elements\): "
                                          r"n counts x and out, so the kernel would index past the buffer. Set n <= "
                                          r"1024, or grow the buffer first: engine.resize\(scalar_mul\['x'\], shape\)"):
        mul.set(n=50_000_000)
    with pytest.raises(BoundsError, match=r"scalar_mul.n = -5 is negative: n counts x and out.*Set 0 <= n <= 1024"):
        mul.params["n"].value = -5
    assert mul.params["n"].value == N // 2


def test_bounds_error_is_a_value_error_that_says_what_was_refused():
    mul = Block.from_kernel(MUL, size=N)
    with pytest.raises(ValueError) as info:
        mul.set(n=N + 1)
    e = info.value
    assert isinstance(e, rxcuda.RxcudaError) and isinstance(e, BoundsError)
    assert (e.block, e.parameter, e.port, e.capacity, e.value, e.subject) == ("scalar_mul", "n", "x", N, N + 1,
                                                                               "scalar_mul.n")


def test_set_checks_every_value_before_storing_any():
    mul = Block.from_kernel(MUL, size=N, scale=1.0)
    with pytest.raises(BoundsError):
        mul.set(scale=2.0, n=N + 1)
    assert mul.values() == {"scale": 1.0, "n": N}


# -- in an engine (null driver) -------------------------------------------------------------------------------
def fed_mul(engine):
    mul = engine.add(Block.from_kernel(MUL, size=N))
    engine.write(mul["x"], np.ones(N, np.float32))
    engine.tick()
    return mul


def test_a_refused_set_changes_nothing_and_the_frames_go_on(engine, api):
    mul = fed_mul(engine)
    changes: list = []
    engine.parameter_changes.subscribe(changes.append)
    mark = len(api.calls)
    with pytest.raises(BoundsError):
        mul.set(n=50_000_000)
    frame = engine.tick()
    assert frame.state == "ok" and frame.tiers == () and changes == []
    assert api.since(mark) == ["cuGraphLaunch", "cuStreamSynchronize"]
    mul.set(n=N // 2)
    assert engine.tick().tiers == ("parameters",)


def test_the_limit_is_the_buffer_as_resized_now(engine):
    mul = fed_mul(engine)
    engine.resize(mul["x"], (2 * N,))
    with pytest.raises(BoundsError, match=r"port 'out' holds \(1024 elements\)"):
        mul.set(n=2 * N)  # out grows with x at the next frame: until then the smaller buffer is the limit
    engine.tick()
    mul.set(n=2 * N)
    with pytest.raises(BoundsError, match=r"holds \(2048 elements\)"):
        mul.set(n=2 * N + 1)
    engine.resize(mul["x"], (N // 2,))
    with pytest.raises(BoundsError, match=r"holds \(512 elements\)"):
        mul.set(n=N)
    frame = engine.tick()
    assert frame.state == "ok" and engine.shape(mul["out"]) == (N // 2,)
    # n followed the size, so the plan passes 512 although n was set to 2048 while the buffer was larger
    g = engine._rt.graph
    args = next(nd for nd in g.plan.nodes if type(nd).__name__ == "KernelNodePlan").args
    assert [a.value for a in args if type(a).__name__ == "ScalarArg" and a.name == "n"] == [N // 2]


def test_a_resize_below_a_count_set_by_number_is_refused_and_the_last_graph_runs(engine):
    mul = engine.add(Block.from_kernel(MUL, size=N, n=N))  # a number: n does not follow the size
    engine.write(mul["x"], np.ones(N, np.float32))
    engine.tick()
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    engine.resize(mul["x"], (N // 4,))
    frame = engine.tick()
    assert frame.launched
    errors = [d for d in seen if d.severity == "error"]
    assert errors and "scalar_mul.n = 1024 is more than port 'x' holds (256 elements)" in errors[0].message
    with pytest.raises(ValidationError, match=r"scalar_mul.n = 1024 is more than port 'x' holds \(256 elements\)"):
        engine.rebuild()
    mul.set(n=N // 4)  # the limit is the pending shape: fits
    engine.rebuild()
    assert engine.shape(mul["out"]) == (N // 4,)


def test_a_bound_observable_past_the_buffer_is_an_error_diagnostic_and_the_last_value_stays(engine):
    mul = fed_mul(engine)
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    knob = Subject()
    mul.params["n"].bind(knob)
    knob.on_next(100)
    knob.on_next(50_000_000)
    assert mul.params["n"].value == 100
    (d,) = seen
    assert d.severity == "error" and d.subject == "scalar_mul.n" and d.block == mul.id
    assert "scalar_mul.n = 50000000 is more than port 'x' holds (1024 elements)" in d.message
    assert "keeps 100" in d.message and mul.state != "error"
    knob.on_next(-1)
    assert mul.params["n"].value == 100 and "negative" in seen[-1].message
    knob.on_next(200)  # the binding is alive
    assert mul.params["n"].value == 200 and engine.tick().state == "ok"


def test_a_plan_from_data_with_a_count_past_its_buffer_is_refused(engine):
    mul = engine.add(Block.from_kernel(MUL, size=N, n=N))  # a number: n does not follow the size
    engine.write(mul["x"], np.ones(N, np.float32))
    desc = engine.describe()
    (entry,) = desc.blocks
    bad = attrs.evolve(desc, blocks=(attrs.evolve(entry, values={**entry.values, "n": 5000}),))
    with pytest.raises(ValidationError, match=r"scalar_mul.n = 5000 is more than port 'x' holds \(1024 elements\)"):
        rxcuda.plan(bad)
    assert rxcuda.plan(desc) is not None and mul.params["n"].value == N


def test_a_count_that_follows_the_size_is_passed_as_the_size_with_a_warning(engine):
    fed_mul(engine)
    desc = engine.describe()
    (entry,) = desc.blocks
    gp = rxcuda.plan(attrs.evolve(desc, blocks=(attrs.evolve(entry, values={**entry.values, "n": 5000}),)))
    (node,) = [nd for nd in gp.nodes if type(nd).__name__ == "KernelNodePlan"]
    assert [a.value for a in node.args if type(a).__name__ == "ScalarArg" and a.name == "n"] == [N]
    (w,) = gp.warnings
    assert w.severity == "warning" and "n follows the size of x, so the frames pass 1024" in w.message


def test_a_block_rebuilt_from_a_description_keeps_its_ties():
    mul = Block.from_kernel(MUL, size=N)
    again = Block(mul.description)
    with pytest.raises(BoundsError):
        again.set(n=N + 1)


def test_replace_with_a_smaller_block_keeps_the_rule(engine):
    mul = fed_mul(engine)
    mul.set(n=N)
    new = engine.replace(mul, Block.from_kernel(MUL, size=N // 2))
    with pytest.raises(BoundsError, match=r"holds \(512 elements\)"):
        new.set(n=N)


def test_a_composite_parameter_checks_every_block_it_sets(engine):
    small, big = Block.from_kernel(MUL, size=N // 2, name="small"), Block.from_kernel(MUL, size=N, name="big")
    c = rxcuda.Composite("pair")
    c.add(small)
    c.add(big)
    c.expose_parameter("n", small.params["n"], big.params["n"])
    inst = engine.add(c)
    with pytest.raises(BoundsError, match=r"n = 1000 is more than port 'x' holds \(512 elements\)"):
        inst.set(n=1000)
    assert [t.value for t in inst.params["n"].targets] == [N // 2, N]
    inst.set(n=500)
    assert [t.value for t in inst.params["n"].targets] == [500, 500]


def test_the_live_views_set_message_reaches_the_same_check(engine):
    """The page's own check only reads the message; the count rule is block.set's (the page calls it: see
    tests/unit/test_serve_controls.py, which plays a page against the real check)."""
    from rxcuda.view import _protocol

    mul = fed_mul(engine)
    blocks = {b.name: b for b in engine.blocks}
    block, name, value = _protocol.check_set({"block": "scalar_mul", "param": "n", "value": 100_000_000}, blocks)
    with pytest.raises(BoundsError, match=r"scalar_mul.n = 100000000 is more than port 'x' holds"):
        block.set(**{name: value})
    block, name, value = _protocol.check_set({"block": "scalar_mul", "param": "n", "value": 512.0}, blocks)
    assert block is mul and value == 512 and isinstance(value, int)


# -- launches ---------------------------------------------------------------------------------------------
def test_a_kernel_with_a_tied_count_takes_any_thread_count():
    mul = Block.from_kernel(MUL, size=N)
    assert mul.set_launch(threads=50_000_000).threads >= 50_000_000  # threads past n do nothing


def test_an_unguarded_kernel_takes_no_more_threads_than_cover_its_buffers(tmp_path, engine):
    blk = engine.add(Block.from_kernel(untied_kernel(tmp_path), size=1000, name="lim"))
    with pytest.raises(BoundsError, match=r"lim.scalar_mul: a launch of 50000128 threads is more than port 'x' "
                                          r"holds \(1000 elements; 1024 threads cover it\).*no count parameter tied"):
        blk.set_launch(threads=50_000_000)
    with pytest.raises(BoundsError, match=r"a launch of 2048 threads"):
        blk.set_launch(grid=(8,))
    assert blk.launch().threads == 1024
    assert blk.set_launch(threads=512).threads == 512 and blk.set_launch(threads=1000).threads == 1024
    with pytest.raises(BoundsError):  # the limit is the element count now, after a resize
        engine.write(blk["x"], np.ones(500, np.float32), resize=True)
        blk.set_launch(threads=1000)


# -- the info diagnostic ---------------------------------------------------------------------------------------
def test_a_kernel_file_whose_scalars_count_nothing_gets_one_info_on_add(tmp_path, engine):
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    mul = engine.add(Block.from_kernel(MUL, size=N))
    engine.write(mul["x"], np.ones(N, np.float32))
    assert seen == []  # the shipped kernels declare their counts
    blk = engine.add(Block.from_kernel(untied_kernel(tmp_path), size=N, name="lim"))
    (d,) = seen
    assert d.severity == "info" and d.block == blk.id and d.subject == "lim.scalar_mul"
    assert "no scalar of this kernel counts its buffers" in d.message and "RX_COUNTS(x, out)" in d.message
    engine.write(blk["x"], np.ones(N, np.float32))
    engine.tick()
    assert [d.severity for d in seen] == ["info"]  # once, when added
    engine.add(Block.from_kernel(untied_kernel(tmp_path), size=N, name="lim2"))
    assert [d.severity for d in seen] == ["info"]  # once per kernel file, not once per block that uses it


def test_a_count_that_reaches_the_engine_past_the_running_buffers_is_not_applied(engine, api):
    # what a set racing a resize would leave pending: the engine's last check keeps it from the GPU
    mul = fed_mul(engine)
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    mark = len(api.calls)
    engine._rt.pending.set_parameter(mul.id, "n", 5000)
    frame = engine.tick()
    assert frame.state == "ok" and frame.tiers == ()
    assert api.since(mark) == ["cuGraphLaunch", "cuStreamSynchronize"]
    (d,) = seen
    assert d.severity == "error" and d.subject == "scalar_mul.n" and "the value was not applied" in d.message
    # with other changes pending (the drained plan's path), the good values still go through
    engine._rt.pending.set_parameter(mul.id, "n", -1)
    mul.set(scale=2.0)
    assert engine.tick().tiers == ("parameters",) and "negative" in seen[-1].message


def test_the_engine_check_follows_a_resize_in_place(engine, api):
    mul = fed_mul(engine)
    engine.resize(mul["x"], (N // 2,))
    engine.tick()
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    engine._rt.pending.set_parameter(mul.id, "n", N)
    engine.tick()
    assert [d.severity for d in seen] == ["error"] and "holds (512 elements)" in seen[0].message


def test_a_composite_binding_past_a_buffer_is_an_error_diagnostic(engine):
    small, big = Block.from_kernel(MUL, size=N // 2, name="small"), Block.from_kernel(MUL, size=N, name="big")
    c = rxcuda.Composite("pair")
    c.add(small)
    c.add(big)
    c.expose_parameter("n", small.params["n"], big.params["n"])
    inst = engine.add(c)
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    knob = Subject()
    inst.params["n"].bind(knob)
    knob.on_next(N)
    (d,) = seen
    assert d.severity == "error" and d.subject == f"{inst.name}.n" and "holds (512 elements)" in d.message
    assert [t.value for t in inst.params["n"].targets] == [N // 2, N]
    knob.on_next(100)
    assert [t.value for t in inst.params["n"].targets] == [100, 100]


def test_limit_is_the_largest_value_a_count_takes_now(engine):
    mul = fed_mul(engine)
    assert mul.params["n"].limit == N and mul.params["scale"].limit is None
    engine.resize(mul["x"], (N // 2,))
    engine.tick()
    assert mul.params["n"].limit == N // 2
    mul.set(n=mul.params["n"].limit)
