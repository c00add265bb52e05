"""Descriptions: Launch validation, signature layouts, what counts as a block's structure."""

from __future__ import annotations

import attrs
import pytest
from _pipeline import ADD, MUL, builder, kcode, ptr, scalar

from rxcuda import KernelCode, KernelSignature, Launch
from rxcuda.model._describe import check_dtype


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


def test_signature_index_names_the_parameters():
    assert MUL.signature.index("scale") == 2
    with pytest.raises(KeyError, match=r"kernel 'mul' has no parameter 'gain' \(it has: x, out, scale, n\)"):
        MUL.signature.index("gain")


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


def test_check_dtype_canonical_names():
    assert check_dtype("float") == "f32" and check_dtype("uint32") == "u32" and check_dtype(None) is None
    with pytest.raises(ValueError, match="unknown scalar type 'complex'"):
        check_dtype("complex")


# -- structure --------------------------------------------------------------------------------------------
def mul_block(code=MUL, size=64, default=1.0, threads=None):
    b = builder("m", size=size)
    k = b.add_kernel(code, threads=threads)
    b.input("x", k["x"])
    b.output("out", k["out"])
    b.scalar("scale", k["scale"], default=default)
    b.scalar("n", k["n"])
    return b.build().description


def test_structure_ignores_the_code_image():
    other = kcode("mul", *MUL.signature.params, image=b"// another body")
    assert mul_block().structure() == mul_block(code=other).structure()
    assert mul_block() != mul_block(code=other)


def test_structure_ignores_launch_and_defaults():
    assert mul_block().structure() == mul_block(threads=32, default=5.0).structure()


def test_structure_sees_a_new_signature():
    code = kcode("mul", ptr("x"), ptr("out", "out"), scalar("scale", "f64", 1.0, size=8), scalar("n", default="size"))
    assert mul_block().structure() != mul_block(code=code).structure()


def test_structure_sees_port_sizes():
    assert mul_block(size=64).structure() != mul_block(size=65).structure()


def test_block_description_lookups():
    d = mul_block()
    assert d.port("x").direction == "in" and d.kernel("mul").code is MUL
    with pytest.raises(KeyError, match=r"block 'm' has no kernel 'add' \(kernels: mul\)"):
        d.kernel("add")
    assert attrs.evolve(d, name="other").structure() == d.structure()
