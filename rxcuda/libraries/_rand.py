"""Random numbers: uniform and normal, from a capture-friendly Philox kernel or from cuRAND.

Two backends, same ports (``out``) and parameters (``seed``, ``offset``, and the distribution's two):

``backend="philox"`` (default)
    A small Philox4x32-10 kernel (NVRTC-compiled in ``setup``) that reads ``seed``, ``offset`` and the
    distribution parameters from *device* scalars: changing any of them is a small copy, never a
    recapture. ``offset`` selects an independent sequence (it is the high half of Philox's counter), so
    bumping it by one per frame gives fresh numbers every frame at Parameters-tier cost. Any ``n``.
    Uniform values lie in (low, high) (an endpoint only through float rounding).

``backend="curand"``
    cuRAND's host API (Philox4x32-10 generator, one per call, made and primed in ``setup``). Seed and
    offset are generator state baked into what is captured, so they are *host* scalars: a change
    recaptures, and every launch of one capture repeats its numbers. ``offset`` skips that many values,
    as ``curandSetGeneratorOffset`` does. Normal variates need an even ``n`` (cuRAND's rule).
    cuRAND cannot re-seed or move its offset while a stream captures (measured, see below), so this call
    has a ``prepare(args)`` step the engine runs right before each capture, outside it; without it only
    the first capture works and later ones raise a clear error.

>>> r = random_normal(1 << 20, mean=0.0, stddev=2.0)
>>> r.device_scalars
('seed', 'offset', 'mean', 'stddev')
"""

from __future__ import annotations

import functools

from ..cuda import _launch, _stream
from ..cuda._context import device_arch
from ..model._describe import KernelCode, KernelParam, Launch
from . import _handles as H
from . import _host
from ._common import (
    LibraryCall,
    check_name,
    dtype_name,
    invalid,
    pointer,
    positive_int,
    real_number,
    scalar,
)

PHILOX4_32_10 = 161  # curandRngType_t CURAND_RNG_PSEUDO_PHILOX4_32_10
CURAND_ON_CPU = ("backend='curand' does not run on the CPU device: it does not reproduce the order in which cuRAND's "
                 "Philox generator lays out its numbers, and would give other numbers than a GPU. Use backend='philox' "
                 "(the default): the same kernel runs on both devices, with the same numbers (docs/cpu.md)")
BACKENDS = ("curand", "philox")
BLOCK = 256

PHILOX_SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, u32 k0, u32 k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        u32 hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        u32 hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    return c;
}

__device__ __forceinline__ uint4 draw(u64 group, u64 seed, u64 offset) {
    uint4 c = make_uint4((u32)group, (u32)(group >> 32), (u32)offset, (u32)(offset >> 32));
    return philox4x32_10(c, (u32)seed, (u32)(seed >> 32));
}

// uniforms in the open interval (0, 1)
__device__ __forceinline__ float u01f(u32 x) { return ((x >> 8) + 0.5f) * (1.0f / 16777216.0f); }
__device__ __forceinline__ double u01d(u32 a, u32 b) {
    u64 v = ((u64)(a >> 5) << 26) | (u64)(b >> 6);
    return ((double)v + 0.5) * (1.0 / 9007199254740992.0);
}

extern "C" __global__ void philox_uniform_f32(float* out, u64 n, const u64* seed, const u64* offset,
                                              const float* low, const float* high) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 i = g * 4;
    if (i >= n) return;
    uint4 r = draw(g, *seed, *offset);
    float lo = *low, span = *high - *low;
    u32 v[4] = {r.x, r.y, r.z, r.w};
    for (int j = 0; j < 4 && i + j < n; ++j) out[i + j] = lo + span * u01f(v[j]);
}

extern "C" __global__ void philox_uniform_f64(double* out, u64 n, const u64* seed, const u64* offset,
                                              const double* low, const double* high) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 i = g * 2;
    if (i >= n) return;
    uint4 r = draw(g, *seed, *offset);
    double lo = *low, span = *high - *low;
    out[i] = lo + span * u01d(r.x, r.y);
    if (i + 1 < n) out[i + 1] = lo + span * u01d(r.z, r.w);
}

extern "C" __global__ void philox_normal_f32(float* out, u64 n, const u64* seed, const u64* offset,
                                             const float* mean, const float* stddev) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 i = g * 4;
    if (i >= n) return;
    uint4 r = draw(g, *seed, *offset);
    float m = *mean, s = *stddev;
    float z[4];
    float r0 = sqrtf(-2.0f * logf(u01f(r.x))), t0 = 6.283185307179586f * u01f(r.y);
    float r1 = sqrtf(-2.0f * logf(u01f(r.z))), t1 = 6.283185307179586f * u01f(r.w);
    z[0] = r0 * cosf(t0); z[1] = r0 * sinf(t0); z[2] = r1 * cosf(t1); z[3] = r1 * sinf(t1);
    for (int j = 0; j < 4 && i + j < n; ++j) out[i + j] = m + s * z[j];
}

extern "C" __global__ void philox_normal_f64(double* out, u64 n, const u64* seed, const u64* offset,
                                             const double* mean, const double* stddev) {
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 i = g * 2;
    if (i >= n) return;
    uint4 r = draw(g, *seed, *offset);
    double m = *mean, s = *stddev;
    double rr = sqrt(-2.0 * log(u01d(r.x, r.y))), sn, cs;
    sincospi(2.0 * u01d(r.z, r.w), &sn, &cs);  // no argument reduction: no out-of-line slow path in the PTX
    out[i] = m + s * rr * cs;
    if (i + 1 < n) out[i + 1] = m + s * rr * sn;
}
"""


def _philox_code(entry: str, arch: str) -> KernelCode:
    """One Philox kernel compiled for ``arch`` by the sources' NVRTC compiler (cached in memory and on disk): the
    shared functions and that kernel alone, so a module holds the code its call runs and nothing else."""
    from ..sources import compile_cuda

    head, *kernels = PHILOX_SOURCE.split('extern "C"')
    own = [k for k in kernels if f" {entry}(" in k]
    return compile_cuda(head + 'extern "C"' + own[0], entry, arch=arch)


def _u64(op: str, param: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise invalid(op, param, f"must be an int in [0, 2**64), got {value!r}")
    return value


# -- cuRAND backend ---------------------------------------------------------------------------------------
# Measured on an H200 (driver 580 / CUDA 13.0, cuRAND 10.4, Philox, XORWOW and MRG32k3a alike):
#   - the first generate allocates: under capture -> ALLOCATION_FAILED, so setup primes the generator;
#   - after priming, a plain curandGenerate* captures and replays the numbers eager code would get;
#   - curandSetPseudoRandomGeneratorSeed / curandSetGeneratorOffset inside a capture make the next generate
#     re-initialise the generator, which fails under capture (LAUNCH_FAILURE), in thread-local and relaxed
#     mode alike.
# So the generator is positioned (seed, offset, curandGenerateSeeds) eagerly by ``prepare`` before each
# capture, and ``record`` only sets the stream and generates. The state remembers where the generator is:
# a captured generate consumes the position (the host-side offset moves on by n).
def _curand_position(curand, gen, stream: int, seed: int, offset: int) -> None:
    curand.set_stream(gen, stream)
    curand.set_pseudo_random_generator_seed(gen, seed)
    curand.set_generator_offset(gen, offset)
    curand.generate_seeds(gen)
    _stream.synchronize(stream)


def _curand_setup(fn: str, n: int, itemsize: int, dist: str, seed: int, offset: int, device_ordinal: int):
    """A generator, primed (one eager generate allocates cuRAND's buffers) and positioned at (seed, offset)."""
    st = H.Resources(device_ordinal)
    try:
        curand = H.binding("curand")
        gen = st.libs.curand_generator(PHILOX4_32_10)
        st.extra["generator"] = gen
        st.cleanups.append(lambda: st.libs.drop_generator(gen))
        # priming and positioning run on a stream of their own, waited for alone: neither the legacy stream
        # nor a device-wide sync, so nobody else's work is ordered with (or stalled by) a block's setup
        stream = _stream.create_stream()
        tmp = st.alloc(n * itemsize)
        try:
            curand.set_stream(gen, int(stream))
            if dist == "uniform":
                getattr(curand, fn)(gen, tmp.ptr, n)
            else:
                getattr(curand, fn)(gen, tmp.ptr, n, 0.0, 1.0)
            _stream.synchronize(stream)
            _curand_position(curand, gen, int(stream), seed, offset)
        finally:
            curand.set_stream(gen, 0)  # an association only; prepare() sets the capture's stream
            st.pool.release(tmp)
            st.pool.trim()  # the priming buffer is not needed again
            _stream.destroy_stream(stream)
        st.extra["stream"] = 0
        st.extra["at"] = (seed, offset)
    except BaseException:
        st.close()
        raise
    return st


def _curand_prepare(args) -> None:
    """Outside the capture: move the generator to (seed, offset) and bind it to the capturing stream."""
    st = args.state
    want = (int(args.values["seed"]), int(args.values["offset"]))
    curand = H.binding("curand")
    gen = st.extra["generator"]
    if st.extra.get("at") != want:
        _curand_position(curand, gen, args.stream, *want)
        st.extra["at"] = want
    elif st.extra.get("stream") != args.stream:
        curand.set_stream(gen, args.stream)
    st.extra["stream"] = args.stream


def _curand_call(op, name, n, dt, dist, seed, offset, p0, p1) -> LibraryCall:
    if dist == "normal" and n % 2:
        raise invalid(
            op,
            "n",
            f"cuRAND draws normal values in pairs, so n must be even (got {n}); round n up or use backend='philox'",
        )
    fn = {
        ("uniform", "f32"): "generate_uniform",
        ("uniform", "f64"): "generate_uniform_double",
        ("normal", "f32"): "generate_normal",
        ("normal", "f64"): "generate_normal_double",
    }[(dist, dt)]

    def record(args):
        st = args.state
        v = args.values
        want = (int(v["seed"]), int(v["offset"]))
        if st.extra.get("at") != want:
            raise RuntimeError(
                f"{name}: the cuRAND generator is not at seed={want[0]}, offset={want[1]} and cannot be moved while "
                f"a stream captures; call the spec's prepare(args) before beginning the capture"
            )
        curand = H.binding("curand")
        gen = st.extra["generator"]
        if st.extra.get("stream") != args.stream:
            curand.set_stream(gen, args.stream)
            st.extra["stream"] = args.stream
        st.extra["at"] = None  # this generate consumes the position
        if dist == "uniform":
            getattr(curand, fn)(gen, args.pointers["out"], n)
        else:
            getattr(curand, fn)(gen, args.pointers["out"], n, float(v["mean"]), float(v["stddev"]))

    params = [pointer("out", dt, "out"), scalar("seed", "u64", seed), scalar("offset", "u64", offset)]
    if dist == "normal":
        params += [scalar("mean", dt, p0), scalar("stddev", dt, p1)]
    return _host.refuse_on_host(LibraryCall(
        name=name,
        params=tuple(params),
        record=record,
        key=("random", "curand", dist, n, dt),
        device_scalars=(),
        setup=functools.partial(_curand_setup, fn, n, 4 if dt == "f32" else 8, dist, seed, offset),
        teardown=H.close_resources,
        prepare=_curand_prepare,
        counts={"out": n},
        workspace_bytes=0,
        summary=f"random {dist} {dt} n={n} (cuRAND Philox)",
    ), CURAND_ON_CPU)


# -- Philox kernel backend --------------------------------------------------------------------------------
def _philox_setup(entry: str, device_ordinal: int):
    st = H.Resources(device_ordinal)
    try:
        st.extra["function"] = st.load(_philox_code(entry, device_arch(device_ordinal)))
    except BaseException:
        st.close()
        raise
    return st


def _philox_call(op, name, n, dt, dist, seed, offset, p0, p1) -> LibraryCall:
    names = ("low", "high") if dist == "uniform" else ("mean", "stddev")
    entry = f"philox_{dist}_{dt}"
    per_thread = 4 if dt == "f32" else 2
    launch = Launch.for_threads(-(-n // per_thread), block=BLOCK)
    # the kernel's arguments: the output, n, then the device slots of seed, offset and the two parameters
    kernel_params = (
        KernelParam("out", "pointer", 8, dt, "out"),
        KernelParam("n", "scalar", 8, "u64"),
        *(KernelParam(s, "pointer", 8, "u64" if s in ("seed", "offset") else dt) for s in ("seed", "offset", *names)),
    )

    def record(args):
        p = args.pointers
        values = (p["out"], n, p["seed"], p["offset"], p[names[0]], p[names[1]])
        _launch.launch_kernel(args.state.extra["function"], launch, args.stream, kernel_params, values)

    params = (
        pointer("out", dt, "out"),
        scalar("seed", "u64", seed),
        scalar("offset", "u64", offset),
        scalar(names[0], dt, p0),
        scalar(names[1], dt, p1),
    )
    return LibraryCall(
        name=name,
        params=params,
        record=record,
        key=("random", "philox", dist, n, dt),
        device_scalars=("seed", "offset") + names,
        setup=functools.partial(_philox_setup, entry),
        teardown=H.close_resources,
        counts={"out": n},
        workspace_bytes=0,
        summary=f"random {dist} {dt} n={n} (Philox kernel, device seed/offset)",
    )


def _random(op, dist, n, dtype, seed, offset, p0, p1, backend, name) -> LibraryCall:
    check_name(op, name)
    n = positive_int(op, "n", n, "number of values to draw")
    dt = dtype_name(op, "dtype", dtype, ("f32", "f64"))
    seed = _u64(op, "seed", seed)
    offset = _u64(op, "offset", offset)
    if backend not in BACKENDS:
        raise invalid(op, "backend", f"got {backend!r}; use 'curand' or 'philox'")
    if dist == "uniform":
        p0 = real_number(op, "low", p0)
        p1 = real_number(op, "high", p1)
        if not p0 < p1:
            raise invalid(op, "high", f"must be greater than low (got low={p0}, high={p1})")
        if backend == "curand" and (p0, p1) != (0.0, 1.0):
            raise invalid(op, "low", "cuRAND draws from (0, 1] only; use backend='philox' for another range")
    else:
        p0 = real_number(op, "mean", p0)
        p1 = real_number(op, "stddev", p1)
        if p1 < 0:
            raise invalid(op, "stddev", f"must be >= 0 (got {p1})")
    make = _curand_call if backend == "curand" else _philox_call
    return make(op, name, n, dt, dist, seed, offset, p0, p1)


def random_uniform(
    n: int,
    *,
    dtype="f32",
    seed: int = 0,
    offset: int = 0,
    low: float = 0.0,
    high: float = 1.0,
    backend: str = "philox",
    name: str = "random_uniform",
) -> LibraryCall:
    """``n`` uniform values into ``out`` (f32 or f64).

    By default (``backend="philox"``) values lie in (low, high) and every parameter is a device scalar (no
    recapture, ever); with ``backend="curand"`` they lie in (0, 1] and ``seed``/``offset`` are host
    scalars (a change recaptures). See the module notes on capturing cuRAND.

    >>> random_uniform(1000, seed=42, low=-1.0).device_scalars
    ('seed', 'offset', 'low', 'high')
    """
    return _random("random_uniform", "uniform", n, dtype, seed, offset, low, high, backend, name)


def random_normal(
    n: int,
    *,
    dtype="f32",
    seed: int = 0,
    offset: int = 0,
    mean: float = 0.0,
    stddev: float = 1.0,
    backend: str = "philox",
    name: str = "random_normal",
) -> LibraryCall:
    """``n`` normal values (``mean``, ``stddev``) into ``out`` (f32 or f64); see :func:`random_uniform`.

    >>> random_normal(1000, stddev=0.1, backend="curand").device_scalars
    ()
    """
    return _random("random_normal", "normal", n, dtype, seed, offset, mean, stddev, backend, name)
