"""Descriptions: Launch validation, signature layouts, dtype spellings, port and kernel lookups."""

from __future__ import annotations

import pytest
from _pipeline import ADD, MUL, builder, kcode, ptr, scalar

from rxcuda import Block, KernelCode, KernelSignature, Launch, UnknownPortError, ValidationError


# -- Launch -----------------------------------------------------------------------------------------------
def test_launch_pads_dimensions_to_three():
    la = Launch(grid=5, block=(16, 4))
    assert la.grid == (5, 1, 1) and la.block == (16, 4, 1) and la.threads == 320


def test_launch_default_block_is_256():
    assert Launch(grid=(2,)).block == (256, 1, 1)


def test_launch_refuses_more_than_1024_threads_per_block():
    with pytest.raises(ValueError, match="'block' has 2048 threads; a CUDA block holds at most 1024"):
        Launch(grid=1, block=(64, 32))


@pytest.mark.parametrize("grid", [0, -1, (1, 0), (2, 2.5), (True,)])
def test_launch_refuses_non_positive_dimensions(grid):
    with pytest.raises(ValueError, match="'grid' must hold positive ints"):
        Launch(grid=grid)


def test_launch_refuses_four_dimensions():
    with pytest.raises(ValueError, match=r"'block' must have 1 to 3 dimensions \(got \(1, 1, 1, 1\)\)"):
        Launch(grid=1, block=(1, 1, 1, 1))


def test_launch_refuses_negative_shared_memory():
    with pytest.raises(ValueError, match=r"'shared_mem' must be a non-negative int \(got -4\)"):
        Launch(grid=1, shared_mem=-4)


@pytest.mark.parametrize(
    ("threads", "block", "grid"), [(1, 256, 1), (256, 256, 1), (257, 256, 2), (1000, 128, 8), (1 << 20, 1024, 1024)]
)
def test_for_threads_covers_every_thread(threads, block, grid):
    la = Launch.for_threads(threads, block=block)
    assert la.grid == (grid, 1, 1) and la.block == (block, 1, 1)
    assert la.threads >= threads > la.threads - block


@pytest.mark.parametrize("threads", [0, -5, 2.0])
def test_for_threads_needs_a_positive_int(threads):
    with pytest.raises(ValueError, match="'threads' must be a positive int"):
        Launch.for_threads(threads)


def test_launch_is_a_value():
    assert Launch.for_threads(1000) == Launch(grid=(4,), block=(256,))
    assert hash(Launch(grid=2)) == hash(Launch(grid=(2, 1, 1)))


# -- signatures and code ----------------------------------------------------------------------------------
def test_same_layout_ignores_names_types_and_directions():
    other = KernelSignature("sub", (ptr("x", "inout", None), ptr("y"), ptr("z", "out"), scalar("count", "u32")))
    assert ADD.signature.same_layout(other)


def test_pointer_and_8_byte_scalar_differ_in_layout():
    a = KernelSignature("k", (ptr("p"),))
    b = KernelSignature("k", (scalar("v", "i64", size=8),))
    assert not a.same_layout(b)


def test_extra_parameter_changes_the_layout():
    add3 = KernelSignature("add3", (*ADD.signature.params[:3], ptr("c"), ADD.signature.params[3]))
    assert not ADD.signature.same_layout(add3)


def test_scalar_size_changes_the_layout():
    a = KernelSignature("k", (scalar("v", "f32"),))
    b = KernelSignature("k", (scalar("v", "f64", size=8),))
    assert not a.same_layout(b)


def test_kernel_param_describe():
    assert ptr("a").describe() == "f32* a (in)"
    assert ptr("raw", "inout", None).describe() == "void* raw (inout)"
    assert scalar("n").describe() == "i32 n"
    assert scalar("blob", None, size=16).describe() == "16-byte blob"


def test_code_key_follows_content_and_entry():
    one = kcode("k", ptr("x"), image=b"abc")
    assert one.key == kcode("k", ptr("x"), image=b"abc").key
    assert one.key != kcode("k", ptr("x"), image=b"abd").key
    assert one.key != kcode("j", ptr("x"), image=b"abc").key


def test_code_format_is_checked():
    with pytest.raises(ValueError, match="'format' must be 'ptx', 'cubin' or 'fatbin'"):
        KernelCode(entry="k", image=b"", format="cu", signature=KernelSignature("k"))


def test_port_dtypes_take_numpy_and_c_spellings():
    b = builder()
    k = b.add_kernel(kcode("raw", ptr("x", "inout", dtype=None), ptr("y", "inout", dtype=None)))
    b.input("x", k["x"], dtype="float")
    b.input("y", k["y"], dtype="uint32")
    assert [p.dtype for p in b.build().description.ports] == ["f32", "u32"]
    other = builder()
    with pytest.raises(ValueError, match="unknown scalar type 'complex'"):
        other.input("z", other.add_kernel(MUL)["x"], dtype="complex")


# -- block descriptions -----------------------------------------------------------------------------------
def mul_block(code=MUL, size=64, default=1.0, threads=None):
    b = builder("m", size=size)
    k = b.add_kernel(code, threads=threads)
    b.input("x", k["x"])
    b.output("out", k["out"])
    b.scalar("scale", k["scale"], default=default)
    b.scalar("n", k["n"])
    return b.build().description


def test_block_description_lookups():
    d = mul_block()
    assert d.port("x").direction == "in" and d.kernel("mul").code is MUL
    with pytest.raises(KeyError, match=r"block 'm' has no kernel 'add' \(kernels: mul\)"):
        d.kernel("add")


def test_unknown_port_is_a_validation_error_and_a_key_error():
    d = mul_block()
    with pytest.raises(UnknownPortError, match=r"block 'm' has no port 'outt' \(ports: x, out\); did you mean 'out'\?"):
        d.port("outt")
    assert issubclass(UnknownPortError, ValidationError) and issubclass(UnknownPortError, KeyError)
    try:
        d.port("nope")
    except KeyError as e:  # the old way to catch it still works, and reads like any other message
        assert str(e) == "block 'm' has no port 'nope' (ports: x, out)" and e.subject == "m"


def test_launch_block_size_is_checked_before_dividing():
    with pytest.raises(ValueError, match=r"'block' must be an int from 1 to 1024 threads per block \(got 0\)"):
        Launch.for_threads(100, block=0)
    with pytest.raises(ValueError, match=r"'block' must be an int from 1 to 1024 .*\(got 2048\)"):
        Launch.for_threads(100, block=2048)


def test_a_block_entry_made_of_its_own_dicts_equals_one_made_through_the_converters():
    from rxcuda.lowlevel import BlockEntry

    block = Block.from_kernel("scalar_mul", size=8, name="m", scale=2.0)
    values, launches = block.values(), block.launches()
    fast = BlockEntry.of(block.id, block.description, values, launches)
    assert fast == BlockEntry(block.id, block.description, values, launches)
    assert fast.values is values and fast.value("scale") == 2.0 and fast.launch("scalar_mul") == block.launch()
