"""Loading .ptx/.cubin/.fatbin kernel files, with and without sidecars; entry choice; the shipped kernels."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from rxcuda.model._errors import KernelFileError
from rxcuda.sources import find_sidecar, load_kernel_file, parse_ptx, read_sidecar, signature_from_ptx
from rxcuda.sources._files import cubin_params, fatbin_params

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
SHIPPED = sorted(KERNELS.glob("*.ptx"))
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")

TWO_ENTRIES = """.version 9.0
.target sm_75
.address_size 64
.visible .entry first(.param .u64 first_param_0, .param .u32 first_param_1) { ret; }
.visible .entry second(.param .f32 second_param_0) { ret; }
"""
ONE_ENTRY = """.version 9.0
.target sm_75
.address_size 64
.visible .entry scale(.param .u64 scale_param_0, .param .f32 scale_param_1, .param .u32 scale_param_2)
{ ret; }
"""
SCALE_SIDECAR = {
    "entry": "scale",
    "block_size": 128,
    "shared_mem": 1024,
    "params": [
        {"name": "x", "type": "f32*"},
        {"name": "factor", "type": "f32", "default": 2.0},
        {"name": "n", "type": "i32", "default": "size"},
    ],
}


def write(folder: Path, name: str, content: str | bytes | dict) -> Path:
    path = folder / name
    if isinstance(content, dict):
        path.write_text(json.dumps(content))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def fake_cubin(kernels: dict[str, tuple[int, ...]], extra_info: bytes = b"") -> bytes:
    """A minimal 64-bit ELF with .text.<k> and .nv.info.<k> (EIATTR_KPARAM_INFO per parameter) sections,
    laid out like nvcc's: records in reverse ordinal order, surrounded by other attributes."""
    sections: list[tuple[str, bytes]] = []
    for name, sizes in kernels.items():
        info = b"\x04\x37\x04\x00" + b"\x00" * 4  # EIATTR_CUDA_API_VERSION-like SVAL record
        info += b"\x03\x19\x20\x00"  # an HVAL record
        offset = 0
        records = []
        for ordinal, size in enumerate(sizes):
            offset = -(-offset // min(size, 8)) * min(size, 8)
            records.append(
                b"\x04\x17\x0c\x00" + struct.pack("<IHHI", 0, ordinal, offset, (size << 18) | 0x1F000)
            )
            offset += size
        info += b"".join(reversed(records)) + extra_info + b"\x01\x00"  # an NVAL record
        sections += [(f".nv.info.{name}", info), (f".text.{name}", b"\0" * 16)]
    names = [""] + [n for n, _ in sections] + [".shstrtab"]
    strtab = b""
    name_offsets = []
    for n in names:
        name_offsets.append(len(strtab))
        strtab += n.encode() + b"\0"
    bodies = [b""] + [d for _, d in sections] + [strtab]
    data = bytearray(64)
    offsets = []
    for body in bodies:
        offsets.append(len(data))
        data += body
    shoff = len(data)
    for name_off, off, body in zip(name_offsets, offsets, bodies, strict=True):
        data += struct.pack("<IIQQQQIIQQ", name_off, 1, 0, 0, off, len(body), 0, 0, 1, 0)
    data[0:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHH", data, 0x3A, 64, len(bodies), len(bodies) - 1)
    return bytes(data)


# --- .ptx -------------------------------------------------------------------------------------------------


def test_ptx_without_sidecar(tmp_path):
    code = load_kernel_file(write(tmp_path, "scale.ptx", ONE_ENTRY))
    assert (code.entry, code.format, code.block_size, code.shared_mem) == ("scale", "ptx", 256, 0)
    assert code.origin == str(tmp_path / "scale.ptx")
    assert code.image == ONE_ENTRY.encode()
    assert code.signature == signature_from_ptx(ONE_ENTRY, "scale")
    assert len(code.key) == 64


def test_ptx_with_sidecar(tmp_path):
    write(tmp_path, "scale.json", SCALE_SIDECAR)
    code = load_kernel_file(str(write(tmp_path, "scale.ptx", ONE_ENTRY)))
    assert (code.block_size, code.shared_mem) == (128, 1024)
    assert [p.describe() for p in code.signature.params] == ["f32* x (inout)", "f32 factor", "i32 n"]
    assert code.signature.params[1].default == 2.0


def test_find_sidecar(tmp_path):
    ptx = write(tmp_path, "scale.ptx", ONE_ENTRY)
    assert find_sidecar(ptx) is None
    write(tmp_path, "scale.json", {})
    assert find_sidecar(ptx) == tmp_path / "scale.json"


def test_same_content_same_key_different_entry_different_key(tmp_path):
    a = load_kernel_file(write(tmp_path, "a.ptx", TWO_ENTRIES), entry="first")
    b = load_kernel_file(write(tmp_path, "b.ptx", TWO_ENTRIES), entry="first")
    c = load_kernel_file(tmp_path / "a.ptx", entry="second")
    assert a.key == b.key != c.key


def test_several_entries_need_a_choice(tmp_path):
    path = write(tmp_path, "two.ptx", TWO_ENTRIES)
    with pytest.raises(
        KernelFileError, match=r"two.ptx: the file has 2 entry points \(first, second\); pass entry="
    ):
        load_kernel_file(path)
    assert load_kernel_file(path, entry="second").signature.params[0].dtype == "f32"


def test_sidecar_entry_picks_among_several(tmp_path):
    write(tmp_path, "two.json", {"entry": "second", "params": [{"name": "gain", "type": "f32"}]})
    code = load_kernel_file(write(tmp_path, "two.ptx", TWO_ENTRIES))
    assert code.entry == "second" and code.signature.params[0].name == "gain"


def test_asking_for_another_entry_than_the_sidecar_describes(tmp_path):
    write(tmp_path, "two.json", {"entry": "second"})
    with pytest.raises(
        KernelFileError,
        match=r"entry 'first' was asked for, but the sidecar .*two.json describes "
        r"'second'",
    ):
        load_kernel_file(write(tmp_path, "two.ptx", TWO_ENTRIES), entry="first")


def test_sidecar_without_entry_applies_to_the_chosen_one(tmp_path):
    write(tmp_path, "two.json", {"block_size": 32})
    code = load_kernel_file(write(tmp_path, "two.ptx", TWO_ENTRIES), entry="first")
    assert (code.entry, code.block_size) == ("first", 32)


def test_unknown_entry_lists_entries(tmp_path):
    with pytest.raises(KernelFileError, match=r"two.ptx: no entry 'third'; entries: first, second") as e:
        load_kernel_file(write(tmp_path, "two.ptx", TWO_ENTRIES), entry="third")
    assert e.value.path == str(tmp_path / "two.ptx")


def test_ptx_without_entries(tmp_path):
    with pytest.raises(
        KernelFileError, match=r"the file has no kernel entry point \(no __global__ function\)"
    ):
        load_kernel_file(write(tmp_path, "empty.ptx", ".version 9.0\n.target sm_75\n"))


def test_sidecar_disagreeing_with_ptx_names_both(tmp_path):
    bad = dict(SCALE_SIDECAR, params=[*SCALE_SIDECAR["params"][:2], {"name": "n", "type": "f32"}])
    write(tmp_path, "scale.json", bad)
    with pytest.raises(
        KernelFileError,
        match=r"scale.json: params\[2\] \('n'\): the sidecar says 'f32' .* but "
        r"kernel 'scale' parameter 2 \(arg2\) is a 4-byte u32",
    ) as e:
        load_kernel_file(write(tmp_path, "scale.ptx", ONE_ENTRY))
    assert e.value.path == str(tmp_path / "scale.json")


def test_malformed_sidecar_is_reported_against_the_sidecar(tmp_path):
    write(tmp_path, "scale.json", {"entry": "scale", "paramz": []})
    with pytest.raises(
        KernelFileError, match=r"scale.json: unknown key 'paramz' \(did you mean 'params'\?\)"
    ):
        load_kernel_file(write(tmp_path, "scale.ptx", ONE_ENTRY))


def test_malformed_ptx(tmp_path):
    path = write(
        tmp_path, "bad.ptx", ".version 9.0\n.target sm_75\n.visible .entry bad(\n .param .u64 bad_param_0\n{ ret; }\n"
    )
    with pytest.raises(KernelFileError, match=r"bad.ptx: unterminated parameter list of entry 'bad'"):
        load_kernel_file(path)


def test_binary_ptx(tmp_path):
    with pytest.raises(KernelFileError, match=r"not a text file; a .ptx file is PTX assembly text"):
        load_kernel_file(write(tmp_path, "k.ptx", b"\x7fELF\xff\xfe"))


def test_missing_file_suggests_similar_names(tmp_path):
    write(tmp_path, "vector_add.ptx", ONE_ENTRY)
    with pytest.raises(
        KernelFileError, match=r"vectoradd.ptx: no such file; did you mean vector_add.ptx\?"
    ) as e:
        load_kernel_file(tmp_path / "vectoradd.ptx")
    assert e.value.path == str(tmp_path / "vectoradd.ptx")


def test_missing_ptx_with_its_source_beside_it(tmp_path):
    write(tmp_path, "blur.cu", 'extern "C" __global__ void blur() {}')
    with pytest.raises(
        KernelFileError, match=r"blur.ptx: no such file \(blur.cu is there: build it with nvcc -ptx"
    ):
        load_kernel_file(tmp_path / "blur.ptx")


def test_missing_folder(tmp_path):
    with pytest.raises(KernelFileError, match=r"no such file \(the folder .*nowhere does not exist\)"):
        load_kernel_file(tmp_path / "nowhere" / "k.ptx")


def test_folder_instead_of_file(tmp_path):
    (tmp_path / "k.ptx").mkdir()
    with pytest.raises(KernelFileError, match="is a folder, not a kernel file"):
        load_kernel_file(tmp_path / "k.ptx")


@pytest.mark.parametrize(
    "name, match",
    [
        ("k.cu", r"unsupported kernel file type '.cu' \(a .cu source is compiled at run time"),
        ("k.txt", r"unsupported kernel file type '.txt'; use .ptx, .cubin or .fatbin"),
        ("k", r"unsupported kernel file type '\(none\)'"),
    ],
)
def test_unsupported_file_types(tmp_path, name, match):
    with pytest.raises(KernelFileError, match=match):
        load_kernel_file(write(tmp_path, name, "x"))


# --- .cubin / .fatbin -------------------------------------------------------------------------------------


def test_cubin_params_from_nv_info():
    image = fake_cubin({"vector_add": (8, 8, 8, 4), "nop": (), "mixed": (16, 1, 2, 8)})
    assert cubin_params(image) == {"vector_add": (8, 8, 8, 4), "nop": (), "mixed": (16, 1, 2, 8)}


def test_cubin_with_unknown_record_format_is_unreadable_not_misread():
    assert cubin_params(fake_cubin({"k": (8, 4)}, extra_info=b"\x07\x10\x00\x00")) == {"k": None}


def test_cubin_bval_records_are_four_bytes():
    # NVRTC 13.5 ends .nv.info.<kernel> with a 4-byte EIFMT_BVAL (0x02) record
    assert cubin_params(fake_cubin({"k": (8, 4)}, extra_info=b"\x02\x10\x01\x00")) == {"k": (8, 4)}


def test_not_an_elf():
    assert cubin_params(b"hello, world" * 8) is None
    assert fatbin_params(b"no cubin in here") == {}


def test_cubin_without_sidecar(tmp_path):
    code = load_kernel_file(write(tmp_path, "k.cubin", fake_cubin({"k": (8, 4, 16)})))
    assert (code.entry, code.format) == ("k", "cubin")
    assert [(p.name, p.kind, p.size, p.dtype) for p in code.signature.params] == [
        ("arg0", "pointer", 8, None),
        ("arg1", "scalar", 4, None),
        ("arg2", "scalar", 16, None),
    ]


def test_cubin_with_sidecar_is_checked(tmp_path):
    path = write(tmp_path, "scale.cubin", fake_cubin({"scale": (8, 4, 4)}))
    write(tmp_path, "scale.json", SCALE_SIDECAR)
    assert [p.name for p in load_kernel_file(path).signature.params] == ["x", "factor", "n"]
    write(tmp_path, "scale.json", dict(SCALE_SIDECAR, params=SCALE_SIDECAR["params"][:2]))
    with pytest.raises(KernelFileError, match=r"'params' lists 2 parameters but kernel 'scale' takes 3"):
        load_kernel_file(path)


def test_cubin_entry_choice(tmp_path):
    path = write(tmp_path, "two.cubin", fake_cubin({"a": (8,), "b": (4,)}))
    with pytest.raises(KernelFileError, match=r"the file has 2 entry points \(a, b\)"):
        load_kernel_file(path)
    with pytest.raises(KernelFileError, match=r"two.cubin: no entry 'c'; entries: a, b"):
        load_kernel_file(path, entry="c")
    assert load_kernel_file(path, entry="b").signature.params[0].size == 4


def test_not_a_cubin(tmp_path):
    with pytest.raises(KernelFileError, match=r"k.cubin: not a cubin \(no 64-bit ELF header\)"):
        load_kernel_file(write(tmp_path, "k.cubin", b"\x00" * 100))


def test_fatbin_with_uncompressed_cubin(tmp_path):
    image = b"\x50\xed\x55\xba" + b"\x00" * 60 + fake_cubin({"k": (8, 8)})
    assert fatbin_params(image) == {"k": (8, 8)}
    assert load_kernel_file(write(tmp_path, "k.fatbin", image)).format == "fatbin"


def test_compressed_fatbin_needs_a_sidecar(tmp_path):
    path = write(tmp_path, "scale.fatbin", b"\x50\xed\x55\xba" + b"\x13" * 200)
    with pytest.raises(
        KernelFileError,
        match=r"cannot be read without loading it .*; write a sidecar scale.json "
        r"with 'entry' and 'params'",
    ):
        load_kernel_file(path)
    write(tmp_path, "scale.json", SCALE_SIDECAR)
    code = load_kernel_file(path)
    assert [(p.name, p.size) for p in code.signature.params] == [("x", 8), ("factor", 4), ("n", 4)]
    assert code.block_size == 128
    write(tmp_path, "scale.json", {k: v for k, v in SCALE_SIDECAR.items() if k != "entry"})
    with pytest.raises(KernelFileError, match=r"cannot list the entry points of this fatbin; set 'entry'"):
        load_kernel_file(path)
    assert load_kernel_file(path, entry="scale").entry == "scale"


def test_unreadable_cubin_kernel_falls_back_to_the_sidecar(tmp_path):
    path = write(tmp_path, "scale.cubin", fake_cubin({"scale": (8, 4, 4)}, extra_info=b"\x09\x00"))
    with pytest.raises(KernelFileError, match=r"parameters in this cubin cannot be read"):
        load_kernel_file(path)
    write(tmp_path, "scale.json", SCALE_SIDECAR)
    assert load_kernel_file(path).signature.params[0].name == "x"


@needs_nvcc
@pytest.mark.parametrize("kind", ["cubin", "fatbin"])
def test_nvcc_built_binaries_agree_with_ptx(tmp_path, kind):
    out = tmp_path / f"append_above.{kind}"
    subprocess.run(
        [NVCC, f"-{kind}", "-arch=sm_75", str(KERNELS / "append_above.cu"), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    shutil.copy(KERNELS / "append_above.json", tmp_path / "append_above.json")
    binary = load_kernel_file(out)
    assert binary.signature == load_kernel_file(KERNELS / "append_above.ptx").signature
    assert binary.format == kind


# --- the shipped kernels ----------------------------------------------------------------------------------

EXPECTED = {
    "vector_add": ["f32* a (in)", "f32* b (in)", "f32* out (out)", "i32 n"],
    "vector_sub": ["f32* a (in)", "f32* b (in)", "f32* out (out)", "i32 n"],
    "vector_add3": ["f32* a (in)", "f32* b (in)", "f32* c (in)", "f32* out (out)", "i32 n"],
    "scalar_mul": ["f32* x (in)", "f32* out (out)", "f32 scale", "i32 n"],
    "saxpy": ["f32* x (in)", "f32* y (in)", "f32* y_out (out)", "f32 a", "i32 n"],
    "append_above": [
        "f32* values (in)",
        "f32* out (out)",
        "u32* count (counter)",
        "f32 threshold",
        "u32 capacity",
        "i32 n",
    ],
}


def test_every_kernel_is_shipped_with_source_ptx_and_sidecar():
    assert sorted(p.stem for p in SHIPPED) == sorted(EXPECTED)
    for stem in EXPECTED:
        for suffix in (".cu", ".ptx", ".json"):
            assert (KERNELS / f"{stem}{suffix}").is_file(), f"kernels/{stem}{suffix} is missing"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_kernel_loads_and_sidecar_agrees(path):
    code = load_kernel_file(path)
    assert code.entry == path.stem
    assert [p.describe() for p in code.signature.params] == EXPECTED[path.stem]
    assert code.signature.params[-1].default == "size"
    # the sidecar adds meaning, not layout
    assert code.signature.same_layout(signature_from_ptx(path.read_text(), path.stem))
    assert read_sidecar(find_sidecar(path)).block_size == code.block_size == 256


def test_shipped_swap_pairs():
    add, sub, add3 = (
        load_kernel_file(KERNELS / f"{k}.ptx").signature for k in ("vector_add", "vector_sub", "vector_add3")
    )
    assert add.same_layout(sub)  # Code tier: swap in place
    assert not add.same_layout(add3)  # Structure tier: rebuild


def test_shipped_append_kernel():
    sidecar = read_sidecar(KERNELS / "append_above.json")
    assert (sidecar.append.data, sidecar.append.counter) == ("out", "count")


@needs_nvcc
def test_shipped_ptx_is_up_to_date_with_its_source(tmp_path):
    for path in SHIPPED:
        built = tmp_path / path.name
        subprocess.run(
            [NVCC, "-ptx", "-arch=compute_75", str(path.with_suffix(".cu")), "-o", str(built)],
            check=True,
            capture_output=True,
        )
        assert parse_ptx(built.read_text()) == parse_ptx(path.read_text()), (
            f"rebuild {path.name}: kernels/build.sh"
        )
