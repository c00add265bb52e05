"""The JSON sidecar: parsing, validation messages, and merging with the kernel's real parameters."""

from __future__ import annotations

import json

import pytest

from rxcuda.model._describe import KernelParam, KernelSignature
from rxcuda.model._errors import KernelFileError
from rxcuda.sources import merge, parse_sidecar, read_sidecar, signature_from_ptx
from rxcuda.sources._sidecar import Append, Sidecar, SidecarParam

VECTOR_ADD = {
    "entry": "vector_add",
    "block_size": 128,
    "shared_mem": 64,
    "params": [
        {"name": "a", "type": "f32*", "direction": "in"},
        {"name": "b", "type": "f32*", "direction": "in"},
        {"name": "out", "type": "f32*", "direction": "out"},
        {"name": "n", "type": "i32", "default": "size"},
    ],
}

VECTOR_ADD_PTX = """.version 9.0
.target sm_75
.address_size 64
.visible .entry vector_add(
	.param .u64 vector_add_param_0,
	.param .u64 vector_add_param_1,
	.param .u64 vector_add_param_2,
	.param .u32 vector_add_param_3
)
{ ret; }
"""


def kernel(*params: tuple[str, int, str | None], entry: str = "k") -> KernelSignature:
    """A kernel signature from (kind, size, dtype) triples, named arg0, arg1, ..."""
    return KernelSignature(
        entry=entry,
        params=tuple(
            KernelParam(name=f"arg{i}", kind=kind, size=size, dtype=dtype, align=size)
            for i, (kind, size, dtype) in enumerate(params)
        ),
    )


def sidecar(*params: dict, **top) -> Sidecar:
    return parse_sidecar({"params": list(params), **top}, "k.json")


def test_full_sidecar():
    s = parse_sidecar(json.dumps(VECTOR_ADD), "va.json")
    assert (s.entry, s.block_size, s.shared_mem, s.path, s.append) == ("vector_add", 128, 64, "va.json", None)
    assert s.params[0] == SidecarParam(name="a", dtype="f32", pointer=True, direction="in")
    assert s.params[3] == SidecarParam(name="n", dtype="i32", pointer=False, direction="in", default="size")


def test_defaults_and_optional_keys():
    s = parse_sidecar("{}")
    assert s == Sidecar(entry=None, params=None, block_size=256, shared_mem=0, append=None, path="<sidecar>")


def test_pointer_direction_defaults_to_inout_and_aliases_are_canonical():
    s = sidecar(
        {"name": "p", "type": "float *"}, {"name": "v", "type": "void*"}, {"name": "k", "type": "int"}
    )
    assert (s.params[0].dtype, s.params[0].pointer, s.params[0].direction) == ("f32", True, "inout")
    assert (s.params[1].dtype, s.params[1].spelled()) == (None, "void*")
    assert (s.params[2].dtype, s.params[2].direction) == ("i32", "in")


def test_numeric_defaults():
    s = sidecar(
        {"name": "scale", "type": "f32", "default": 2},
        {"name": "k", "type": "u8", "default": 255.0},
    )
    assert s.params[0].default == 2
    assert s.params[1].default == 255 and isinstance(s.params[1].default, int)


def test_read_sidecar_from_file(tmp_path):
    path = tmp_path / "va.json"
    path.write_text(json.dumps(VECTOR_ADD))
    s = read_sidecar(path)
    assert s.path == str(path) and len(s.params) == 4


def test_read_sidecar_missing_file(tmp_path):
    with pytest.raises(KernelFileError, match="sidecar not found") as e:
        read_sidecar(tmp_path / "nope.json")
    assert e.value.path == str(tmp_path / "nope.json")


def test_invalid_json_says_where():
    with pytest.raises(KernelFileError, match=r"^k.json: not valid JSON: .* at line 2 column"):
        parse_sidecar('{"entry": "k",\n "params": [,]}', "k.json")


@pytest.mark.parametrize(
    "data, match",
    [
        ([], r"k.json: a sidecar must be a JSON object \(got list\)"),
        (
            {"blocksize": 128},
            r"k.json: unknown key 'blocksize' \(did you mean 'block_size'\?\); allowed keys: entry",
        ),
        ({"entry": ""}, r"'entry' must be a non-empty string \(got ''\)"),
        ({"entry": 3}, r"'entry' must be a non-empty string \(got 3\)"),
        ({"block_size": 0}, r"'block_size' must be an int from 1 to 1024 \(got 0\)"),
        ({"block_size": 2048}, r"'block_size' must be an int from 1 to 1024 \(got 2048\)"),
        ({"block_size": True}, r"'block_size' must be an int from 1 to 1024 \(got True\)"),
        ({"shared_mem": -1}, r"'shared_mem' must be a non-negative int, in bytes \(got -1\)"),
        ({"shared_mem": 1.5}, r"'shared_mem' must be a non-negative int, in bytes \(got 1.5\)"),
        ({"params": {"a": "f32*"}}, r"'params' must be a list of objects \(got dict\)"),
    ],
)
def test_top_level_errors(data, match):
    with pytest.raises(KernelFileError, match=match) as e:
        parse_sidecar(data, "k.json")
    assert e.value.path == "k.json"


@pytest.mark.parametrize(
    "param, match",
    [
        ("f32*", r"params\[0\] must be an object like"),
        ({"type": "f32"}, r"params\[0\]: 'name' must be an identifier such as 'out' \(got None\)"),
        ({"name": "my out", "type": "f32"}, r"params\[0\]: 'name' must be an identifier"),
        ({"name": "n"}, r"params\[0\] \('n'\): 'type' is required; one of f16, f32"),
        (
            {"name": "n", "type": "int33"},
            r"k.json: params\[0\] \('n'\): 'type' must be one of f16, .*, void\* \(got 'int33'\)",
        ),
        ({"name": "n", "type": 4}, r"params\[0\] \('n'\): 'type' must be one of .* \(got 4\)"),
        (
            {"name": "n", "type": "i32", "dir": "in"},
            r"params\[0\] \('n'\): unknown key 'dir' \(did you mean 'direction'",
        ),
        (
            {"name": "p", "type": "f32*", "direction": "output"},
            r"params\[0\] \('p'\): 'direction' must be one of in, out, inout, counter \(got 'output'\)",
        ),
        (
            {"name": "n", "type": "i32", "direction": "out"},
            r"params\[0\] \('n'\): a scalar is always an input; 'direction' must be 'in' \(got 'out'\)",
        ),
        ({"name": "p", "type": "f32*", "default": 0}, r"params\[0\] \('p'\): a pointer takes no 'default'"),
        (
            {"name": "n", "type": "i32", "default": "len"},
            r"'default' must be a number or \"size\" \(got 'len'\)",
        ),
        (
            {"name": "n", "type": "i32", "default": True},
            r"'default' must be a number or \"size\" \(got True\)",
        ),
        (
            {"name": "n", "type": "i32", "default": [1]},
            r"'default' must be a number or \"size\" \(got \[1\]\)",
        ),
        (
            {"name": "x", "type": "f32", "default": "size"},
            r"'default' \"size\" is an element count; give 'f32'",
        ),
        (
            {"name": "n", "type": "i32", "default": 1.5},
            r"'default' 1.5 is not an integer, but 'type' is 'i32'",
        ),
        ({"name": "n", "type": "u8", "default": 256}, r"'default' 256 does not fit 'u8' \(0 to 255\)"),
        ({"name": "n", "type": "i8", "default": -129}, r"'default' -129 does not fit 'i8' \(-128 to 127\)"),
        (
            {"name": "c", "type": "i32*", "direction": "counter"},
            r"params\[0\] \('c'\): a counter must have 'type' 'u32\*' \(got 'i32\*'\)",
        ),
    ],
)
def test_param_errors(param, match):
    with pytest.raises(KernelFileError, match=match):
        parse_sidecar({"params": [param]}, "k.json")


def test_duplicate_param_names():
    with pytest.raises(
        KernelFileError, match=r"params\[1\] \('x'\): the name is already used by params\[0\]"
    ):
        sidecar({"name": "x", "type": "f32*"}, {"name": "x", "type": "i32"})


def test_float_default_must_be_finite():
    with pytest.raises(KernelFileError, match=r"'default' must be a number or \"size\" \(got nan\)"):
        sidecar({"name": "x", "type": "f32", "default": float("nan")})


# --- append outputs ---------------------------------------------------------------------------------------

APPEND_PARAMS = [
    {"name": "values", "type": "f32*", "direction": "in"},
    {"name": "out", "type": "f32*", "direction": "out"},
    {"name": "count", "type": "u32*", "direction": "counter"},
    {"name": "n", "type": "i32", "default": "size"},
]


def test_append_output():
    s = sidecar(*APPEND_PARAMS, append={"data": "out", "counter": "count"})
    assert s.append == Append(data="out", counter="count")
    assert s.params[2].direction == "counter"


def test_append_counter_direction_is_inferred():
    params = [dict(p) for p in APPEND_PARAMS]
    del params[2]["direction"]
    s = sidecar(*params, append={"data": "out", "counter": "count"})
    assert s.params[2].direction == "counter"


def test_counter_without_append_section():
    with pytest.raises(
        KernelFileError, match=r"params\[2\] \('count'\): direction 'counter' belongs to an append"
    ):
        sidecar(*APPEND_PARAMS)


@pytest.mark.parametrize(
    "append, match",
    [
        ("out", r"'append' must be an object like"),
        ({"data": "out"}, r"append: 'counter' must name a parameter \(got None\)"),
        ({"data": "out", "counter": "count", "cap": 4}, r"append: unknown key 'cap'"),
        (
            {"data": "res", "counter": "count"},
            r"append: 'data' names 'res', which is not a parameter \(values, out",
        ),
        ({"data": "count", "counter": "count"}, r"'data' and 'counter' must be different parameters"),
        (
            {"data": "n", "counter": "count"},
            r"append: 'data' must be a pointer, but params\[3\] \('n'\) is 'i32'",
        ),
        (
            {"data": "values", "counter": "count"},
            r"params\[0\] \('values'\) has direction 'in', make it 'out'",
        ),
        (
            {"data": "out", "counter": "values"},
            r"append: 'counter' must be a 'u32\*', but params\[0\] \('values'\)",
        ),
    ],
)
def test_append_errors(append, match):
    with pytest.raises(KernelFileError, match=match):
        sidecar(*APPEND_PARAMS, append=append)


def test_append_counter_with_wrong_direction():
    params = [*APPEND_PARAMS[:2], {"name": "count", "type": "u32*", "direction": "out"}]
    with pytest.raises(
        KernelFileError, match=r"params\[2\] \('count'\) is the counter, so its direction must be"
    ):
        sidecar(*params, append={"data": "out", "counter": "count"})


def test_append_needs_params():
    with pytest.raises(KernelFileError, match="'append' needs 'params'"):
        parse_sidecar({"append": {"data": "out", "counter": "count"}})


# --- merge ------------------------------------------------------------------------------------------------


def test_merge_with_ptx_signature():
    merged = merge(parse_sidecar(VECTOR_ADD, "va.json"), signature_from_ptx(VECTOR_ADD_PTX, "vector_add"))
    assert [p.describe() for p in merged.params] == ["f32* a (in)", "f32* b (in)", "f32* out (out)", "i32 n"]
    assert merged.params[3] == KernelParam(
        name="n", kind="scalar", size=4, dtype="i32", direction="in", default="size", align=4
    )
    assert merged.same_layout(signature_from_ptx(VECTOR_ADD_PTX, "vector_add"))


def test_merge_without_params_keeps_the_kernel_signature():
    sig = kernel(("pointer", 8, None))
    assert merge(parse_sidecar({"block_size": 64}), sig) is sig


def test_merge_64_bit_pointer_slot_may_be_a_64_bit_scalar():
    merged = merge(
        sidecar({"name": "seed", "type": "u64"}, {"name": "t", "type": "f64"}),
        kernel(("pointer", 8, None), ("pointer", 8, None)),
    )
    assert [(p.kind, p.dtype) for p in merged.params] == [("scalar", "u64"), ("scalar", "f64")]


def test_merge_untyped_values_accept_any_type_of_that_size():
    merged = merge(
        sidecar({"name": "h", "type": "f16"}, {"name": "x", "type": "f32"}),
        kernel(("scalar", 2, None), ("scalar", 4, None)),
    )
    assert [p.dtype for p in merged.params] == ["f16", "f32"]


def test_merge_signedness_is_not_checked():
    # nvcc writes `int` as .u32, so 'i32' against u32 is the normal case
    merged = merge(sidecar({"name": "n", "type": "i32"}), kernel(("scalar", 4, "u32")))
    assert merged.params[0].dtype == "i32"


def test_merge_entry_mismatch():
    with pytest.raises(KernelFileError, match=r"k.json: the sidecar describes entry 'other', not 'k'"):
        merge(sidecar({"name": "x", "type": "i32"}, entry="other"), kernel(("scalar", 4, "u32")))


def test_merge_count_mismatch_lists_the_kernel_params():
    with pytest.raises(
        KernelFileError,
        match=r"'params' lists 1 parameters but kernel 'k' takes 2 \(arg0: 8 bytes \(a pointer or a 64-bit "
        r"integer\), arg1: a 4-byte u32 \(an integer\)\); list one entry per kernel parameter, in order",
    ):
        merge(sidecar({"name": "x", "type": "f32*"}), kernel(("pointer", 8, None), ("scalar", 4, "u32")))


def test_merge_pointer_where_kernel_has_32_bit_value():
    with pytest.raises(
        KernelFileError,
        match=r"params\[1\] \('n'\): the sidecar says 'i32\*' \(a pointer, 8 bytes\) but kernel 'k' "
        r"parameter 1 \(arg1\) is a 4-byte u32 \(an integer\); a pointer takes 8 bytes: use a 4-byte type "
        r"such as 'i32' or 'u32', or check the parameter order",
    ):
        merge(
            sidecar({"name": "a", "type": "f32*"}, {"name": "n", "type": "i32*"}),
            kernel(("pointer", 8, None), ("scalar", 4, "u32")),
        )


def test_merge_scalar_where_kernel_has_a_pointer():
    with pytest.raises(
        KernelFileError,
        match=r"params\[0\] \('a'\): the sidecar says 'f32' \(a float, 4 bytes\) but kernel 'k' parameter 0 "
        r"\(arg0\) is 8 bytes \(a pointer or a 64-bit integer\); write 'f32\*' if it is a pointer",
    ):
        merge(sidecar({"name": "a", "type": "f32"}), kernel(("pointer", 8, None)))


def test_merge_size_mismatch():
    with pytest.raises(
        KernelFileError,
        match=r"params\[0\] \('x'\): the sidecar says 'f64' \(a float, 8 bytes\) but kernel 'k' parameter 0 "
        r"\(arg0\) is a 4-byte f32 \(a float\); use a 4-byte type such as 'f32', or fix the kernel",
    ):
        merge(sidecar({"name": "x", "type": "f64"}), kernel(("scalar", 4, "f32")))


@pytest.mark.parametrize("type_", ["f32", "f32*"])
def test_merge_struct_parameter_cannot_be_described(type_):
    with pytest.raises(
        KernelFileError,
        match=r"is 16 bytes of any type; a sidecar cannot describe a 16-byte value \(a struct passed by "
        r"value\) yet: leave out 'params'",
    ):
        merge(sidecar({"name": "s", "type": type_}), kernel(("scalar", 16, None)))


def test_merge_untyped_size_mismatch():
    with pytest.raises(KernelFileError, match=r"is 2 bytes of any type; use a 2-byte type such as 'u16'"):
        merge(sidecar({"name": "h", "type": "f32"}), kernel(("scalar", 2, None)))


def test_merge_float_where_kernel_has_an_int():
    with pytest.raises(
        KernelFileError,
        match=r"params\[0\] \('n'\): the sidecar says 'f32' \(a float, 4 bytes\) but kernel 'k' parameter 0 "
        r"\(arg0\) is a 4-byte u32 \(an integer\); use 'i32' or 'u32', or fix the kernel",
    ):
        merge(sidecar({"name": "n", "type": "f32"}), kernel(("scalar", 4, "u32")))


def test_merge_int_where_kernel_has_a_float():
    with pytest.raises(
        KernelFileError, match=r"says 'i32' \(an integer, 4 bytes\) but .* is a 4-byte f32 \(a float\)"
    ):
        merge(sidecar({"name": "x", "type": "i32"}), kernel(("scalar", 4, "f32")))


def test_merge_pointer_where_kernel_has_a_double():
    with pytest.raises(KernelFileError, match=r"says 'f64\*' \(a pointer, 8 bytes\) but .* is an 8-byte f64"):
        merge(sidecar({"name": "x", "type": "f64*"}), kernel(("scalar", 8, "f64")))


def test_sidecar_alone_gives_a_signature():
    s = parse_sidecar(VECTOR_ADD)
    sig = s.signature()
    assert sig.entry == "vector_add"
    assert [(p.kind, p.size, p.direction) for p in sig.params] == [
        ("pointer", 8, "in"),
        ("pointer", 8, "in"),
        ("pointer", 8, "out"),
        ("scalar", 4, "in"),
    ]
    assert sig == merge(s, signature_from_ptx(VECTOR_ADD_PTX, "vector_add"))


def test_sidecar_alone_needs_entry_and_params():
    with pytest.raises(KernelFileError, match="'entry' is required here"):
        sidecar({"name": "x", "type": "f32*"}).signature()
    with pytest.raises(KernelFileError, match="'params' is required: the kernel's parameters cannot be read"):
        parse_sidecar({"entry": "k"}).signature()
