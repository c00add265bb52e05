"""`rxcuda kernels build`: .cu -> .ptx (+ .cubin) + .json sidecar, deterministic."""

import json
import shutil
from pathlib import Path

import pytest

from rxcuda import _cli
from rxcuda.model._errors import CompileError
from rxcuda.sources import _build as build
from rxcuda.sources import _nvrtc as nv
from rxcuda.sources._files import load_kernel_file
from rxcuda.sources._sidecar import parse_sidecar

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
HAVE_NVCC = build.find_nvcc() is not None


@pytest.fixture(autouse=True)
def compiler(tmp_path):
    c = nv.Compiler(tmp_path / "cache")
    prev = nv.set_default_compiler(c)
    yield c
    nv.set_default_compiler(prev)


@pytest.fixture
def shipped(tmp_path):
    d = tmp_path / "kernels"
    shutil.copytree(KERNELS, d)
    return d


def test_rebuilding_reproduces_the_shipped_sidecars(shipped):
    before = {p.name: p.read_bytes() for p in shipped.glob("*.json")}
    assert before, "no shipped sidecars"
    build.build_kernels(shipped, use_nvcc=False)
    assert {p.name: p.read_bytes() for p in shipped.glob("*.json")} == before


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not on PATH")
def test_rebuilding_with_nvcc_reproduces_the_shipped_ptx(shipped):
    before = {p.name: p.read_bytes() for p in shipped.glob("*.ptx")}
    build.build_kernels(shipped)
    after = {p.name: p.read_bytes() for p in shipped.glob("*.ptx")}
    assert after == before


def test_sidecars_from_scratch_match_the_source(shipped):
    for p in shipped.glob("*.json"):
        p.unlink()
    outputs = build.build_kernels(shipped, use_nvcc=False)
    assert sorted(p.name for p in outputs if p.suffix == ".json") == sorted(
        p.stem + ".json" for p in shipped.glob("*.cu")
    )
    saxpy = json.loads((shipped / "saxpy.json").read_text())
    assert saxpy == {
        "entry": "saxpy",
        "block_size": 256,
        "shared_mem": 0,
        "params": [
            {"name": "x", "type": "f32*", "direction": "in"},
            {"name": "y", "type": "f32*", "direction": "in"},
            {"name": "y_out", "type": "f32*", "direction": "out"},
            {"name": "a", "type": "f32"},
            {"name": "n", "type": "i32", "default": "size", "counts": ["x", "y", "y_out"]},  # /*counts ...*/
        ],
    }
    # what the loader makes of the new sidecar and the PTX
    code = load_kernel_file(shipped / "saxpy.ptx")
    assert [p.describe() for p in code.signature.params] == [
        "f32* x (in)",
        "f32* y (in)",
        "f32* y_out (out)",
        "f32 a",
        "i32 n",
    ]


ANNOTATED = """\
// a kernel that says everything about its parameters in the source
extern "C" __global__ void __launch_bounds__(128) collect(RX_IN float* values, /*out*/ float* kept,
                                                          RX_COUNTER unsigned int* count, float threshold /*= 0.5*/,
                                                          unsigned int capacity RX_SIZE, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && values[i] > threshold) {
        unsigned int j = atomicAdd(count, 1u);
        if (j < capacity) kept[j] = values[i];
    }
}
"""

ANNOTATED_SIDECAR = """\
{
  "entry": "collect",
  "block_size": 128,
  "shared_mem": 0,
  "params": [
    {"name": "values", "type": "f32*", "direction": "in"},
    {"name": "kept", "type": "f32*", "direction": "out"},
    {"name": "count", "type": "u32*", "direction": "counter"},
    {"name": "threshold", "type": "f32", "default": 0.5},
    {"name": "capacity", "type": "u32", "default": "size"},
    {"name": "n", "type": "i32", "default": "size"}
  ],
  "append": {"data": "kept", "counter": "count"}
}
"""


def test_annotations_make_the_sidecar_and_a_rebuild_changes_nothing(tmp_path):
    (tmp_path / "collect.cu").write_text(ANNOTATED)
    outputs = build.build_kernels(tmp_path, cubin_arch="sm_90", use_nvcc=False)
    assert [p.name for p in outputs] == ["collect.ptx", "collect.cubin", "collect.json"]
    assert (tmp_path / "collect.json").read_text() == ANNOTATED_SIDECAR
    code = load_kernel_file(tmp_path / "collect.cubin")
    assert code.block_size == 128 and code.signature.params[2].direction == "counter"
    stamps = {p: p.stat().st_mtime_ns for p in outputs}
    build.build_kernels(tmp_path, cubin_arch="sm_90", use_nvcc=False)
    assert {p: p.stat().st_mtime_ns for p in outputs} == stamps  # unchanged files are not rewritten


def test_source_annotation_wins_over_an_old_sidecar(tmp_path):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(RX_INOUT float* x, float s, int n) {}\n')
    (tmp_path / "k.json").write_text(
        json.dumps(
            {
                "entry": "k",
                "params": [
                    {"name": "x", "type": "f32*", "direction": "out"},
                    {"name": "s", "type": "f32", "default": 4.0},
                    {"name": "n", "type": "i32"},
                ],
            }
        )
    )
    build.build_kernels(tmp_path, use_nvcc=False)
    side = json.loads((tmp_path / "k.json").read_text())
    assert side["params"] == [
        {"name": "x", "type": "f32*", "direction": "inout"},  # annotated: source wins
        {"name": "s", "type": "f32", "default": 4.0},  # kept from the old sidecar
        {"name": "n", "type": "i32"},
    ]  # the old sidecar had no default: kept so
    assert "block_size" not in side


def test_a_file_with_two_kernels_gets_no_sidecar(tmp_path, caplog):
    (tmp_path / "two.cu").write_text(
        'extern "C" __global__ void a(float* x) {}\nextern "C" __global__ void b(float* x) {}\n'
    )
    lines = []
    outputs = build.build_kernels(tmp_path, use_nvcc=False, report=lines.append)
    assert [p.name for p in outputs] == ["two.ptx"]
    assert "put each kernel in its own file" in caplog.text  # logged, not printed
    assert any("put each kernel in its own file" in line for line in lines)  # and in the CLI's report


def test_a_compile_error_is_raised_after_the_other_sources_built(tmp_path):
    (tmp_path / "bad.cu").write_text('extern "C" __global__ void bad(float* x) { x[0] = nope; }\n')
    (tmp_path / "good.cu").write_text('extern "C" __global__ void good(float* x) { x[0] = 1.0f; }\n')
    with pytest.raises(CompileError, match=r"1 kernel source\(s\) .* did not build:\n  .*bad.cu:1:\d+: error: "
                       r'identifier "nope" is undefined') as e:
        build.build_kernels(tmp_path, use_nvcc=False)
    assert e.value.diagnostics[0].line == 1
    assert [f.source.name for f in e.value.failures] == ["bad.cu"]
    assert (tmp_path / "good.ptx").is_file() and (tmp_path / "good.json").is_file()


@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc is not on PATH")
def test_nvcc_errors_are_structured_too(tmp_path):
    (tmp_path / "bad.cu").write_text('extern "C" __global__ void bad(float* x)\n{\n    x[0] = nope;\n}\n')
    with pytest.raises(CompileError) as e:
        build.build_kernels(tmp_path)
    assert (e.value.diagnostics[0].file, e.value.diagnostics[0].line) == ("bad.cu", 3)
    assert "nvcc could not compile" in str(e.value.failures[0].error)  # labelled by the compiler used
    assert "NVRTC" not in str(e.value.failures[0].error)


def test_format_sidecar_is_canonical_and_valid():
    data = {"params": [{"default": 1.0, "type": "f32", "name": "a"}], "entry": "k", "block_size": 64}
    text = build.format_sidecar(data)
    assert text == (
        '{\n  "entry": "k",\n  "block_size": 64,\n  "params": [\n'
        '    {"name": "a", "type": "f32", "default": 1.0}\n  ]\n}\n'
    )
    assert parse_sidecar(text).params[0].default == 1.0
    assert json.loads(text) == data


def _run_cli(argv):
    return _cli.main(argv)


def test_cli_build_and_cache(shipped, capsys):
    assert _run_cli(["kernels", "build", str(shipped), "--nvrtc", "-q"]) == 0
    assert _run_cli(["kernels", "build", str(shipped / "missing")]) == 2
    err = capsys.readouterr().err
    assert "no such kernels directory" in err and err.count("\n") == 1  # one line
    assert _run_cli(["cache", "info"]) == 0
    assert "entries:" in capsys.readouterr().out
    assert _run_cli(["cache", "clear"]) == 0
    assert nv.cache_info()["entries"] == 0
    assert _run_cli(["kernels"]) == 2


def test_build_help(capsys):
    with pytest.raises(SystemExit):
        _cli.main(["kernels", "build", "--help"])
    assert "--cubin" in capsys.readouterr().out


def test_the_build_reports_through_a_callback_and_its_result_not_print(shipped, capsys):
    """The library returns what it did and reports progress to a callback; rxcuda._cli prints."""
    said = []
    result = build.build_folder(shipped, use_nvcc=False, report=said.append)
    assert result.ok and set(result.outputs) >= {shipped / "vector_add.ptx", shipped / "vector_add.json"}
    assert said[0].startswith("compiling with NVRTC") and any("vector_add.json" in m for m in said)
    assert capsys.readouterr() == ("", "")


TRITON_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def scale(x, out, s, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * s, mask=mask)


RXCUDA_KERNEL = {
    "kernel": scale,
    "signature": {"x": "*fp32", "out": "*fp32", "s": "fp32", "n": "i32"},
    "constexprs": {"BLOCK": 256},
    "directions": {"out": "out"},
    "defaults": {"s": 1.0, "n": "size"},
    "num_warps": 8,
}
"""


def test_triton_kernels_build_where_triton_is_installed(tmp_path):
    (tmp_path / "scale.triton.py").write_text(TRITON_KERNEL)
    if not build.triton_available():
        assert build.build_kernels(tmp_path, use_nvcc=False) == []  # skipped cleanly
        pytest.skip("triton is not installed")
    outputs = build.build_kernels(tmp_path, use_nvcc=False)
    assert [p.name for p in outputs] == ["scale.ptx", "scale.json"]
    code = load_kernel_file(tmp_path / "scale.ptx")
    assert [p.name for p in code.signature.params][:4] == ["x", "out", "s", "n"]
    assert code.block_size == 256


