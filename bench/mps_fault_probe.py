"""Does a GPU fault in one MPS client end the others on that GPU (NVIDIA's MPS "error containment"), on this card?

    python bench/mps_fault_probe.py

Under a private MPS control daemon (its own pipe and log folders), client B computes on the GPU (each result checked
against NumPy) while client A launches a kernel that writes to an illegal address; then prints what B saw after A's
fault, whether a new client C starts while B lives, and once B has exited. The same first without MPS, where only A
should lose its context. Decides whether ``rxcuda.distributed.Engine(share_gpu="auto")`` can be the default (issue
42) without breaking fault isolation (issues 37, 38). Needs CuPy and ``nvidia-cuda-mps-control`` (the GPU machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time

B = textwrap.dedent("""
    import sys, time, numpy as np, cupy as cp
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1 << 20).astype(np.float32)
    d = cp.asarray(x)
    t0, n, bad = time.time(), 0, None
    while time.time() - t0 < float(sys.argv[1]):
        try:
            y = (d * 2.0 + 1.0).get()
            n += 1
            if not np.allclose(y, x * 2 + 1):
                print("B: WRONG numbers", flush=True)
        except Exception as e:
            bad = f"{type(e).__name__}: {e}"
            print(f"B: after {n} frames ({time.time() - t0:.2f} s): {bad}", flush=True)
            break
    print(f"B: done, {n} good frames, error={bad}", flush=True)
""")
A = textwrap.dedent("""
    import cupy as cp
    k = cp.RawKernel(r'extern "C" __global__ void bad(float* p) { p[threadIdx.x + (1ull << 40)] = 1.0f; }', 'bad')
    try:
        k((1,), (32,), (cp.zeros(32, cp.float32),))
        cp.cuda.runtime.deviceSynchronize()
        print("A: no fault?!")
    except Exception as e:
        print(f"A: {type(e).__name__}: {e}", flush=True)
""")
C = ("import cupy as cp; "
     "print('C:', float((cp.arange(10, dtype=cp.float32) * 3).sum().get()), flush=True)")


def _last(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return lines[-1] if lines else "(nothing)"


def _client_c(env: dict, when: str, timeout: float) -> None:
    t = time.perf_counter()
    try:
        c = subprocess.run([sys.executable, "-c", C], env=env, capture_output=True, text=True, timeout=timeout)
        print(f"C {when} ({time.perf_counter() - t:.2f} s): {_last(c)}", flush=True)
    except subprocess.TimeoutExpired:
        print(f"C {when}: no answer in {timeout:g} s (refused or hung)", flush=True)


def run(env: dict, label: str) -> None:
    print(f"== {label}", flush=True)
    b = subprocess.Popen([sys.executable, "-c", B, "6"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    time.sleep(2.0)
    a = subprocess.run([sys.executable, "-c", A], env=env, capture_output=True, text=True, timeout=60)
    print(_last(a), flush=True)
    time.sleep(0.5)
    _client_c(env, "while B lives", 20)
    out, _ = b.communicate(timeout=60)
    print(out.strip(), flush=True)
    _client_c(env, "after B exited", 30)


def main() -> int:
    env = dict(os.environ)
    run(env, "no MPS")
    pipe, log = tempfile.mkdtemp(prefix="mps-pipe-"), tempfile.mkdtemp(prefix="mps-log-")
    menv = {**env, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}
    r = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=menv, capture_output=True, text=True)
    print("mps daemon:", r.returncode, r.stderr.strip()[:200], flush=True)
    try:
        run(menv, "private MPS")
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=menv, capture_output=True, text=True,
                       timeout=20)
        time.sleep(0.5)
        for f in os.listdir(log):
            with open(os.path.join(log, f)) as fh:
                print("--", f, fh.read()[-1500:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
