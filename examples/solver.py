"""A solver that loops on the GPU until it has converged: weighted Jacobi for A x = b inside a While region.

    python -m rxcuda.examples.solver

Each frame solves A x = b from x = 0. One pass is a cuBLAS GEMV (y = A x) and two kernels: the update
(x += omega (b - y) / diag(A), keeping (b - y)^2) and a check (residual = ||b - y||, go = residual > tol). The
pass repeats inside a `While` region that reads `go` on the device, so the host launches one graph per frame
however many passes it takes. The residual is an Observable; omega is swept live from an Rx Subject; each
solution is checked against NumPy's.
"""

import numpy as np
from reactivex.subject import Subject

import rxcuda as rx
from rxcuda import libraries as lib

ok, why = rx.probe()
if not ok:
    print(f"no CUDA device ({why}): running on the CPU device")

N = 1024
TOL = 1e-3
SRC = r"""
extern "C" __global__ void seed(float* x, unsigned* iters, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0.0f;
    if (i == 0) *iters = 0;
}
extern "C" __global__ void update(/*inout*/ float* x, const float* y, const float* b, const float* diag,
                                  float* r2, float omega, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float r = b[i] - y[i];
        r2[i] = r * r;
        x[i] += omega * r / diag[i];
    }
}
extern "C" __global__ void check(const float* r2, float* residual, unsigned* go, /*inout*/ unsigned* iters,
                                 float tol, unsigned n) {
    __shared__ float part[1024];
    float s = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) s += r2[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float res = sqrtf(part[0]);
        *residual = res;
        *go = res > tol;
        *iters += 1;
    }
}
"""

rng = np.random.default_rng()
off = rng.uniform(-1.0, 1.0, (N, N)).astype(np.float32)
np.fill_diagonal(off, 0.0)
diag = (np.abs(off).sum(axis=1) * 1.25 + 1.0).astype(np.float32)  # diagonally dominant: Jacobi converges
A = off + np.diag(diag)
b = rng.standard_normal(N).astype(np.float32)
exact = np.linalg.solve(A.astype(np.float64), b.astype(np.float64))

code = {e: rx.compile_cuda(SRC, entry=e) for e in ("seed", "update", "check")}


def one_kernel(name, entry, ports, scalars=None, threads=N, block=256):
    """A block of one kernel; ``ports``: name -> ("in" | "out", element count)."""
    bb = rx.BlockBuilder(name, size=N)
    k = bb.add_kernel(code[entry], threads=threads, block=block)
    for port, (direction, count) in ports.items():
        (bb.input if direction == "in" else bb.output)(port, k[port], count=count)
    for s, value in (scalars or {}).items():
        bb.scalar(s, k[s], default=value)
    return bb.build()


seed = one_kernel("seed", "seed", {"x": ("out", N), "iters": ("out", 1)}, {"n": N})
gemv = rx.Block.from_call(lib.gemv(N, N), name="gemv")
update = one_kernel("update", "update", {"x": ("in", N), "y": ("in", N), "b": ("in", N), "diag": ("in", N),
                                         "r2": ("out", N)}, {"omega": 1.0, "n": N})
check = one_kernel("check", "check", {"r2": ("in", N), "residual": ("out", 1), "go": ("out", 1),
                                      "iters": ("in", 1)}, {"tol": TOL, "n": N}, threads=1024, block=1024)
residuals = []


def numpy_passes(omega: float) -> int:
    """Passes of the same do-while loop in NumPy: update, then stop once the residual is within tol."""
    A64, x = A.astype(np.float64), np.zeros(N)
    for p in range(1, 10_001):
        r = b - A64 @ x
        x += omega * r / diag
        if np.linalg.norm(r) <= TOL:
            return p
    return 10_000

with rx.Engine() as engine:
    engine.add(seed)
    engine.add(rx.While(check["go"], [gemv, update, check], max_iterations=10_000, name="jacobi"))
    engine.connect(seed["x"], gemv["x"])
    engine.connect(seed["x"], update["x"])   # the update writes x in place: the next pass's GEMV reads it
    engine.connect(gemv["y"], update["y"])
    engine.connect(update["r2"], check["r2"])
    engine.connect(seed["iters"], check["iters"])
    engine.write(gemv["a"], A)
    engine.write(update["b"], b)
    engine.write(update["diag"], diag)
    sub = engine.observe(check["residual"]).subscribe(lambda r: residuals.append(float(r[0])))
    omega = Subject()  # a live control: any Rx source could drive it
    update.params["omega"].bind(omega)
    print(f"{'omega':>6} {'passes':>7} {'residual':>10} {'max |x - x*|':>13} {'frame us':>9}")
    passes = {}
    for w in (0.4, 0.6, 0.8, 1.0):
        omega.on_next(w)
        frame = engine.tick()
        x = engine.read(seed["x"])
        iters = int(engine.read(check["iters"])[0])
        err = float(np.abs(x - exact).max())
        passes[w] = iters
        print(f"{w:6.2f} {iters:7d} {residuals[-1]:10.2e} {err:13.2e} {frame.host_us:9.0f}")
        assert residuals[-1] <= TOL, "the loop stopped before the residual met the tolerance"
        assert np.allclose(x, exact, rtol=1e-3, atol=1e-4), "the solution differs from NumPy's"
        # the same loop in NumPy (float64) takes the same number of passes, give or take rounding
        assert abs(numpy_passes(w) - iters) <= 2, f"NumPy needs {numpy_passes(w)} passes, the GPU ran {iters}"
    sub.dispose()
    assert passes[0.4] > passes[1.0], "a smaller relaxation factor should need more passes"
    s = engine.stats  # memory reuse: intermediates whose lifetimes do not overlap share an allocation
    print(f"memory: buffers={s.buffers} allocations={s.allocations} allocated={s.bytes_allocated} "
          f"without_reuse={s.bytes_unshared} saved={s.bytes_saved}")
    print(f"OK: every solve met tol={TOL} on the device in one launch per frame; "
          f"{engine.frame} frames, {sum(passes.values())} passes")
