"""The kernels shipped with rxcuda, by name: rxcuda.kernels.names()/path(), Block.from_kernel("vector_add") and
Block.from_cuda("saxpy") from any directory, and what a name that matches nothing (or a repository path copied
into another directory) says."""

from __future__ import annotations

import pathlib

import pytest

import rxcuda
from rxcuda import Block, KernelFileError, kernels
from rxcuda.sources._paths import shipped_kernel

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = ["append_above", "saxpy", "scalar_mul", "vector_add", "vector_add3", "vector_sub"]


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A current directory with no kernels/ in it, as a user's project has."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_names_lists_the_shipped_kernels():
    assert kernels.names() == SHIPPED == sorted(p.stem for p in (ROOT / "kernels").glob("*.ptx"))


@pytest.mark.parametrize("name", SHIPPED)
def test_path_gives_each_file_of_a_shipped_kernel(name):
    assert kernels.path(name) == ROOT / "kernels" / f"{name}.ptx"
    for suffix in (".ptx", ".cu", ".json"):
        assert kernels.path(name + suffix) == ROOT / "kernels" / f"{name}{suffix}"
        assert kernels.path(name + suffix).is_file()


@pytest.mark.parametrize(("name", "says"), [
    ("vectoradd", r"no kernel named 'vectoradd' ships with rxcuda; did you mean vector_add, "),
    ("zzz", r"no kernel named 'zzz' ships with rxcuda; the shipped kernels are append_above, saxpy, scalar_mul, "
            r"vector_add, vector_add3, vector_sub \(files \.ptx, \.cu, \.json\)$"),
    ("vector_add.txt", r"no kernel named 'vector_add.txt' ships"),
    ("__init__", r"no kernel named '__init__' ships"),
])
def test_path_of_an_unknown_name_raises_with_did_you_mean(name, says):
    with pytest.raises(KernelFileError, match=says) as e:
        kernels.path(name)
    assert e.value.path == name


def test_from_kernel_takes_a_shipped_name_from_any_directory(elsewhere):
    mul = Block.from_kernel("scalar_mul", size=64, scale=2.5)
    assert mul.params["scale"].value == 2.5 and mul.params["n"].value == 64
    assert [p.name for p in mul.description.ports] == ["x", "out"]
    (k,) = mul.description.kernels
    assert k.code.origin == str(ROOT / "kernels" / "scalar_mul.ptx")


def test_builder_and_load_source_take_a_shipped_name_too(elsewhere):
    code = rxcuda.load_source("vector_add")
    assert code.entry == "vector_add" and code.origin == str(kernels.path("vector_add"))
    b = rxcuda.BlockBuilder("twice", size=16)
    k = b.add_kernel("scalar_mul")
    b.input("x", k["x"])
    b.output("out", k["out"])
    assert b.build()["out"].spec.count == 16


def test_a_file_of_that_name_in_the_current_directory_wins(elsewhere):
    (elsewhere / "vector_add").write_text("not a kernel")
    assert shipped_kernel("vector_add") is None  # the user's file is what they meant


@pytest.mark.parametrize("source", ["kernels/vector_add", "vector_add.ptx", "my kernel", "", "3d", 42])
def test_only_a_bare_name_is_looked_up(source, elsewhere):
    assert shipped_kernel(source) is None


def test_an_unknown_name_says_did_you_mean_and_that_a_path_works_too(elsewhere):
    with pytest.raises(KernelFileError, match=r"no kernel named 'scalar_mull' ships with rxcuda; did you mean "
                                              r"scalar_mul\? the shipped kernels are .*; a path to a kernel file "
                                              r"works too, e.g. './scalar_mull.ptx'$"):
        Block.from_kernel("scalar_mull", size=8)


def test_a_repository_path_in_another_directory_says_how_to_load_the_shipped_kernel(elsewhere):
    with pytest.raises(KernelFileError, match=r"kernels/vector_add.ptx: no such file \(the folder kernels does not "
                                              r"exist\) \(rxcuda ships a kernel of that name: load it by name, "
                                              r"Block.from_kernel\('vector_add', ...\), or its file, "
                                              r"rxcuda.kernels.path\('vector_add.ptx'\)\)$"):
        Block.from_kernel("kernels/vector_add.ptx", size=8)


def test_a_missing_file_of_another_name_gets_no_shipped_hint(elsewhere):
    with pytest.raises(KernelFileError) as e:
        Block.from_kernel("kernels/my_kernel.ptx", size=8)
    assert "ships" not in str(e.value)


def test_from_cuda_takes_a_shipped_name_as_its_cu_source(elsewhere):
    blk = Block.from_cuda("saxpy", size=32, a=2.0)
    (k,) = blk.description.kernels
    assert k.code.entry == "saxpy" and blk.params["a"].value == 2.0
    assert {p.name for p in blk.description.ports} == {"x", "y", "y_out"}


def test_from_cuda_of_an_unknown_name_says_did_you_mean(elsewhere):
    with pytest.raises(KernelFileError, match=r"no kernel named 'saxp' ships with rxcuda; did you mean saxpy\?"):
        Block.from_cuda("saxp", size=32)


def test_a_kernel_file_without_its_sidecar_says_so_when_a_parameter_name_is_unknown(tmp_path):
    """What `rxcuda demo --kernels DIR` met: without scalar_mul.json the scalars are arg2, arg3."""
    ptx = tmp_path / "scalar_mul.ptx"
    ptx.write_bytes(kernels.path("scalar_mul").read_bytes())
    with pytest.raises(TypeError, match=r"scalar_mul: unknown parameter\(s\) scale; the kernel's scalars are arg2, "
                                        r"arg3 \(parameter names come from a sidecar, and .*scalar_mul.json is "
                                        r"missing\)$"):
        Block.from_kernel(ptx, size=8, scale=2.0)


def test_with_its_sidecar_an_unknown_parameter_gets_no_sidecar_hint():
    with pytest.raises(TypeError) as e:
        Block.from_kernel("scalar_mul", size=8, scael=2.0)
    assert str(e.value) == "scalar_mul: unknown parameter(s) scael; the kernel's scalars are scale, n"
