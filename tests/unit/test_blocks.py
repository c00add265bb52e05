"""Blocks and BlockBuilder: every builder error, from_kernel on the shipped kernels, parameters, changes."""

from __future__ import annotations

import pathlib
import shutil

import attrs
import numpy as np
import pytest
from _pipeline import ADD, APPEND, MUL, builder, kcode, ptr, scalar

from rxcuda import (
    Block,
    BlockBuilder,
    CallSpec,
    ForeignBlockError,
    Launch,
    NotAPortError,
    PortHandle,
    UnknownPortError,
    ValidationError,
)
from rxcuda.blocks._blocks import resolve_port
from rxcuda.lowlevel import Pin, PortRef
from rxcuda.streams import BlockChanged, PendingPlan

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "kernels"


# -- builder errors ---------------------------------------------------------------------------------------
def test_builder_needs_a_name():
    with pytest.raises(ValueError, match=r"'name' must be a non-empty str \(got ''\)"):
        BlockBuilder("")


def test_builder_size_must_be_positive():
    with pytest.raises(ValueError, match=r"'size' must be a positive int \(got -3\)"):
        BlockBuilder("b", size=-3)


def test_build_needs_a_kernel():
    with pytest.raises(ValidationError, match="b: a block needs at least one kernel or call"):
        BlockBuilder("b", size=4).build()


def test_build_names_an_unfed_pointer():
    b = builder()
    k = b.add_kernel(ADD)
    b.input("a", k["a"])
    b.output("out", k["out"])
    with pytest.raises(ValidationError, match=r"parameter 1 \('b'\) of 'add' is not fed; declare a port or internal"):
        b.build()


def test_build_names_an_unfed_scalar_without_default():
    b = builder()
    k = b.add_kernel(kcode("k", ptr("x", "inout"), scalar("gain", "f32")))
    b.input("x", k["x"])
    with pytest.raises(ValidationError, match=r"parameter 1 \('gain'\) of 'k' is not fed; declare a scalar parameter"):
        b.build()


def test_scalar_with_kernel_default_may_stay_undeclared():
    b = builder()
    k = b.add_kernel(MUL)
    b.input("x", k["x"])
    b.output("out", k["out"])
    blk = b.build()  # scale (1.0) and n ("size") have defaults
    assert dict(blk.params) == {}


def test_port_on_a_scalar_parameter_is_refused():
    b = builder()
    k = b.add_kernel(MUL)
    with pytest.raises(ValidationError, match="which is a scalar; declare it with scalar"):
        b.input("scale", k["scale"])


def test_input_on_a_written_parameter_is_refused():
    b = builder()
    k = b.add_kernel(MUL)
    with pytest.raises(ValidationError, match=r"input 'o' maps to 'out' of 'mul', which the kernel writes"):
        b.input("o", k["out"])


def test_port_feeding_parameters_of_different_types_is_refused():
    b = builder()
    k1 = b.add_kernel(MUL)
    k2 = b.add_kernel(kcode("i", ptr("x", dtype="i32"), scalar("n", default="size")))
    with pytest.raises(ValidationError, match=r"port 'x' feeds parameters of different types \(f32, i32\)"):
        b.input("x", [k1["x"], k2["x"]])


def test_declared_dtype_must_match_the_kernel():
    b = builder()
    k = b.add_kernel(MUL)
    with pytest.raises(ValidationError, match="port 'x' is declared i32 but the kernel parameter is f32"):
        b.input("x", k["x"], dtype="int32")


def test_declared_dtype_types_an_untyped_pointer():
    b = builder()
    k = b.add_kernel(kcode("raw", ptr("x", "inout", dtype=None), scalar("n", default="size")))
    b.input("x", k["x"], dtype="float64")
    assert b.build().description.port("x").dtype == "f64"


def test_output_from_two_parameters_is_refused():
    b = builder()
    k = b.add_kernel(ADD)
    with pytest.raises(ValueError, match="output 'out' must come from exactly one kernel parameter"):
        b.output("out", [k["out"], k["a"]])


def test_port_without_count_or_size_is_refused():
    b = BlockBuilder("nosize")
    k = b.add_kernel(MUL, threads=8)
    with pytest.raises(ValueError, match="port 'x' needs a positive element 'count'"):
        b.input("x", k["x"])


def test_append_counter_must_be_u32_pointer():
    b = builder()
    k = b.add_kernel(kcode("bad", ptr("x"), ptr("out", "out"), ptr("cnt", "inout", "f32")))
    with pytest.raises(ValidationError, match=r"the counter of append output 'out' must be a u32\* parameter"):
        b.output("out", k["out"], counter=k["cnt"])


def test_a_parameter_can_be_used_once():
    b = builder()
    k = b.add_kernel(ADD)
    b.input("a", k["a"])
    with pytest.raises(ValidationError, match="parameter 0 of 'add' is already used by 'a'"):
        b.input("again", k["a"])


def test_names_are_declared_once():
    b = builder()
    k = b.add_kernel(ADD)
    b.input("a", k["a"])
    with pytest.raises(ValidationError, match="'a' is declared twice"):
        b.input("a", k["b"])


def test_names_must_be_non_empty_strings():
    b = builder()
    k = b.add_kernel(ADD)
    with pytest.raises(ValueError, match="port and parameter names must be non-empty str"):
        b.input("", k["a"])


def test_scalar_on_a_pointer_is_refused():
    b = builder()
    k = b.add_kernel(MUL)
    with pytest.raises(ValidationError, match="parameter 'x' maps to 'x' of 'mul', which is a pointer"):
        b.scalar("x", k["x"])


def test_scalar_of_unknown_type_needs_dtype():
    b = builder()
    k = b.add_kernel(kcode("k", ptr("x", "inout"), scalar("v", dtype=None, size=4)))
    with pytest.raises(ValidationError, match=r"the type of parameter 'v' is unknown \(no sidecar\); pass dtype="):
        b.scalar("v", k["v"])


def test_refused_declaration_leaves_the_builder_unchanged():
    b = builder()
    k = b.add_kernel(kcode("k", ptr("x", "inout"), scalar("v", dtype=None, size=4)))
    with pytest.raises(ValidationError, match="is unknown"):
        b.scalar("v", k["v"])
    with pytest.raises(ValidationError, match="is declared i32"):
        b.input("x", k["x"], dtype="i32")
    b.input("x", k["x"])  # neither failed call claimed its parameter
    b.scalar("v", k["v"], dtype="u32", default=7)
    assert b.build().params["v"].value == 7


def test_refused_internal_connection_claims_nothing():
    b = builder()
    k1, k2, k3 = b.add_kernel(MUL), b.add_kernel(MUL), b.add_kernel(MUL)
    b.input("x", k3["x"])
    with pytest.raises(ValidationError, match="already used by 'x'"):
        b.connect(k1["out"], [k2["x"], k3["x"]])
    b.connect(k1["out"], k2["x"])  # k1.out was not left claimed


def test_a_parameter_listed_twice_is_refused():
    b = builder()
    k = b.add_kernel(ADD)
    with pytest.raises(ValueError, match="a kernel parameter is listed twice"):
        b.input("a", [k["a"], k["a"]])


def test_scalar_of_unknown_type_with_dtype_is_accepted():
    b = builder()
    k = b.add_kernel(kcode("k", ptr("x", "inout"), scalar("v", dtype=None, size=4)))
    b.input("x", k["x"])
    b.scalar("v", k["v"], dtype="u32", default=7)
    p = b.build().params["v"]
    assert (p.dtype, p.value) == ("u32", 7)


def test_size_default_needs_a_builder_size():
    b = BlockBuilder("nosize")
    k = b.add_kernel(MUL, threads=8)
    with pytest.raises(ValueError, match="parameter 'n' defaults to the block size; give the builder a size"):
        b.scalar("n", k["n"])


def test_internal_connection_joins_pointers_only():
    b = builder()
    k1, k2 = b.add_kernel(MUL), b.add_kernel(MUL)
    with pytest.raises(ValidationError, match="internal connections join pointer parameters"):
        b.connect(k1["out"], k2["scale"])


def test_internal_connection_checks_types():
    b = builder()
    k1 = b.add_kernel(MUL)
    k2 = b.add_kernel(kcode("i", ptr("x", dtype="i32"), scalar("n", default="size")))
    with pytest.raises(ValidationError, match=r"cannot connect mul\.out \(f32\) to i\.x \(i32\)"):
        b.connect(k1["out"], k2["x"])


def test_internal_connection_goes_forward():
    b = builder()
    k1, k2 = b.add_kernel(MUL, name="first"), b.add_kernel(MUL, name="second")
    with pytest.raises(ValidationError, match="first runs before or with second"):
        b.connect(k2["out"], k1["x"])


def test_internal_connection_needs_a_count():
    b = BlockBuilder("nosize")
    k1, k2 = b.add_kernel(MUL, threads=4), b.add_kernel(MUL, threads=4)
    with pytest.raises(ValueError, match="give the internal buffer a 'count'"):
        b.connect(k1["out"], k2["x"])


def test_kernel_needs_threads_grid_or_size():
    with pytest.raises(ValueError, match="give 'threads' or 'grid' for kernel 'mul', or a builder size"):
        BlockBuilder("nosize").add_kernel(MUL)


def test_add_call_takes_a_call_spec():
    with pytest.raises(TypeError, match="add_call takes a CallSpec"):
        builder().add_call("cublasSgemm")


def test_kernel_handle_index_errors():
    k = builder().add_kernel(MUL)
    assert k[1] == Pin("mul", 1) and k["scale"] == Pin("mul", 2)
    with pytest.raises(IndexError, match="'mul' has 4 parameters"):
        k[4]
    with pytest.raises(KeyError, match=r"'mul' has no parameter 'zz' \(it has: x, out, scale, n\)"):
        k["zz"]


def test_pin_must_come_from_this_builder():
    b = builder()
    b.add_kernel(MUL)
    with pytest.raises(KeyError, match="no kernel 'ghost' in this builder"):
        b.input("x", Pin("ghost", 0))
    with pytest.raises(TypeError, match="expected a kernel parameter"):
        b.input("y", ["not a pin"])
    with pytest.raises(ValueError, match="give at least one kernel parameter"):
        b.input("z", [])


def test_same_kernel_twice_gets_unique_names():
    b = builder()
    assert [b.add_kernel(MUL).name for _ in range(3)] == ["mul", "mul_2", "mul_3"]


def test_add_kernel_launch_from_grid_threads_and_sidecar_block():
    b = builder(size=1000)
    assert b.add_kernel(MUL) and b._steps[-1].launch == Launch(grid=(4,), block=(256,))
    b.add_kernel(MUL, threads=100, block=32)
    assert b._steps[-1].launch == Launch(grid=(4,), block=(32,))
    b.add_kernel(MUL, grid=(2, 3), block=(8, 8), shared_mem=128)
    assert b._steps[-1].launch == Launch(grid=(2, 3, 1), block=(8, 8, 1), shared_mem=128)


def test_call_block_ports_and_parameters():
    spec = CallSpec("axpy", (ptr("x"), ptr("y", "inout"), scalar("alpha", "f32", 2.0)), record=lambda a: None)
    b = builder("blas", size=10)
    k = b.add_call(spec)
    b.input("x", k["x"])
    b.output("y", k["y"])
    b.scalar("alpha", k["alpha"])
    blk = b.build()
    assert blk.description.kernels[0] is not spec and blk.description.kernels[0].name == "axpy"
    assert blk.params["alpha"].value == 2.0
    with pytest.raises(TypeError, match=r"blas\.axpy is a library call, not a kernel"):
        blk.set_code("axpy", MUL)


# -- from_kernel on the shipped kernels -------------------------------------------------------------------
def test_from_kernel_vector_add():
    blk = Block.from_kernel(KERNELS / "vector_add.ptx", size=100)
    assert blk.name == "vector_add"
    assert [p.name for p in blk.inputs] == ["a", "b"] and [p.name for p in blk.outputs] == ["out"]
    assert all(p.spec.dtype == "f32" and p.spec.count == 100 for p in blk.inputs + blk.outputs)
    assert blk.values() == {"n": 100}
    assert blk.launch() == Launch(grid=(1,), block=(256,))


def test_from_kernel_scalar_mul_keyword_default_and_name():
    blk = Block.from_kernel(KERNELS / "scalar_mul.ptx", size=8, scale=3.0, name="times3")
    assert blk.name == "times3" and blk.values() == {"scale": 3.0, "n": 8}


def test_from_kernel_append_above_has_an_append_output():
    blk = Block.from_kernel(KERNELS / "append_above.ptx", size=256, threshold=200.0)
    out = blk["out"].spec
    assert out.direction == "out" and out.counter == Pin("append_above", 2) and out.count == 256
    assert blk.values() == {"threshold": 200.0, "capacity": 256, "n": 256}
    assert [p.name for p in blk.inputs] == ["values"]


def test_from_kernel_saxpy():
    blk = Block.from_kernel(KERNELS / "saxpy.ptx", size=16, a=2.0)
    assert [p.name for p in blk.inputs] == ["x", "y"] and [p.name for p in blk.outputs] == ["y_out"]
    assert blk.params["a"].value == 2.0


def test_from_kernel_unknown_keyword_lists_the_scalars():
    with pytest.raises(TypeError, match="unknown parameter.*bogus; the kernel's scalars are scale, n"):
        Block.from_kernel(KERNELS / "scalar_mul.ptx", size=8, bogus=1)


def test_from_kernel_missing_file_is_a_kernel_file_error():
    from rxcuda import KernelFileError

    with pytest.raises(KernelFileError, match="no such file"):
        Block.from_kernel(KERNELS / "vector_ad.ptx", size=8)


def test_unknown_port_lists_the_ports():
    blk = Block.from_kernel(KERNELS / "vector_add.ptx", size=8)
    with pytest.raises(UnknownPortError, match=r"has no port 'c' \(ports: a, b, out\)") as e:
        blk["c"]
    assert isinstance(e.value, ValidationError) and isinstance(e.value, KeyError)
    assert str(e.value) == "block 'vector_add' has no port 'c' (ports: a, b, out)"  # not quoted as KeyError's


@pytest.mark.parametrize("bad", [0, -32, 1025, 2.5, True])
def test_from_kernel_block_size_must_be_1_to_1024(bad):
    with pytest.raises(ValueError, match=rf"'block_size' must be an int from 1 to 1024 .* \(got {bad!r}\)"):
        Block.from_kernel(MUL, size=64, block_size=bad)


def test_block_size_names_the_argument_of_each_call():
    with pytest.raises(ValueError, match=r"'block' must be an int from 1 to 1024 threads per block \(got 0\)"):
        builder().add_kernel(MUL, block=0)
    blk = Block.from_kernel(MUL, size=64, block_size=32)
    assert blk.launch() == Launch(grid=(2,), block=(32,))
    with pytest.raises(ValueError, match=r"'block' must be an int from 1 to 1024 threads per block \(got -32\)"):
        blk.set_launch(threads=64, block=-32)
    assert blk.launch() == Launch(grid=(2,), block=(32,))


# -- resolving ports (what engine.connect, bind, write, read and observe do first) ---------------------------
def test_resolve_port_gives_the_port_ref():
    blk = Block.from_kernel(MUL, size=4)
    assert resolve_port(blk["out"], {blk.id: blk}) == PortRef(blk.id, "out")


@pytest.mark.parametrize("bad", ["out", None, 3])
def test_resolve_port_refuses_what_is_not_a_port(bad):
    blk = Block.from_kernel(MUL, size=4)
    with pytest.raises(NotAPortError, match=r"expected a port such as block\['out'\] \(got ") as e:
        resolve_port(bad, {blk.id: blk})
    assert isinstance(e.value, ValidationError) and isinstance(e.value, TypeError)


def test_resolve_port_of_a_block_says_to_name_a_port():
    blk = Block.from_kernel(MUL, size=4)
    with pytest.raises(NotAPortError, match=r"name one of its ports, e\.g\. mul\['x'\] \(ports: x, out\)"):
        resolve_port(blk, {blk.id: blk})


def test_resolve_port_refuses_a_block_of_another_engine():
    blk, other = Block.from_kernel(MUL, size=4), Block.from_kernel(MUL, size=4, name="other")
    with pytest.raises(ForeignBlockError, match=r"other is not in this engine; engine\.add\(block\) first") as e:
        resolve_port(other["x"], {blk.id: blk})
    assert isinstance(e.value, ValidationError) and e.value.subject == "other"


def test_resolve_port_refuses_an_unknown_port_name():
    blk = Block.from_kernel(MUL, size=4)
    with pytest.raises(UnknownPortError, match=r"block 'mul' has no port 'y' \(ports: x, out\)"):
        resolve_port(PortHandle(blk, "y"), {blk.id: blk})


def test_one_except_catches_every_bad_port():
    blk = Block.from_kernel(MUL, size=4)
    for bad in ("out", PortHandle(Block.from_kernel(MUL, size=4), "x"), PortHandle(blk, "y")):
        with pytest.raises(ValidationError):
            resolve_port(bad, {blk.id: blk})


def test_block_ids_are_unique():
    ids = {Block.from_kernel(MUL, size=4).id for _ in range(5)}
    assert len(ids) == 5


# -- parameters -------------------------------------------------------------------------------------------
def param_block():
    code = kcode(
        "p",
        ptr("x", "inout"),
        scalar("f", "f32", 0.0),
        scalar("i", "i32", 0),
        scalar("u", "u32", 0),
        scalar("b", "u8", 0, size=1),
    )
    return Block.from_kernel(code, size=4)


def test_float_parameter_takes_ints_and_floats_of_python_and_numpy():
    p = param_block().params["f"]
    p.value = 3
    assert p.value == 3.0 and type(p.value) is float
    p.value = np.float32(0.5)
    assert p.value == 0.5 and type(p.value) is float
    p.value = np.int16(-7)
    assert p.value == -7.0
    p.value = np.float64(1e38)
    assert p.value == 1e38


@pytest.mark.parametrize("bad", ["2.5", "abc", True, np.bool_(False), None, 1 + 2j, [1.0], b"1"])
def test_float_parameter_refuses_what_is_not_a_number_and_keeps_its_value(bad):
    p = param_block().params["f"]
    p.value = 1.5
    with pytest.raises(TypeError, match=r"p\.f \(f32\) takes a number: a Python or NumPy int or float \(got "):
        p.value = bad
    assert p.value == 1.5


@pytest.mark.parametrize("bad", [1e300, -1e39, float("inf"), float("-inf"), float("nan"), 10**400, np.float64(4e38)])
def test_f32_parameter_refuses_values_beyond_its_range(bad):
    p = param_block().params["f"]
    p.value = 2.0
    with pytest.raises(ValueError, match=r"p\.f \(f32\) takes a finite number within "
                                         r"\[-3\.4028235e\+38, 3\.4028235e\+38\] \(got "):
        p.value = bad
    assert p.value == 2.0


@pytest.mark.parametrize(("dtype", "top"), [("f16", 65504.0), ("f32", 3.4028234663852886e38),
                                            ("f64", 1.7976931348623157e308)])
def test_each_float_type_takes_its_largest_finite_value_and_no_more(dtype, top):
    size = {"f16": 2, "f32": 4, "f64": 8}[dtype]
    blk = Block.from_kernel(kcode("k", ptr("x", "inout"), scalar("v", dtype, 0.0, size=size)), size=4)
    p = blk.params["v"]
    p.value = top
    p.value = -top
    assert p.value == -top
    beyond = float("inf") if dtype == "f64" else top * 1.0001
    with pytest.raises(ValueError, match=rf"k\.v \({dtype}\) takes a finite number"):
        p.value = beyond
    assert p.value == -top


@pytest.mark.parametrize(("dtype", "size", "lo", "hi"), [
    ("i8", 1, -128, 127), ("i16", 2, -32768, 32767), ("i32", 4, -2**31, 2**31 - 1), ("i64", 8, -2**63, 2**63 - 1),
    ("u8", 1, 0, 255), ("u16", 2, 0, 65535), ("u32", 4, 0, 2**32 - 1), ("u64", 8, 0, 2**64 - 1),
])
def test_each_integer_type_takes_integers_within_its_range(dtype, size, lo, hi):
    blk = Block.from_kernel(kcode("k", ptr("x", "inout"), scalar("v", dtype, 0, size=size)), size=4)
    p = blk.params["v"]
    for v in (lo, hi, np.int64(lo) if lo >= -2**63 else lo, np.uint8(7)):
        p.value = v
        assert p.value == int(v) and type(p.value) is int
    for beyond in (lo - 1, hi + 1):
        with pytest.raises(ValueError, match=rf"k\.v \({dtype}\) must be within \[{lo}, {hi}\] \(got {beyond}\)"):
            p.value = beyond
    assert p.value == 7


@pytest.mark.parametrize("bad", [7.0, 3.5, np.float32(2.0), "7", True, np.bool_(True), None, float("nan")])
def test_int_parameter_refuses_floats_bools_and_strings_and_keeps_its_value(bad):
    p = param_block().params["i"]
    p.value = 4
    with pytest.raises(TypeError, match=r"p\.i \(i32\) takes an integer: a Python or NumPy int \(got "):
        p.value = bad
    assert p.value == 4


def test_a_bad_default_is_refused_when_the_block_is_made():
    with pytest.raises(ValueError, match=r"k\.v \(f16\) takes a finite number .* \(got 100000\.0\)"):
        Block.from_kernel(kcode("k", ptr("x", "inout"), scalar("v", "f16", 0.0, size=2)), size=4, v=1e5)


def test_parameter_messages_follow_a_rename():
    blk = Block.from_kernel(MUL, size=4)
    blk._desc = attrs.evolve(blk._desc, name="renamed")  # what an engine does with a name already taken
    with pytest.raises(TypeError, match=r"renamed\.scale \(f32\) takes a number"):
        blk.params["scale"].value = "x"


def test_int_parameter_range():
    p = param_block().params["i"]
    p.value = 2**31 - 1
    with pytest.raises(ValueError, match=r"p\.i \(i32\) must be within \[-2147483648, 2147483647\] \(got 2147483648\)"):
        p.value = 2**31


def test_u32_parameter_range():
    p = param_block().params["u"]
    p.value = 2**32 - 1
    assert p.value == 4294967295
    with pytest.raises(ValueError, match=r"\(u32\) must be within \[0, 4294967295\] \(got -1\)"):
        p.value = -1


def test_u8_parameter_range():
    p = param_block().params["b"]
    with pytest.raises(ValueError, match=r"\[0, 255\] \(got 256\)"):
        p.value = 256


def test_set_several_and_unknown_parameter():
    blk = param_block()
    blk.set(f=1.5, i=2)
    assert blk.values() == {"f": 1.5, "i": 2, "u": 0, "b": 0}
    with pytest.raises(KeyError, match=r"no parameter 'g' \(parameters: f, i, u, b\)"):
        blk.set(g=1)


def test_parameter_repr():
    blk = Block.from_kernel(MUL, size=4, scale=2.0)
    assert repr(blk.params["scale"]) == "<parameter mul.scale: f32 = 2.0>"


# -- changes notify the engine's sink ---------------------------------------------------------------------
def in_engine(block: Block) -> PendingPlan:
    sink = PendingPlan()
    block._sink = sink
    return sink


def test_parameter_change_notifies_the_sink():
    blk = Block.from_kernel(MUL, size=4)
    sink = in_engine(blk)
    blk.params["scale"].value = 0.5
    blk.set(scale=0.25, n=3)
    plan = sink.drain()
    assert plan.params == {(blk.id, "scale"): 0.25, (blk.id, "n"): 3} and plan.events == 3


def test_rejected_value_notifies_nothing():
    blk = Block.from_kernel(MUL, size=4)
    sink = in_engine(blk)
    with pytest.raises(TypeError):
        blk.params["n"].value = 1.5
    assert sink.drain() is None


def test_block_outside_an_engine_just_records():
    blk = Block.from_kernel(MUL, size=4)
    blk.params["scale"].value = 9.0
    assert blk.values()["scale"] == 9.0


def test_set_launch_threads_and_block():
    blk = Block.from_kernel(MUL, size=1000)
    sink = in_engine(blk)
    new = blk.set_launch(threads=1000, block=128)
    assert new == Launch(grid=(8,), block=(128,)) and blk.launch() == new
    assert sink.drain().launches == {(blk.id, "mul"): new}


def test_set_launch_grid_keeps_block_and_shared_mem():
    blk = Block.from_kernel(MUL, size=64)
    blk.set_launch(grid=7, shared_mem=64)
    assert blk.launch("mul") == Launch(grid=(7,), block=(256,), shared_mem=64)
    assert blk.launches() == {"mul": blk.launch()}


def test_set_launch_refuses_threads_and_grid():
    blk = Block.from_kernel(MUL, size=64)
    with pytest.raises(ValueError, match="give 'threads' or 'grid', not both"):
        blk.set_launch(threads=10, grid=1)


def test_kernel_must_be_named_in_multi_kernel_blocks():
    b = builder("two", size=8)
    k1, k2 = b.add_kernel(MUL, name="first"), b.add_kernel(MUL, name="second")
    b.input("x", k1["x"])
    b.connect(k1["out"], k2["x"])
    b.output("out", k2["out"])
    blk = b.build()
    with pytest.raises(ValueError, match=r"two has several kernels \(first, second\); name the one you mean"):
        blk.set_launch(threads=4)
    with pytest.raises(KeyError, match="no kernel 'third'"):
        blk.launch("third")
    assert blk.set_launch("second", threads=4).grid == (1, 1, 1)


def test_set_code_with_same_layout_is_a_code_change():
    blk = Block.from_kernel(ADD, size=8)
    sink = in_engine(blk)
    sub = kcode("sub", *ADD.signature.params)
    assert blk.set_code(None, sub) == "code"
    assert blk.description.kernels[0].code is sub
    assert sink.drain().code == {(blk.id, "add"): sub}


def test_set_code_with_new_layout_is_a_structure_change():
    blk = Block.from_kernel(ADD, size=8)
    sink = in_engine(blk)
    add3 = kcode("add3", ptr("a"), ptr("b"), ptr("c"), ptr("out", "out"), scalar("n", default="size"))
    assert blk.set_code("add", add3) == "structure"
    plan = sink.drain()
    assert plan.code == {} and len(plan.structure) == 1
    ev = plan.structure[0]
    assert isinstance(ev, BlockChanged) and "changed its signature" in ev.reason


def test_reload_unchanged_file_changes_nothing_and_edited_file_swaps_code(tmp_path):
    src = tmp_path / "k.ptx"
    shutil.copy(KERNELS / "vector_add.ptx", src)
    shutil.copy(KERNELS / "vector_add.json", tmp_path / "k.json")
    blk = Block.from_kernel(src, size=16)
    sink = in_engine(blk)
    assert blk.reload() == []
    src.write_text((KERNELS / "vector_sub.ptx").read_text().replace("vector_sub", "vector_add"))
    assert blk.reload() == ["code"]
    assert list(sink.drain().code) == [(blk.id, "vector_add")]


# -- summaries --------------------------------------------------------------------------------------------
def test_str_block_summarises_kernels_ports_parameters():
    blk = Block.from_kernel(APPEND, size=64, threshold=1.5, name="above")
    text = str(blk)
    assert text.splitlines()[0] == f"block above (#{blk.id}): not built"
    assert "kernel append: append from <memory>, grid 1x256 (256 threads)" in text
    assert " in port values: f32[64]" in text
    assert "out append port out: f32[64]" in text
    assert "parameter threshold: f32 = 1.5" in text


def test_str_block_shows_error_message():
    blk = Block.from_kernel(MUL, size=4)
    blk.state, blk.message = "error", "compile failed"
    assert str(blk).splitlines()[0].endswith("error — compile failed")
    assert repr(blk) == f"<Block mul #{blk.id} error>"


# -- the builder describes; BlockBuilder.build wraps the description -------------------------------------------
def test_the_builder_describes_and_build_wraps_the_description_in_a_new_block():
    from rxcuda.blocks._builder import DescriptionBuilder
    from rxcuda.lowlevel import BlockDescription

    b = BlockBuilder("doubled", size=64)
    k = b.add_kernel("kernels/scalar_mul.ptx")
    b.input("x", k["x"])
    b.output("out", k["out"])
    b.scalar("scale", k["scale"], default=2.0)
    b.scalar("n", k["n"])
    desc = b.describe()
    one, two = b.build(), b.build()
    assert isinstance(b, DescriptionBuilder) and isinstance(desc, BlockDescription)
    assert one.description == desc == two.description and one is not two and one.id != two.id
    assert one.params["scale"].value == 2.0 and [p.name for p in one.outputs] == ["out"]


def test_describing_an_incomplete_block_names_what_is_missing():
    from rxcuda.blocks._builder import DescriptionBuilder

    with pytest.raises(ValidationError, match="empty: a block needs at least one kernel or call"):
        DescriptionBuilder("empty").describe()
    b = DescriptionBuilder("half", size=64)
    k = b.add_kernel("kernels/scalar_mul.ptx")
    b.input("x", k["x"])
    with pytest.raises(ValidationError, match=r"half: parameter 1 \('out'\) of 'scalar_mul' is not fed; declare a "
                                              "port or internal connection"):
        b.describe()
