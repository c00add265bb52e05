"""Float32 math for the PTX emitter (``_ptx``): ``exp``, ``log``, ``tanh`` and a correctly rounded division as
PTX instruction sequences, each written into a kernel being emitted (``fn.reg(cls)`` gives a register,
``fn.op(text)`` appends an instruction) and returning the register of its result.

exp, log and tanh are the sequences of CUDA's own ``expf``/``logf``/``tanhf`` (exp: ``ex2.approx`` of an
accurately reduced fraction, scaled by 2**k; never ``ex2.approx`` of x log2 e alone), and the division goes
through float64 and rounds once (``div.rn.f32``'s slow-path subroutine alone costs ptxas 6-10 ms). The unit
tests run these sequences in a NumPy PTX interpreter (approximate instructions exact there): exp and log within
1 ulp, division bit-exact.
"""

from __future__ import annotations

import struct
from typing import Protocol


class _Fn(Protocol):
    """The kernel being written (``_ptxwriter._Fn``): only these two of its methods are used here."""

    def reg(self, cls: str) -> str: ...

    def op(self, text: str) -> None: ...

_LOG_POLY = (0xBE055027, 0x3E1039F6, 0xBDF8CDCC, 0x3E0F2955, 0xBE2AD8B9, 0x3E4CED0B, 0xBE7FFF22, 0x3EAAAA78,
             0xBF000000)  # CUDA's logf: (log1p(f) - f) / f^2 on [-1/3, 1/3]
_TANH_POLY = (0x3C80F082, 0xBD563CAE, 0x3E085941, 0xBEAAA9ED, 0x00000000)  # CUDA's tanhf for |x| < 0.6


def f32(value: float) -> str:
    """A float32 PTX literal (exact bits): ``f32(1.0) == '0f3F800000'``."""
    return f"0f{struct.unpack('<I', struct.pack('<f', value))[0]:08X}"


def f64(value: float) -> str:
    return f"0d{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"


def _bits(bits: int) -> str:
    return f"0f{bits:08X}"


def expf(fn: _Fn, x: str) -> str:
    """e**x for a float32 register the way CUDA's ``expf`` (libdevice ``__nv_expf``) computes it, in eight
    machine instructions: 2**(x log2 e) as 2**k (exponent bits) times ``ex2.approx.ftz`` of the fraction
    f = x log2 e - k.

    - k = floor(x log2 e) clamped to [-126, 127], found without a conversion: t = sat(x * C + B) with C the
      float32 nearest log2(e) / 253 (0x3BBADACC) and B the one nearest 126 / 253 (0x3EFEFCF7) puts
      x log2 e + 126 in [0, 253] as 253 t; ``fma.rm`` of 253 t + M, M = 0x4B400001 = 1.5 * 2**23 + 1, rounds
      down to an integer (the float spacing there is 1): j = M + 126 + k. t's rounding and B's (at most
      253 * 2**-25 together) can move k by one next to an integer, so f lies in (-2**-16, 1 + 2**-16), which
      ex2 does not mind. j - (M + 126) = k exactly, and j's bits shifted left by 23 leave (k + 127) << 23: the
      float 2**k. (CUDA clamps k at 126 instead: its f reaches 2 just below overflow, where it loses an ulp.)
    - f = x * L_hi - k + x * L_lo, L_hi = 0x3FB8AA3B (log2 e rounded to float32), L_lo = 0x32A57060 (the
      float32 nearest log2 e - L_hi): two fmas rounding once each, so while the result is a normal float f is
      off by at most 2**-25 + 2**-25, plus |x| 2**-48 from L_lo's own rounding: 2**-24 ln 2 relative in the
      result, under 0.7 ulp. With an exact ex2 (the unit tests' interpreter) the result is within 1 ulp of e**x
      everywhere; the GPU's ``ex2.approx.ftz`` adds its own error (about 2**-22.5 relative on [0, 1)), which
      is CUDA's documented 2 ulp for ``expf`` (the GPU test checks 2 ulp over a million values).
    - Below x = -87.34 k stays at -126 and f carries the rest: 2**f * 2**-126 rounds once into the denormals
      (0 below about -103.97); past x = 88.72 the product overflows to inf. x = inf: f = inf, the result inf;
      x = -inf: f = -inf, 2**f = 0; NaN: sat gives t = 0, f is NaN and so is the result."""
    t, j, k, f, e, s, d = (fn.reg("f") for _ in range(7))
    b = fn.reg("r")
    fn.op(f"fma.rn.sat.f32 {t}, {x}, {_bits(0x3BBADACC)}, {_bits(0x3EFEFCF7)}")
    fn.op(f"fma.rm.f32 {j}, {t}, {_bits(0x437D0000)}, {_bits(0x4B400001)}")
    fn.op(f"sub.rn.f32 {k}, {_bits(0x4B40007F)}, {j}")  # (M + 126) - j = -k, exact
    fn.op(f"fma.rn.f32 {f}, {x}, {_bits(0x3FB8AA3B)}, {k}")
    fn.op(f"fma.rn.f32 {f}, {x}, {_bits(0x32A57060)}, {f}")
    fn.op(f"ex2.approx.ftz.f32 {e}, {f}")
    fn.op(f"mov.b32 {b}, {j}")
    fn.op(f"shl.b32 {b}, {b}, 23")
    fn.op(f"mov.b32 {s}, {b}")
    fn.op(f"mul.rn.f32 {d}, {e}, {s}")
    return d


def divf(fn: _Fn, a: str, b: str) -> str:
    """a / b for float32 registers, correctly rounded like ``div.rn.f32`` but straight-line (``div.rn.f32``
    brings ptxas's slow-path subroutine, 6-10 ms of JIT time): the quotient in float64 from an approximate
    reciprocal, two Newton steps and a Markstein correction (relative error below 2**-51), rounded once to
    float32. That rounding is exact: a quotient of two floats is never a float32 midpoint (an odd 25-bit
    significand times a 24-bit one has more than 24 bits), nor within 2**-49 of one. Zero, infinite and NaN
    operands take ``a * (1 / b)``, which gives IEEE's inf, zero and NaN results there."""
    A, B, nb, y, e, q, r = (fn.reg("fd") for _ in range(7))
    fn.op(f"cvt.f64.f32 {A}, {a}")
    fn.op(f"cvt.f64.f32 {B}, {b}")
    fn.op(f"neg.f64 {nb}, {B}")
    fn.op(f"rcp.approx.ftz.f64 {y}, {B}")
    for _ in range(2):
        fn.op(f"fma.rn.f64 {e}, {nb}, {y}, {f64(1.0)}")
        fn.op(f"fma.rn.f64 {y}, {y}, {e}, {y}")
    q1, zero = fn.reg("fd"), fn.reg("p")
    fn.op(f"mul.rn.f64 {q}, {A}, {y}")
    fn.op(f"fma.rn.f64 {r}, {nb}, {q}, {A}")
    fn.op(f"fma.rn.f64 {q1}, {r}, {y}, {q}")
    fn.op(f"setp.eq.f64 {zero}, {A}, {f64(0.0)}")
    fn.op(f"selp.f64 {q}, {q}, {q1}, {zero}")  # 0 / b keeps the product's sign (the correction adds +0)
    quot, ta, tb, rb, spec, d = (fn.reg("f") for _ in range(6))
    fn.op(f"cvt.rn.f32.f64 {quot}, {q}")
    ok = fn.reg("p")
    fn.op(f"abs.f32 {ta}, {a}")
    fn.op(f"abs.f32 {tb}, {b}")
    fn.op(f"setp.lt.f32 {ok}, {ta}, {_bits(0x7F800000)}")
    fn.op(f"setp.lt.and.f32 {ok}, {tb}, {_bits(0x7F800000)}, {ok}")
    fn.op(f"setp.ne.and.f32 {ok}, {b}, {_bits(0)}, {ok}")
    fn.op(f"rcp.approx.ftz.f32 {rb}, {b}")
    fn.op(f"mul.rn.f32 {spec}, {a}, {rb}")
    fn.op(f"selp.f32 {d}, {quot}, {spec}, {ok}")
    return d


def logf(fn: _Fn, x: str) -> str:
    """log(x) for a float32 register: CUDA's logf (libdevice): denormals scaled by 2**23, x = 2**e m with m in
    [2/3, 4/3), log1p(m - 1) by a polynomial, + e ln2; then inf, NaN, negatives and zeros."""
    p, x1, ea, m, e, f, q, r, res, sp = (fn.reg("p"), *(fn.reg("f") for _ in range(9)))
    fn.op(f"setp.lt.f32 {p}, {x}, {_bits(0x00800000)}")
    fn.op(f"mul.rn.f32 {x1}, {x}, {_bits(0x4B000000)}")
    fn.op(f"selp.f32 {x1}, {x1}, {x}, {p}")
    fn.op(f"selp.f32 {ea}, {_bits(0xC1B80000)}, {_bits(0)}, {p}")
    ix, t, mb = fn.reg("r"), fn.reg("r"), fn.reg("r")
    fn.op(f"mov.b32 {ix}, {x1}")
    fn.op(f"add.s32 {t}, {ix}, -1059760811")  # - bits(2/3)
    fn.op(f"and.b32 {t}, {t}, -8388608")  # the exponent field
    fn.op(f"sub.s32 {mb}, {ix}, {t}")
    fn.op(f"mov.b32 {m}, {mb}")
    fn.op(f"cvt.rn.f32.s32 {e}, {t}")
    fn.op(f"fma.rn.f32 {e}, {e}, {_bits(0x34000000)}, {ea}")
    fn.op(f"add.rn.f32 {f}, {m}, {_bits(0xBF800000)}")
    fn.op(f"fma.rn.f32 {q}, {_bits(_LOG_POLY[0])}, {f}, {_bits(_LOG_POLY[1])}")
    for c in _LOG_POLY[2:]:
        fn.op(f"fma.rn.f32 {q}, {q}, {f}, {_bits(c)}")
    fn.op(f"mul.rn.f32 {r}, {f}, {q}")
    fn.op(f"fma.rn.f32 {r}, {r}, {f}, {f}")
    fn.op(f"fma.rn.f32 {res}, {e}, {_bits(0x3F317218)}, {r}")
    finite, zero = fn.reg("p"), fn.reg("p")
    fn.op(f"setp.lt.u32 {finite}, {ix}, 2139095040")  # 0 <= x < inf (bits), else inf, NaN or negative
    fn.op(f"fma.rn.f32 {sp}, {x1}, {_bits(0x7F800000)}, {_bits(0x7F800000)}")
    fn.op(f"selp.f32 {res}, {res}, {sp}, {finite}")
    fn.op(f"setp.eq.f32 {zero}, {x1}, {_bits(0)}")
    d = fn.reg("f")
    fn.op(f"selp.f32 {d}, {_bits(0xFF800000)}, {res}, {zero}")
    return d


def tanhf(fn: _Fn, x: str) -> str:
    """tanh(x) for a float32 register: CUDA's tanhf (libdevice): 1 - 2 / (e**(2|x|) + 1) for |x| >= 0.6
    (with its approximate exp2 and reciprocal, sign copied), an odd polynomial below."""
    a, t, u, w, big, s2, q, small, d = (fn.reg("f") for _ in range(9))
    p1, p2 = fn.reg("p"), fn.reg("p")
    fn.op(f"abs.f32 {a}, {x}")
    fn.op(f"mul.rn.f32 {t}, {a}, {_bits(0x4038AA3B)}")
    fn.op(f"ex2.approx.ftz.f32 {t}, {t}")
    fn.op(f"add.rn.f32 {u}, {t}, {_bits(0x3F800000)}")
    fn.op(f"rcp.approx.ftz.f32 {w}, {u}")
    fn.op(f"fma.rn.f32 {big}, {w}, {_bits(0xC0000000)}, {_bits(0x3F800000)}")
    fn.op(f"setp.ge.f32 {p1}, {a}, {_bits(0x41102CB4)}")
    fn.op(f"selp.f32 {big}, {_bits(0x3F800000)}, {big}, {p1}")
    fn.op(f"copysign.f32 {big}, {x}, {big}")
    fn.op(f"mul.rn.f32 {s2}, {x}, {x}")
    fn.op(f"fma.rn.f32 {q}, {_bits(_TANH_POLY[0])}, {s2}, {_bits(_TANH_POLY[1])}")
    for c in _TANH_POLY[2:]:
        fn.op(f"fma.rn.f32 {q}, {q}, {s2}, {_bits(c)}")
    fn.op(f"fma.rn.f32 {small}, {q}, {x}, {x}")
    fn.op(f"setp.ge.f32 {p2}, {a}, {_bits(0x3F19999A)}")
    fn.op(f"selp.f32 {d}, {big}, {small}, {p2}")
    return d
