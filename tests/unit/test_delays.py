"""Delayed connections (feedback across frames): planning, legal and refused cycles, bad delays and initial
values, and on the null driver what the engine does with previous-frame buffers (made, kept through rebuilds
that leave them alone, reset, freed) and with their copy nodes (built, rebound, run eagerly)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from _pipeline import add, mul, pipeline, ref

import rxcuda
from rxcuda import Block, ValidationError
from rxcuda.lowlevel import Connection, PortRef, order_blocks, plan, validate
from rxcuda.model._graphplan import CopyNodePlan
from rxcuda.plan._index import PipelineIndex

N = 1024
KERNELS = "kernels"


def delayed(desc, *conns):
    """``desc`` with delayed connections added: (src port, dst port[, initial]) each."""
    extra = tuple(Connection(ref(c[0]), ref(c[1]), 1, c[2] if len(c) > 2 else None) for c in conns)
    return attrs.evolve(desc, connections=desc.connections + extra)


def copies(gp):
    return [n for n in gp.nodes if isinstance(n, CopyNodePlan)]


# -- planning --------------------------------------------------------------------------------------------------
def test_a_delayed_input_reads_a_previous_frame_buffer_that_a_copy_node_refreshes_last():
    a, m = add(), mul()
    desc = delayed(pipeline(a, m, conns=[(a["out"], m["x"])], fed=[a["b"]]), (m["out"], a["a"]))
    gp = plan(desc)
    cur, prev = gp.port_buffers[ref(m["out"])], gp.port_buffers[ref(a["a"])]
    assert gp.delays == {cur: prev}
    b = gp.buffers[prev]
    assert (b.kind, b.key, b.label, b.dtype, b.count) == ("delay", ("delay", m.id, "out"), "mul.out (previous frame)",
                                                          "f32", 64)
    (copy,) = copies(gp)
    assert gp.nodes[-1] is copy and (copy.src, copy.dst, copy.nbytes) == (cur, prev, 64 * 4)
    assert copy.label == "delay mul.out" and copy.reads == {cur} and copy.writes == {prev}
    add_node, mul_node = gp.kernel_nodes[(a.id, "add")], gp.kernel_nodes[(m.id, "mul")]
    assert gp.deps[add_node] == ()  # the delayed input orders nothing: add runs first although mul feeds it
    assert set(gp.deps[copy.id]) == {add_node, mul_node}  # after the producer, and after the reader of prev


def test_a_block_may_feed_itself_through_a_delay():
    a = add()
    desc = delayed(pipeline(a, fed=[a["b"]]), (a["out"], a["a"], np.full(64, 2, np.float32)))
    gp = plan(desc)
    node = gp.kernel_nodes[(a.id, "add")]
    (copy,) = copies(gp)
    assert gp.port_buffers[ref(a["a"])] == copy.dst and gp.port_buffers[ref(a["out"])] == copy.src
    assert gp.deps[copy.id] == (node,)
    assert [b.id for b in order_blocks(desc)] == [a.id]


def test_a_two_block_cycle_through_a_delay_is_legal_and_keeps_insertion_order():
    m1, m2 = mul(name="m1"), mul(name="m2")
    desc = delayed(pipeline(m1, m2, conns=[(m1["out"], m2["x"])]), (m2["out"], m1["x"]))
    validate(desc)
    assert [b.id for b in order_blocks(desc)] == [m1.id, m2.id]


def test_several_delayed_inputs_of_one_output_share_one_previous_frame_buffer_and_one_copy():
    src, m1, m2 = mul(name="src"), mul(name="m1"), mul(name="m2")
    desc = delayed(pipeline(src, m1, m2, fed=[src["x"]]), (src["out"], m1["x"]), (src["out"], m2["x"]))
    gp = plan(desc)
    assert gp.port_buffers[ref(m1["x"])] == gp.port_buffers[ref(m2["x"])]
    (copy,) = copies(gp)
    assert set(gp.deps[copy.id]) == {gp.kernel_nodes[(b.id, "mul")] for b in (src, m1, m2)}


def test_a_delayed_and_a_plain_connection_from_one_output():
    src, now, prev = mul(name="src"), mul(name="now"), mul(name="prev")
    desc = delayed(pipeline(src, now, prev, conns=[(src["out"], now["x"])], fed=[src["x"]]), (src["out"], prev["x"]))
    gp = plan(desc)
    assert gp.port_buffers[ref(now["x"])] == gp.port_buffers[ref(src["out"])]  # this frame's value
    assert gp.port_buffers[ref(prev["x"])] == gp.delays[gp.port_buffers[ref(src["out"])]]  # the last frame's


def test_a_plan_without_delays_has_no_copy_nodes():
    a, m = add(), mul()
    gp = plan(pipeline(a, m, conns=[(a["out"], m["x"])], fed=[a["a"], a["b"]]))
    assert gp.delays == {} and copies(gp) == []


# -- refused ---------------------------------------------------------------------------------------------------
def test_a_cycle_without_a_delay_is_refused_with_a_message_that_suggests_one():
    m1, m2 = mul(name="m1"), mul(name="m2")
    desc = pipeline(m1, m2, conns=[(m1["out"], m2["x"]), (m2["out"], m1["x"])])
    with pytest.raises(ValidationError, match=r"cycle through blocks m1, m2; a frame must be a DAG: make one of "
                                              r"its connections delayed \(engine.connect\(src, dst, delay=1\)"):
        plan(desc)


def test_a_delay_elsewhere_does_not_break_a_cycle_without_one():
    m1, m2, m3 = mul(name="m1"), mul(name="m2"), mul(name="m3")
    desc = delayed(pipeline(m1, m2, m3, conns=[(m1["out"], m2["x"]), (m2["out"], m1["x"])]), (m2["out"], m3["x"]))
    with pytest.raises(ValidationError, match="cycle through blocks m1, m2;"):
        plan(desc)


def test_a_delay_from_an_input_port_names_both_ports_and_the_outputs_to_use():
    a, m = add(), mul()
    desc = delayed(pipeline(a, m, fed=[a["a"], a["b"]]), (a["a"], m["x"]))
    with pytest.raises(ValidationError, match=r"cannot delay add\.a -> mul\.x: add\.a is an input port, and a "
                                              r"delayed connection carries the value an output had at the end of "
                                              r"the previous frame; connect one of add's outputs instead \(out\): "
                                              r"engine\.connect\(add\['out'\], mul\['x'\], delay=1\)"):
        plan(desc)


def test_a_delay_into_an_output_port_is_refused():
    a, m = add(), mul()
    desc = delayed(pipeline(a, m, fed=[a["a"], a["b"], m["x"]]), (a["out"], m["out"]))
    with pytest.raises(ValidationError, match=r"mul\.out is an output port and cannot be a connection's target"):
        plan(desc)


@pytest.mark.parametrize(("size", "dtype", "what"), [(32, None, "sizes differ"), (64, "i32", "element types differ")])
def test_a_delay_between_ports_of_different_size_or_dtype_is_refused(size, dtype, what):
    a = add()
    other = Block.from_kernel(rxcuda.lowlevel.KernelCode("imul", b"// imul", "ptx", rxcuda.KernelSignature(
        "imul", (rxcuda.KernelParam("x", "pointer", 8, dtype or "f32", "in"),
                 rxcuda.KernelParam("out", "pointer", 8, dtype or "f32", "out")))),
        size=size, name="other", counts={"x": size})
    desc = delayed(pipeline(a, other, fed=[a["a"], a["b"]]), (a["out"], other["x"]))
    with pytest.raises(ValidationError, match=rf"cannot connect add\.out .* to other\.x .*{what}.*; a delayed "
                                              "connection copies the output into the input's previous-frame "
                                              "buffer each frame"):
        plan(desc)


@pytest.mark.parametrize("delay", [2, -1, True, 1.0])
def test_a_delay_other_than_0_or_1_is_refused(delay):
    with pytest.raises(ValueError, match=rf"'delay' must be 0 .* or 1 .*got {delay!r}"):
        Connection(PortRef(1, "out"), PortRef(2, "x"), delay)


def test_an_initial_value_that_does_not_fit_the_port_is_refused_by_the_planner():
    a, m = add(), mul()
    desc = delayed(pipeline(a, m, fed=[a["a"], a["b"]]), (a["out"], m["x"], np.zeros(10, np.float32)))
    with pytest.raises(ValidationError, match=r"the initial value of the delayed connection add\.out -> mul\.x has "
                                              r"10 elements, the port holds 64; give a number .* or 64 elements"):
        plan(desc)


def test_two_different_initial_values_for_one_output_are_refused_by_the_planner():
    src, m1, m2 = mul(name="src"), mul(name="m1"), mul(name="m2")
    desc = delayed(pipeline(src, m1, m2, fed=[src["x"]]), (src["out"], m1["x"], np.ones(64, np.float32)),
                   (src["out"], m2["x"], np.zeros(64, np.float32)))
    with pytest.raises(ValidationError, match=r"src\.out -> m1\.x and src\.out -> m2\.x give different initial "
                                              "values; one output has one previous-frame buffer"):
        plan(desc)


# -- the index (one connection at a time) ----------------------------------------------------------------------
def test_the_index_accepts_cycles_through_a_delay_and_forgets_them():
    index = PipelineIndex()
    m1, m2 = mul(name="m1"), mul(name="m2")
    index.add_block(m1.id, m1.description)
    index.add_block(m2.id, m2.description)
    index.add_connection(Connection(ref(m1["out"]), ref(m2["x"])))
    back = Connection(ref(m2["out"]), ref(m1["x"]), 1)
    index.add_connection(back)
    index.remove_connection(back)
    with pytest.raises(ValidationError, match="make one of its connections delayed"):
        index.add_connection(Connection(ref(m2["out"]), ref(m1["x"])))
    index.add_connection(back)
    assert index.remove_block(m2.id) == (Connection(ref(m1["out"]), ref(m2["x"])), back)
    self_loop = Connection(ref(m1["out"]), ref(m1["x"]), 1)
    index.add_connection(self_loop)
    assert index.connections == (self_loop,)


# -- the engine on the null driver -----------------------------------------------------------------------------


def accumulator(engine, **connect):
    acc = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N, name="acc"))
    engine.connect(acc["out"], acc["a"], delay=1, **connect)
    engine.write(acc["b"], np.ones(N, np.float32))
    return acc


def delay_buffer(engine):
    (prev,) = engine.plan.delays.values()
    return engine._rt.graph.pointers[prev], engine.plan.buffers[prev].nbytes


def touches(api, mark: int, ptr: int, nbytes: int) -> list[str]:
    """The calls since ``mark`` that clear or write device memory overlapping [ptr, ptr + nbytes)."""
    hits = []
    for name, args in api.calls[mark:]:
        if name in ("cuMemsetD8Async", "cuMemcpyHtoDAsync") and args[0] < ptr + nbytes and ptr < args[0] + (
                args[2] if name == "cuMemsetD8Async" else args[1]):
            hits.append(name)
    return hits


def test_a_delay_builds_a_memcpy_node_from_the_output_to_its_previous_frame_buffer(engine, api):
    acc = accumulator(engine)
    assert engine.tick().tiers == ("structure",)
    gp = engine.plan
    pointers = engine._rt.graph.pointers
    ((cur, prev),) = gp.delays.items()
    (add_args,) = [args for name, args in api.calls if name == "cuGraphAddMemcpyNode"]
    assert add_args[1:] == (1, pointers[cur], pointers[prev], N * 4)  # one dependency: the accumulating kernel
    assert gp.port_buffers[PortRef(acc.id, "a")] == prev


def test_a_given_initial_value_is_uploaded_into_the_new_previous_frame_buffer(engine, api):
    accumulator(engine, initial=2.5)
    engine.tick()
    ptr, nbytes = delay_buffer(engine)
    assert [n for n, a in api.calls if n == "cuMemcpyHtoDAsync" and a[0] == ptr] == ["cuMemcpyHtoDAsync"]


def test_the_engine_turns_initial_values_into_port_arrays_and_refuses_what_does_not_fit(engine):
    acc = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N, name="acc"))
    with pytest.raises(ValidationError, match=r"acc\.out -> acc\.a has 3 elements, the port holds 1024"):
        engine.connect(acc["out"], acc["a"], delay=1, initial=[1.0, 2.0, 3.0])
    with pytest.raises(ValidationError, match=r"has dtype float64, the port holds f32; convert it "
                                              r"\(initial=arr.astype\('float32'\)\)"):
        engine.connect(acc["out"], acc["a"], delay=1, initial=np.zeros(N))
    with pytest.raises(ValidationError, match=r"must be None \(zeros\), a number or an array of 1024 f32 elements "
                                              r"\(got str"):
        engine.connect(acc["out"], acc["a"], delay=1, initial="zero")

    class OnTheDevice:
        __cuda_array_interface__: dict = {}

    with pytest.raises(ValidationError, match=r"is a device array; give a NumPy array \(e.g. cupy.asnumpy\(arr\)\)"):
        engine.connect(acc["out"], acc["a"], delay=1, initial=OnTheDevice())
    with pytest.raises(ValidationError, match="an initial value is the frame-0 value of a delayed connection"):
        engine.connect(acc["out"], acc["a"], initial=1.0)
    with pytest.raises(ValidationError, match=r"'delay' must be 0 .* or 1 .*got 3"):
        engine.connect(acc["out"], acc["a"], delay=3)
    assert engine.connections == ()  # every refusal left the engine as it was
    for scalar in (np.float64(1.5), 1.5, 2):  # a number of any kind fills every element
        engine.connect(acc["out"], acc["a"], delay=1, initial=scalar)
        (conn,) = engine.describe().connections
        assert conn.initial.dtype == np.float32 and conn.initial.shape == (N,) and conn.initial[-1] == scalar
        engine.disconnect(acc["out"], acc["a"])
    given = np.arange(N, dtype=np.float32)
    engine.connect(acc["out"], acc["a"], delay=1, initial=given)
    given[:] = 0  # the engine kept its own copy
    (conn,) = engine.describe().connections
    assert conn.delay == 1 and conn.initial[5] == 5.0 and not conn.initial.flags.writeable


def test_a_delay_from_an_input_port_is_refused_at_connect(engine):
    acc = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N, name="acc"))
    with pytest.raises(ValidationError, match=r"cannot delay acc\.b -> acc\.a: acc\.b is an input port.*"
                                              r"connect one of acc's outputs instead \(out\)"):
        engine.connect(acc["b"], acc["a"], delay=1, initial=1.0)


def test_a_second_delayed_input_with_another_initial_value_is_refused_at_connect(engine):
    src = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="src"))
    m1 = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="m1"))
    m2 = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="m2"))
    engine.connect(src["out"], m1["x"], delay=1, initial=1.0)
    with pytest.raises(ValidationError, match=r"src\.out already feeds m1\.x through a delayed connection with "
                                              "another initial value"):
        engine.connect(src["out"], m2["x"], delay=1, initial=2.0)
    engine.connect(src["out"], m2["x"], delay=1, initial=1.0)  # the same value is fine
    engine.write(src["x"], np.ones(N, np.float32))
    engine.tick()
    assert len(engine.plan.delays) == 1


def test_an_unrelated_rebuild_keeps_the_previous_frame_buffer_and_its_contents(engine, api):
    accumulator(engine, initial=1.0)
    engine.tick()
    ptr, nbytes = delay_buffer(engine)
    mark, rebuilds = len(api.calls), engine.rebuilds
    other = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="other"))
    engine.write(other["x"], np.ones(N, np.float32))
    engine.tick()
    assert engine.rebuilds == rebuilds + 1
    assert delay_buffer(engine) == (ptr, nbytes)
    assert touches(api, mark, ptr, nbytes) == []  # neither reallocated, zeroed nor given its initial value again


def test_disconnecting_and_connecting_again_in_one_frame_starts_the_delay_over(engine, api):
    acc = accumulator(engine)
    engine.tick()
    ptr, nbytes = delay_buffer(engine)
    mark = len(api.calls)
    engine.disconnect(acc["out"], acc["a"])
    engine.connect(acc["out"], acc["a"], delay=1, initial=3.0)
    engine.tick()
    assert delay_buffer(engine) == (ptr, nbytes)  # the same buffer, kept by key ...
    assert touches(api, mark, ptr, nbytes) == ["cuMemcpyHtoDAsync"]  # ... given the new initial value


def test_removing_the_last_delayed_connection_frees_its_buffer(engine, api):
    acc = accumulator(engine)
    engine.tick()
    in_use = engine.memory.in_use
    engine.disconnect(acc["out"], acc["a"])
    engine.write(acc["a"], np.ones(N, np.float32))  # acc.a gets its own buffer: one for the other
    engine.tick()
    assert engine.plan.delays == {} and not copies(engine.plan)
    assert engine.memory.in_use == in_use
    assert not any(b.kind == "delay" for b in engine.plan.buffers)


def test_disconnect_needs_the_connected_source(engine):
    acc = accumulator(engine)
    other = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="other"))
    with pytest.raises(ValidationError, match=r"<port other\.out> is not connected to <port acc\.a>"):
        engine.disconnect(other["out"], acc["a"])


def test_reset_delays_clears_or_reuploads_every_previous_frame_buffer(engine, api):
    acc = accumulator(engine)
    src = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="src"))
    m = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="m"))
    engine.connect(src["out"], m["x"], delay=1, initial=np.full(N, 4.0, np.float32))
    engine.write(src["x"], np.ones(N, np.float32))
    engine.tick()
    gp, pointers = engine.plan, engine._rt.graph.pointers
    prev_acc = gp.port_buffers[PortRef(acc.id, "a")]
    prev_m = gp.port_buffers[PortRef(m.id, "x")]
    mark, rebuilds = len(api.calls), engine.rebuilds
    engine.reset_delays()
    assert touches(api, mark, pointers[prev_acc], N * 4) == ["cuMemsetD8Async"]  # zeros
    assert touches(api, mark, pointers[prev_m], N * 4) == ["cuMemcpyHtoDAsync"]  # the initial value
    assert engine.rebuilds == rebuilds


def test_reset_delays_before_the_first_build_does_nothing(engine, api):
    accumulator(engine)
    engine.reset_delays()
    assert api.count("cuMemsetD8Async") == 0 and engine.plan is None


def test_a_rebound_delayed_output_points_the_copy_at_the_new_array(engine, api, monkeypatch):
    import rxcuda.engine._engine as engine_module
    from rxcuda.cuda._memory import ExternalArray

    class FakeArray:  # the null driver has no memory: a resolved array is a pointer and a size
        def __init__(self, ptr):
            self.ptr = ptr

    monkeypatch.setattr(engine_module, "resolve_device_array",
                        lambda arr, stream=None, api=None: ExternalArray(arr.ptr, "f32", N, (N,), arr))
    acc = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N, name="acc"))
    engine.bind(acc["out"], FakeArray(0xA000))
    engine.connect(acc["out"], acc["a"], delay=1)
    engine.write(acc["b"], np.ones(N, np.float32))
    engine.tick()
    rebuilds = engine.rebuilds
    engine.bind(acc["out"], FakeArray(0xB000))
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == rebuilds
    (update,) = [args for name, args in api.calls if name == "cuGraphExecMemcpyNodeSetParams"]
    ptr, _ = delay_buffer(engine)
    assert update[2:] == (0xB000, ptr, N * 4)


def test_a_debug_frame_runs_the_copy_eagerly_after_the_kernel(api):
    with rxcuda.Engine(driver=api, debug=True) as engine:
        accumulator(engine)
        engine.tick()
        ptr, nbytes = delay_buffer(engine)
        names = [n for n in api.names() if n in ("cuLaunchKernel", "cuMemcpyDtoDAsync")]
        assert names == ["cuLaunchKernel", "cuMemcpyDtoDAsync"]
        (copy,) = [a for n, a in api.calls if n == "cuMemcpyDtoDAsync"]
        assert copy[0] == ptr and copy[2] == nbytes


def test_writing_a_delayed_input_sets_what_the_next_frame_reads(engine, api):
    acc = accumulator(engine)
    engine.tick()
    ptr, nbytes = delay_buffer(engine)
    mark, rebuilds = len(api.calls), engine.rebuilds
    engine.write(acc["a"], np.full(N, 7.0, np.float32))
    assert touches(api, mark, ptr, nbytes) == ["cuMemcpyHtoDAsync"]  # into the previous-frame buffer
    mark = len(api.calls)
    assert engine.read(acc["a"]).shape == (N,)
    assert [a[0] for n, a in api.calls[mark:] if n == "cuMemcpyDtoHAsync"] == [ptr]
    engine.tick()
    assert engine.rebuilds == rebuilds and PortRef(acc.id, "a") not in engine.describe().fed  # still connected


def test_a_cycle_without_a_delay_is_refused_at_connect_with_the_suggestion(engine):
    m1 = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="m1"))
    m2 = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="m2"))
    engine.connect(m1["out"], m2["x"])
    with pytest.raises(ValidationError, match=r"engine.connect\(src, dst, delay=1\)"):
        engine.connect(m2["out"], m1["x"])
    engine.connect(m2["out"], m1["x"], delay=1)
    engine.tick()
    assert len(copies(engine.plan)) == 1
