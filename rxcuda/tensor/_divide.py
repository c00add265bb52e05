"""Division by a scalar in the generated C++ (``rxcuda.tensor._codegen``): ``a / s`` where ``s`` is one value for
the whole launch is ``a`` times ``s``'s correctly rounded reciprocal, as XLA and TorchInductor divide by a constant.

The reciprocal is within half a step of ``1/s``, so the product is within one step of the IEEE quotient (the GPU
tests check it over a million values of every binade). It is used only where the reciprocal is a normal number:
the kernel body is written twice under one test of the scalars (times the reciprocal, or IEEE division), since a
test per element cost ~15 % of the 100-op chain of ``bench/tensor.py`` on an H200 (522 against 449 us)."""

from __future__ import annotations

import re

DIV_S = """\
// a / s for a scalar s (one value for the whole launch): a times s's correctly rounded reciprocal, as XLA and
// TorchInductor divide by a constant (within one step of a / s; the reciprocal is computed once a thread), in a copy
// of the body taken when every scalar divisor's reciprocal is a normal number, and IEEE division in the other copy
// (rx_div_s, the choice per element, only where the body cannot be copied: a per-element test costs ~15 %)
__device__ __forceinline__ bool rx_rcp_ok(float s) { return fabsf(s) > 1.17549435e-38f && fabsf(s) < 8.50705917e37f; }
__device__ __forceinline__ bool rx_rcp_ok(double s)
{ return fabs(s) > 2.2250738585072014e-308 && fabs(s) < 4.49423283715579e307; }
__device__ __forceinline__ float rx_div_r(float a, float s) { return a * __frcp_rn(s); }
__device__ __forceinline__ double rx_div_r(double a, double s) { return a * __drcp_rn(s); }
template <typename T> __device__ __forceinline__ T rx_div_ieee(T a, T s) { return a / s; }
template <typename T> __device__ __forceinline__ T rx_div_s(T a, T s) { return rx_rcp_ok(s) ? rx_div_r(a, s) : a / s; }
"""  # (only in kernels that divide by a scalar)


def split_scalar_divisions(text: str) -> str:
    """A kernel body that divides by scalars (``rx_div_s``), as two copies under one test of the scalars: times
    their reciprocals when all of them are normal numbers, IEEE division else (see ``DIV_S``). Bodies with
    shared memory keep the per-element choice (two copies would declare their shared arrays twice)."""
    divisors = sorted(set(re.findall(r"rx_div_s\([^;]*?, \((?:float|double)\)\((s\d+)\)\)", text)))
    if not divisors or "__shared__" in text:
        return text
    ok = " && ".join(f"rx_rcp_ok({d})" for d in divisors)
    times, ieee = text.replace("rx_div_s(", "rx_div_r("), text.replace("rx_div_s(", "rx_div_ieee(")
    return f"    if ({ok}) {{  // every scalar divisor has a normal reciprocal\n{times}\n    }} else {{\n{ieee}\n    }}"
