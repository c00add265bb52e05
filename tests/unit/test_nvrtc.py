"""NVRTC compilation (no GPU needed), declaration parsing, diagnostics, and the compile cache."""

import statistics
import time

import pytest

from rxcuda.model._errors import CompileError
from rxcuda.sources import _arch, _cdecl, _headers
from rxcuda.sources import _diagnostics as diag
from rxcuda.sources import _nvrtc as nv
from rxcuda.sources._ptx import parse_ptx

SCALE = """
extern "C" __global__ void scale(const float* x, float* out, float s, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s;
}
"""


@pytest.fixture
def compiler(tmp_path):
    """A compiler with its own disk cache, installed as the process-wide one for the test."""
    c = nv.Compiler(tmp_path / "cache")
    prev = nv.set_default_compiler(c)
    yield c
    nv.set_default_compiler(prev)


# -- declarations -------------------------------------------------------------------------------------
def describe(decl):
    return [(p.name, p.spelled(), p.direction, p.default) for p in decl.params]


def test_const_pointer_is_in_plain_pointer_is_out():
    d = _cdecl.parse_declarations(SCALE)["scale"]
    assert describe(d) == [
        ("x", "f32*", "in", None),
        ("out", "f32*", "out", None),
        ("s", "f32", "in", None),
        ("n", "i32", "in", "size"),
    ]


def test_macro_and_comment_annotations():
    src = """
    extern "C" __global__ void __launch_bounds__(128) k(
        RX_IN float* a,                 // macro form
        /*inout*/ double* acc,          // comment form
        RX_COUNTER unsigned int* hits,
        float w RX_DEFAULT(0.5),
        unsigned long long seed /*= 42*/,
        int count RX_SIZE,
        const float table[],
        float bias = 2.5f)
    { }
    """
    d = _cdecl.parse_declarations(src)["k"]
    assert describe(d) == [
        ("a", "f32*", "in", None),
        ("acc", "f64*", "inout", None),
        ("hits", "u32*", "counter", None),
        ("w", "f32", "in", 0.5),
        ("seed", "u64", "in", 42),
        ("count", "i32", "in", "size"),
        ("table", "f32*", "in", None),
        ("bias", "f32", "in", 2.5),
    ]
    assert d.block_size == 128
    assert d.params[0].direction_explicit and not d.params[6].direction_explicit
    assert d.line == 2


def test_only_extern_c_non_template_kernels_are_read():
    src = """
    // extern "C" __global__ void in_a_comment(float* x) {}
    template <typename T> __global__ void templ(T* x) {}
    __global__ void mangled(float* x) {}
    extern "C" { __global__ void in_block(int* x, long long n) {} }
    extern "C" __global__ void declared_only(float* x);
    """
    found = _cdecl.parse_declarations(src)
    assert list(found) == ["in_block", "declared_only"]
    assert describe(found["in_block"]) == [("x", "i32*", "out", None), ("n", "i64", "in", "size")]
    assert _cdecl.mangled_kernels(src) == ["templ", "mangled"]


def test_unknown_types_and_pointer_to_pointer():
    src = 'extern "C" __global__ void k(struct Params p, float** rows, void* raw, const __half* h) {}'
    d = _cdecl.parse_declarations(src)["k"]
    assert [(p.name, p.dtype, p.pointer) for p in d.params] == [
        ("p", None, False),
        ("rows", None, True),
        ("raw", None, True),
        ("h", "f16", True),
    ]


@pytest.mark.parametrize(
    "decl, message",
    [
        ("RX_OUT float s", "scalar, always an input"),
        ("float* x RX_DEFAULT(1)", "takes no default"),
        ("RX_COUNTER int* c", r"counter, which must be an 'unsigned int\*'"),
        ("float s RX_DEFAULT(abc)", "not a number"),
        ("float s RX_SIZE", "integer type"),
    ],
)
def test_bad_annotations_are_compile_errors(decl, message):
    with pytest.raises(CompileError, match=message) as e:
        _cdecl.parse_declarations(f'extern "C" __global__ void k({decl}) {{}}', "k.cu")
    assert e.value.diagnostics[0].file == "k.cu"


def test_signature_checks_compiled_sizes():
    d = _cdecl.parse_declarations(SCALE)["scale"]
    assert [p.size for p in d.signature((8, 8, 4, 4)).params] == [8, 8, 4, 4]
    with pytest.raises(CompileError, match=r"declares 4 parameters \(x, out, s, n\) but its compiled code takes 5"):
        d.signature((8, 8, 4, 4, 8))
    with pytest.raises(CompileError, match="4 bytes.*passes 8 bytes"):
        d.signature((8, 8, 8, 4))


# -- diagnostics ---------------------------------------------------------------------------------------
LOG = """k.cu(3): error: identifier "oops" is undefined
      x[0] = oops;
             ^

k.cu(7): warning #177-D: variable "unused" was declared but never referenced
    int unused;
        ^

inc/h.cuh(1): catastrophic error: cannot open source file "missing.h"
  #include "missing.h"
                      ^

2 errors detected in the compilation of "k.cu".
"""


def test_parse_diagnostics():
    assert diag.parse_diagnostics(LOG) == (
        diag.Diagnostic("k.cu", 3, 12, 'identifier "oops" is undefined', "error"),
        diag.Diagnostic("k.cu", 7, 7, 'variable "unused" was declared but never referenced', "warning"),
        diag.Diagnostic("inc/h.cuh", 1, 21, 'cannot open source file "missing.h"', "error"),
    )
    assert str(diag.parse_diagnostics(LOG)[0]) == 'k.cu:3:12: error: identifier "oops" is undefined'


def test_compile_error_carries_structured_diagnostics(compiler):
    bad = 'extern "C" __global__ void k(float* a)\n{\n    a[0] = undefined_x;\n}\n'
    with pytest.raises(CompileError) as e:
        nv.compile_cuda(bad, name="bad.cu")
    assert e.value.diagnostics[0] == diag.Diagnostic("bad.cu", 3, 12, 'identifier "undefined_x" is undefined')
    assert "bad.cu:3:12: error" in str(e.value)
    assert "undefined_x" in e.value.log
    with pytest.raises(CompileError) as e:
        nv.compile_cuda(bad, name="bad.cu", target="ptx")
    assert e.value.diagnostics[0].line == 3


# -- compiling -----------------------------------------------------------------------------------------
def test_cubin_for_sm90_with_signature(compiler):
    code = nv.compile_cuda(SCALE, arch="sm_90", target="cubin")  # (PTX by default where the CPU device runs)
    assert code.format == "cubin" and code.entry == "scale"
    assert code.image[:4] == b"\x7fELF"
    assert nv.cubin_param_sizes(code.image) == {"scale": (8, 8, 4, 4)}
    assert [p.describe() for p in code.signature.params] == ["f32* x (in)", "f32* out (out)", "f32 s", "i32 n"]
    assert code.signature.params[3].default == "size"


def test_ptx_holds_the_entry_and_its_parameters(compiler):
    code = nv.compile_cuda(SCALE, arch="compute_75", target="ptx")
    text = code.image.decode()
    assert ".visible .entry scale(" in text and ".target sm_75" in text
    assert [p.ptx_type for p in parse_ptx(text)["scale"]] == ["u64", "u64", "f32", "u32"]


def test_defines_include_paths_and_options(compiler, tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "factor.cuh").write_text("#define FACTOR 3.0f\n")
    src = '#include "factor.cuh"\nextern "C" __global__ void k(float* x) { x[0] = FACTOR * WIDTH; }\n'
    code = nv.compile_cuda(
        src, include_paths=[inc], defines={"WIDTH": 4}, options={"use_fast_math": True}, target="ptx", arch="sm_90"
    )
    assert "1094713344" in code.image.decode() or "0f41400000" in code.image.decode()  # 12.0f


def test_file_source_and_entry_choice(compiler, tmp_path):
    f = tmp_path / "two.cu"
    f.write_text(SCALE + 'extern "C" __global__ void other(int* y) { y[0] = 1; }\n')
    with pytest.raises(CompileError, match="several kernels .*scale, other"):
        nv.compile_cuda(f)
    code = nv.compile_cuda(f, "other")
    assert code.origin == str(f) and code.entry == "other"
    with pytest.raises(CompileError, match="no kernel 'nope'"):
        nv.compile_cuda(f, "nope")
    with pytest.raises(CompileError, match="no such CUDA source file"):
        nv.compile_cuda(tmp_path / "missing.cu")


def test_mangled_kernel_gets_a_hint(compiler):
    with pytest.raises(CompileError, match='not extern "C"'):
        nv.compile_cuda("__global__ void plain(float* x) { x[0] = 1; }\n", "plain")


# -- cache ---------------------------------------------------------------------------------------------
def test_memory_hit_disk_hit_and_miss_accounting(compiler):
    nv.compile_cuda(SCALE, arch="sm_90")
    assert compiler.stats() == nv.CacheStats(0, 0, 1, compiler.stats().compile_seconds)
    nv.compile_cuda(SCALE, arch="sm_90")
    s = compiler.stats()
    assert (s.memory_hits, s.disk_hits, s.misses) == (1, 0, 1)
    again = nv.Compiler(compiler.directory)  # a second process, as far as the cache can tell
    m = again.compile_module(SCALE, arch="sm_90")
    assert m.cached == "disk" and (again.stats().disk_hits, again.stats().misses) == (1, 0)
    nv.compile_cuda(SCALE, arch="sm_80")  # another architecture: another entry
    nv.compile_cuda(SCALE, arch="sm_90", defines=["X=1"])  # other options: another entry
    assert compiler.stats().misses == 3


def test_memory_hit_is_well_under_a_millisecond(compiler):
    nv.compile_cuda(SCALE, arch="sm_90")
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        nv.compile_cuda(SCALE, arch="sm_90")
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 1e-3


def test_header_change_is_a_miss(compiler, tmp_path):
    h = tmp_path / "k.cuh"
    h.write_text("#define V 1\n")
    src = tmp_path / "k.cu"
    src.write_text('#include "k.cuh"\nextern "C" __global__ void k(int* x) { x[0] = V; }\n')
    nv.compile_cuda(src, arch="sm_90")
    nv.compile_cuda(src, arch="sm_90")
    h.write_text("#define V 2\n")
    nv.compile_cuda(src, arch="sm_90")
    s = compiler.stats()
    assert (s.memory_hits, s.misses) == (1, 2)
    assert _headers.header_files(src.read_text(), tmp_path, []) == [h.resolve()]


def test_clear_and_info(compiler):
    nv.compile_cuda(SCALE, arch="sm_90")
    assert nv.cache_info()["entries"] == 1
    nv.clear_cache()
    assert nv.cache_info()["entries"] == 0
    nv.compile_cuda(SCALE, arch="sm_90")
    assert compiler.stats().misses == 2


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RXCUDA_CACHE_DIR", str(tmp_path / "mine"))
    assert nv.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("RXCUDA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert nv.cache_dir() == tmp_path / "xdg" / "rxcuda"
    assert nv.Compiler().directory == tmp_path / "xdg" / "rxcuda" / "programs"


def test_disabled_disk_cache(tmp_path):
    c = nv.Compiler(False)
    assert c.compile_module(SCALE, arch="sm_90").cached == "miss"
    assert c.compile_module(SCALE, arch="sm_90").cached == "memory"


def test_warm_up_runs_once_in_the_background():
    t = nv.warm_up()
    assert t is nv.warm_up()
    t.join(60)
    assert not t.is_alive()


def test_default_arch_without_device():
    arch = nv.default_arch()
    assert arch.startswith("sm_")
    if _arch.device_arch() is None:
        assert arch == "sm_90"


def test_runtime_types_compile_and_real_errors_are_reported(compiler):
    tex = ('extern "C" __global__ void fetch(cudaTextureObject_t t, float* out)\n'
           '{ out[threadIdx.x] = tex1Dfetch<float>(t, threadIdx.x); }\n')
    code = nv.compile_cuda(tex, arch="sm_90")
    assert [p.size for p in code.signature.params] == [8, 8] and code.signature.params[0].dtype is None
    assert compiler.stats().misses == 1
    with pytest.raises(CompileError, match="undefined_x"):
        nv.compile_cuda('extern "C" __global__ void k(float* a) { a[0] = undefined_x; }', arch="sm_90")

