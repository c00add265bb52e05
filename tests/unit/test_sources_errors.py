"""Kernel sources: the fixes of issue 8 (warm-up race, launch bounds, truncated PTX, `kernels build` going
past a failure) and messages that name the thing and the fix. No GPU needed."""

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rxcuda.sources._compose as rx
from rxcuda.model._errors import CompileError, KernelFileError
from rxcuda.sources import _build as build
from rxcuda.sources import _headers
from rxcuda.sources import _nvrtc as nv
from rxcuda.sources._compose import f32
from rxcuda.sources._files import load_kernel_file
from rxcuda.sources._sidecar import read_sidecar

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
SCALE = 'extern "C" __global__ void scale(float* x, float s, int n) { int i = threadIdx.x; if (i < n) x[i] *= s; }\n'


@pytest.fixture(autouse=True)
def compiler(tmp_path):
    c = nv.Compiler(tmp_path / "cache")
    prev = nv.set_default_compiler(c)
    yield c
    nv.set_default_compiler(prev)


# -- the NVRTC warm-up thread and the caller's first compile (issue 8, #2) -----------------------------
RACE = """
from rxcuda.sources import _nvrtc as nv
nv.set_default_compiler(nv.Compiler(False))
nv.warm_up("sm_90")
nv.compile_cuda('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', arch="sm_90")
"""


def test_compiling_right_after_warm_up_in_a_fresh_interpreter():
    # cuda.core's first import is not thread-safe: the warm-up thread must not be the one importing it
    procs = [subprocess.Popen([sys.executable, "-c", RACE], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        assert "ImportError" not in err


# -- __launch_bounds__ (issue 8, #3) -------------------------------------------------------------------
BOUNDED = """
extern "C" __global__ void __launch_bounds__(128) k(const float* x, float* out, int n)
{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i]; }
"""


@pytest.mark.parametrize("source", [BOUNDED, BOUNDED.replace('"C" __global__ void __launch_bounds__(128)',
                                                             '"C" __launch_bounds__(128, 4) __global__ void')])
def test_launch_bounds_are_the_block_size_of_the_compiled_kernel(source, tmp_path):
    assert nv.compile_cuda(source, arch="sm_90").block_size == 128
    assert nv.compile_cuda(source, arch="sm_90", block_size=64).block_size == 64
    with pytest.raises(ValueError, match=r"block_size=256 exceeds __launch_bounds__\(128\) of kernel 'k'"):
        nv.compile_cuda(source, arch="sm_90", block_size=256)
    # the same source built by `rxcuda kernels build` gets the same block size in its sidecar
    (tmp_path / "k.cu").write_text(source)
    build.build_kernels(tmp_path, use_nvcc=False)
    assert read_sidecar(tmp_path / "k.json").block_size == 128


def test_without_launch_bounds_the_block_size_is_256():
    assert nv.compile_cuda(SCALE, arch="sm_90").block_size == 256


# -- arguments that are not sources, options, architectures --------------------------------------------
@pytest.mark.parametrize("source", ["", "   ", "\n"])
def test_an_empty_source_is_named(source):
    with pytest.raises(CompileError, match="the CUDA source is empty"):
        nv.compile_cuda(source)


def test_a_missing_cu_file_gets_did_you_mean(tmp_path):
    (tmp_path / "scale.cu").write_text(SCALE)
    with pytest.raises(CompileError, match=r"scle.cu: no such CUDA source file; did you mean scale.cu\?"):
        nv.compile_cuda(tmp_path / "scle.cu")


def test_a_misspelled_option_is_named_with_the_close_ones():
    with pytest.raises(ValueError, match=r"unknown compile option 'use_fast_mth'; did you mean 'use_fast_math'"):
        nv.compile_cuda(SCALE, options={"use_fast_mth": True})
    with pytest.raises(ValueError, match=r"'include_path' is set by compile_cuda's own argument include_paths="):
        nv.compile_cuda(SCALE, options={"include_path": ["x"]})


@pytest.mark.parametrize("arch", ["sm_999", "sm90", "gfx90a"])
def test_an_unknown_arch_is_named_with_the_valid_ones(arch):
    with pytest.raises(ValueError, match=rf"arch '{arch}' is not an architecture .* use one of .*sm_90"):
        nv.compile_cuda(SCALE, arch=arch)


def test_a_cubin_for_a_virtual_arch_names_the_fix():
    with pytest.raises(ValueError, match=r"a cubin needs a real architecture .*'compute_90'.*target='ptx'"):
        nv.compile_cuda(SCALE, arch="compute_90", target="cubin")


def test_a_non_utf8_source_names_the_line(tmp_path):
    f = tmp_path / "k.cu"
    f.write_bytes(b'// fine\n// caf\xe9 in Latin-1\nextern "C" __global__ void k(float* x) {}\n')
    with pytest.raises(CompileError, match=r"k.cu:2:7: not UTF-8 text \(byte 0xe9\); save the file as UTF-8"):
        nv.compile_cuda(f)
    side = tmp_path / "k.json"
    side.write_bytes(b'{"entry": "k",\n "params": "\xff"}')
    with pytest.raises(KernelFileError, match=r"k.json:2:13: not UTF-8 text"):
        read_sidecar(side)


# -- the toolkit's headers ------------------------------------------------------------------------------
FP16 = '#include <cuda_fp16.h>\nextern "C" __global__ void h(__half* x) { x[0] = __float2half(RX_VALUE); }\n'


def test_toolkit_headers_come_from_cuda_home(monkeypatch, tmp_path):
    include = tmp_path / "toolkit" / "include"
    include.mkdir(parents=True)
    (include / "cuda_runtime.h").write_text("// probe\n")
    (include / "cuda_fp16.h").write_text("struct __half { unsigned short v; };\n"
                                         "__device__ __half __float2half(float f) { return __half{7}; }\n"
                                         "#define RX_VALUE 3.0f\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "toolkit"))
    assert _headers.toolkit_include_dir() == include
    code = nv.compile_cuda(FP16, arch="sm_90", target="ptx")
    assert code.entry == "h"


def test_without_a_toolkit_the_error_says_use_bundled_headers(monkeypatch):
    monkeypatch.setattr(nv, "toolkit_include_dir", lambda: None)
    with pytest.raises(CompileError, match=r"(?s)cuda_fp16.h.*use_bundled_headers=True"):
        nv.compile_cuda(FP16, arch="sm_90")
    code = nv.compile_cuda(FP16.replace("RX_VALUE", "1.0f"), arch="sm_90", options={"use_bundled_headers": True})
    assert code.entry == "h"


@pytest.mark.skipif(_headers.toolkit_include_dir() is None, reason="no CUDA toolkit installed here")
def test_an_installed_toolkit_serves_cuda_fp16():
    code = nv.compile_cuda(FP16.replace("RX_VALUE", "1.0f"), arch="sm_90")
    assert code.signature.params[0].dtype == "f16"


# -- truncated PTX (issue 8, #11) -----------------------------------------------------------------------
def test_a_truncated_ptx_is_refused_when_loaded(tmp_path):
    text = (KERNELS / "vector_add.ptx").read_text()
    cut = tmp_path / "vector_add.ptx"
    cut.write_text(text[: text.index("{", text.index(".entry")) + 200])  # the header and part of the body
    with pytest.raises(KernelFileError, match=r"vector_add.ptx: 1 '\{' never closed .* incomplete") as e:
        load_kernel_file(cut)
    assert e.value.path == str(cut)


@pytest.mark.parametrize("text, why", [
    (".target sm_75\n.visible .entry k(.param .u64 p) { ret; }\n", "no '.version' directive"),
    (".version 9.0\n.visible .entry k(.param .u64 p) { ret; }\n", "no '.target' directive"),
    (".version 9.0\n.target sm_75\n.visible .entry k(.param .u64 p)\n", "entry 'k' has no body"),
    (".version 9.0\n.target sm_75\n.visible .entry k(.param .u64 p) { ret; }\n}\n", r"a '\}' without its '\{'"),
])
def test_malformed_ptx_is_named(tmp_path, text, why):
    f = tmp_path / "k.ptx"
    f.write_text(text)
    with pytest.raises(KernelFileError, match=rf"k.ptx: {why}"):
        load_kernel_file(f)


def test_the_shipped_ptx_files_pass_the_check():
    for f in KERNELS.glob("*.ptx"):
        load_kernel_file(f)


# -- `rxcuda kernels build` -----------------------------------------------------------------------------
def _cli(argv):
    from rxcuda._cli import main

    return main(argv)


def test_build_goes_past_broken_sources_and_reports_each_on_one_line(tmp_path, capsys):
    (tmp_path / "a_latin1.cu").write_bytes(b'// caf\xe9\nextern "C" __global__ void a(float* x) {}\n')
    (tmp_path / "b_bad.cu").write_text('extern "C" __global__ void b(float* x)\n{\n    x[0] = nope;\n}\n')
    (tmp_path / "c_good.cu").write_text('extern "C" __global__ void c(float* x) { x[0] = 1.0f; }\n')
    assert _cli(["kernels", "build", str(tmp_path), "--nvrtc", "-q"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[0].startswith("rxcuda kernels build: error: ") and "a_latin1.cu:1:7: not UTF-8 text" in err[0]
    assert err[1] == (f"rxcuda kernels build: error: {tmp_path / 'b_bad.cu'}:3:12: error: identifier \"nope\" is "
                      f"undefined")
    assert "2 source(s) failed" in err[2] and len(err) == 3
    assert (tmp_path / "c_good.ptx").is_file() and (tmp_path / "c_good.json").is_file()


def test_build_reports_through_the_logger_not_print(tmp_path, capsys, caplog):
    (tmp_path / "empty.cu").write_text("__device__ float twice(float x) { return 2 * x; }\n")
    with caplog.at_level(logging.WARNING, logger="rxcuda"):
        assert build.build_kernels(tmp_path, use_nvcc=False) == [tmp_path / "empty.ptx"]
    assert "no extern \"C\" __global__ kernel, so no sidecar" in caplog.text
    assert capsys.readouterr() == ("", "")


def test_an_unusable_disk_cache_is_logged_not_printed(tmp_path, capsys, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="rxcuda"):
        assert nv.Compiler(blocker / "cache").compile_module(SCALE, arch="sm_90").cached == "miss"
    assert "compile cache disabled" in caplog.text
    assert capsys.readouterr() == ("", "")


# -- NumPy inside a composed kernel ---------------------------------------------------------------------
def test_numpy_functions_on_traced_values_point_to_rx():
    with pytest.raises(rx.ComposeError, match=r"np.sin\(...\) cannot run on a traced value .* use rx.sin\(...\)"):
        @rx.kernel
        def k(x: rx.In[f32], out: rx.Out[f32]):
            i = rx.thread_index()
            out[i] = np.sin(x[i])

    with pytest.raises(rx.ComposeError, match=r"np.maximum\(...\) .* use rx.max\(...\)"):
        @rx.kernel
        def k2(x: rx.In[f32], out: rx.Out[f32]):
            i = rx.thread_index()
            out[i] = np.maximum(x[i], 0.0)

    with pytest.raises(rx.ComposeError, match=r"np.where\(...\) .* use rx.where\(...\)"):
        @rx.kernel
        def k3(x: rx.In[f32], out: rx.Out[f32]):
            i = rx.thread_index()
            out[i] = np.where(x[i] > 0, x[i], 0.0)


def test_numpy_scalars_still_work_as_operands():
    @rx.kernel
    def k(x: rx.In[f32], out: rx.Out[f32]):
        i = rx.thread_index()
        out[i] = np.float32(2) * x[i] - np.float32(1)

    assert "2.0f * v0" in k.source and "v1 - 1.0f" in k.source
