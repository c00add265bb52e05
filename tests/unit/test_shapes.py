"""Shapes and element types without a GPU: vector types and structs (layouts, parsing, host arrays), shape
rules and their planning, every shape validation error, and which path a resize takes on the null driver."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda import Block, BlockBuilder, Broadcast, Follow, Like, Reduce, ShapeError, ValidationError
from rxcuda.cuda import NullDriver
from rxcuda.lowlevel import (
    BlockDescription,
    BlockEntry,
    Connection,
    Pin,
    PipelineDescription,
    PortRef,
    PortSpec,
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


@pytest.fixture
def api():
    return NullDriver()


@pytest.fixture
def engine(api):
    e = rxcuda.Engine(driver=api)
    yield e
    e.close()


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
