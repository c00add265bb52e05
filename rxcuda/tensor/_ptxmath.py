"""Float32 math for the PTX emitter (``_ptx``): ``exp``, ``log``, ``tanh`` and a correctly rounded division as
PTX instruction sequences, each written into a kernel being emitted (``fn.reg(cls)`` gives a register,
``fn.op(text)`` appends an instruction) and returning the register of its result.

exp is a range reduction and a polynomial with an exact two-step scaling (denormal results stay right; never
``ex2.approx`` alone), log and tanh are the sequences of CUDA's own ``logf``/``tanhf``, and the division goes
through float64 and rounds once (``div.rn.f32``'s slow-path subroutine alone costs ptxas 6-10 ms). The unit
tests run these sequences in a NumPy PTX interpreter: exp and log within 1 ulp, division bit-exact.
"""

from __future__ import annotations

import struct
from typing import Protocol


class _Fn(Protocol):
    """The kernel being written (``_ptxwriter._Fn``): only these two of its methods are used here."""

    def reg(self, cls: str) -> str: ...

    def op(self, text: str) -> None: ...

_EXP_POLY = (0x3AB50836, 0x3C0922EA, 0x3D2AAC9F, 0x3E2AAA41, 0x3EFFFFFE, 0x3F800000)  # (e^r - 1) / r, high first
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
    """e**x for a float32 register: x clamped to [-104, 89] (beyond them the result is 0 or inf), j = rint(x
    log2 e), r = x - j ln2 with ln2 in two parts (the first product exact), e**r = 1 + r q(r) with q a
    degree-5 minimax polynomial, then two exact scalings by 2**(j/2): max 1 ulp, denormal results included."""
    t, j, r, q, e, nan = (fn.reg("f") for _ in range(6))
    fn.op(f"max.f32 {t}, {x}, {f32(-104.0)}")
    fn.op(f"min.f32 {t}, {t}, {f32(89.0)}")
    fn.op(f"mul.rn.f32 {j}, {t}, {_bits(0x3FB8AA3B)}")
    fn.op(f"cvt.rni.f32.f32 {j}, {j}")
    fn.op(f"fma.rn.f32 {r}, {j}, {_bits(0xBF317200)}, {t}")
    fn.op(f"fma.rn.f32 {r}, {j}, {_bits(0xB5BFBE8E)}, {r}")
    fn.op(f"fma.rn.f32 {q}, {_bits(_EXP_POLY[0])}, {r}, {_bits(_EXP_POLY[1])}")
    for c in _EXP_POLY[2:]:
        fn.op(f"fma.rn.f32 {q}, {q}, {r}, {_bits(c)}")
    fn.op(f"fma.rn.f32 {e}, {q}, {r}, {_bits(0x3F800000)}")
    ji, j1, j2 = fn.reg("r"), fn.reg("r"), fn.reg("r")
    fn.op(f"cvt.rzi.s32.f32 {ji}, {j}")
    fn.op(f"shr.s32 {j1}, {ji}, 1")
    fn.op(f"sub.s32 {j2}, {ji}, {j1}")
    for half in (j1, j2):
        b, s = fn.reg("r"), fn.reg("f")
        fn.op(f"add.s32 {b}, {half}, 127")
        fn.op(f"shl.b32 {b}, {b}, 23")
        fn.op(f"mov.b32 {s}, {b}")
        fn.op(f"mul.rn.f32 {e}, {e}, {s}")
    p, d = fn.reg("p"), fn.reg("f")
    fn.op(f"setp.nan.f32 {p}, {x}, {x}")
    fn.op(f"add.rn.f32 {nan}, {x}, {x}")
    fn.op(f"selp.f32 {d}, {nan}, {e}, {p}")
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
