"""Library call descriptors: ports, counts, keys, chains, validation — no GPU needed.

Construction must never touch CUDA: ``no_cuda`` makes every binding and driver access fail.
``record`` argument order (the row-major -> column-major swaps) is checked against fake bindings.
"""

from __future__ import annotations

import types

import attrs
import pytest

from rxcuda import libraries as lib
from rxcuda.cuda import _launch, _stream
from rxcuda.libraries import _handles, _rand
from rxcuda.model._describe import CallSpec, CaptureArgs, KernelCode, KernelParam, KernelSignature, Launch
from rxcuda.model._errors import ValidationError


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("constructing a library call must not touch CUDA")

    monkeypatch.setattr(_handles, "binding", refuse)
    monkeypatch.setattr(_handles, "Resources", refuse)
    monkeypatch.setattr(_launch, "launch_kernel", refuse)
    monkeypatch.setattr(_launch, "copy_async", refuse)
    for verb in ("create_stream", "synchronize", "destroy_stream"):  # what the cuRAND backend's setup uses
        monkeypatch.setattr(_stream, verb, refuse)


def ports(spec):
    return {p.name: (p.dtype, p.direction, spec.counts.get(p.name)) for p in spec.params if p.is_pointer}


def scalars(spec):
    return {p.name: (p.dtype, p.default) for p in spec.params if not p.is_pointer}


# -- BLAS ------------------------------------------------------------------------------------------------
def test_gemm_ports_counts_and_device_scalars():
    mm = lib.gemm(256, 128, 64)
    assert isinstance(mm, CallSpec)
    assert ports(mm) == {
        "a": ("f32", "in", 256 * 64),
        "b": ("f32", "in", 64 * 128),
        "c": ("f32", "out", 256 * 128),
    }
    assert scalars(mm) == {"alpha": ("f32", 1.0)}
    assert mm.device_scalars == ("alpha",)
    assert mm.setup is not None and mm.teardown is not None
    assert mm.workspace_bytes >= 64 << 20
    assert mm.nbytes("c") == 256 * 128 * 4


def test_gemm_beta_makes_c_inout_and_adds_a_device_scalar():
    mm = lib.gemm(8, 8, 8, dtype="f64", alpha=2.0, beta=0.5, batch=3)
    assert ports(mm)["c"] == ("f64", "inout", 3 * 64)
    assert scalars(mm) == {"alpha": ("f64", 2.0), "beta": ("f64", 0.5)}
    assert mm.device_scalars == ("alpha", "beta")


def test_gemm_half_inputs_accumulate_in_f32():
    mm = lib.gemm(64, 64, 64, dtype="f16", out_dtype="f32")
    assert ports(mm)["a"][0] == "f16" and ports(mm)["c"][0] == "f32"
    assert scalars(mm)["alpha"][0] == "f32"
    bf = lib.gemm(64, 64, 64, dtype="bfloat16")
    assert ports(bf)["c"][0] == "bf16"


def test_gemm_key_is_structural():
    assert lib.gemm(4, 5, 6).key == lib.gemm(4, 5, 6, alpha=3.0).key  # alpha is a value, not structure
    assert lib.gemm(4, 5, 6).key != lib.gemm(4, 5, 7).key
    assert lib.gemm(4, 5, 6).key != lib.gemm(4, 5, 6, trans_a=True).key
    assert lib.gemm(4, 5, 6).key != lib.gemm(4, 5, 6, beta=0.0).key


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"m": 0, "n": 4, "k": 4}, r"gemm: 'm' must be a positive int"),
        ({"m": 4, "n": -1, "k": 4}, r"gemm: 'n' must be a positive int"),
        ({"m": 4, "n": 4, "k": 2.5}, r"gemm: 'k' must be a positive int"),
        (
            {"m": 4, "n": 4, "k": 4, "dtype": "i32"},
            r"gemm: 'dtype' has unsupported dtype 'i32'; use one of f32",
        ),
        ({"m": 4, "n": 4, "k": 4, "dtype": "f32", "out_dtype": "f64"}, r"gemm: 'out_dtype'.*use one of f32"),
        ({"m": 4, "n": 4, "k": 4, "dtype": "f64", "tf32": True}, r"gemm: 'tf32'.*f32 GEMMs only"),
        ({"m": 4, "n": 4, "k": 4, "alpha": "x"}, r"gemm: 'alpha' must be a real number"),
        ({"m": 4, "n": 4, "k": 4, "beta": float("nan")}, r"gemm: 'beta' must be finite"),
        ({"m": 4, "n": 4, "k": 4, "workspace_bytes": 0}, r"gemm: 'workspace_bytes'.*64 MiB"),
        ({"m": 4, "n": 4, "k": 4, "name": "not a name"}, r"gemm: 'name'"),
    ],
)
def test_gemm_validation(kwargs, match):
    with pytest.raises(ValidationError, match=match) as info:
        lib.gemm(**kwargs)
    assert info.value.subject.startswith("gemm")


def test_gemv_axpy_scal():
    mv = lib.gemv(100, 30)
    assert ports(mv) == {"a": ("f32", "in", 3000), "x": ("f32", "in", 30), "y": ("f32", "out", 100)}
    mvt = lib.gemv(100, 30, trans=True, beta=1.0, dtype="f64")
    assert ports(mvt)["x"] == ("f64", "in", 100) and ports(mvt)["y"] == ("f64", "inout", 30)
    ax = lib.axpy(10, alpha=0.5)
    assert ports(ax) == {"x": ("f32", "in", 10), "y": ("f32", "inout", 10)} and ax.device_scalars == ("alpha",)
    sc = lib.scal(10, dtype="c128", alpha=2.0)
    assert ports(sc) == {"x": ("c128", "inout", 10)} and scalars(sc) == {"alpha": ("f64", 2.0)}
    with pytest.raises(ValidationError, match=r"axpy: 'dtype' has unsupported dtype 'c64'; use one of f32, f64"):
        lib.axpy(10, dtype="c64")
    with pytest.raises(ValidationError, match=r"gemv: 'm' must be a positive int"):
        lib.gemv(0, 3)


# -- FFT -------------------------------------------------------------------------------------------------
def test_fft_ports():
    f = lib.fft(1024, batch=8)
    assert ports(f) == {"x": ("c64", "in", 8192), "y": ("c64", "out", 8192)}
    assert f.device_scalars == () and scalars(f) == {}
    assert ports(lib.ifft(16, dtype="complex128")) == {"x": ("c128", "in", 16), "y": ("c128", "out", 16)}
    assert ports(lib.fft2((32, 48), batch=2))["y"] == ("c64", "out", 2 * 32 * 48)
    r = lib.rfft(1000, batch=4)
    assert ports(r) == {"x": ("f32", "in", 4000), "y": ("c64", "out", 4 * 501)}
    ir = lib.irfft(1000, batch=4, dtype="f64")
    assert ports(ir) == {"x": ("c128", "in", 4 * 501), "y": ("f64", "out", 4000)}
    assert ports(lib.irfft(8, preserve_input=False))["x"] == ("c64", "inout", 5)
    assert ports(lib.rfft2((6, 9)))["y"] == ("c64", "out", 6 * 5)
    assert ports(lib.irfft2((6, 9)))["x"] == ("c64", "in", 6 * 5)


def test_fft_keys_differ_by_direction_and_norm():
    assert lib.fft(64).key != lib.ifft(64).key
    assert lib.fft(64).key != lib.fft(64, norm="ortho").key
    assert lib.fft(64).key == lib.fft(64, name="other").key


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: lib.fft(0), r"fft: 'n' must be a positive int"),
        (lambda: lib.fft(64, dtype="f32"), r"fft: 'dtype'.*f32 is real.*use rfft/irfft"),
        (lambda: lib.fft(64, dtype="i32"), r"fft: 'dtype' has unsupported dtype 'i32'"),
        (lambda: lib.fft(64, norm="sideways"), r"fft: 'norm'.*'backward', 'ortho', 'forward' or None"),
        (lambda: lib.fft2(64), r"fft2: 'shape' must be a shape of 2 positive ints"),
        (lambda: lib.fft2((64, 0)), r"fft2: 'shape'.*every extent"),
        (lambda: lib.rfft(64, batch=0), r"rfft: 'batch' must be a positive int"),
        (lambda: lib.irfft(64, dtype="f16"), r"irfft: 'dtype' has unsupported dtype 'f16'"),
    ],
)
def test_fft_validation(make, match):
    with pytest.raises(ValidationError, match=match):
        make()


# -- random ----------------------------------------------------------------------------------------------
def test_random_curand_scalars_are_host_scalars():
    r = lib.random_uniform(1000, seed=42, offset=7, backend="curand")
    assert ports(r) == {"out": ("f32", "out", 1000)}
    assert scalars(r) == {"seed": ("u64", 42), "offset": ("u64", 7)}
    assert r.device_scalars == ()  # cuRAND bakes seed/offset into the capture: a change recaptures
    n = lib.random_normal(1000, dtype="f64", mean=1.0, stddev=2.0, backend="curand")
    assert scalars(n) == {
        "seed": ("u64", 0),
        "offset": ("u64", 0),
        "mean": ("f64", 1.0),
        "stddev": ("f64", 2.0),
    }


def test_random_philox_scalars_are_device_scalars():
    r = lib.random_uniform(1001, low=-1.0, high=1.0, backend="philox")
    assert r.device_scalars == ("seed", "offset", "low", "high")
    n = lib.random_normal(1001, backend="philox", dtype="f64")
    assert n.device_scalars == ("seed", "offset", "mean", "stddev")
    assert scalars(n)["mean"] == ("f64", 0.0)
    assert r.key != lib.random_uniform(1001, backend="curand").key
    assert lib.random_uniform(8).device_scalars == ("seed", "offset", "low", "high")  # philox is the default


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: lib.random_normal(1001, backend="curand"), r"random_normal: 'n'.*must be even.*backend='philox'"),
        (lambda: lib.random_uniform(10, seed=-1), r"random_uniform: 'seed'.*\[0, 2\*\*64\)"),
        (lambda: lib.random_uniform(10, offset=1.5), r"random_uniform: 'offset'"),
        (lambda: lib.random_uniform(10, dtype="f16"), r"random_uniform: 'dtype' has unsupported dtype 'f16'"),
        (
            lambda: lib.random_uniform(10, low=2.0, high=1.0, backend="philox"),
            r"'high': must be greater than low",
        ),
        (
            lambda: lib.random_uniform(10, low=-1.0, backend="curand"),
            r"cuRAND draws from \(0, 1\] only; use backend='philox'",
        ),
        (lambda: lib.random_normal(10, stddev=-1.0), r"random_normal: 'stddev': must be >= 0"),
        (lambda: lib.random_normal(10, backend="numpy"), r"random_normal: 'backend'.*'curand' or 'philox'"),
    ],
)
def test_random_validation(make, match):
    with pytest.raises(ValidationError, match=match):
        make()


# -- sparse / solve --------------------------------------------------------------------------------------
def test_spmv_ports():
    s = lib.spmv(1000, 800, 5000)
    assert ports(s) == {
        "indptr": ("i32", "in", 1001),
        "indices": ("i32", "in", 5000),
        "data": ("f32", "in", 5000),
        "x": ("f32", "in", 800),
        "y": ("f32", "out", 1000),
    }
    t = lib.spmv(1000, 800, 5000, transpose=True, beta=1.0, dtype="f64", index_dtype="i64")
    assert ports(t)["x"] == ("f64", "in", 1000) and ports(t)["y"] == ("f64", "inout", 800)
    assert ports(t)["indices"][0] == "i64" and t.device_scalars == ("alpha", "beta")


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: lib.spmv(4, 4, 17), r"spmv: 'nnz'.*do not fit a 4x4 matrix"),
        (lambda: lib.spmv(4, 4, 0), r"spmv: 'nnz' must be a positive int"),
        (lambda: lib.spmv(4, 4, 4, index_dtype="i16"), r"spmv: 'index_dtype' has unsupported dtype 'i16'"),
        (
            lambda: lib.spmv(4, 4, 4, dtype="c64"),
            r"spmv: 'dtype' has unsupported dtype 'c64'; use one of f32, f64",
        ),
        (lambda: lib.spmv(4, 4, 4, alg="fast"), r"spmv: 'alg'.*default"),
    ],
)
def test_spmv_validation(make, match):
    with pytest.raises(ValidationError, match=match):
        make()


def test_lu_ports():
    f = lib.lu_factor(5, dtype="f64")
    assert ports(f) == {
        "a": ("f64", "in", 25),
        "lu": ("f64", "out", 25),
        "piv": ("i32", "out", 5),
        "info": ("i32", "out", 1),
    }
    assert ports(lib.lu_factor(5, overwrite_a=True))["a"] == ("f32", "inout", 25)
    s = lib.lu_solve(5, 3)
    assert ports(s) == {
        "lu": ("f32", "in", 25),
        "piv": ("i32", "in", 5),
        "b": ("f32", "in", 15),
        "x": ("f32", "out", 15),
        "info": ("i32", "out", 1),
    }
    with pytest.raises(ValidationError, match=r"lu_solve: 'nrhs' must be a positive int"):
        lib.lu_solve(5, 0)
    with pytest.raises(ValidationError, match=r"lu_factor: 'dtype' has unsupported dtype 'f16'"):
        lib.lu_factor(5, dtype="f16")


# -- chains ----------------------------------------------------------------------------------------------
def test_chain_gemm_scale_fft_params_are_the_union_minus_internals():
    c = lib.chain(
        lib.gemm(64, 32, 16),
        (lib.scal(64 * 32, alpha=0.5), {"x": "c", "alpha": "gain"}),
        (lib.rfft(32, batch=64), {"x": "c", "y": "spectrum"}),
        internal=("c",),
        name="mm_scale_fft",
    )
    assert isinstance(c, CallSpec) and c.name == "mm_scale_fft"
    assert ports(c) == {
        "a": ("f32", "in", 64 * 16),
        "b": ("f32", "in", 16 * 32),
        "spectrum": ("c64", "out", 64 * 17),
    }
    assert scalars(c) == {"alpha": ("f32", 1.0), "gain": ("f32", 0.5)}
    assert c.device_scalars == ("alpha", "gain")
    assert c.workspace_bytes >= 64 * 32 * 4
    assert (
        c.key
        == lib.chain(
            lib.gemm(64, 32, 16),
            (lib.scal(2048), {"x": "c", "alpha": "gain"}),
            (lib.rfft(32, batch=64), {"x": "c", "y": "spectrum"}),
            internal="c",
        ).key
    )


def test_chain_exposed_directions():
    # c is written by gemm, then read and written by scal: seen from outside it is an output
    c = lib.chain(lib.gemm(4, 4, 4), (lib.scal(16), {"x": "c", "alpha": "k"}))
    assert ports(c)["c"] == ("f32", "out", 16)
    # y is read first (axpy inout) then written -> inout; x only read -> in
    d = lib.chain(lib.axpy(16), (lib.scal(16), {"x": "y"}))
    assert ports(d) == {"x": ("f32", "in", 16), "y": ("f32", "inout", 16)}
    # shared device scalar: one slot read by both steps
    assert d.device_scalars == ("alpha",)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: lib.chain(), r"chain: 'steps'.*at least one step"),
        (lambda: lib.chain("gemm"), r"chain: 'steps\[0\]': expected a CallSpec"),
        (lambda: lib.chain((lib.scal(4), {"z": "q"})), r"step 'scal' has no parameter 'z'.*it has: x, alpha"),
        (
            lambda: lib.chain(lib.gemm(4, 4, 4), (lib.scal(15), {"x": "c"})),
            r"chain: 'c'.*16 elements.*expects 15",
        ),
        (
            lambda: lib.chain(lib.gemm(4, 4, 4), (lib.scal(16, dtype="f64"), {"x": "c"})),
            r"chain: 'c'.*f32.*f64",
        ),
        (
            lambda: lib.chain(lib.scal(16), internal=("x",)),
            r"'x' is read by step 0.*before any step writes it",
        ),
        (lambda: lib.chain(lib.scal(16), internal=("nope",)), r"'nope' is not a parameter of any step"),
        (lambda: lib.chain(lib.scal(16), internal=("alpha",)), r"'alpha' is a scalar"),
        (lambda: lib.chain((lib.axpy(4), {"y": "x"})), r"binds both 'x' and 'y' to one buffer"),
        (
            lambda: lib.chain(
                lib.random_normal(4, mean=1.0, backend="curand"), (lib.scal(4), {"x": "out", "alpha": "mean"})
            ),
            r"'mean': is a device scalar in one step and a host scalar",
        ),
        (
            lambda: lib.chain(lib.scal(4), (lib.scal(4), {"alpha": "x"})),
            r"'x': is a pointer in one step and a scalar",
        ),
    ],
)
def test_chain_validation(make, match):
    with pytest.raises(ValidationError, match=match):
        make()


def _fake_step(name, params, log, device=()):
    def setup(ordinal):
        log.append(("setup", name, ordinal))
        return f"state-{name}"

    def teardown(state):
        log.append(("teardown", name, state))

    def record(args):
        log.append(("record", name, args.stream, dict(args.pointers), dict(args.values), args.state))

    return lib.LibraryCall(
        name=name,
        params=tuple(params),
        record=record,
        key=(name,),
        device_scalars=tuple(device),
        setup=setup,
        teardown=teardown,
        counts={p.name: 16 for p in params if p.is_pointer},
    )


def test_chain_record_maps_pointers_values_and_internals(monkeypatch):
    log = []
    p = KernelParam
    first = _fake_step(
        "first",
        [
            p("src", "pointer", 8, "f32", "in"),
            p("dst", "pointer", 8, "f32", "out"),
            p("k", "scalar", 4, "f32", default=2.0),
        ],
        log,
        device=("k",),
    )
    second = _fake_step(
        "second",
        [
            p("x", "pointer", 8, "f32", "in"),
            p("y", "pointer", 8, "f32", "out"),
            p("n", "scalar", 4, "i32", default=3),
        ],
        log,
    )
    c = lib.chain(first, (second, {"x": "dst", "y": "result"}), internal=("dst",))
    assert [q.name for q in c.params] == ["src", "k", "result", "n"]

    class FakeResources:
        def __init__(self, ordinal):
            self.ptr = 0x9000
            self.closed = False

        def alloc(self, nbytes):
            log.append(("alloc", nbytes))
            self.ptr += 0x100
            return types.SimpleNamespace(ptr=self.ptr)

        def close(self):
            log.append(("close",))

    monkeypatch.setattr(_handles, "Resources", FakeResources)
    state = c.setup(0)
    assert log[:3] == [("alloc", 64), ("setup", "first", 0), ("setup", "second", 0)]
    c.record(CaptureArgs(stream=77, pointers={"src": 0x10, "result": 0x20, "k": 0x30}, values={"n": 5}, state=state))
    assert log[3] == ("record", "first", 77, {"src": 0x10, "dst": 0x9100, "k": 0x30}, {}, "state-first")
    assert log[4] == ("record", "second", 77, {"x": 0x9100, "y": 0x20}, {"n": 5}, "state-second")
    c.teardown(state)
    assert log[5:] == [
        ("teardown", "second", "state-second"),
        ("teardown", "first", "state-first"),
        ("close",),
    ]


def test_chain_setup_failure_tears_down_what_was_set_up(monkeypatch):
    log = []

    def boom(_):
        raise RuntimeError("no plan")

    good = _fake_step("good", [KernelParam("x", "pointer", 8, "f32", "out")], log)
    bad = lib.LibraryCall(name="bad", params=(KernelParam("y", "pointer", 8, "f32", "out"),), record=None, setup=boom)

    class FakeResources:
        def __init__(self, ordinal):
            pass

        def alloc(self, n):
            return types.SimpleNamespace(ptr=1)

        def close(self):
            log.append(("close",))

    monkeypatch.setattr(_handles, "Resources", FakeResources)
    c = lib.chain(good, bad)
    with pytest.raises(RuntimeError, match="no plan"):
        c.setup(0)
    assert log == [("setup", "good", 0), ("teardown", "good", "state-good"), ("close",)]


def _scale_code():
    sig = KernelSignature(
        "scale",
        (
            KernelParam("x", "pointer", 8, "f32", "inout"),
            KernelParam("factor", "scalar", 4, "f32", default=2.0),
            KernelParam("n", "scalar", 8, "u64", default="size"),
        ),
    )
    return KernelCode(entry="scale", image=b".version 8.0\n.target sm_90\n", format="ptx", signature=sig)


def test_kernel_step_in_a_chain():
    k = lib.kernel(_scale_code(), Launch.for_threads(2048), counts={"x": 2048})
    assert scalars(k) == {"factor": ("f32", 2.0), "n": ("u64", 2048)}
    assert k.device_scalars == ()
    c = lib.chain(lib.gemm(32, 64, 8), (k, {"x": "c"}), (lib.rfft(64, batch=32), {"x": "c", "y": "spec"}), internal="c")
    assert ports(c) == {"a": ("f32", "in", 256), "b": ("f32", "in", 512), "spec": ("c64", "out", 32 * 33)}
    assert scalars(c) == {"alpha": ("f32", 1.0), "factor": ("f32", 2.0), "n": ("u64", 2048)}
    with pytest.raises(ValidationError, match=r"kernel: 'counts'.*no parameter 'y'"):
        lib.kernel(_scale_code(), Launch.for_threads(8), counts={"y": 8})
    with pytest.raises(ValidationError, match=r"kernel: 'launch'.*Launch.for_threads"):
        lib.kernel(_scale_code(), (8,))


# -- record against fake bindings ------------------------------------------------------------------------
class FakeBinding:
    def __init__(self, log):
        self.log = log

    def __getattr__(self, name):
        def call(*args):
            self.log.append((name, args))
            return 0

        return call


def _fake_state(**extra):
    ws = types.SimpleNamespace(ptr=0xABC, nbytes=1024)
    return types.SimpleNamespace(extra={"handle": 5, "workspace": ws, "zero": 0xE0, **extra})


def test_gemm_record_swaps_operands_for_row_major(monkeypatch):
    log = []
    monkeypatch.setattr(_handles, "binding", lambda name: FakeBinding(log))
    mm = lib.gemm(3, 5, 7, trans_b=True)
    ptrs = {"a": 0xA, "b": 0xB, "c": 0xC, "alpha": 0xAA}
    mm.record(CaptureArgs(stream=9, pointers=ptrs, values={}, state=_fake_state()))
    names = [n for n, _ in log]
    assert names == ["set_stream", "set_workspace", "set_pointer_mode", "gemm_ex"]
    assert log[0][1] == (5, 9) and log[1][1] == (5, 0xABC, 1024) and log[2][1] == (5, 1)
    # C^T(5x3) = op(B)^T @ A^T: B first with op T (b stored (n, k) -> ld k), A with op N (ld k), ldc n
    assert log[3][1] == (5, 1, 0, 5, 3, 7, 0xAA, 0xB, 0, 7, 0xA, 0, 7, 0xE0, 0xC, 0, 5, 68, -1)


def test_gemv_record_transposes_the_column_major_view(monkeypatch):
    log = []
    monkeypatch.setattr(_handles, "binding", lambda name: FakeBinding(log))
    mv = lib.gemv(4, 6, dtype="f64", beta=1.0)
    ptrs = {"a": 1, "x": 2, "y": 3, "alpha": 4, "beta": 5}
    mv.record(CaptureArgs(stream=0, pointers=ptrs, values={}, state=_fake_state()))
    assert log[-1] == ("dgemv", (5, 1, 6, 4, 4, 1, 6, 2, 1, 5, 3, 1))


def test_curand_prepare_positions_the_generator_outside_the_capture(monkeypatch):
    log = []
    monkeypatch.setattr(_handles, "binding", lambda name: FakeBinding(log))
    monkeypatch.setattr(_stream, "synchronize", lambda s: log.append(("sync", s)))
    r = lib.random_normal(8, seed=3, offset=4, mean=1.0, stddev=2.0, backend="curand")
    st = types.SimpleNamespace(extra={"generator": 42, "at": (3, 4), "stream": 0})
    values = {"seed": 3, "offset": 4, "mean": 1.0, "stddev": 2.0}
    args = CaptureArgs(stream=1, pointers={"out": 0x100}, values=values, state=st)
    # where setup left it: prepare only binds the stream; record just generates
    r.prepare(args)
    assert log == [("set_stream", (42, 1))]
    log.clear()
    r.record(args)
    assert log == [("generate_normal", (42, 0x100, 8, 1.0, 2.0))]
    # the generate consumed the position: capturing again without prepare is refused, clearly
    with pytest.raises(RuntimeError, match=r"cannot be moved while a stream captures; call the spec's prepare"):
        r.record(args)
    log.clear()
    r.prepare(attrs.evolve(args, values={**values, "seed": 9}))
    assert log == [
        ("set_stream", (42, 1)),
        ("set_pseudo_random_generator_seed", (42, 9)),
        ("set_generator_offset", (42, 4)),
        ("generate_seeds", (42,)),
        ("sync", 1),
    ]
    assert st.extra["at"] == (9, 4)
    # a chain forwards prepare to the steps that have one
    c = lib.chain(r, (lib.scal(8), {"x": "out"}))
    assert c.prepare is not None and lib.chain(lib.scal(8)).prepare is None
    assert lib.random_normal(8).prepare is None  # the Philox kernel needs none


def test_enum_constants_match_nvmath():
    pytest.importorskip("nvmath")
    import nvmath
    from nvmath.bindings import cublas, cufft, curand, cusparse

    from rxcuda.libraries import _blas, _common, _fft, _sparse

    assert {
        "f16": int(nvmath.CudaDataType.CUDA_R_16F),
        "bf16": int(nvmath.CudaDataType.CUDA_R_16BF),
        "f32": int(nvmath.CudaDataType.CUDA_R_32F),
        "f64": int(nvmath.CudaDataType.CUDA_R_64F),
        "c64": int(nvmath.CudaDataType.CUDA_C_32F),
        "c128": int(nvmath.CudaDataType.CUDA_C_64F),
    } == _common.CUDA_DATA_TYPE
    assert _blas.COMPUTE_32F == cublas.ComputeType.COMPUTE_32F
    assert _blas.COMPUTE_32F_FAST_TF32 == cublas.ComputeType.COMPUTE_32F_FAST_TF32
    assert _blas.COMPUTE_64F == cublas.ComputeType.COMPUTE_64F
    assert (_blas.OP_N, _blas.OP_T) == (cublas.Operation.N, cublas.Operation.T)
    assert _fft._C2C == {"c64": cufft.Type.C2C, "c128": cufft.Type.Z2Z}
    assert _fft._R2C == {"f32": cufft.Type.R2C, "f64": cufft.Type.D2Z}
    assert _fft._C2R == {"c64": cufft.Type.C2R, "c128": cufft.Type.Z2D}
    assert _rand.PHILOX4_32_10 == curand.RngType.PSEUDO_PHILOX4_32_10
    assert _sparse._INDEX_TYPE == {"i32": cusparse.IndexType.INDEX_32I, "i64": cusparse.IndexType.INDEX_64I}
    assert _sparse.ALGS == {
        "default": cusparse.SpMVAlg.DEFAULT,
        "csr_alg1": cusparse.SpMVAlg.CSR_ALG1,
        "csr_alg2": cusparse.SpMVAlg.CSR_ALG2,
    }


def test_public_names():
    expected = {
        "gemm", "gemv", "axpy", "scal", "fft", "ifft", "rfft", "irfft", "fft2", "ifft2",
        "random_uniform", "random_normal", "spmv", "lu_factor", "lu_solve", "chain",
    }  # fmt: skip
    assert expected <= set(lib.__all__)
    for name in lib.__all__:
        assert getattr(lib, name).__doc__


# -- dtypes come from the one table (rxcuda.model._dtypes) ------------------------------------------------
def test_dtype_names_use_the_engine_table_and_numpy_spellings():
    import numpy as np

    from rxcuda.libraries._common import complex_of, real_of

    assert ports(lib.gemm(2, 2, 2, dtype=np.float16))["a"][0] == "f16"
    assert ports(lib.fft(8, dtype="complex"))["x"][0] == "c128"  # NumPy's spelling, read as NumPy reads it
    assert ports(lib.axpy(8, dtype="double"))["x"][0] == "f64"  # rxcuda's C spelling
    for bad in (None, np.uint16, "i8"):
        with pytest.raises(ValidationError, match="unsupported dtype"):
            lib.gemm(2, 2, 2, dtype=bad)
    assert (real_of("c64"), real_of("c128"), real_of("f32")) == ("f32", "f64", "f32")
    assert (complex_of("f32"), complex_of("f64"), complex_of("c64")) == ("c64", "c128", "c64")


# -- a recapture with rebound buffers uses the new pointers, for every call --------------------------------
OLD, NEW, OWN = 0x1000_0000, 0x2000_0000, 0x9000_0000


class FakeLibs:
    def cublas(self):
        return 11

    def cusparse(self):
        return 12

    def cusolver(self):
        return 13

    def fft_plan(self, key):
        return 14, 4096

    def curand_generator(self, rng_type):
        return 15

    def drop_generator(self, gen):
        pass


class FakeResources:
    """Resources without a GPU: allocations get addresses in the OWN range, modules a fake function."""

    def __init__(self, ordinal):
        self.libs = FakeLibs()
        self.extra = {}
        self.cleanups = []
        self.next = OWN
        self.pool = types.SimpleNamespace(release=lambda buf: None, trim=lambda: 0)

    def alloc(self, nbytes):
        self.next += 0x10000
        return types.SimpleNamespace(ptr=self.next, nbytes=max(int(nbytes), 1))

    def constant(self, value, dtype):
        return self.alloc(16)

    def load(self, code):
        return ("function", code.entry)

    def close(self):
        pass


def _ints(obj):
    if isinstance(obj, bool):
        return
    if isinstance(obj, int):
        yield obj
    elif isinstance(obj, tuple | list):
        for o in obj:
            yield from _ints(o)


REBIND_CASES = {
    "gemm": lambda: lib.gemm(8, 6, 4),
    "gemm_beta_batched": lambda: lib.gemm(8, 6, 4, beta=0.5, batch=2, dtype="f64"),
    "gemv": lambda: lib.gemv(8, 6, beta=1.0),
    "axpy": lambda: lib.axpy(16),
    "scal": lambda: lib.scal(16, dtype="c64"),
    "fft": lambda: lib.fft(64, batch=2),
    "ifft_scaled": lambda: lib.ifft(64, dtype="c128"),
    "rfft2": lambda: lib.rfft2((8, 6), norm="ortho"),
    "irfft_copies_its_input": lambda: lib.irfft(64, batch=3),
    "random_philox": lambda: lib.random_normal(1000),
    "random_curand": lambda: lib.random_uniform(1000, backend="curand"),
    "spmv": lambda: lib.spmv(10, 8, 20, beta=2.0),
    "lu_factor": lambda: lib.lu_factor(8),
    "lu_solve": lambda: lib.lu_solve(8, 2, dtype="f64"),
    "chain_lu": lambda: lib.chain(lib.lu_factor(8), lib.lu_solve(8, 2), name="solve"),
    "chain_gemm_kernel_rfft": lambda: lib.chain(
        lib.gemm(4, 8, 2), (lib.kernel(_scale_code(), Launch.for_threads(32), counts={"x": 32}), {"x": "c"}),
        (lib.rfft(8, batch=4), {"x": "c", "y": "spectrum"}), internal="c"),
}  # fmt: skip


@pytest.mark.parametrize("make", REBIND_CASES.values(), ids=REBIND_CASES.keys())
def test_recapture_after_a_rebind_uses_only_the_new_pointers(make, monkeypatch):
    """What the engine does when a buffer is rebound: capture the call again (prepare, then record) with
    new pointers. No call may keep a buffer pointer from an earlier capture in its setup state."""
    log = []
    monkeypatch.setattr(_handles, "binding", lambda name: FakeBinding(log))
    monkeypatch.setattr(_handles, "Resources", FakeResources)
    monkeypatch.setattr(_launch, "launch_kernel", lambda *a: log.append(("launch", a)))
    monkeypatch.setattr(_launch, "copy_async", lambda *a: log.append(("copy", a)))
    monkeypatch.setattr(_stream, "create_stream", lambda: 42)
    monkeypatch.setattr(_stream, "synchronize", lambda s: None)
    monkeypatch.setattr(_stream, "destroy_stream", lambda s: None)
    monkeypatch.setattr(_rand, "device_arch", lambda ordinal: "sm_90")
    monkeypatch.setattr(_rand, "_philox_code", lambda entry, arch: _scale_code())
    spec = make()
    state = spec.setup(0)
    names = [p.name for p in spec.params if p.is_pointer or p.name in spec.device_scalars]
    values = {p.name: p.default for p in spec.params if not p.is_pointer and p.name not in spec.device_scalars}

    def capture(base):
        pointers = {name: base + 0x100 * i for i, name in enumerate(names)}
        args = CaptureArgs(stream=base + 7, pointers=pointers, values=values, state=state)
        log.clear()
        if spec.prepare is not None:  # the engine runs it before every capture, outside it
            spec.prepare(args)
        spec.record(args)
        return set(pointers.values()), {v for entry in log for v in _ints(entry[1])}

    old, used_before = capture(OLD)
    new, used = capture(NEW)
    assert used_before & old  # the fakes see the pointers
    assert not used & old, f"{spec.summary}: a recapture still uses {sorted(hex(v) for v in used & old)}"
    buffers = {NEW + 0x100 * i for i, name in enumerate(names) if spec.params[spec.index(name)].is_pointer}
    assert buffers <= used, f"{spec.summary}: unused rebound buffers {sorted(hex(v) for v in buffers - used)}"
    spec.teardown(state)
