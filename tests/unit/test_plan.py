"""The planner: every validation error, block order, hazards, buffer sizing, parameter slots, memsets."""

from __future__ import annotations

import attrs
import pytest
from _pipeline import (
    ADD,
    APPEND,
    IMUL,
    MUL,
    add,
    all_inputs,
    builder,
    entry,
    kcode,
    mul,
    pipeline,
    ptr,
    ref,
    scalar,
)

from rxcuda import Block, CallSpec, Tier, UnknownPortError, ValidationError
from rxcuda.lowlevel import (
    BlockDescription,
    BufferArg,
    BufferPlan,
    Connection,
    KernelNodePlan,
    KernelSpec,
    Launch,
    MemsetNodePlan,
    Pin,
    PipelineDescription,
    PortRef,
    PortSpec,
    ScalarArg,
    order_blocks,
    plan,
    validate,
)
from rxcuda.plan._order import hazard_deps  # the hazard rule alone, on hand-made nodes


def chain(size: int = 64):
    a, m = add(size), mul(size)
    return a, m, pipeline(a, m, conns=[(a["out"], m["x"])], fed=[a["a"], a["b"]])


# -- validation ---------------------------------------------------------------------------------------------
def test_connection_to_unknown_port_names_the_ports():
    a, m = add(), mul()
    desc = pipeline(a, m, fed=all_inputs(a, m))
    desc = attrs.evolve(desc, connections=(Connection(ref(a["out"]), PortRef(m.id, "nope")),))
    with pytest.raises(UnknownPortError, match=r"block 'mul' has no port 'nope' \(ports: x, out\)"):
        plan(desc)


def test_connection_to_block_not_in_pipeline():
    a, m = add(), mul()
    desc = pipeline(a, fed=all_inputs(a))
    desc = attrs.evolve(desc, connections=(Connection(ref(a["out"]), ref(m["x"])),))
    with pytest.raises(ValidationError, match="names a block that is not in the engine; add the block first"):
        plan(desc)


def test_input_as_connection_source_is_refused():
    a, m = add(), mul()
    desc = pipeline(a, m, conns=[(m["x"], a["a"])], fed=all_inputs(a, m))
    with pytest.raises(ValidationError, match=r"mul\.x is an input port and cannot be a connection's source"):
        plan(desc)


def test_output_as_connection_target_is_refused():
    a, m = add(), mul()
    desc = pipeline(a, m, conns=[(a["out"], m["out"])], fed=all_inputs(a, m))
    with pytest.raises(ValidationError, match=r"mul\.out is an output port and cannot be a connection's target"):
        plan(desc)


def test_dtype_mismatch_names_both_ports_and_types():
    a, i = add(), Block.from_kernel(IMUL, size=64, name="imul")
    desc = pipeline(a, i, conns=[(a["out"], i["x"])], fed=all_inputs(a))
    with pytest.raises(
        ValidationError,
        match=r"cannot connect add\.out \(f32\) to imul\.x \(i32\): element types "
        "differ",
    ) as e:
        plan(desc)
    assert e.value.subject == "imul.x"


def test_size_mismatch_says_to_give_the_same_size():
    a, m = add(64), mul(128, counts={"x": 128})  # x has its own count: fixed
    desc = pipeline(a, m, conns=[(a["out"], m["x"])], fed=all_inputs(a))
    with pytest.raises(ValidationError, match=r"\(64 elements\) to mul\.x \(128 elements\): sizes differ; give both"):
        plan(desc)


def test_second_connection_into_an_input_is_refused():
    a1, a2, m = add(name="a1"), add(name="a2"), mul()
    desc = pipeline(a1, a2, m, conns=[(a1["out"], m["x"]), (a2["out"], m["x"])], fed=all_inputs(a1, a2))
    with pytest.raises(ValidationError, match=r"mul\.x is already connected from a1\.out; an input takes one"):
        plan(desc)


def test_connected_and_bound_input_is_refused():
    a, m = add(), mul()
    desc = pipeline(a, m, conns=[(a["out"], m["x"])], fed=all_inputs(a), bindings={m["x"]: ("f32", 64)})
    with pytest.raises(ValidationError, match=r"mul\.x is both connected and bound to an array"):
        plan(desc)


def test_cycle_names_the_blocks_in_it():
    first, second, third = mul(name="first"), mul(name="second"), mul(name="third")
    desc = pipeline(
        first,
        second,
        third,
        conns=[(first["out"], second["x"]), (second["out"], first["x"]), (second["out"], third["x"])],
    )
    with pytest.raises(ValidationError, match="cycle through blocks first, second; a frame must be a DAG"):
        plan(desc)


def test_self_loop_is_a_cycle():
    m = mul(name="loop")
    with pytest.raises(ValidationError, match="cycle through blocks loop"):
        plan(pipeline(m, conns=[(m["out"], m["x"])]))


def test_missing_required_input_names_the_port_and_the_fixes():
    a = add()
    with pytest.raises(ValidationError, match=r"required input add\.a is neither connected nor bound") as e:
        plan(pipeline(a))
    msg = str(e.value)
    assert "engine.connect(other['out'], add['a'])" in msg and "engine.bind(add['a'], array)" in msg
    assert "engine.write" in msg and e.value.subject == "add"


def test_fed_input_satisfies_the_requirement():
    a = add()
    gp = plan(pipeline(a, fed=[a["a"], a["b"]]))
    assert gp.buffers[gp.port_buffers[ref(a["a"])]].kind == "port"


def test_optional_input_left_open_gets_a_zeros_buffer():
    b = builder("opt", size=32)
    k = b.add_kernel(MUL)
    b.input("x", k["x"], required=False)
    b.output("out", k["out"])
    b.scalar("scale", k["scale"])
    b.scalar("n", k["n"])
    blk = b.build()
    gp = plan(pipeline(blk))
    buf = gp.buffers[gp.port_buffers[ref(blk["x"])]]
    assert (buf.kind, buf.count, buf.dtype) == ("zeros", 32, "f32")


def test_bound_array_of_wrong_dtype_says_how_to_convert():
    m = mul()
    desc = pipeline(m, bindings={m["x"]: ("f64", 64)})
    with pytest.raises(
        ValidationError,
        match=r"has dtype f64, the port takes f32; convert it \(e\.g\. "
        r"arr\.astype\('float32'\)\)",
    ):
        plan(desc)


def test_bound_array_too_small_is_refused():
    m = mul()
    with pytest.raises(ValidationError, match=r"mul\.x has 10 elements, the port needs 64"):
        plan(pipeline(m, bindings={m["x"]: ("f32", 10)}))


def test_bound_array_larger_than_port_is_accepted_as_external():
    m = mul()
    gp = plan(pipeline(m, bindings={m["x"]: ("f32", 100)}))
    assert gp.buffers[gp.port_buffers[ref(m["x"])]].kind == "external"


def test_bound_output_is_external_and_not_allocated():
    m = mul()
    gp = plan(pipeline(m, fed=[m["x"]], bindings={m["out"]: ("f32", 64)}))
    assert gp.buffers[gp.port_buffers[ref(m["out"])]].kind == "external"


def test_pointer_that_nothing_feeds_is_reported():
    desc = BlockDescription(
        "raw",
        kernels=(KernelSpec("mul", MUL, Launch.for_threads(64)),),
        ports=(PortSpec("x", "in", "f32", 64, (Pin("mul", 0),)),),
    )
    blk = Block(desc)
    with pytest.raises(ValidationError, match=r"parameter 1 \('out'\) of 'mul' is a pointer that no port"):
        plan(pipeline(blk, fed=[blk["x"]]))


def test_scalar_without_value_is_reported():
    code = kcode("k", ptr("x"), scalar("nodefault"))
    desc = BlockDescription(
        "raw",
        kernels=(KernelSpec("k", code, Launch.for_threads(8)),),
        ports=(PortSpec("x", "in", "f32", 8, (Pin("k", 0),)),),
    )
    blk = Block(desc)
    with pytest.raises(ValidationError, match=r"scalar parameter 1 \('nodefault'\) of 'k' has no value"):
        plan(pipeline(blk, fed=[blk["x"]]))


def test_scalar_left_at_an_unresolved_size_default_is_reported():
    code = kcode("k", ptr("x"), scalar("n", default="size"))
    desc = BlockDescription(
        "raw",
        kernels=(KernelSpec("k", code, Launch.for_threads(8)),),
        ports=(PortSpec("x", "in", "f32", 8, (Pin("k", 0),)),),
    )
    blk = Block(desc)
    with pytest.raises(ValidationError, match=r"scalar parameter 1 \('n'\) of 'k' has no value; .* numeric default"):
        plan(pipeline(blk, fed=[blk["x"]]))


def test_same_block_twice_is_refused():
    a, m = add(), mul()
    desc = pipeline(a, m, a, conns=[(a["out"], m["x"])], fed=all_inputs(a))
    with pytest.raises(ValidationError, match=r"block 'add' \(id \d+\) appears twice in the pipeline; a block is "
                                              r"added once \(create another Block for a second copy\)"):
        plan(desc)


def test_same_block_twice_without_connections_is_refused():
    a = add()
    with pytest.raises(ValidationError, match="appears twice in the pipeline"):
        validate(pipeline(a, a, fed=all_inputs(a)))


def test_two_blocks_of_one_name_are_refused():
    one, two = mul(name="dup"), mul(name="dup")
    desc = pipeline(one, two, conns=[(one["out"], two["x"]), (two["out"], one["x"])])
    with pytest.raises(ValidationError, match=rf"two blocks are named 'dup' \(ids {one.id} and {two.id}\); give each "
                                              "block its own name") as e:
        plan(desc)
    assert e.value.subject == "dup"


def test_validate_accepts_a_good_pipeline():
    _, _, desc = chain()
    assert validate(desc) is None


# -- block order ------------------------------------------------------------------------------------------
def test_order_of_a_chain_added_backwards():
    a, m = add(), mul()
    desc = pipeline(m, a, conns=[(a["out"], m["x"])], fed=all_inputs(a))
    assert [b.id for b in order_blocks(desc)] == [a.id, m.id]


def test_diamond_orders_sources_before_join_before_sink():
    sink = mul(name="sink")
    join = add(name="join")
    right = mul(name="right")
    left = mul(name="left")
    desc = pipeline(
        sink,
        join,
        right,
        left,
        conns=[(left["out"], join["a"]), (right["out"], join["b"]), (join["out"], sink["x"])],
        fed=[left["x"], right["x"]],
    )
    assert [b.label() for b in order_blocks(desc)] == ["right", "left", "join", "sink"]
    gp = plan(desc)
    join_node = gp.kernel_nodes[(join.id, "add")]
    assert set(gp.deps[join_node]) == {gp.kernel_nodes[(left.id, "mul")], gp.kernel_nodes[(right.id, "mul")]}
    assert gp.deps[gp.kernel_nodes[(sink.id, "mul")]] == (join_node,)


def test_independent_blocks_keep_insertion_order():
    blocks = [mul(name=f"m{i}") for i in (3, 1, 2)]
    desc = pipeline(*blocks, fed=all_inputs(*blocks))
    assert [b.label() for b in order_blocks(desc)] == ["m3", "m1", "m2"]
    gp = plan(desc)
    assert [n.label for n in gp.nodes] == ["m3/mul", "m1/mul", "m2/mul"]
    assert all(d == () for d in gp.deps)


def test_ties_after_a_join_keep_insertion_order():
    src = mul(name="src")
    b, a = mul(name="b"), mul(name="a")
    desc = pipeline(src, b, a, conns=[(src["out"], a["x"]), (src["out"], b["x"])], fed=[src["x"]])
    assert [x.label() for x in order_blocks(desc)] == ["src", "b", "a"]


# -- hazards ----------------------------------------------------------------------------------------------
def node(i: int, reads=(), writes=()) -> KernelNodePlan:
    return KernelNodePlan(i, 1, f"k{i}", "key", Launch(1), (), frozenset(reads), frozenset(writes), f"k{i}")


def test_read_after_write_depends_on_the_writer():
    assert hazard_deps([node(0, writes={1}), node(1, reads={1})]) == ((), (0,))


def test_write_after_read_waits_for_the_reader():
    assert hazard_deps([node(0, reads={1}), node(1, writes={1})]) == ((), (0,))


def test_write_after_write_is_ordered():
    assert hazard_deps([node(0, writes={1}), node(1, writes={1})]) == ((), (0,))


def test_disjoint_buffers_have_no_dependency():
    assert hazard_deps([node(0, writes={1}), node(1, reads={2}, writes={3})]) == ((), ())


def test_kernel_reading_and_writing_one_buffer():
    nodes = [node(0, writes={1}), node(1, reads={1}, writes={1}), node(2, reads={1}), node(3, writes={1})]
    deps = hazard_deps(nodes)
    assert deps[1] == (0,)  # never on itself
    assert deps[2] == (1,)  # reads the inout result
    assert deps[3] == (1, 2)  # waits for the last writer and the readers since


def test_readers_since_the_last_write_only():
    nodes = [node(0, reads={1}), node(1, writes={1}), node(2, reads={1}), node(3, writes={1})]
    assert hazard_deps(nodes)[3] == (1, 2)


def test_inout_port_orders_a_reader_before_the_in_place_writer():
    code_read = kcode("peek", ptr("x"), ptr("y", "out"), scalar("n", default="size"))
    code_inplace = kcode("bump", ptr("x", "inout"), scalar("n", default="size"))
    b = builder("inplace", size=16)
    r = b.add_kernel(code_read)
    w = b.add_kernel(code_inplace)
    b.input("x", [r["x"], w["x"]])
    b.output("y", r["y"])
    b.scalar("n", [r["n"], w["n"]])
    blk = b.build()
    gp = plan(pipeline(blk, fed=[blk["x"]]))
    peek, bump = gp.kernel_nodes[(blk.id, "peek")], gp.kernel_nodes[(blk.id, "bump")]
    assert gp.deps[bump] == (peek,)
    x = gp.port_buffers[ref(blk["x"])]
    assert x in gp.nodes[bump].reads and x in gp.nodes[bump].writes


# -- buffers ----------------------------------------------------------------------------------------------
def test_connected_ports_share_one_engine_buffer():
    a, m, desc = chain(1000)
    gp = plan(desc)
    assert gp.port_buffers[ref(a["out"])] == gp.port_buffers[ref(m["x"])]
    assert len(gp.buffers) == 4  # a, b, add.out = mul.x, mul.out


def test_buffers_are_sized_from_ports_not_from_the_grid():
    a, m, desc = chain(1000)  # 4 blocks of 256 threads = 1024 threads
    gp = plan(desc)
    assert gp.nodes[0].launch.threads == 1024
    for b in gp.buffers:
        assert (b.count, b.nbytes) == (1000, 4000)


def test_explicit_port_count_sizes_the_buffer():
    b = builder("sized", size=100)
    k = b.add_kernel(MUL)
    b.input("x", k["x"], count=37)
    b.output("out", k["out"], count=45)
    b.scalar("scale", k["scale"])
    b.scalar("n", k["n"])
    blk = b.build()
    gp = plan(pipeline(blk, fed=[blk["x"]]))
    sizes = {buf.label: (buf.count, buf.nbytes) for buf in gp.buffers}
    assert sizes == {"sized.x": (37, 148), "sized.out": (45, 180)}


def test_internal_connection_gets_its_own_buffer():
    b = builder("scaled_sum", size=50)
    k_add = b.add_kernel(ADD)
    k_mul = b.add_kernel(MUL)
    b.input("a", k_add["a"])
    b.input("b", k_add["b"])
    b.connect(k_add["out"], k_mul["x"], count=50)
    b.output("out", k_mul["out"])
    b.scalar("scale", k_mul["scale"])
    b.scalar("n", [k_add["n"], k_mul["n"]])
    blk = b.build()
    gp = plan(pipeline(blk, fed=all_inputs(blk)))
    internal = [buf for buf in gp.buffers if buf.kind == "internal"]
    assert [(buf.label, buf.count, buf.dtype) for buf in internal] == [("scaled_sum/add.out", 50, "f32")]
    add_node, mul_node = gp.kernel_nodes[(blk.id, "add")], gp.kernel_nodes[(blk.id, "mul")]
    assert gp.deps[mul_node] == (add_node,)


def test_tiny_buffers_take_at_least_four_bytes():
    assert BufferPlan(0, ("k",), "b", "u8", 1, "port").nbytes == 4
    assert BufferPlan(0, ("k",), "b", "f64", 3, "port").nbytes == 24
    assert BufferPlan(0, ("k",), "b", None, 10, "port").nbytes == 10


def test_buffer_keys_are_stable_across_plans():
    a, m, desc = chain()
    first = plan(desc)
    m.params["scale"].value = 7.0
    second = plan(pipeline(a, m, conns=[(a["out"], m["x"])], fed=[a["a"], a["b"]]))
    assert [b.key for b in first.buffers] == [b.key for b in second.buffers]


# -- parameters -------------------------------------------------------------------------------------------
def test_scalar_parameters_map_to_argument_slots():
    a, m, desc = chain()
    gp = plan(desc)
    mul_node = gp.kernel_nodes[(m.id, "mul")]
    assert gp.slots[(m.id, "scale")] == ((mul_node, 2),)
    assert gp.slots[(m.id, "n")] == ((mul_node, 3),)
    assert gp.slots[(a.id, "n")] == ((gp.kernel_nodes[(a.id, "add")], 3),)


def test_node_args_carry_current_values_and_buffers():
    a, m = add(), mul(scale=2.5)
    m.params["scale"].value = -4.0
    gp = plan(pipeline(a, m, conns=[(a["out"], m["x"])], fed=all_inputs(a)))
    args = gp.nodes[gp.kernel_nodes[(m.id, "mul")]].args
    assert args[0] == BufferArg(gp.port_buffers[ref(m["x"])])
    assert args[2] == ScalarArg(m.id, "scale", "f32", 4, -4.0)
    assert args[3] == ScalarArg(m.id, "n", "i32", 4, 64)


def test_one_parameter_feeding_two_kernels_has_two_slots():
    b = builder("two", size=8)
    k1 = b.add_kernel(MUL, name="first")
    k2 = b.add_kernel(MUL, name="second")
    b.input("x", k1["x"])
    b.connect(k1["out"], k2["x"])
    b.output("out", k2["out"])
    b.scalar("scale", [k1["scale"], k2["scale"]], default=2.0)
    b.scalar("n", [k1["n"], k2["n"]])
    blk = b.build()
    gp = plan(pipeline(blk, fed=[blk["x"]]))
    first, second = gp.kernel_nodes[(blk.id, "first")], gp.kernel_nodes[(blk.id, "second")]
    assert gp.slots[(blk.id, "scale")] == ((first, 2), (second, 2))


def test_scalar_fixed_at_its_default_has_no_slot():
    code = kcode("k", ptr("x", "inout"), scalar("fixed", "f32", 1.5))
    b = builder("fixed", size=8)
    k = b.add_kernel(code)
    b.input("x", k["x"])
    blk = b.build()
    gp = plan(pipeline(blk, fed=[blk["x"]]))
    assert gp.nodes[0].args[1] == ScalarArg(blk.id, None, "f32", 4, 1.5)
    assert gp.slots == {}


def test_launch_override_reaches_the_node():
    m = mul(size=1000)
    m.set_launch(threads=500, block=128)
    gp = plan(pipeline(m, fed=[m["x"]]))
    assert gp.nodes[0].launch == Launch(grid=(4,), block=(128,))


def test_node_code_key_is_the_kernel_content_key():
    m = mul()
    gp = plan(pipeline(m, fed=[m["x"]]))
    assert gp.nodes[0].code_key == MUL.key


# -- append counters -------------------------------------------------------------------------------------
def test_append_counter_gets_a_memset_before_its_kernel():
    ap = Block.from_kernel(APPEND, size=256, name="above")
    gp = plan(pipeline(ap, fed=[ap["values"]]))
    memsets = [n for n in gp.nodes if isinstance(n, MemsetNodePlan)]
    assert len(memsets) == 1
    reset = memsets[0]
    cid = gp.counters[ref(ap["out"])]
    assert (reset.buffer, reset.value, reset.count) == (cid, 0, 1)
    assert gp.buffers[cid].kind == "counter" and gp.buffers[cid].dtype == "u32" and gp.buffers[cid].nbytes == 4
    kernel = gp.kernel_nodes[(ap.id, "append")]
    assert reset.id < kernel and reset.id in gp.deps[kernel]
    assert cid in gp.nodes[kernel].reads and cid in gp.nodes[kernel].writes


def test_append_after_a_producer_waits_for_both():
    m = mul()
    ap = Block.from_kernel(APPEND, size=64, name="above")
    gp = plan(pipeline(m, ap, conns=[(m["out"], ap["values"])], fed=[m["x"]]))
    kernel = gp.kernel_nodes[(ap.id, "append")]
    reset = next(n.id for n in gp.nodes if isinstance(n, MemsetNodePlan))
    assert set(gp.deps[kernel]) == {gp.kernel_nodes[(m.id, "mul")], reset}


def test_no_memset_without_counters():
    _, _, desc = chain()
    gp = plan(desc)
    assert not any(isinstance(n, MemsetNodePlan) for n in gp.nodes) and gp.counters == {}


# -- topology and tiers -----------------------------------------------------------------------------------
def test_equal_structures_have_equal_topology():
    _, _, one = chain(64)
    a, m = add(64), mul(64, scale=9.0)
    m.set_launch(threads=64, block=32)
    two = pipeline(a, m, conns=[(a["out"], m["x"])], fed=[a["a"], a["b"]])
    assert plan(one).topology() == plan(two).topology()


def test_added_block_changes_topology():
    a, m, desc = chain()
    extra = mul(name="extra")
    bigger = pipeline(a, m, extra, conns=[(a["out"], m["x"]), (m["out"], extra["x"])], fed=[a["a"], a["b"]])
    assert plan(desc).topology() != plan(bigger).topology()


def test_plan_is_immutable():
    _, _, desc = chain()
    gp = plan(desc)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        gp.nodes = ()


def test_empty_pipeline_plans_nothing():
    gp = plan(PipelineDescription())
    assert gp.nodes == () and gp.buffers == () and gp.topology() == ((), 0)


def call_block():
    spec = CallSpec(
        name="gemm",
        params=(ptr("a"), ptr("c", "out"), scalar("alpha", "f32", 1.0), scalar("m", "i32", 4)),
        record=lambda args: None,
        key=("gemm", 4),
        device_scalars=("alpha",),
    )
    b = builder("blas", size=16)
    k = b.add_call(spec)
    b.input("a", k["a"])
    b.output("c", k["c"])
    b.scalar("alpha", k["alpha"])
    b.scalar("m", k["m"])
    return b.build()


def test_tier_of_each_kind_of_parameter():
    m = mul()
    blas = call_block()
    gp = plan(pipeline(m, blas, fed=[m["x"], blas["a"]]))
    assert gp.tier_of(m.id, "scale") is Tier.PARAMETERS
    assert gp.tier_of(blas.id, "alpha") is Tier.PARAMETERS
    assert gp.tier_of(blas.id, "m") is Tier.RECAPTURE
    assert gp.tier_of(m.id, "nope") is None
    assert gp.route_of(m.id, "scale") == "parameters (exec-node update)"
    assert gp.route_of(blas.id, "alpha") == "parameters (device scalar copy)"
    assert gp.route_of(blas.id, "m").startswith("recapture")
    assert gp.route_of(m.id, "nope") == "unused"


def test_library_call_gets_device_scalar_buffer_and_recapture_list():
    blas = call_block()
    gp = plan(pipeline(blas, fed=[blas["a"]]))
    sid = gp.device_scalars[(blas.id, "alpha")]
    assert gp.buffers[sid].kind == "device_scalar" and gp.buffers[sid].count == 1
    call = gp.kernel_nodes[(blas.id, "gemm")]
    assert gp.recapture[(blas.id, "m")] == (call,)
    assert sid in gp.nodes[call].reads and gp.nodes[call].args[2] == BufferArg(sid)


def test_entry_values_override_defaults():
    m = mul(scale=2.0)
    e = entry(m)
    assert e.value("scale") == 2.0
    e2 = attrs.evolve(e, values={"scale": 5.0})
    assert e2.value("scale") == 5.0 and e2.value("n") == 64
    with pytest.raises(KeyError):
        e2.value("nope")


def test_pipeline_block_lookup_raises_for_unknown_id():
    with pytest.raises(KeyError, match="no block with id -1"):
        PipelineDescription().block(-1)


def test_mixed_kernels_sorted_node_ids_match_positions():
    a, m, desc = chain()
    gp = plan(desc)
    assert [n.id for n in gp.nodes] == list(range(len(gp.nodes)))
    assert all(all(d < n.id for d in gp.deps[n.id]) for n in gp.nodes)
    assert isinstance(gp.nodes[0], KernelNodePlan)
