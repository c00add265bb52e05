"""Declaring is cheap: a kernel file loaded before is not read and parsed again while it is unchanged
(``rxcuda.sources._files._FileCache``), and an edited file or sidecar is (hot reload sees new content)."""

from __future__ import annotations

import os
import pathlib
import shutil
import threading
import time

import pytest

import rxcuda
from rxcuda import Block, KernelFileError
from rxcuda.sources import _files

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "kernels"
OLD = 10 * 10**9  # ten seconds in ns: far past the window in which a stamp alone cannot tell an edit


@pytest.fixture(autouse=True)
def fresh_cache():
    _files._files.clear()
    yield
    _files._files.clear()


def _copy(tmp_path: pathlib.Path, name: str = "scalar_mul", *, age_ns: int = OLD) -> pathlib.Path:
    """A copy of a shipped kernel and its sidecar in ``tmp_path``, last modified ``age_ns`` ago."""
    for suffix in (".ptx", ".json"):
        shutil.copy(KERNELS / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
        _age(tmp_path / f"{name}{suffix}", age_ns)
    return tmp_path / f"{name}.ptx"


def _age(path: pathlib.Path, age_ns: int) -> None:
    t = time.time_ns() - age_ns
    os.utime(path, ns=(t, t))


def test_the_same_file_gives_the_same_parsed_kernel(tmp_path):
    ptx = _copy(tmp_path)
    first = rxcuda.load_kernel_file(ptx)
    assert rxcuda.load_kernel_file(ptx) is first
    assert rxcuda.load_kernel_file(str(ptx)) is first
    assert (_files._files.hits, _files._files.misses) == (2, 1)


def test_from_kernel_by_path_reuses_the_parsed_kernel(tmp_path):
    ptx = _copy(tmp_path)
    blocks = [Block.from_kernel(ptx, size=64, scale=2.0, name=f"m{i}") for i in range(5)]
    codes = {id(b.description.kernels[0].code) for b in blocks}
    assert len(codes) == 1 and _files._files.misses == 1
    assert [b.params["scale"].value for b in blocks] == [2.0] * 5


def test_an_unchanged_old_file_is_not_read_again(tmp_path, monkeypatch):
    ptx = _copy(tmp_path)
    first = rxcuda.load_kernel_file(ptx)
    reads = []
    monkeypatch.setattr(_files, "_bytes_of", lambda p: reads.append(p))
    monkeypatch.setattr(_files, "_load_kernel_file", lambda *a: pytest.fail("parsed again"))
    assert rxcuda.load_kernel_file(ptx) is first
    assert reads == []  # two stat calls, no read


def test_an_edited_file_is_read_again(tmp_path):
    ptx = _copy(tmp_path)
    first = rxcuda.load_kernel_file(ptx)
    ptx.write_text(ptx.read_text().replace("mul.f32", "add.f32"))  # same size, new content, new mtime
    second = rxcuda.load_kernel_file(ptx)
    assert second is not first and second.key != first.key and b"add.f32" in second.image


def test_an_edit_that_keeps_the_stamp_is_seen_by_its_bytes(tmp_path):
    # an edit within one tick of the file system's clock: same size, same mtime, same inode
    ptx = _copy(tmp_path, age_ns=0)
    first = rxcuda.load_kernel_file(ptx)
    st = os.stat(ptx)
    with open(ptx, "r+b") as f:  # in place: the inode stays
        f.write(ptx.read_bytes().replace(b"mul.f32", b"add.f32"))
    os.utime(ptx, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _files._stamp(str(ptx)) == (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    second = rxcuda.load_kernel_file(ptx)
    assert second is not first and b"add.f32" in second.image
    assert rxcuda.load_kernel_file(ptx) is second  # confirmed by its bytes: the same object again


def test_a_racy_entry_becomes_a_plain_stamp_hit_once_old_enough(tmp_path, monkeypatch):
    ptx = _copy(tmp_path, age_ns=0)
    first = rxcuda.load_kernel_file(ptx)
    assert rxcuda.load_kernel_file(ptx) is first  # racy: confirmed by reading the bytes
    monkeypatch.setattr(_files, "_RACY_NS", 0)  # the window has passed
    assert rxcuda.load_kernel_file(ptx) is first
    reads = []
    monkeypatch.setattr(_files, "_bytes_of", lambda p: reads.append(p))
    assert rxcuda.load_kernel_file(ptx) is first and reads == []


def test_an_edited_sidecar_is_read_again(tmp_path):
    ptx = _copy(tmp_path)
    first = rxcuda.load_kernel_file(ptx)
    sidecar = ptx.with_suffix(".json")
    sidecar.write_text(sidecar.read_text().replace('"block_size": 256', '"block_size": 128'))
    second = rxcuda.load_kernel_file(ptx)
    assert second is not first and (first.block_size, second.block_size) == (256, 128)


def test_a_sidecar_that_appears_or_goes_is_seen(tmp_path):
    ptx = _copy(tmp_path)
    sidecar = ptx.with_suffix(".json")
    kept = sidecar.read_bytes()
    sidecar.unlink()
    bare = rxcuda.load_kernel_file(ptx)
    assert bare.signature.params[0].name != "x"  # without a sidecar the names come from the PTX
    sidecar.write_bytes(kept)
    named = rxcuda.load_kernel_file(ptx)
    assert named is not bare and named.signature.params[0].name == "x"


def test_other_entries_and_spellings_are_other_entries(tmp_path, monkeypatch):
    ptx = _copy(tmp_path)
    monkeypatch.chdir(tmp_path)
    by_name = rxcuda.load_kernel_file("scalar_mul.ptx")
    by_path = rxcuda.load_kernel_file(ptx)
    assert by_name.origin == "scalar_mul.ptx" and by_path.origin == str(ptx)  # messages name what was given
    assert by_name.key == by_path.key
    assert rxcuda.load_kernel_file(ptx, entry="scalar_mul").entry == "scalar_mul"
    assert _files._files.misses == 3


def test_a_file_that_went_away_raises_as_before(tmp_path):
    ptx = _copy(tmp_path)
    rxcuda.load_kernel_file(ptx)
    ptx.unlink()
    with pytest.raises(KernelFileError, match=r"scalar_mul\.ptx: no such file"):
        rxcuda.load_kernel_file(ptx)


def test_a_broken_file_is_not_cached(tmp_path):
    bad = tmp_path / "bad.ptx"
    bad.write_text(".version 8.0\n.target sm_75\n")
    _age(bad, OLD)
    for _ in range(2):
        with pytest.raises(KernelFileError, match="no kernel entry point"):
            rxcuda.load_kernel_file(bad)
    assert _files._files.misses == 0


def test_the_cache_holds_its_limit_most_recent_files(tmp_path, monkeypatch):
    monkeypatch.setattr(_files._files, "limit", 2)
    paths = []
    for name in ("scalar_mul", "vector_add", "saxpy"):
        paths.append(_copy(tmp_path, name))
        rxcuda.load_kernel_file(paths[-1])
    assert len(_files._files._entries) == 2
    rxcuda.load_kernel_file(paths[0])  # the oldest was dropped: parsed again
    assert _files._files.misses == 4


def test_threads_loading_one_file_at_once_agree(tmp_path):
    ptx = _copy(tmp_path)
    codes, errors = [], []
    start = threading.Barrier(8)

    def load():
        try:
            start.wait()
            for _ in range(50):
                codes.append(rxcuda.load_kernel_file(ptx))
        except Exception as e:  # pragma: no cover - what the test reports
            errors.append(e)

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(codes) == 400
    assert len({c.key for c in codes}) == 1
    assert _files._files.hits + _files._files.misses == 400


def test_hot_reload_of_an_edited_file_still_swaps_code(tmp_path):
    ptx = _copy(tmp_path)
    blk = Block.from_kernel(ptx, size=64, scale=2.0)
    assert blk.reload() == []
    ptx.write_text(ptx.read_text().replace("mul.f32", "add.f32"))
    assert blk.reload() == ["code"]


# -- Block.from_kernel: one description per kernel and arguments ------------------------------------------
ARGUMENTS = [
    dict(size=64, scale=2.0),
    dict(size=64, scale=2),  # an int default is another key than a float one
    dict(shape=(8, 16), block_size=(16, 16)),
    dict(size=64, threads=32, block_size=128),
    dict(size=64, counts={"x": 32}, n=32),
    dict(size=64, ranges={"scale": (0, 10, 0.5)}, scale=1.5),
]


@pytest.mark.parametrize("kwargs", ARGUMENTS)
def test_a_block_declared_again_has_the_description_of_a_fresh_declaration(kwargs):
    from rxcuda.blocks import _blocks

    first = Block.from_kernel("scalar_mul", name="a", **kwargs)
    again = Block.from_kernel("scalar_mul", name="b", **kwargs)
    _blocks._declared.clear()
    fresh = Block.from_kernel("scalar_mul", name="b", **kwargs)
    assert again.description == fresh.description and again.name == "b" and first.name == "a"
    assert again.description.ports is first.description.ports  # shared, not built again
    assert {k: p.value for k, p in again.params.items()} == {k: p.value for k, p in fresh.params.items()}
    assert [type(p.value) for p in again.params.values()] == [type(p.value) for p in fresh.params.values()]


def test_blocks_sharing_a_description_are_separate_blocks():
    a = Block.from_kernel("scalar_mul", size=64, scale=2.0, name="a")
    b = Block.from_kernel("scalar_mul", size=64, scale=2.0, name="b")
    a.set(scale=5.0)
    assert a.id != b.id and (a.params["scale"].value, b.params["scale"].value) == (5.0, 2.0)
    assert Block.from_kernel("scalar_mul", size=64, scale=2.0).name == "scalar_mul"  # the entry, as before


def test_different_arguments_make_different_descriptions():
    a = Block.from_kernel("scalar_mul", size=64, scale=2.0)
    b = Block.from_kernel("scalar_mul", size=128, scale=2.0)
    c = Block.from_kernel("scalar_mul", size=64, scale=3.0)
    assert a.description.port("x").count == 64 and b.description.port("x").count == 128
    assert c.params["scale"].value == 3.0


def test_errors_are_raised_on_every_declaration():
    Block.from_kernel("scalar_mul", size=64, scale=2.0)
    for _ in range(2):
        with pytest.raises(TypeError, match="unknown parameter"):
            Block.from_kernel("scalar_mul", size=64, scael=2.0)
    for bad in ("", 3):
        with pytest.raises(ValueError, match="'name' must be a non-empty str"):
            Block.from_kernel("scalar_mul", size=64, scale=2.0, name=bad)


def test_an_unhashable_argument_declares_the_long_way():
    from rxcuda.blocks import _blocks

    assert _blocks._Declared.key(object(), 64, {"scale": [0, 1]}) is None
    blk = Block.from_kernel("scalar_mul", size=64, ranges={"scale": [0, 10]}, scale=1.0)
    assert blk.params["scale"].max == 10


def test_an_edited_kernel_file_gives_blocks_its_new_code(tmp_path):
    ptx = _copy(tmp_path)
    before = Block.from_kernel(ptx, size=64, scale=2.0)
    ptx.write_text(ptx.read_text().replace("mul.f32", "add.f32"))
    after = Block.from_kernel(ptx, size=64, scale=2.0)
    assert b"add.f32" in after.description.kernels[0].code.image
    assert b"mul.f32" in before.description.kernels[0].code.image


def test_a_relative_path_names_the_file_in_the_current_folder(tmp_path, monkeypatch):
    """The cache remembers a relative path's absolute one per working folder: after a chdir the same relative
    path is the other folder's file."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    _copy(one, "scalar_mul")
    _copy(two, "vector_add")
    shutil.copy(two / "vector_add.ptx", two / "scalar_mul.ptx")  # the same relative name, another kernel
    shutil.copy(two / "vector_add.json", two / "scalar_mul.json")
    monkeypatch.chdir(one)
    first = rxcuda.load_kernel_file("scalar_mul.ptx")
    monkeypatch.chdir(two)
    second = rxcuda.load_kernel_file("scalar_mul.ptx")
    assert first.entry == "scalar_mul" and second.entry == "vector_add"
    monkeypatch.chdir(one)
    assert rxcuda.load_kernel_file("scalar_mul.ptx") is first
