"""The PTX instruction writer of the tensor kernels (``_ptx`` writes the kernel shapes with it): register
classes and memory types per dtype, immediates, iteration contexts (a linear index and its coordinates), and
:class:`_Fn`, one kernel being written (registers, instructions, labels, loads and stores, and each op's
instruction sequence; the longer float32 math comes from ``_ptxmath``).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..model._shapes import c_strides
from ._ir import ENTRY, Layout, Unsupported
from ._ptxmath import divf, expf, f32, f64, logf, tanhf

VERSION = "7.0"
TARGET = "sm_70"
MAX_THREADS = 1024  # any block up to this size: registers (.maxntid) and the block reduction's warp slots
_UNROLL = 4  # elementwise: at most this many elements per thread and trip (fewer with heavy math: _HEAVY)
_HEAVY = frozenset({"exp", "log", "tanh", "sqrt"})  # ~20 instructions or more each, as is a float32 division
_SLOT = 8  # bytes per value in shared memory
_REGION = 33 * _SLOT  # shared memory per reduction: one value per warp (up to 32), then the block's result

# dtype key (the dtype string without its byte order) -> register class, memory type
_CLS = {"b1": "p", "i1": "r", "u1": "r", "i2": "r", "u2": "r", "i4": "r", "u4": "r", "i8": "rd", "u8": "rd",
        "f4": "f", "f8": "fd"}
_MEM = {"b1": "u8", "i1": "s8", "u1": "u8", "i2": "s16", "u2": "u16", "i4": "s32", "u4": "u32", "i8": "s64",
        "u8": "u64", "f4": "f32", "f8": "f64"}
_ITEM = {"b1": 1, "i1": 1, "u1": 1, "i2": 2, "u2": 2, "i4": 4, "u4": 4, "i8": 8, "u8": 8, "f4": 4, "f8": 8}
_DECL = {"p": ".pred", "r": ".b32", "rd": ".b64", "f": ".f32", "fd": ".f64"}
_NARROW = {"i1": "cvt.s32.s8", "u1": "cvt.u32.u8", "i2": "cvt.s32.s16", "u2": "cvt.u32.u16"}
_FLOAT = {"f": "f32", "fd": "f64"}
_RED_OPS = ("sum", "max", "min", "mean")
_SUPPORTED = frozenset({"add", "sub", "mul", "div", "neg", "abs", "maximum", "minimum", "where", "eq", "ne", "lt",
                        "le", "gt", "ge", "cast", "reshape", "broadcast_to", "sqrt", "exp", "log", "tanh",
                        *_RED_OPS})
_CMP_FLOAT = {"eq": "eq", "ne": "neu", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}



def _key(dtype: str) -> str:
    if dtype[0] == ">" or dtype[1:] not in _CLS:
        raise Unsupported(f"no PTX type for dtype {dtype}")
    return dtype[1:]


def _signed(key: str) -> bool:
    return key[0] == "i"


@functools.lru_cache(maxsize=256)
def _common(keys: tuple[str, ...]) -> str:
    """The dtype key NumPy compares ``keys`` in (the C++ generator casts both operands to it)."""
    return _key(np.result_type(*(np.dtype(k) for k in keys)).str)


def _imm(value, key: str) -> str:
    """``value`` as an immediate operand of register class ``key``'s type."""
    cls = _CLS[key]
    if cls == "f":
        return f32(float(value))
    if cls == "fd":
        return f64(float(value))
    if cls == "rd":
        return f"0x{int(value) & (1 << 64) - 1:016X}"
    return f"0x{int(value) & (1 << 32) - 1:08X}"


def _identity(op: str, key: str):
    if op in ("sum", "mean"):
        return 0
    if key[0] == "f":
        return -math.inf if op == "max" else math.inf
    if key == "b1":
        return op == "min"
    info = np.iinfo(np.dtype(key))
    return int(info.min if op == "max" else info.max)


class _Ctx:
    """An iteration context: the linear index register ``lin`` (u64) over ``axes`` of the space, and the
    coordinate registers computed from it (32-bit where the context has fewer than 2**31 elements)."""

    def __init__(self, space: tuple, axes: tuple):
        self.axes = tuple(a for a in axes if space[a] != 1)
        self.dims = {a: space[a] for a in self.axes}
        self.size = math.prod(space[a] for a in axes)
        self.wide = self.size >= 1 << 31
        sub = c_strides(tuple(space[a] for a in axes))
        self.cstride = {a: s for a, s in zip(axes, sub, strict=True) if space[a] != 1}
        self.lin = ""
        self.coords: dict[int, str] = {}

    def split(self, terms: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], int | None]:
        """``terms`` (axis, bytes) restricted to this context, and the factor F where they sum to lin * F."""
        mine = [(a, b) for a, b in terms if a in self.dims]
        if not mine:
            return mine, None
        coef: dict[int, int] = {}
        for a, b in mine:
            coef[a] = coef.get(a, 0) + b
        f = coef.get(self.axes[-1], 0)
        if f > 0 and len(coef) == len(self.axes) and all(coef[a] == f * self.cstride[a] for a in self.axes):
            return mine, f
        return mine, None


class _Fn:
    """One kernel being written: numbered registers per class, the instruction lines, labels."""

    def __init__(self, ir: tuple, lay: Layout):
        self.ir, self.lay = ir, lay
        self.unroll = _UNROLL
        self.guard = ""  # a predicate the loads are issued under (an unrolled element past the end)
        self.count = {"p": 0, "r": 0, "rd": 0, "f": 0, "fd": 0}
        self.lines: list[str] = []
        self.labels = 0
        self.inkeys = [_key(i[2] if i[0] == "array" else i[1]) for i in lay.inputs]
        self.nodekeys = [_key(n[3]) for n in lay.nodes]
        self.scopes: list[dict] = [{}]  # (kind, ...) -> register, innermost last
        self.rowbase: dict[tuple, str] = {}  # (input, coordinates) -> its address at the row's coordinates
        self.shared = 0

    # -- registers and lines
    def reg(self, cls: str) -> str:
        self.count[cls] += 1
        return f"%{cls}{self.count[cls]}"

    def op(self, text: str) -> None:
        self.lines.append("\t" + text + ";")

    def label(self) -> str:
        self.labels += 1
        return f"$L{self.labels}"

    def find(self, key):
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    # -- values
    def mov(self, key: str, value) -> str:
        cls = _CLS[key]
        d = self.reg(cls)
        if cls == "p":
            self.op(f"setp.ne.u32 {d}, {1 if value else 0}, 0")
        else:
            self.op(f"mov.{_DECL[cls][1:]} {d}, {_imm(value, key)}")
        return d

    def narrow(self, key: str, reg: str) -> str:
        """A 32-bit register holding a value of ``key`` wrapped to its width (sign- or zero-extended)."""
        if key not in _NARROW:
            return reg
        d = self.reg("r")
        self.op(f"{_NARROW[key]} {d}, {reg}")
        return d

    def conv(self, reg: str, src: str, dst: str) -> str:
        """``reg`` (a value of dtype key ``src``) as a value of ``dst``, as C++'s ``(dst)(value)``."""
        if src == dst:
            return reg
        cs, cd = _CLS[src], _CLS[dst]
        if dst == "b1":
            d = self.reg("p")
            if cs in _FLOAT:
                self.op(f"setp.neu.{_FLOAT[cs]} {d}, {reg}, {_imm(0, src)}")
            else:
                self.op(f"setp.ne.{'s32' if cs == 'r' else 's64'} {d}, {reg}, 0")
            return d
        if src == "b1":
            d = self.reg(cd)
            self.op(f"selp.{_DECL[cd][1:]} {d}, {_imm(1, dst)}, {_imm(0, dst)}, {reg}")
            return d
        if cs in _FLOAT:
            d = self.reg(cd)
            if cd in _FLOAT:
                self.op(f"cvt.f64.f32 {d}, {reg}" if cd == "fd" else f"cvt.rn.f32.f64 {d}, {reg}")
                return d
            # float -> integer truncates (C++'s cast). Out of range it is undefined in C++; here a negative
            # float becomes an unsigned integer as on NumPy's x86 (through a signed integer, wrapped)
            ft = _FLOAT[cs]
            if dst == "u8":
                s, p = self.reg("rd"), self.reg("p")
                self.op(f"cvt.rzi.u64.{ft} {d}, {reg}")
                self.op(f"cvt.rzi.s64.{ft} {s}, {reg}")
                self.op(f"setp.lt.{ft} {p}, {reg}, {_imm(0, src)}")
                return self.select("rd", p, s, d)
            if cd == "rd" or dst == "u4":
                w = d if cd == "rd" else self.reg("rd")
                self.op(f"cvt.rzi.s64.{ft} {w}, {reg}")
                if cd == "r":
                    self.op(f"cvt.u32.u64 {d}, {w}")
                return d
            self.op(f"cvt.rzi.s32.{ft} {d}, {reg}")  # narrow types through int32, then wrapped
            return self.narrow(dst, d)
        itype = f"{'s' if _signed(src) else 'u'}{32 if cs == 'r' else 64}"
        if cd in _FLOAT:
            d = self.reg(cd)
            self.op(f"cvt.rn.{_FLOAT[cd]}.{itype} {d}, {reg}")
            return d
        if cs == "r" and cd == "rd":  # widen by the source's signedness: the value is kept
            d = self.reg("rd")
            self.op(f"cvt.{itype[0]}64.{itype} {d}, {reg}")
            return d
        if cs == "rd" and cd == "r":
            d = self.reg("r")
            self.op(f"cvt.u32.u64 {d}, {reg}")
            return self.narrow(dst, d)
        return reg if cs == "rd" else self.narrow(dst, reg)  # same width: the same bits, wrapped if narrower

    # -- addresses and loads
    def decompose(self, ctx: _Ctx, need: set[int]) -> None:
        """Coordinate registers of ``ctx`` for the axes in ``need`` (row-major over ctx's axes)."""
        need = need & set(ctx.axes)
        ctx.coords = {}
        if not need:
            return
        outer = min(ctx.axes.index(a) for a in need)
        if ctx.wide:
            t, cls, ty = ctx.lin, "rd", "u64"
        else:
            t, cls, ty = self.reg("r"), "r", "u32"
            self.op(f"cvt.u32.u64 {t}, {ctx.lin}")
        for pos in range(len(ctx.axes) - 1, outer - 1, -1):
            a = ctx.axes[pos]
            if pos == 0:
                ctx.coords[a] = t
                break
            q, c = self.reg(cls), self.reg(cls)
            d = ctx.dims[a]
            self.op(f"div.{ty} {q}, {t}, {d}")
            self.op(f"mul.lo.{ty} {c}, {q}, {d}")
            self.op(f"sub.{ty} {c}, {t}, {c}")
            ctx.coords[a] = c
            t = q

    def needs(self, ctx: _Ctx, terms: list[tuple[int, int]]) -> set[int]:
        mine, f = ctx.split(terms)
        return set() if f is not None else {a for a, _ in mine}

    def offset(self, ctx: _Ctx, terms: list[tuple[int, int]]) -> str | None:
        """A u64 register with the byte offset sum(coordinate * bytes) of ``terms`` in ``ctx`` (None for 0)."""
        mine, f = ctx.split(terms)
        if not mine:
            return None
        if f is not None:
            key = ("lin", id(ctx), ctx.lin, f)
            hit = self.find(key)
            if hit:
                return hit
            d = self.reg("rd")
            if f & (f - 1) == 0:
                self.op(f"shl.b64 {d}, {ctx.lin}, {f.bit_length() - 1}")
            else:
                self.op(f"mul.lo.s64 {d}, {ctx.lin}, {f}")
            self.scopes[-1][key] = d
            return d
        acc = None
        for a, b in mine:
            c, t = ctx.coords[a], self.reg("rd")
            if ctx.wide:
                self.op(f"mul.lo.s64 {t}, {c}, {b}")
            elif -(1 << 31) <= b < 1 << 31:
                self.op(f"mul.wide.s32 {t}, {c}, {b}")
            else:
                w = self.reg("rd")
                self.op(f"cvt.u64.u32 {w}, {c}")
                self.op(f"mul.lo.s64 {t}, {w}, {b}")
            if acc is not None:
                s = self.reg("rd")
                self.op(f"add.s64 {s}, {acc}, {t}")
                t = s
            acc = t
        return acc

    def address(self, base: str, ctxs: list[_Ctx], terms: list[tuple[int, int]]) -> str:
        out = base
        for ctx in ctxs:
            off = self.offset(ctx, terms)
            if off is not None:
                d = self.reg("rd")
                self.op(f"add.s64 {d}, {out}, {off}")
                out = d
        return out

    def terms(self, k: int, at: tuple) -> list[tuple[int, int]]:
        inp, item = self.lay.inputs[k], _ITEM[self.inkeys[k]]
        space = self.lay.space
        return [(a, s * item) for a, s in zip(at, inp[3], strict=True) if a is not None and space[a] != 1 and s]

    def load(self, k: int, at: tuple, ctxs: list[_Ctx]) -> str:
        key = ("load", k, tuple(at))
        hit = self.find(key)
        if hit:
            return hit
        ikey = self.inkeys[k]
        base = self.rowbase.get(key[1:]) or self.base[k]  # a reduce kernel's row part, once per row
        addr = self.address(base, ctxs, self.terms(k, at))
        cls = _CLS[ikey]
        guard = f"@{self.guard} " if self.guard else ""
        if cls == "p":
            r, d = self.reg("r"), self.reg("p")
            self.op(f"{guard}ld.global.nc.u8 {r}, [{addr}]")
            self.op(f"setp.ne.u32 {d}, {r}, 0")
        else:
            d = self.reg(cls)
            self.op(f"{guard}ld.global.nc.{_MEM[ikey]} {d}, [{addr}]")
        self.scopes[-1][key] = d
        return d

    def store(self, key: str, addr: str, value: str, pred: str = "") -> None:
        guard = f"@{pred} " if pred else ""
        if key == "b1":
            r = self.reg("r")
            self.op(f"selp.u32 {r}, 1, 0, {value}")
            value = r
        self.op(f"{guard}st.global.{_MEM[key]} [{addr}], {value}")

    # -- nodes
    def operand(self, j: int, k: int, ctxs: list[_Ctx]) -> tuple[str, str]:
        s, r = self.lay.nodes[j][4][k]
        if s == "n":
            reg = self.find(("node", r))
            assert reg is not None, f"node {r} used before it is computed"
            return reg, self.nodekeys[r]
        if self.lay.inputs[r][0] == "scalar":
            return self.scalar[r], self.inkeys[r]
        return self.load(r, self.lay.reads[j][k], ctxs), self.inkeys[r]

    def node(self, j: int, ctxs: list[_Ctx]) -> str:
        op, _, _, _, refs = self.lay.nodes[j]
        key = self.nodekeys[j]
        args = [self.operand(j, k, ctxs) for k in range(len(refs))]
        d = self.compute(op, key, args)
        self.scopes[-1][("node", j)] = d
        return d

    def compute(self, op: str, key: str, args: list[tuple[str, str]]) -> str:
        if op in _CMP_FLOAT:
            ct = _common(tuple(k for _, k in args))
            a, b = (self.conv(r, k, ct) for r, k in args)
            return self.compare(op, ct, a, b)
        if op == "where":
            c = self.conv(*args[0], "b1")
            a, b = (self.conv(r, k, key) for r, k in args[1:])
            return self.select(_CLS[key], c, a, b)
        vals = [self.conv(r, k, key) for r, k in args]
        if op in ("cast", "reshape", "broadcast_to"):
            return vals[0]
        if op in ("add", "sub", "mul", "div", "maximum", "minimum"):
            return self.binary(op, key, vals[0], vals[1])
        return self.unary(op, key, vals[0])

    def select(self, cls: str, c: str, a: str, b: str) -> str:
        """``c ? a : b`` for registers of class ``cls``."""
        d = self.reg(cls)
        if cls == "p":
            t, n = self.reg("p"), self.reg("p")
            self.op(f"and.pred {t}, {c}, {a}")
            self.op(f"and.pred {n}, {b}, !{c}")
            self.op(f"or.pred {d}, {t}, {n}")
        else:
            self.op(f"selp.{_DECL[cls][1:]} {d}, {a}, {b}, {c}")
        return d

    def compare(self, op: str, ct: str, a: str, b: str) -> str:
        cls = _CLS[ct]
        if cls == "p":
            a, b = self.conv(a, "b1", "u4"), self.conv(b, "b1", "u4")
            cls, ct = "r", "u4"
        d = self.reg("p")
        if cls in _FLOAT:
            self.op(f"setp.{_CMP_FLOAT[op]}.{_FLOAT[cls]} {d}, {a}, {b}")
        else:
            ty = f"{'s' if _signed(ct) else 'u'}{32 if cls == 'r' else 64}"
            self.op(f"setp.{op}.{ty} {d}, {a}, {b}")
        return d

    def binary(self, op: str, key: str, a: str, b: str) -> str:
        cls = _CLS[key]
        d = self.reg(cls)
        if cls == "p":
            if op in ("add", "maximum"):
                self.op(f"or.pred {d}, {a}, {b}")
            elif op in ("mul", "minimum"):
                self.op(f"and.pred {d}, {a}, {b}")
            else:
                raise Unsupported(f"{op} of bool")
            return d
        if cls in _FLOAT:
            t = _FLOAT[cls]
            if op in ("maximum", "minimum"):  # (a > b || a != a) ? a : b, as the C++ rx_max/rx_min
                p, q = self.reg("p"), self.reg("p")
                self.op(f"setp.{'gt' if op == 'maximum' else 'lt'}.{t} {p}, {a}, {b}")
                self.op(f"setp.nan.or.{t} {q}, {a}, {a}, {p}")
                self.op(f"selp.{t} {d}, {a}, {b}, {q}")
            elif op == "div" and cls == "f":
                self.count["f"] -= 1
                return divf(self, a, b)
            else:
                self.op(f"{op}.rn.{t} {d}, {a}, {b}")
            return d
        width = 32 if cls == "r" else 64
        if op in ("maximum", "minimum"):
            self.op(f"{op[:3]}.{'s' if _signed(key) else 'u'}{width} {d}, {a}, {b}")
            return d
        if op == "div":
            raise Unsupported(f"integer division of {key}")
        self.op(f"{'mul.lo' if op == 'mul' else op}.s{width} {d}, {a}, {b}")
        return self.narrow(key, d) if cls == "r" else d

    def unary(self, op: str, key: str, a: str) -> str:
        cls = _CLS[key]
        if op == "abs" and (cls == "p" or key[0] == "u"):
            return a
        if op in ("neg", "abs"):
            if cls == "p":
                raise Unsupported(f"{op} of bool")
            d = self.reg(cls)
            t = _FLOAT.get(cls) or f"s{32 if cls == 'r' else 64}"
            self.op(f"{op}.{t} {d}, {a}")
            return self.narrow(key, d) if cls == "r" else d
        if cls not in _FLOAT:
            raise Unsupported(f"{op} of {key}")
        if op == "sqrt":
            d = self.reg(cls)
            self.op(f"sqrt.rn.{_FLOAT[cls]} {d}, {a}")
            return d
        if cls != "f":
            raise Unsupported(f"{op} of float64 (NVRTC's libdevice has it)")
        if op == "exp":
            return expf(self, a)
        if op == "log":
            return logf(self, a)
        if op == "tanh":
            return tanhf(self, a)
        raise Unsupported(f"op {op}")

    def combine(self, op: str, key: str, acc: str, value: str) -> str:
        return self.binary("add" if op in ("sum", "mean") else ("maximum" if op == "max" else "minimum"),
                           key, acc, value)

    # -- the whole kernel
    def params(self) -> list[str]:
        lay, out = self.lay, []
        self.base: dict[int, str] = {}
        self.scalar: dict[int, str] = {}
        self.outbase: list[str] = []
        names = [f"{ENTRY}_param_{k}" for k in range(len(lay.inputs) + len(lay.outputs))]
        for k, inp in enumerate(lay.inputs):
            key = self.inkeys[k]
            if inp[0] == "scalar":
                out.append(f"\t.param .{_MEM[key] if key != 'b1' else 'u8'} {names[k]}")
                cls = _CLS[key]
                if cls == "p":
                    r, d = self.reg("r"), self.reg("p")
                    self.op(f"ld.param.u8 {r}, [{names[k]}]")
                    self.op(f"setp.ne.u32 {d}, {r}, 0")
                else:
                    d = self.reg(cls)
                    self.op(f"ld.param.{_MEM[key]} {d}, [{names[k]}]")
                self.scalar[k] = d
            else:
                out.append(f"\t.param .u64 {names[k]}")
                self.base[k] = self.pointer(names[k])
        for k in range(len(lay.outputs)):
            name = names[len(lay.inputs) + k]
            out.append(f"\t.param .u64 {name}")
            self.outbase.append(self.pointer(name))
        return out

    def pointer(self, name: str) -> str:
        r, g = self.reg("rd"), self.reg("rd")
        self.op(f"ld.param.u64 {r}, [{name}]")
        self.op(f"cvta.to.global.u64 {g}, {r}")
        return g

    def special(self) -> None:
        self.tid, self.ntid, self.ctaid, self.nctaid = (self.reg("r") for _ in range(4))
        for r, name in ((self.tid, "tid"), (self.ntid, "ntid"), (self.ctaid, "ctaid"), (self.nctaid, "nctaid")):
            self.op(f"mov.u32 {r}, %{name}.x")

    def loop_head(self, lin: str, start: str, end: int, unroll: bool = True) -> tuple[str, str]:
        """``for (lin = start; lin < end; ...)``: the loop and exit labels (the loop label is placed).
        ``unroll=False`` asks the JIT not to unroll it (a short loop: unrolling costs JIT time, gains little)."""
        top, done = self.label(), self.label()
        self.op(f"mov.u64 {lin}, {start}")
        p = self.reg("p")
        self.op(f"setp.ge.u64 {p}, {lin}, {end}")
        self.op(f"@{p} bra {done}")
        self.lines.append(f"{top}:")
        if not unroll:
            self.op('.pragma "nounroll"')
        return top, done

    def loop_tail(self, lin: str, step: str, end: int, top: str, done: str) -> None:
        p = self.reg("p")
        self.op(f"add.s64 {lin}, {lin}, {step}")
        self.op(f"setp.lt.u64 {p}, {lin}, {end}")
        self.op(f"@{p} bra {top}")
        self.lines.append(f"{done}:")
