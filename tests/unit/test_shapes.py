"""Shapes and element types without a GPU: vector types and structs (layouts, parsing, host arrays), shape
rules and their planning, every shape validation error, and which path a resize takes on the null driver."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda import Block, BlockBuilder, Broadcast, Follow, Like, Reduce, ShapeError, ValidationError
from rxcuda.cuda import NullDriver
from rxcuda.lowlevel import (
    Connection,
    PipelineDescription,
    PortRef,
)
from rxcuda.model import _dtypes
from rxcuda.sources import _cdecl
from rxcuda.sources._sidecar import parse_sidecar

KERNELS = "kernels"
N = 1024

DRIFT = r"""
extern "C" __global__ void drift(const float4* pos, const float4* vel, float4* out, float dt, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float4 p = pos[i], v = vel[i];
                 out[i] = make_float4(p.x + dt * v.x, p.y + dt * v.y, p.z + dt * v.z, p.w); }
}
"""
TAKE3 = r"""
extern "C" __global__ void take3(const float3* p, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = p[i].x + p[i].y + p[i].z;
}
"""
PARTICLES = r"""
struct Particle { float3 pos; float3 vel; float mass; };
extern "C" __global__ void weigh(const Particle* ps, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = ps[i].mass * ps[i].vel.x;
}
"""


# -- vector types -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "size", "align"), [
    ("float2", 8, 8), ("float3", 12, 4), ("float4", 16, 16), ("double2", 16, 16), ("double3", 24, 8),
    ("double4", 32, 16), ("int2", 8, 8), ("int3", 12, 4), ("int4", 16, 16), ("uint2", 8, 8), ("uint4", 16, 16),
    ("char4", 4, 4), ("uchar3", 3, 1), ("short2", 4, 4), ("short4", 8, 8), ("longlong2", 16, 16),
    ("half2", 4, 4),
])
def test_vector_types_have_cudas_sizes_and_alignments(name, size, align):
    assert _dtypes.itemsize(name) == size and _dtypes.alignment(name) == align
    assert _dtypes.dtype_name(name.upper()) == name and _dtypes.from_c_name(name) == name


def test_vector_types_map_to_numpy_lanes():
    dt = _dtypes.to_numpy("float4")
    assert dt.names == ("x", "y", "z", "w") and dt.itemsize == 16
    assert _dtypes.dtype_name(dt) == "float4"
    assert _dtypes.host_dtype("float3") == (np.dtype(np.float32), (3,))
    assert _dtypes.from_c_name("long2") == "longlong2" and _dtypes.from_c_name("cufftComplex") == "c64"
    assert _dtypes.compatible("c64", "float2") and not _dtypes.compatible("float4", "float3")


def test_host_arrays_of_vectors_take_lanes_on_a_last_axis_or_the_structured_layout():
    arr, shape = _dtypes.elements_of("float4", np.zeros((5, 4), np.float32), "p")
    assert shape == (5,) and arr.shape == (5, 4)
    structured = np.zeros(7, _dtypes.to_numpy("float4"))
    arr, shape = _dtypes.elements_of("float4", structured, "p")
    assert shape == (7,) and arr.shape == (7, 4) and arr.dtype == np.float32
    with pytest.raises(ValueError, match=r"b\.x takes float4 \(4 x f32, 16 bytes\): pass a float32 array shaped "
                                         r"\(\.\.\., 4\) .*shape \(5, 3\), 3 on its last axis"):
        _dtypes.elements_of("float4", np.zeros((5, 3), np.float32), "b.x")
    with pytest.raises(ValueError, match=r"b\.x takes float4 .*got float64; pass a float32 array"):
        _dtypes.elements_of("float4", np.zeros((5, 4)), "b.x")


# -- structs -----------------------------------------------------------------------------------------------
def test_a_struct_is_laid_out_by_the_c_rules():
    p = rxcuda.struct("Particle", {"pos": "float3", "vel": "float3", "mass": "f32"})
    assert p == "Particle{pos:float3,vel:float3,mass:f32}" and _dtypes.itemsize(p) == 28
    dt = rxcuda.numpy_dtype("Particle")
    assert dt.fields["mass"][1] == 24 and dt.fields["pos"][0].shape == (3,)
    q = rxcuda.struct("Padded", a="u8", b="float4", c="f32[3]")  # b at 16 (align 16), c at 32, size 48
    layout = _dtypes.struct_type(q)
    assert [f.offset for f in layout.fields] == [0, 16, 32] and layout.size == 48 and layout.align == 16
    aligned = rxcuda.struct("Wide", x="f32", align=16)
    assert _dtypes.itemsize(aligned) == 16 and aligned.endswith("@16")


@pytest.mark.parametrize(("fields", "match"), [
    ({}, "has no fields"),
    ({"x": "vec3"}, r"field 'x' has type 'vec3', which is not a scalar"),
    ({"x": "f32[0]"}, "array length must be a positive int"),
    ({"1x": "f32"}, "is not an identifier"),
])
def test_bad_structs_are_refused_naming_the_field(fields, match):
    with pytest.raises(ValueError, match=match):
        rxcuda.struct("Bad", fields)


def test_a_struct_name_round_trips_through_its_canonical_spelling():
    p = rxcuda.struct("RoundTrip", {"a": "float2", "b": "i32[2]"})
    for key in [k for k in list(_dtypes._BY_NAME) if k == p]:
        del _dtypes._BY_NAME[key]
    _dtypes._STRUCTS.pop(p)
    assert _dtypes.dtype_name(p) == p and _dtypes.itemsize(p) == 16


def test_structs_parsed_from_cuda_source():
    src = ("struct __align__(16) P { float3 pos; float mass; };\n"
           "typedef struct { int a, b[2]; P p; } Pair;\n"
           "struct Method { float x; __device__ float f() const { return x; } };\n"
           'extern "C" __global__ void k(const P* ps, Pair* out, const Method* m, float4* v, int n) {}\n')
    structs = _cdecl.parse_structs(src)
    assert structs["P"] == "P{pos:float3,mass:f32}@16" and "Method" not in structs  # not plain: left untyped
    assert _dtypes.itemsize(structs["Pair"]) == 32  # a, b[2] at 0..12, p aligned to 16
    decl = _cdecl.parse_declarations(src)["k"]
    assert [(p.name, p.dtype, p.direction) for p in decl.params] == [
        ("ps", structs["P"], "in"), ("out", structs["Pair"], "out"), ("m", None, "in"), ("v", "float4", "out"),
        ("n", "i32", "in")]


def test_structs_declared_in_a_sidecar():
    sc = parse_sidecar({"structs": {"Particle": {"pos": "float3", "vel": "float3", "mass": "f32"}},
                        "params": [{"name": "ps", "type": "Particle*", "direction": "in"},
                                   {"name": "v", "type": "float4*"}]})
    assert sc.params[0].dtype == "Particle{pos:float3,vel:float3,mass:f32}" and sc.params[1].dtype == "float4"


@pytest.mark.parametrize(("data", "match"), [
    ({"structs": []}, "'structs' must be an object"),
    ({"structs": {"P": {"x": "nope"}}}, r"structs: struct P: field 'x' has type 'nope'"),
    ({"params": [{"name": "g", "type": "float4"}]}, r"a float4 \(4 x f32, 16 bytes\) is passed by pointer"),
    ({"params": [{"name": "g", "type": "Nope*"}]}, r"pointers may also point to a vector type"),
])
def test_bad_sidecar_structs_and_vectors(data, match):
    with pytest.raises(rxcuda.KernelFileError, match=match):
        parse_sidecar(data, "k.json")


# -- float4 ports end to end (null driver) ------------------------------------------------------------------
def test_float4_ports_from_cuda_cxx(engine, api):
    drift = engine.add(Block.from_cuda(DRIFT, size=100, dt=0.5))
    assert [(p.name, p.dtype, p.shape) for p in drift.description.ports] == [
        ("pos", "float4", (100,)), ("vel", "float4", (100,)), ("out", "float4", (100,))]
    engine.write(drift["pos"], np.ones((100, 4), np.float32))
    engine.write(drift["vel"], np.zeros(100, _dtypes.to_numpy("float4")))  # structured works too
    engine.tick()
    assert {b.label: b.nbytes for b in engine.plan.buffers}["drift.out"] == 1600
    assert engine.read(drift["out"]).shape == (100, 4) and engine.read(drift["out"]).dtype == np.float32
    with pytest.raises(ValidationError, match=r"drift\.pos takes float4 .* shaped \(\.\.\., 4\)"):
        engine.write(drift["pos"], np.ones((100, 3), np.float32))


def test_a_float4_output_into_a_float3_input_is_an_error_that_says_so(engine):
    drift = engine.add(Block.from_cuda(DRIFT, size=64))
    take3 = engine.add(Block.from_cuda(TAKE3, size=64))
    with pytest.raises(ValidationError, match=r"cannot connect drift\.out \(float4 \(4 x f32, 16 bytes\)\) to "
                                              r"take3\.p \(float3 \(3 x f32, 12 bytes\)\): element types differ; "
                                              r"a float4 output feeds only a float4 input"):
        engine.connect(drift["out"], take3["p"])


def test_struct_ports_from_cuda_cxx(engine):
    weigh = engine.add(Block.from_cuda(PARTICLES, size=10))
    spec = weigh["ps"].spec
    assert spec.dtype.startswith("Particle{") and _dtypes.itemsize(spec.dtype) == 28
    arr = np.zeros(10, rxcuda.numpy_dtype(spec.dtype))
    arr["vel"][:, 0] = 2.0
    engine.write(weigh["ps"], arr)
    engine.tick()
    assert {b.label: b.nbytes for b in engine.plan.buffers}["weigh.ps"] == 280
    assert engine.read(weigh["ps"]).dtype == rxcuda.numpy_dtype(spec.dtype)
    with pytest.raises(ValidationError, match=r"weigh\.ps takes struct Particle \(28 bytes\), got float32; pass a "
                                              r"structured array"):
        engine.write(weigh["ps"], np.zeros(10, np.float32))


# -- shape rules -----------------------------------------------------------------------------------------------
def test_rules_apply_and_name_ports_and_shapes_when_they_cannot():
    assert Like("x").apply({"x": (3, 5)}, "out") == (3, 5)
    assert Reduce("x", axis=1).apply({"x": (4, 8)}, "s") == (4,)
    assert Reduce("x", axis=(0, 1)).apply({"x": (4, 8)}, "s") == (1,)
    assert Reduce("x", axis=-1, keepdims=True).apply({"x": (4, 8)}, "s") == (4, 1)
    assert Broadcast("a", "b").apply({"a": (4, 1), "b": (8,)}, "out") == (4, 8)
    with pytest.raises(ShapeError, match=r"'s' reduces 'x' over axis 2, but 'x' has shape \(4, 8\) \(2 axes\)"):
        Reduce("x", axis=2).apply({"x": (4, 8)}, "s")
    with pytest.raises(ShapeError, match=r"'a' has shape \(4, 3\) and 'b' has shape \(5,\): axis -1 is 3 in one "
                                         r"and 5 in the other"):
        Broadcast("a", "b").apply({"a": (4, 3), "b": (5,)}, "out")


def test_launch_geometry_covers_the_shape():
    from rxcuda.model._shapes import launch_geometry

    assert launch_geometry((1000,), (256, 1, 1)) == (4, 1, 1)
    assert launch_geometry((1000,), (256, 1, 1), items_per_thread=4) == (1, 1, 1)
    assert launch_geometry((480, 640), (16, 16, 1)) == (40, 30, 1)
    assert launch_geometry((2, 30, 40), (8, 8, 2)) == (5, 4, 1)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"count": 10, "shape": (3, 4)}, r"'count' 10 disagrees with 'shape' \(3, 4\)"),
    ({"strides": (4, 1)}, "'strides' need an explicit 'shape'"),
    ({"shape": (3, 4), "strides": (1,)}, r"'strides of port 'x'' must be 2 positive ints"),
    ({"shape": (3, 4), "strides": (2, 1)}, r"make elements of shape \(3, 4\) overlap"),
    ({"shape": (0, 4)}, r"'shape of port 'x'' must be a tuple of positive ints"),
    ({"shape": Follow(), "rule": Follow()}, "gives a rule twice"),
    ({"rule": Reduce("y", 0)}, "input 'x' cannot be a Reduce"),
])
def test_bad_input_declarations(kwargs, match):
    b = BlockBuilder("blk", size=12)
    k = b.add_kernel(f"{KERNELS}/scalar_mul.ptx")
    with pytest.raises(ValueError, match=match):
        b.input("x", k["x"], **kwargs)


def _reducer(out_shape, **kw):
    from tests.unit._pipeline import kcode, ptr, scalar

    code = kcode("rows", ptr("x"), ptr("s", "out"), scalar("rows"), scalar("cols"))
    b = BlockBuilder("rows")
    k = b.add_kernel(code, over="s", block=kw.pop("block", 128))
    b.input("x", k["x"], shape=kw.pop("x_shape", (6, 10)), rule=Follow())
    b.output("s", k["s"], shape=out_shape)
    b.scalar("rows", k["rows"], size_of=("x", 0))
    b.scalar("cols", k["cols"], size_of=("x", 1))
    return b.build()


def test_a_builder_derives_declared_shapes_scalars_and_grids_from_rules():
    blk = _reducer(Reduce("x", axis=1))
    s = blk.description.port("s")
    assert s.shape == (6,) and s.count == 6 and s.rule == Reduce("x", 1)
    assert blk.params["rows"].value == 6 and blk.params["cols"].value == 10
    kernel = blk.description.kernels[0]
    assert kernel.grid_of == "s" and kernel.launch.grid == (1, 1, 1)


@pytest.mark.parametrize(("build", "match"), [
    (lambda: _reducer(Like("nope")), r"port 's' takes its shape from 'nope', which is not a port of the block"),
    (lambda: _reducer(Reduce("x", axis=3)), r"rows: 's' reduces 'x' over axis 3, but 'x' has shape \(6, 10\)"),
])
def test_bad_rules_are_refused_when_the_block_is_built(build, match):
    with pytest.raises(ValidationError, match=match):
        build()


def test_rules_that_refer_to_each_other_are_refused():
    from tests.unit._pipeline import kcode, ptr

    code = kcode("k", ptr("x"), ptr("a", "out"), ptr("b", "out"))
    b = BlockBuilder("loop", size=8)
    k = b.add_kernel(code)
    b.input("x", k["x"])
    b.output("a", k["a"], shape=Like("b"))
    b.output("b", k["b"], shape=Like("a"))
    with pytest.raises(ValidationError, match="the shape rules of ports a, b refer to each other"):
        b.build()


def test_a_like_port_with_another_explicit_shape_is_refused():
    from tests.unit._pipeline import kcode, ptr

    code = kcode("k", ptr("x"), ptr("y"), ptr("out", "out"))
    b = BlockBuilder("pair")
    k = b.add_kernel(code, threads=8)
    b.input("x", k["x"], shape=(2, 4))
    b.input("y", k["y"], shape=(4, 2), rule=Like("x"))
    b.output("out", k["out"], shape=(8,))
    with pytest.raises(ShapeError, match=r"port 'y' has shape \(4, 2\) but is declared like 'x', which has shape "
                                         r"\(2, 4\)"):
        b.build()


def test_from_kernel_with_a_shape_and_a_2d_block():
    blk = Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", shape=(480, 640), block_size=(16, 16))
    assert blk["x"].spec.shape == (480, 640) and blk["out"].spec.rule == Like("x")
    assert blk.launch() == rxcuda.Launch(grid=(40, 30), block=(16, 16))
    assert blk.params["n"].value == 480 * 640
    with pytest.raises(TypeError, match="needs 'size'"):
        Block.from_kernel(f"{KERNELS}/scalar_mul.ptx")


# -- connections: element types and declared shapes ---------------------------------------------------------
def _port_block(name, shape, direction="out", rule=None, strides=None, dtype="f32"):
    from tests.unit._pipeline import kcode, ptr

    code = kcode(name, ptr("p", direction, dtype))
    b = BlockBuilder(name)
    k = b.add_kernel(code, threads=8)
    if direction == "out":
        b.output("p", k["p"], shape=shape, strides=strides, dtype=dtype)
    else:
        b.input("p", k["p"], shape=shape, strides=strides, rule=rule, dtype=dtype)
    return b.build()


@pytest.mark.parametrize(("src", "dst", "match"), [
    (((64,),), ((32,), "in"), r"cannot connect s\.p \(64 elements\) to d\.p \(32 elements\): sizes differ"),
    (((4, 8),), ((4, 4), "in"), r"cannot connect s\.p \(shape \(4, 8\), 32 elements\) to d\.p \(shape \(4, 4\), "
                                r"16 elements\): sizes differ"),
    (((4, 8),), ((8, 4), "in"), r"cannot connect s\.p \(shape \(4, 8\)\) to d\.p \(shape \(8, 4\)\): shapes differ "
                                r"and d\.p has a fixed shape"),
    (((4, 8), "out", None, (16, 1)), ((4, 8), "in"), r"cannot connect s\.p \(shape \(4, 8\), strides \(16, 1\)\) "
                                                     r"to d\.p \(shape \(4, 8\), C-contiguous\)"),
])
def test_connections_whose_declared_shapes_do_not_fit(src, dst, match):
    engine = rxcuda.Engine(driver=NullDriver())
    try:
        s = engine.add(_port_block("s", *src))
        d = engine.add(_port_block("d", *dst))
        with pytest.raises(ValidationError, match=match):
            engine.connect(s["p"], d["p"])
    finally:
        engine.close()


def test_compatible_declared_shapes_connect_and_resolve():
    engine = rxcuda.Engine(driver=NullDriver())
    try:
        s = engine.add(_port_block("s", (4, 8)))
        flat = engine.add(_port_block("flat", (32,), "in"))  # a 1-D input takes any shape of 32 elements
        follow = engine.add(_port_block("follow", (8, 4), "in", Follow()))
        engine.connect(s["p"], flat["p"])
        engine.connect(s["p"], follow["p"])  # declared (8, 4), but it follows: it takes (4, 8)
        engine.tick()
        assert engine.shape(flat["p"]) == (32,) and engine.shape(follow["p"]) == (4, 8)
        assert engine.plan.shapes == {PortRef(follow.id, "p"): (4, 8)}
    finally:
        engine.close()


# -- planning shapes (pure) -----------------------------------------------------------------------------------
def _desc(*blocks, connections=(), shapes=None, fed=()):
    from tests.unit._pipeline import entry, ref

    return PipelineDescription(tuple(entry(b) for b in blocks),
                               tuple(Connection(ref(a), ref(b)) for a, b in connections),
                               fed=frozenset(ref(p) for p in fed),
                               shapes={ref(p): s for p, s in (shapes or {}).items()})


def test_a_resize_flows_downstream_through_following_ports():
    from tests.unit._pipeline import add, mul, ref

    a, m = add(64), mul(64)
    gp = rxcuda.plan(_desc(a, m, connections=[(a["out"], m["x"])], fed=[a["a"], a["b"]],
                           shapes={a["a"]: (128,), a["b"]: (128,)}))
    assert gp.shapes[ref(m["out"])] == (128,)
    assert {b.label: b.count for b in gp.buffers}["mul.out"] == 128
    node = gp.nodes[gp.kernel_nodes[(m.id, "mul")]]
    assert node.launch.grid == (1, 1, 1) and [x.value for x in node.args if hasattr(x, "value")] == [1.0, 128]


def test_nothing_resized_resolves_to_the_declared_shapes_for_free():
    from tests.unit._pipeline import add, mul

    a, m = add(64), mul(64)
    gp = rxcuda.plan(_desc(a, m, connections=[(a["out"], m["x"])], fed=[a["a"], a["b"]]))
    assert gp.shapes == {}


def test_a_reduction_over_an_axis_follows_a_2d_resize():
    from tests.unit._pipeline import ref

    blk = _reducer(Reduce("x", axis=1))
    gp = rxcuda.plan(_desc(blk, fed=[blk["x"]], shapes={blk["x"]: (50, 7)}))
    assert gp.shapes[ref(blk["s"])] == (50,)
    node = gp.nodes[0]
    values = {blk.description.scalars[i].name: v for i, v in enumerate(
        [a.value for a in node.args if hasattr(a, "value")])}
    assert values == {"rows": 50, "cols": 7} and node.launch.grid == (1, 1, 1)


def test_shape_errors_at_plan_time_name_both_ports_and_both_shapes():
    from tests.unit._pipeline import add, kcode, ptr, scalar

    a = add(64)
    fixed = BlockBuilder("fixed")
    k = fixed.add_kernel(kcode("f", ptr("x"), scalar("n", default=64)), threads=64)
    fixed.input("x", k["x"], count=64)  # an explicit count: fixed
    fixed = fixed.build()
    with pytest.raises(ShapeError) as e:
        rxcuda.plan(_desc(a, fixed, connections=[(a["out"], fixed["x"])], fed=[a["a"], a["b"]],
                          shapes={a["a"]: (128,), a["b"]: (128,)}))
    assert "add.out has shape (128,) but fixed.x takes shape (64,), a fixed shape" in str(e.value)
    with pytest.raises(ShapeError) as e:
        rxcuda.plan(_desc(a, fed=[a["a"], a["b"]], shapes={a["a"]: (128,)}))
    assert ("add.b must have the shape of add.a, but add.a has shape (128,) (resized) and add.b has shape (64,) "
            "(as declared)") in str(e.value)


def test_a_broadcast_that_does_not_fit_after_a_resize():
    from tests.unit._pipeline import kcode, ptr

    code = kcode("bc", ptr("a"), ptr("b"), ptr("out", "out"))
    b = BlockBuilder("bc")
    k = b.add_kernel(code, over="out")
    b.input("a", k["a"], shape=(4, 1), rule=Follow())
    b.input("b", k["b"], shape=(5,), rule=Follow())
    b.output("out", k["out"], shape=Broadcast("a", "b"))
    blk = b.build()
    assert blk["out"].spec.shape == (4, 5)
    with pytest.raises(ShapeError, match=r"bc: 'out' broadcasts 'a', 'b', but 'a' has shape \(4, 3\) and 'b' has "
                                         r"shape \(5,\)"):
        rxcuda.plan(_desc(blk, fed=[blk["a"], blk["b"]], shapes={blk["a"]: (4, 3)}))


def test_a_bound_array_too_small_for_the_resized_port():
    from rxcuda.lowlevel import ExternalBinding
    from tests.unit._pipeline import add, ref

    a = add(64)
    desc = _desc(a, fed=[a["b"]], shapes={a["a"]: (128,), a["b"]: (128,)})
    desc = PipelineDescription(desc.blocks, desc.connections, {ref(a["a"]): ExternalBinding("f32", 100)},
                               desc.fed, shapes=desc.shapes)
    with pytest.raises(ValidationError, match=r"array bound to add\.a has 100 elements, the port needs 128"):
        rxcuda.plan(desc)


# -- resizing on the null driver: which path ------------------------------------------------------------------
def _chain(engine, n=N):
    add = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=n))
    mul = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=n, scale=3.0))
    other = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=n, name="other"))
    engine.connect(add["out"], mul["x"])
    for port in (add["a"], add["b"], other["x"]):
        engine.write(port, np.ones(n, np.float32))
    engine.tick()
    return add, mul, other


def test_a_resize_that_fits_the_buffers_is_exec_node_updates_only(engine, api):
    add, mul, _other = _chain(engine)
    pointers = dict(engine._rt.graph.pointers)
    engine.write(add["a"], np.ones(600, np.float32), resize=True)
    engine.write(add["b"], np.ones(600, np.float32), resize=True)
    mark = len(api.calls)
    frame = engine.tick()
    calls = api.since(mark)
    assert frame.tiers == ("parameters",) and frame.state == "ok"
    assert calls.count("cuGraphExecKernelNodeSetParams") == 2  # add and mul: grid and n; `other` untouched
    for heavy in ("cuGraphCreate", "cuGraphInstantiate", "cuGraphExecUpdate", "cuMemAlloc"):
        assert heavy not in calls
    assert engine._rt.graph.pointers == pointers and engine._builder.resized_in_place == 1
    assert engine.shape(mul["out"]) == (600,) and engine.read(mul["out"]).shape == (600,)
    node = engine.plan.nodes[engine.plan.kernel_nodes[(mul.id, "scalar_mul")]]
    assert node.launch.grid == (3, 1, 1) and node.args[-1].value == 600


def test_a_resize_that_outgrows_its_buffers_rebuilds_only_what_it_touches(engine, api):
    add, mul, other = _chain(engine)
    g = engine._rt.graph
    before = {b.label: g.pointers[b.id] for b in g.plan.buffers}
    engine.resize(add["a"], 4 * N)
    engine.resize(add["b"], (4 * N,))
    mark = len(api.calls)
    frame = engine.tick()
    calls = api.since(mark)
    assert frame.tiers == ("structure",) and "cuGraphExecUpdate" in calls and "cuGraphInstantiate" not in calls
    g = engine._rt.graph
    after = {b.label: g.pointers[b.id] for b in g.plan.buffers}
    assert after["other.x"] == before["other.x"] and after["other.out"] == before["other.out"]  # untouched: kept
    assert after["scalar_mul.out"] != before["scalar_mul.out"]
    assert {b.label: b.count for b in g.plan.buffers}["scalar_mul.out"] == 4 * N
    assert engine.read(mul["out"]).shape == (4 * N,) and engine.rebuilds == 2


def test_resizing_back_to_the_declared_shape(engine, api):
    add, mul, _other = _chain(engine)
    engine.resize(add["a"], (512,))
    engine.resize(add["b"], (512,))
    engine.tick()
    engine.resize(add["a"], (N,))
    engine.resize(add["b"], (N,))
    assert engine.tick().tiers == ("parameters",)  # the buffers never shrank: back in place
    assert engine.plan.shapes == {} and engine.shape(mul["out"]) == (N,)


def test_a_resize_some_port_cannot_take_keeps_the_last_good_graph(engine, api):
    add, mul, _other = _chain(engine)
    engine.resize(add["a"], (2 * N,))  # b stays at N: add.b must be like add.a
    frame = engine.tick()
    assert frame.launched and frame.state == "error"
    assert ("vector_add.b must have the shape of vector_add.a, but vector_add.a has shape (2048,) (resized) and "
            "vector_add.b has shape (1024,) (as declared); resize them together") in engine.diagnostic_log[-1].message
    assert engine.shape(mul["out"]) == (N,)  # the running graph is the old one


@pytest.mark.parametrize(("port", "shape", "match"), [
    (lambda a, m: m["out"], (8,), r"scalar_mul\.out is an output: its shape follows from its block's inputs"),
    (lambda a, m: m["x"], (8,), r"scalar_mul\.x is connected from vector_add\.out and takes its shape"),
    (lambda a, m: a["a"], (0,), r"vector_add\.a: 'shape' must be a tuple of positive ints"),
])
def test_bad_resizes_are_refused_at_once(engine, port, shape, match):
    add, mul, _other = _chain(engine)
    with pytest.raises(ValidationError, match=match):
        engine.resize(port(add, mul), shape)


def test_a_fixed_or_strided_input_refuses_a_resize(engine):
    from tests.unit._pipeline import kcode, ptr

    b = BlockBuilder("fixed")
    k = b.add_kernel(kcode("f", ptr("x"), ptr("y")), threads=64)
    b.input("x", k["x"], shape=(8, 8))
    b.input("y", k["y"], shape=(8, 8), strides=(16, 1))
    blk = engine.add(b.build())
    with pytest.raises(ShapeError, match=r"fixed\.x has a fixed shape \(8, 8\) and cannot take \(4, 16\)"):
        engine.resize(blk["x"], (4, 16))
    with pytest.raises(ShapeError, match=r"fixed\.y is laid out with strides \(16, 1\)"):
        engine.resize(blk["y"], (4, 8))


def test_a_write_too_big_says_how_to_resize(engine):
    add, _mul, _other = _chain(engine)
    with pytest.raises(ValidationError, match=r"2048 elements do not fit vector_add\.a \(1024 elements, shape "
                                              r"\(1024,\)\); to give the port the array's shape \(2048,\), write with "
                                              r"resize=True"):
        engine.write(add["a"], np.ones(2 * N, np.float32))


def test_a_strided_port_is_scattered_and_gathered(engine, api):
    from tests.unit._pipeline import kcode, ptr

    b = BlockBuilder("pitched")
    k = b.add_kernel(kcode("p", ptr("img")), threads=32)
    b.input("img", k["img"], shape=(3, 4), strides=(8, 1))  # rows padded to 8 elements
    blk = engine.add(b.build())
    assert blk["img"].spec.extent == 20
    img = np.arange(12, dtype=np.float32).reshape(3, 4)
    engine.write(blk["img"], img)
    engine.tick()
    assert {x.label: x.count for x in engine.plan.buffers}["pitched.img"] == 20
    got = engine.read(blk["img"])
    assert got.shape == (3, 4)  # the null driver reads zeros: only the layout is checked here
    with pytest.raises(ValidationError, match=r"write a whole array of its shape \(3, 4\)"):
        engine.write(blk["img"], np.ones(4, np.float32))


def test_a_bound_array_of_lanes_is_a_vector_port():
    from rxcuda.cuda._memory import ExternalArray
    from rxcuda.engine import _shapes_io

    spec = Block.from_cuda(DRIFT, size=16)["pos"].spec
    ext = ExternalArray(0x1000, "f32", 64, (16, 4), owner=None)
    got = _shapes_io.as_elements(ext, spec, "drift.pos")
    assert (got.dtype, got.count, got.shape) == ("float4", 16, (16,))
    with pytest.raises(ValidationError, match=r"drift\.pos takes float4 .* bind a f32 array shaped \(\.\.\., 4\)"):
        _shapes_io.as_elements(ExternalArray(0x1000, "f32", 48, (16, 3), owner=None), spec, "drift.pos")


INTEGRATE = r"""
extern "C" __global__ void integrate(const float4* pos, const float4* vel, float4* pos_out, float4* vel_out,
                                     float dt, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float4 p = pos[i], v = vel[i]; v.y -= 9.8f * dt;
                 pos_out[i] = make_float4(p.x + dt * v.x, p.y + dt * v.y, p.z + dt * v.z, p.w); vel_out[i] = v; }
}
"""


def test_float4_state_fed_back_through_delayed_connections(engine):
    n = 1000
    integ = engine.add(Block.from_cuda(INTEGRATE, size=n, dt=0.01))
    start = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
    engine.connect(integ["pos_out"], integ["pos"], delay=1, initial=start)  # (n, 4) float32: n float4
    engine.connect(integ["vel_out"], integ["vel"], delay=1)
    frame = engine.tick()
    assert frame.state == "ok"
    assert {b.label: b.nbytes for b in engine.plan.buffers}["integrate.pos_out (previous frame)"] == 16 * n
    with pytest.raises(ValidationError, match=r"takes float4 .* shaped \(\.\.\., 4\)"):
        engine.connect(integ["vel_out"], integ["vel"], delay=1, initial=np.zeros((n, 3), np.float32))


@pytest.mark.parametrize("module", ["rxcuda.model._shapes", "rxcuda.model._dtypes", "rxcuda.plan._shapes",
                                    "rxcuda.sources._cdecl"])
def test_docstring_examples_run_without_a_gpu(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_observers_and_streamed_inputs_follow_a_resize(engine):
    from reactivex.subject import Subject

    add = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N))
    a, b = Subject(), Subject()
    engine.feed(add["a"], a)
    engine.feed(add["b"], b)
    seen: list = []
    engine.observe(add["out"]).subscribe(seen.append)
    a.on_next(np.ones(N, np.float32))
    b.on_next(np.ones(N, np.float32))
    engine.tick()
    assert seen[-1].shape == (N,)
    engine.resize(add["a"], (2 * N,))
    engine.resize(add["b"], (2 * N,))
    engine.tick()
    assert seen[-1].shape == (2 * N,)  # the same subscription, the new shape
    a.on_next(np.ones(2 * N, np.float32))  # the stream takes arrays of the new size
    b.on_next(np.ones(2 * N, np.float32))
    engine.tick()
    assert seen[-1].shape == (2 * N,) and not [d for d in engine.diagnostic_log if d.severity == "warning"]


def test_observing_a_float4_port_gives_lanes_on_a_last_axis(engine):
    drift = engine.add(Block.from_cuda(DRIFT, size=10))
    engine.write(drift["pos"], np.ones((10, 4), np.float32))
    engine.write(drift["vel"], np.ones((10, 4), np.float32))
    seen: list = []
    engine.observe(drift["out"]).subscribe(seen.append)
    engine.tick()
    assert seen[-1].shape == (10, 4) and seen[-1].dtype == np.float32


def test_a_resize_through_a_delayed_loop_updates_its_copy_in_place(engine, api):
    acc = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N, name="acc"))
    engine.connect(acc["out"], acc["b"], delay=1)  # b is like a, and fed back from out (like a)
    engine.write(acc["a"], np.ones(N, np.float32))
    engine.tick()
    engine.write(acc["a"], np.ones(600, np.float32), resize=True)
    mark = len(api.calls)
    frame = engine.tick()
    calls = api.since(mark)
    assert frame.tiers == ("parameters",)
    assert calls[:2] == ["cuGraphExecKernelNodeSetParams", "cuGraphExecMemcpyNodeSetParams"]
    assert {b.label: b.count for b in engine.plan.buffers}["acc.out (previous frame)"] == 600
    assert engine.shape(acc["b"]) == (600,)


def test_a_vector_passed_by_value_says_how_to_pass_it():
    with pytest.raises(TypeError, match=r"g\.gravity: a float4 \(4 x f32, 16 bytes\) passed by value is not a block "
                                        r"parameter; pass its components as separate scalar parameters"):
        Block.from_cuda('extern "C" __global__ void g(float4* p, float4 gravity, int n) {}', size=8)


def test_a_block_prints_its_ports_shapes():
    text = str(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", shape=(4, 8)))
    assert "in port x: f32[4, 8]" in text and "parameter n: i32 = 32" in text
