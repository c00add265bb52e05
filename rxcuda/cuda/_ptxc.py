"""PTX -> C: the CPU device's kernel translator (one C function per ``.entry``, compiled by the host's C compiler).

Why C and not a NumPy interpreter: a 10-kernel elementwise chain at 2^20 f32 (``bench/cpu.py``) spends its time
in per-instruction passes over every thread's registers when each PTX instruction is a NumPy operation (~15 array
passes a kernel), while the same PTX as C runs each thread's instructions in machine registers: see docs/cpu.md for
the numbers. Every state space maps to host memory, so addresses are real pointers: global memory is the CPU
driver's allocations, shared memory a per-block array (a ``.shared`` address is an offset into it, as the PTX
shared window is), local memory a per-thread array.

Threads of a block run one after another. A kernel with no barrier and no warp operation runs each thread start to
end (its registers C locals); one with ``bar.sync``, ``shfl.sync``, ``vote.sync`` or ``bar.warp.sync`` keeps each
thread's registers in a struct and runs it as a coroutine: it returns at such an instruction with where to resume,
and a small scheduler resumes a warp once all its live threads reached a warp operation, and the block once all
reached the barrier. Global and generic accesses are checked: an address outside the allocation its pointer
argument came from (or outside every allocation) stops the launch with the kernel, the argument, the address and
the thread, as the GPU's illegal address would.

>>> src = '''.version 8.0
... .target sm_75
... .address_size 64
... .visible .entry twice(.param .u64 p, .param .u32 n)
... {
...   .reg .pred %p<2>; .reg .b32 %r<4>; .reg .f32 %f<3>; .reg .b64 %rd<4>;
...   ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n];
...   mov.u32 %r2, %tid.x; setp.ge.u32 %p1, %r2, %r1; @%p1 bra DONE;
...   mul.wide.u32 %rd2, %r2, 4; add.s64 %rd3, %rd1, %rd2;
...   ld.global.f32 %f1, [%rd3]; add.f32 %f2, %f1, %f1; st.global.f32 [%rd3], %f2;
... DONE:
...   ret;
... }'''
>>> m = translate(src)
>>> [(k.name, [p.size for p in k.params], k.coroutine) for k in m.kernels]
[('twice', [8, 4], False)]
"""

from __future__ import annotations

import re

import attrs

from ..model._errors import KernelFileError

CTYPE = {"f32": "float", "f64": "double", "s8": "int8_t", "s16": "int16_t", "s32": "int32_t", "s64": "int64_t",
         "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t", "b8": "uint8_t",
         "b16": "uint16_t", "b32": "uint32_t", "b64": "uint64_t", "pred": "int", "f16": "uint16_t",
         "bf16": "uint16_t", "f16x2": "uint32_t", "bf16x2": "uint32_t"}
SIZE = {"f32": 4, "f64": 8, "s8": 1, "s16": 2, "s32": 4, "s64": 8, "u8": 1, "u16": 2, "u32": 4, "u64": 8, "b8": 1,
        "b16": 2, "b32": 4, "b64": 8, "pred": 1, "f16": 2, "bf16": 2, "f16x2": 4, "bf16x2": 4, "b128": 16}
UNSIGNED = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}
SIGNED = {1: "int8_t", 2: "int16_t", 4: "int32_t", 8: "int64_t"}
_TYPES = set(CTYPE)
_SPACES = {"global", "shared", "local", "param", "const", "generic"}
_SYNC_OPS = {"bar", "barrier", "shfl", "vote", "activemask", "match", "redux"}

# What each translated module starts with: the launch record the driver fills, the helpers the kernels call.
HEADER = r"""
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#include <time.h>
typedef struct RxLaunch {
  uint32_t grid[3], block[3];
  const unsigned char* params;
  uint64_t shared_dyn;
  const uint64_t* lo; const uint64_t* span;   /* per kernel argument: the allocation it points into */
  const uint64_t* alo; const uint64_t* ahi; int64_t nalloc;  /* every allocation, sorted */
  const uint64_t* globals;                    /* the module's .global/.const variables */
  void* ctx; void (*set_cond)(void* ctx, uint64_t handle, uint32_t value);
  int32_t workers, pad_;                      /* host threads running blocks at once */
  /* out: the first illegal access */
  int32_t fault, fault_arg, fault_write, fault_size, fault_insn; uint64_t fault_addr;
  uint32_t fault_block[3], fault_thread[3];
} RxLaunch;
typedef struct RxBlk { uint32_t ctaid[3]; unsigned char* sh; uint64_t shsize; uint64_t* xchg[2];
  uint32_t nthreads; } RxBlk;
typedef struct RxThr { int32_t resume, wpar; uint32_t tid[3], lin, lane; unsigned char* ld; } RxThr;
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline double u2d(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }
static inline uint64_t d2u(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }
static inline float h2f(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t f2h(float f) { _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h; }
static inline float bh2f(uint16_t h) { return u2f(((uint32_t)h) << 16); }
static inline uint16_t f2bh(float f) { uint32_t u = f2u(f); if (f != f) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
static inline int64_t sat_s(double x, double lo, double hi) { if (x != x) return 0; if (x < lo) return (int64_t)lo;
  if (x > hi) return (int64_t)hi; return (int64_t)x; }
static inline uint64_t sat_u(double x, double hi) { if (!(x > 0)) return 0; if (x >= hi) return (uint64_t)hi;
  return (uint64_t)x; }
static inline uint64_t sat_u64(double x) { if (!(x > 0)) return 0; if (x >= 18446744073709551615.0)
  return 18446744073709551615ull; return (uint64_t)x; }
static inline int64_t sat_s64(double x) { if (x != x) return 0; if (x <= -9223372036854775808.0)
  return INT64_MIN; if (x >= 9223372036854775807.0) return INT64_MAX; return (int64_t)x; }
static inline float satf(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline double satd(double x) { return x != x ? 0.0 : x < 0.0 ? 0.0 : x > 1.0 ? 1.0 : x; }
static inline uint32_t brev32(uint32_t x) { uint32_t r = 0; for (int i = 0; i < 32; i++) { r = (r << 1) | (x & 1);
  x >>= 1; } return r; }
static inline uint64_t brev64(uint64_t x) {
  return ((uint64_t)brev32((uint32_t)x) << 32) | brev32((uint32_t)(x >> 32)); }
static inline uint32_t lop3(uint32_t a, uint32_t b, uint32_t c, uint32_t lut) { uint32_t r = 0;
  for (int i = 0; i < 8; i++) if (lut >> i & 1) r |= ((i & 4) ? a : ~a) & ((i & 2) ? b : ~b) & ((i & 1) ? c : ~c);
  return r; }
static inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) { uint64_t x = ((uint64_t)b << 32) | a; uint32_t r = 0;
  for (int i = 0; i < 4; i++) { uint32_t sel = (s >> (4 * i)) & 15; uint32_t byte = (x >> (8 * (sel & 7))) & 255;
  if (sel & 8) byte = (byte & 128) ? 255 : 0; r |= byte << (8 * i); } return r; }
static inline uint64_t bfe_u(uint64_t a, uint32_t pos, uint32_t len, int w) { pos &= 255; len &= 255;
  if (len == 0 || pos >= (uint32_t)w) return 0;
  uint64_t v = a >> pos; if (len < 64) v &= ((1ull << len) - 1); return v; }
static inline int64_t bfe_s(int64_t a, uint32_t pos, uint32_t len, int w) {
  pos &= 255; len &= 255; if (len == 0) return 0;
  uint32_t top = pos + len - 1 < (uint32_t)w - 1 ? pos + len - 1 : (uint32_t)w - 1;
  int sign = (a >> (pos < (uint32_t)w ? top : w - 1)) & 1;
  uint64_t v = bfe_u((uint64_t)a, pos, len, w); if (sign && len < 64) v |= ~((1ull << len) - 1); return (int64_t)v; }
static inline uint64_t bfi(uint64_t a, uint64_t b, uint32_t pos, uint32_t len, int w) { pos &= 255; len &= 255;
  if (len == 0 || pos >= (uint32_t)w) return b; uint64_t m = (len >= 64 ? ~0ull : ((1ull << len) - 1)) << pos;
  if (w < 64) m &= ((1ull << w) - 1); return (b & ~m) | ((a << pos) & m); }
static inline uint32_t bfind32(uint32_t x, int sgn) {
  if (sgn && (int32_t)x < 0) x = ~x; return x ? 31 - __builtin_clz(x) : 0xffffffffu; }
static inline uint32_t bfind64(uint64_t x, int sgn) {
  if (sgn && (int64_t)x < 0) x = ~x; return x ? 63 - __builtin_clzll(x) : 0xffffffffu; }
static inline uint64_t rx_now(void) { struct timespec t; clock_gettime(CLOCK_REALTIME, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec; }
static inline int64_t divs(int64_t a, int64_t b) {
  return b == 0 ? -1 : (b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b); }
static inline uint64_t divu(uint64_t a, uint64_t b) { return b == 0 ? ~0ull : a / b; }
static inline int64_t rems(int64_t a, int64_t b) { return (b == 0 || b == -1) ? (b == 0 ? a : 0) : a % b; }
static inline uint64_t remu(uint64_t a, uint64_t b) { return b == 0 ? a : a % b; }
/* an address in no allocation, the block's shared memory or the thread's local memory */
static int rx_stray_at(const RxLaunch* L, const unsigned char* sh, uint64_t shsize, const unsigned char* ld,
                       uint64_t ldsize, uint64_t a, uint64_t n) {
  if (a - (uint64_t)sh < shsize && a + n - (uint64_t)sh <= shsize) return 0;
  if (ld && a - (uint64_t)ld < ldsize && a + n - (uint64_t)ld <= ldsize) return 0;
  int64_t lo = 0, hi = L->nalloc - 1;
  while (lo <= hi) { int64_t m = (lo + hi) / 2; if (L->alo[m] > a) hi = m - 1; else if (L->ahi[m] <= a) lo = m + 1;
    else return a + n > L->ahi[m]; }
  return 1; }
/* the first fault of a launch (blocks may run on several host threads) */
static void rx_fault_at(RxLaunch* L, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t t0, uint32_t t1, uint32_t t2,
                        int arg, uint64_t a, int n, int w, int insn) {
  int32_t none = 0;
  if (!__atomic_compare_exchange_n(&L->fault, &none, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return;
  L->fault_arg = arg; L->fault_addr = a; L->fault_size = n; L->fault_write = w; L->fault_insn = insn;
  L->fault_block[0] = c0; L->fault_block[1] = c1; L->fault_block[2] = c2;
  L->fault_thread[0] = t0; L->fault_thread[1] = t1; L->fault_thread[2] = t2; }
"""


@attrs.frozen
class Param:
    name: str
    type: str  # the PTX type ('u64', 'f32', 'b8' for an array)
    size: int
    offset: int  # in the packed parameter buffer
    align: int


@attrs.frozen
class Kernel:
    name: str
    params: tuple[Param, ...]
    coroutine: bool  # registers in a struct per thread, resumed after barriers and warp operations
    static_shared: int
    instructions: tuple[str, ...]  # the PTX instructions, by the index a fault reports

    @property
    def params_size(self) -> int:
        return max((p.offset + p.size for p in self.params), default=0)


@attrs.frozen
class Variable:
    name: str
    space: str  # 'global' or 'const'
    size: int
    align: int
    init: bytes


@attrs.frozen
class Module:
    source: str  # the C
    kernels: tuple[Kernel, ...]
    variables: tuple[Variable, ...]  # allocated by the driver, their addresses in RxLaunch.globals


class PtxError(KernelFileError):
    """PTX the CPU device cannot run (yet): names the kernel and the instruction."""


def _strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _split_operands(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _cname(reg: str) -> str:
    return "v_" + re.sub(r"[^A-Za-z0-9_]", lambda m: f"_{ord(m.group()):x}", reg)


_DECL = re.compile(r"^\.reg\s+(?:\.v\d\s+)?\.(\w+)\s+(.+)$")
_VAR = re.compile(r"^(?:\.(?:visible|extern|weak)\s+)*\.(global|const|shared|local)\s+(.*)$")


def _parse_var(rest: str):
    """'.align 4 .b8 name[16] = {..}' -> (align, type, name, count or None, init list or None)."""
    init = None
    if "=" in rest:
        rest, _, init_s = rest.partition("=")
        init = [x.strip() for x in init_s.strip().strip("{}").split(",") if x.strip()]
    align = 0
    m = re.search(r"\.align\s+(\d+)", rest)
    if m:
        align = int(m.group(1))
        rest = rest[:m.start()] + rest[m.end():]
    toks = rest.split()
    typ = next(t[1:] for t in toks if t.startswith(".") and t[1:] in SIZE)
    decl = toks[-1]
    m = re.match(r"([\w$.%]+)((?:\[\d*\])*)$", decl)
    if not m:
        raise PtxError(f"cannot read the variable declaration {rest!r}")
    count = None
    dims = re.findall(r"\[(\d*)\]", m.group(2))
    if dims:
        count = 1
        for d in dims:
            count = count * int(d) if d else -1
    return align or SIZE[typ], typ, m.group(1), count, init


def _imm_value(tok: str) -> int | float:
    t = tok.strip()
    neg = t.startswith("-")
    if neg:
        t = t[1:]
    if re.fullmatch(r"0[fF][0-9a-fA-F]{8}", t):
        import struct
        v: int | float = struct.unpack("<f", int(t[2:], 16).to_bytes(4, "little"))[0]
    elif re.fullmatch(r"0[dD][0-9a-fA-F]{16}", t):
        import struct
        v = struct.unpack("<d", int(t[2:], 16).to_bytes(8, "little"))[0]
    elif re.fullmatch(r"0[xX][0-9a-fA-F]+U?", t):
        v = int(t.rstrip("U"), 16)
    elif re.fullmatch(r"0[bB][01]+U?", t):
        v = int(t.rstrip("U")[2:], 2)
    elif re.fullmatch(r"0[0-7]+U?", t):
        v = int(t.rstrip("U"), 8)
    elif re.fullmatch(r"\d+U?", t):
        v = int(t.rstrip("U"))
    else:
        v = float(t)
    return -v if neg else v


def _is_imm(tok: str) -> bool:
    return bool(re.fullmatch(r"-?(0[fFdD][0-9a-fA-F]+|0[xX][0-9a-fA-F]+U?|0[bB][01]+U?|\d+U?|\d*\.\d+(e[-+]?\d+)?)",
                             tok.strip()))


def translate(ptx: str | bytes, *, prefix: str = "rx") -> Module:
    """Translate a PTX module's text into C (``Module.source``), one ``int <prefix>_<entry>(RxLaunch*)`` per
    entry. Raises :class:`PtxError` naming the kernel and the instruction it cannot translate."""
    if isinstance(ptx, bytes):
        ptx = ptx.rstrip(b"\0").decode("utf-8", "replace")
    text = _strip(ptx)
    variables: list[Variable] = []
    shared_mod: list[tuple[str, int, int, int]] = []  # module-level .shared: (name, size, align, dynamic)
    kernels = []
    bodies = []
    pos = 0
    entry_re = re.compile(r"(?:\.(?:visible|weak|extern)\s+)*\.(entry|func)\s+(?:\(([^)]*)\)\s*)?([\w$]+)\s*\(([^)]*)\)"
                          r"((?:\s*\.\w+(?:\s+[\d,\s]+)?)*)\s*(\{|;)", re.S)
    while True:
        m = entry_re.search(text, pos)
        top = text[pos:m.start()] if m else text[pos:]
        for stmt in top.split(";"):
            stmt = " ".join(stmt.split())
            vm = _VAR.match(stmt)
            if not vm:
                continue
            space, rest = vm.groups()
            align, typ, name, count, init = _parse_var(rest)
            size = SIZE[typ] * (count if count and count > 0 else 1)
            if space == "shared":
                shared_mod.append((name, 0 if count == -1 else size, align, int(count == -1)))
            elif space in ("global", "const"):
                data = b""
                if init:
                    import numpy as np
                    dt = {"f32": "<f4", "f64": "<f8"}.get(typ, f"<{'i' if typ[0] == 's' else 'u'}{SIZE[typ]}")
                    data = np.array([_imm_value(x) for x in init], dtype=dt).tobytes()
                variables.append(Variable(name, space, size, align, data))
        if m is None:
            break
        kind, _ret, name, params_s, _attrs, opener = m.groups()
        if opener == ";":  # a declaration (an extern function such as cudaGraphSetConditional)
            pos = m.end()
            continue
        depth, i = 1, m.end()
        while depth:
            c = text[i]
            depth += c == "{"
            depth -= c == "}"
            i += 1
        body = text[m.end():i - 1]
        pos = i
        if kind == "func":
            raise PtxError(f"a non-inlined device function ({name}): the CPU device runs kernels whose device "
                           "functions are inlined (the default for NVRTC and nvcc at -O3); mark it __forceinline__")
        bodies.append((name, params_s, body))
    names = [v.name for v in variables]
    out = [HEADER]
    for name, params_s, body in bodies:
        k, c = _Kernel(name, params_s, body, names, shared_mod, prefix).emit()
        kernels.append(k)
        out.append(c)
    return Module("\n".join(out), tuple(kernels), tuple(variables))


class _Kernel:
    def __init__(self, name: str, params_s: str, body: str, globals_: list[str], shared_mod, prefix: str):
        self.name = name
        self.fn = f"{prefix}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"
        self.globals = {g: i for i, g in enumerate(globals_)}
        self.regs: dict[str, str] = {}  # PTX register -> its storage type
        self.params: list[Param] = []
        off = 0
        for p in _split_operands(params_s):
            p = " ".join(p.split())
            if not p:
                continue
            align, typ, pname, count, _ = _parse_var(p.replace(".param", "", 1))
            size = SIZE[typ] * (count if count and count > 0 else 1)
            a = align if "align" in p else SIZE[typ]
            off = -(-off // a) * a
            self.params.append(Param(pname, typ, size, off, a))
            off += size
        self.pindex = {p.name: i for i, p in enumerate(self.params)}
        self.shared: dict[str, int] = {}  # .shared symbol -> offset in the block's shared memory
        self.shared_size = 0
        self.dynamic: list[str] = []
        for sname, size, align, dyn in shared_mod:
            self._add_shared(sname, size, align, dyn)
        self.local: dict[str, int] = {}
        self.local_size = 0
        self.callparams: dict[str, int] = {}  # .param declared in the body (a call's arguments): their sizes
        self.stmts: list[tuple[str | None, str]] = []  # (label, statement)
        self._parse(body)
        self.coroutine = any(s.split(".")[0].lstrip("@!%p0123456789 ").split()[0] in _SYNC_OPS
                             for _, s in self.stmts if s)
        self.resume = 0
        self.bases = self._provenance()

    def _add_shared(self, name, size, align, dyn):
        if dyn:
            self.dynamic.append(name)
            return
        self.shared_size = -(-self.shared_size // align) * align
        self.shared[name] = self.shared_size
        self.shared_size += size

    def _parse(self, body: str) -> None:
        label = None
        for raw in body.split(";"):
            s = " ".join(raw.split())
            while True:  # scope braces (a call's, an inline asm block's) open or close before a statement
                s = s.lstrip("{} ")
                m = re.match(r"^([\w$]+):\s*(.*)$", s)
                if not m:
                    break
                if label is not None:
                    self.stmts.append((label, ""))
                label, s = m.group(1), m.group(2)
            if not s:
                continue
            d = _DECL.match(s)
            if d:
                typ, names = d.groups()
                for n in names.split(","):
                    n = n.strip()
                    mm = re.match(r"^([%\w$]+)<(\d+)>$", n)
                    if mm:
                        for j in range(int(mm.group(2))):
                            self.regs[f"{mm.group(1)}{j}"] = typ
                    else:
                        self.regs[n] = typ
                continue
            v = _VAR.match(s)
            if v:
                space, rest = v.groups()
                align, typ, vname, count, _ = _parse_var(rest)
                size = SIZE[typ] * (count if count and count > 0 else 1)
                if space == "shared":
                    self._add_shared(vname, size, align, count == -1)
                elif space == "local":
                    self.local_size = -(-self.local_size // align) * align
                    self.local[vname] = self.local_size
                    self.local_size += size
                else:
                    raise PtxError(f"{self.name}: a {space} variable inside a kernel ({s!r})")
                continue
            if s.startswith(".param"):
                align, typ, vname, count, _ = _parse_var(s[len(".param"):])
                self.callparams[vname] = SIZE[typ] * (count if count and count > 0 else 1)
                continue
            if s.startswith(".") or s.startswith("//"):
                continue  # .pragma, .maxntid and such
            self.stmts.append((label, s))
            label = None
        if label is not None:
            self.stmts.append((label, ""))

    # -- pointer provenance: which kernel argument's allocation an address register derives from --------------
    def _provenance(self) -> dict[str, object]:
        defs: dict[str, list] = {}
        for _, s in self.stmts:
            if not s:
                continue
            pred, op, mods, ops = self._split(s)
            if not ops or op in ("st", "bra", "red", "bar", "barrier", "call", "ret", "exit"):
                continue
            dst = ops[0]
            if dst.startswith("{") or dst not in self.regs or SIZE.get(self.regs[dst], 0) != 8:
                continue
            if op == "ld" and "param" in mods:
                sym = ops[1].strip("[]").split("+")[0].strip()
                defs.setdefault(dst, []).append(("p", self.pindex[sym]) if sym in self.pindex else "any")
            elif op in ("ld", "atom", "mov") and (op != "mov" or ops[1] not in self.regs):
                defs.setdefault(dst, []).append("any" if op != "mov" or ops[1].lstrip("-")[:1].isdigit() is False
                                                else "off")
            else:
                defs.setdefault(dst, []).append(tuple(o for o in ops[1:] if o in self.regs))
        base: dict[str, object] = {}
        for _ in range(8):
            changed = False
            for reg, ds in defs.items():
                found: set = set()
                for d in ds:
                    if d == "any" or d == "off" or (isinstance(d, tuple) and d and d[0] == "p"):
                        found.add(d)
                    else:
                        pts = {base.get(o) for o in d} - {None, "off"}
                        found |= pts or {"off"}
                found.discard("off") if len(found) > 1 else None
                b = found.pop() if len(found) == 1 else "any"
                if base.get(reg) != b:
                    base[reg] = b
                    changed = True
            if not changed:
                break
        return base

    @staticmethod
    def _split(s: str):
        pred = None
        m = re.match(r"^@(!?)([%\w]+)\s+(.*)$", s)
        if m:
            pred = (m.group(1) == "!", m.group(2))
            s = m.group(3)
        parts = s.split(None, 1)
        head = parts[0].split(".")
        return pred, head[0], head[1:], _split_operands(parts[1]) if len(parts) > 1 else []

    # -- operands --------------------------------------------------------------------------------------------
    def reg(self, r: str) -> str:
        return f"T->{_cname(r)}" if self.coroutine else _cname(r)

    def cp(self, name: str) -> str:
        """A call argument's storage (``.param`` declared in the body)."""
        return f"T->cp_{_cname(name)}" if self.coroutine else f"cp_{_cname(name)}"

    def special(self, tok: str) -> str | None:
        axes = {"x": 0, "y": 1, "z": 2}
        m = re.fullmatch(r"%(tid|ntid|ctaid|nctaid)\.([xyz])", tok)
        if m:
            kind, ax = m.group(1), axes[m.group(2)]
            return {"tid": f"TID{ax}", "ntid": f"NTID{ax}", "ctaid": f"CTA{ax}", "nctaid": f"NCTA{ax}"}[kind]
        return {"%laneid": "LANE", "%warpid": "(LIN >> 5)", "%nwarpid": "((NTHR + 31) >> 5)",
                "%clock": "(uint32_t)rx_now()", "%clock64": "rx_now()", "%globaltimer": "rx_now()",
                "%globaltimer_lo": "(uint32_t)rx_now()", "%globaltimer_hi": "(uint32_t)(rx_now() >> 32)",
                "%dynamic_smem_size": "(uint32_t)SHDYN", "%smid": "0u", "%nsmid": "1u",
                "%lanemask_eq": "(1u << LANE)", "%lanemask_lt": "((1u << LANE) - 1u)",
                "%lanemask_le": "((2u << LANE) - 1u)", "%lanemask_gt": "(~((2u << LANE) - 1u))",
                "%lanemask_ge": "(~((1u << LANE) - 1u))",
                "%total_smem_size": "(uint32_t)SHSIZE"}.get(tok)

    def symbol(self, tok: str) -> str | None:
        """A symbol's address: shared and local ones in their windows, everything else a real pointer."""
        if tok in self.shared:
            return f"((uint64_t){self.shared[tok]}u)"
        if tok in self.dynamic:
            return f"((uint64_t){-(-self.shared_size // 16) * 16}u)"
        if tok in self.local:
            return f"((uint64_t){self.local[tok]}u)"
        if tok in self.pindex:
            return f"((uint64_t)(PARAMS + {self.params[self.pindex[tok]].offset}))"
        if tok in self.globals:
            return f"GLOB({self.globals[tok]})"
        if tok in self.callparams:
            return f"((uint64_t){self.cp(tok)})"
        return None

    def val(self, tok: str, t: str) -> str:
        """The C expression reading operand ``tok`` as PTX type ``t``."""
        tok = tok.strip()
        ct = CTYPE.get(t, UNSIGNED.get(SIZE.get(t, 4), "uint32_t"))
        if tok.startswith("!"):
            return f"(!{self.val(tok[1:], 'pred')})"
        if tok in self.regs:
            k = self.regs[tok]
            r = self.reg(tok)
            if t == k or (t == "pred") or (k not in ("f32", "f64") and t not in ("f32", "f64") and
                                            SIZE.get(t) == SIZE.get(k) and ct == CTYPE[k]):
                return r
            if k == "f32":
                return f"(({ct})f2u({r}))" if t != "f64" else f"((double){r})"
            if k == "f64":
                return f"(({ct})d2u({r}))" if t != "f32" else f"((float){r})"
            if t == "f32":
                return f"u2f((uint32_t){r})"
            if t == "f64":
                return f"u2d((uint64_t){r})"
            if k == "pred":
                return f"(({ct}){r})"
            return f"(({ct}){r})"
        sp = self.special(tok)
        if sp is not None:
            return f"(({ct}){sp})"
        sym = self.symbol(tok.split("+")[0].strip())
        if sym is not None:
            extra = tok.split("+", 1)[1] if "+" in tok else "0"
            return f"(({ct})({sym} + {int(_imm_value(extra))}))"
        if _is_imm(tok):
            v = _imm_value(tok)
            if t == "f32":
                import struct
                return f"u2f(0x{struct.unpack('<I', struct.pack('<f', float(v)))[0]:08x}u)"
            if t == "f64":
                import struct
                return f"u2d(0x{struct.unpack('<Q', struct.pack('<d', float(v)))[0]:016x}ull)"
            if t in ("f16", "bf16") and isinstance(v, float):
                return f"f2h({float(v)!r}f)" if t == "f16" else f"f2bh({float(v)!r}f)"
            iv = int(v) & ((1 << (8 * SIZE.get(t, 8))) - 1)
            return f"(({ct})0x{iv:x}ull)"
        raise PtxError(f"{self.name}: cannot read the operand {tok!r}")

    def put(self, tok: str, t: str, expr: str) -> str:
        """The C statement writing ``expr`` (of PTX type ``t``) to register ``tok``."""
        tok = tok.strip()
        if tok == "_":
            return f"(void)({expr});"
        if tok not in self.regs:
            raise PtxError(f"{self.name}: {tok!r} is not a register")
        k = self.regs[tok]
        r = self.reg(tok)
        return self._put(r, k, t, expr)

    @staticmethod
    def _put(r: str, k: str, t: str, expr: str) -> str:
        if k == "pred":
            return f"{r} = ({expr}) != 0;"
        if k == t or (k not in ("f32", "f64") and t not in ("f32", "f64")):
            return f"{r} = ({CTYPE[k]})({expr});"
        if k == "f32":
            return f"{r} = u2f((uint32_t)({expr}));" if t != "f64" else f"{r} = (float)({expr});"
        if k == "f64":
            return f"{r} = u2d((uint64_t)({expr}));" if t != "f32" else f"{r} = (double)({expr});"
        if t == "f32":
            return f"{r} = ({CTYPE[k]})f2u({expr});"
        return f"{r} = ({CTYPE[k]})d2u({expr});"

    # -- memory ----------------------------------------------------------------------------------------------
    def address(self, tok: str, space: str, size: int, write: bool, i: int) -> tuple[str, str]:
        """(checks, pointer expression) of ``[a+off]`` in ``space``."""
        inner = tok.strip()[1:-1].strip()
        m = re.match(r"^([^+\-]+?)\s*(?:([+-])\s*(-?[\w]+))?$", inner)
        if not m:
            raise PtxError(f"{self.name}: cannot read the address {tok!r}")
        base, sign, off = m.group(1).strip(), m.group(2), m.group(3)
        o = int(_imm_value(off)) * (-1 if sign == "-" else 1) if off else 0
        if base in self.regs:
            a = f"((uint64_t){self.val(base, 'u64' if SIZE.get(self.regs[base], 8) == 8 else 'u32')} + {o}ull)"
            prov = self.bases.get(base, "any")
        else:
            sym = self.symbol(base)
            if sym is None:
                if _is_imm(base):
                    sym = f"((uint64_t){int(_imm_value(base))}ull)"
                else:
                    raise PtxError(f"{self.name}: unknown symbol {base!r} in {tok!r}")
            a = f"({sym} + {o}ull)"
            prov = "sym"
        w = int(write)
        if space == "shared":
            ck = f"if ({a} + {size} > SHSIZE) FAULT(-2, {a}, {size}, {w}, {i});"
            return ck, f"(SH + {a})"
        if space == "local":
            ck = f"if ({a} + {size} > {max(self.local_size, 1)}u) FAULT(-3, {a}, {size}, {w}, {i});"
            return ck, f"(LD + {a})"
        if space in ("param",) or prov == "sym" and base not in self.regs and space != "generic":
            return "", f"((unsigned char*){a})"
        if isinstance(prov, tuple) and prov[0] == "p":
            j = prov[1]
            ck = (f"{{ uint64_t a_ = {a}; if (a_ - LO({j}) > SPAN({j}) || a_ - LO({j}) + {size} > SPAN({j})) "
                  f"FAULT({j}, a_, {size}, {w}, {i}); }}")
        else:
            ck = (f"{{ uint64_t a_ = {a}; if (STRAY(a_, {size}, {max(self.local_size, 1)}u)) "
                  f"FAULT(-1, a_, {size}, {w}, {i}); }}")
        return ck, f"((unsigned char*){a})"

    # -- instructions ----------------------------------------------------------------------------------------
    def emit(self) -> tuple[Kernel, str]:
        lines: list[str] = []
        for i, (label, s) in enumerate(self.stmts):
            if label:
                lines.append(f"L_{_cname(label)}: ;")
            if s:
                try:
                    lines.append(self.insn(s, i))
                except PtxError:
                    raise
                except Exception as e:
                    raise PtxError(f"{self.name}: cannot translate `{s}` ({type(e).__name__}: {e})") from e
        kernel = Kernel(self.name, tuple(self.params), self.coroutine, self.shared_size,
                        tuple(s for _, s in self.stmts))
        return kernel, self._wrap(lines)

    def _wrap(self, lines: list[str]) -> str:
        fn = self.fn
        decls = " ".join(f"{CTYPE.get(t, UNSIGNED[SIZE[t]])} {_cname(r)};" for r, t in self.regs.items())
        cps = "".join(f"uint64_t cp_{_cname(n)}[{-(-s // 8)}];" for n, s in self.callparams.items())
        local = max(self.local_size, 1)
        static = -(-self.shared_size // 16) * 16
        body = "\n      ".join(lines)
        np_ = max(len(self.params), 1)
        psize = max(max((p.offset + p.size for p in self.params), default=0), 1)
        # both modes name what an instruction reads through these macros: locals of the block loop (a thread
        # start to end), or fields of the thread's struct (a coroutine)
        common = ("#define NTID0 L->block[0]\n#define NTID1 L->block[1]\n#define NTID2 L->block[2]\n"
                  "#define NCTA0 L->grid[0]\n#define NCTA1 L->grid[1]\n#define NCTA2 L->grid[2]\n"
                  "#define SHDYN L->shared_dyn\n#define GLOB(i) L->globals[i]\n")
        undef = ("#undef NTID0\n#undef NTID1\n#undef NTID2\n#undef NCTA0\n#undef NCTA1\n#undef NCTA2\n#undef SHDYN\n"
                 "#undef GLOB\n#undef TID0\n#undef TID1\n#undef TID2\n#undef LIN\n#undef LANE\n#undef LD\n#undef CTA0\n"
                 "#undef CTA1\n#undef CTA2\n#undef SH\n#undef SHSIZE\n#undef NTHR\n#undef PARAMS\n#undef LO\n"
                 "#undef SPAN\n#undef FAULT\n#undef STRAY\n#undef RET\n")
        if not self.coroutine:
            depot = (f"unsigned char depot_[{local}] __attribute__((aligned(16)));" if self.local_size
                     else "unsigned char* depot_ = 0;")
            return f"""
{common.replace("L->block[0]", "b0_").replace("L->block[1]", "b1_").replace("L->block[2]", "b2_")}#define TID0 tx
#define TID1 ty
#define TID2 tz
#define LIN lin
#define LANE (lin & 31u)
#define LD depot_
#define CTA0 c0
#define CTA1 c1
#define CTA2 c2
#define SH sh_
#define SHSIZE shsize_
#define NTHR nthr_
#define PARAMS params_
#define LO(j) lo_[j]
#define SPAN(j) span_[j]
#define FAULT(arg, a, n, w, i) {{ rx_fault_at(L, c0, c1, c2, tx, ty, tz, arg, a, n, w, i); goto fault_; }}
#define STRAY(a, n, ldsize) rx_stray_at(L, sh_, shsize_, (unsigned char*)LD, ldsize, a, n)
#define RET goto done_
int {fn}(RxLaunch* L) {{
  const int64_t nblocks = (int64_t)L->grid[0] * L->grid[1] * L->grid[2];
  int failed = 0;
  int workers = (nblocks > 1 && nblocks * (int64_t)L->block[0] * L->block[1] * L->block[2] >= 65536) ? L->workers : 1;
  #pragma omp parallel num_threads(workers > 0 ? workers : 1)
  {{
  /* each host thread's own copies: nothing a kernel's store may reach, so the compiler keeps them in registers */
  unsigned char params_[{psize}] __attribute__((aligned(16))); memcpy(params_, L->params, {psize});
  uint64_t lo_[{np_}], span_[{np_}]; memcpy(lo_, L->lo, sizeof lo_); memcpy(span_, L->span, sizeof span_);
  const uint64_t shsize_ = {static}u + L->shared_dyn;
  const uint32_t nthr_ = L->block[0] * L->block[1] * L->block[2];
  const uint32_t b0_ = L->block[0], b1_ = L->block[1], b2_ = L->block[2];
  unsigned char* sh_ = (unsigned char*)calloc(1, shsize_ + 16);
  #pragma omp for schedule(static)
  for (int64_t b = 0; b < nblocks; b++) {{
    if (__atomic_load_n(&failed, __ATOMIC_RELAXED)) continue;
    const uint32_t c0 = (uint32_t)(b % L->grid[0]), c1 = (uint32_t)((b / L->grid[0]) % L->grid[1]);
    const uint32_t c2 = (uint32_t)(b / ((int64_t)L->grid[0] * L->grid[1]));
    uint32_t lin = 0;
    for (uint32_t tz = 0; tz < b2_; tz++) for (uint32_t ty = 0; ty < b1_; ty++)
    for (uint32_t tx = 0; tx < b0_; tx++, lin++) {{
      {decls} {cps} {depot}
      {body}
      goto done_;
      fault_: __atomic_store_n(&failed, 1, __ATOMIC_RELAXED); goto block_;
      done_: ;
    }}
    block_: ;
  }}
  free(sh_);
  }}
  return failed ? -1 : 0;
}}
{undef}"""
        resumes = "".join(f"case {k}: goto R_{k};" for k in range(1, self.resume + 1))
        return f"""
{common}#define TID0 TH->tid[0]
#define TID1 TH->tid[1]
#define TID2 TH->tid[2]
#define LIN TH->lin
#define LANE TH->lane
#define LD TH->ld
#define CTA0 B->ctaid[0]
#define CTA1 B->ctaid[1]
#define CTA2 B->ctaid[2]
#define SH B->sh
#define SHSIZE B->shsize
#define NTHR B->nthreads
#define PARAMS L->params
#define LO(j) L->lo[j]
#define SPAN(j) L->span[j]
#define FAULT(arg, a, n, w, i) {{ rx_fault_at(L, CTA0, CTA1, CTA2, TID0, TID1, TID2, arg, a, n, w, i); return -1; }}
#define STRAY(a, n, ldsize) rx_stray_at(L, B->sh, B->shsize, TH->ld, ldsize, a, n)
#define RET return 0
typedef struct {{ RxThr th; {decls} {cps} unsigned char depot[{local}] __attribute__((aligned(16))); }} {fn}_regs;
static int {fn}_step(RxLaunch* L, const RxBlk* B, {fn}_regs* T) {{
  RxThr* TH = &T->th;
  switch (TH->resume) {{ {resumes} default: break; }}
  {body}
  return 0;
}}
int {fn}(RxLaunch* L) {{
  RxBlk blk; RxBlk* B = &blk; B->shsize = {static}u + L->shared_dyn;
  uint32_t n = L->block[0] * L->block[1] * L->block[2]; B->nthreads = n;
  B->sh = (unsigned char*)calloc(1, B->shsize + 16);
  {fn}_regs* R = ({fn}_regs*)calloc(n, sizeof({fn}_regs)); uint8_t* st = (uint8_t*)calloc(n, 1);
  uint64_t* x = (uint64_t*)calloc(2 * (size_t)n, 8); B->xchg[0] = x; B->xchg[1] = x + n;
  int rc = 0;
  for (uint32_t cz = 0; cz < L->grid[2] && !rc; cz++) for (uint32_t cy = 0; cy < L->grid[1] && !rc; cy++)
  for (uint32_t cx = 0; cx < L->grid[0] && !rc; cx++) {{
    B->ctaid[0] = cx; B->ctaid[1] = cy; B->ctaid[2] = cz;
    memset(R, 0, n * sizeof({fn}_regs)); memset(st, 0, n); memset(x, 0, 16 * (size_t)n);
    for (uint32_t t = 0; t < n; t++) {{ RxThr* th = &R[t].th; th->tid[0] = t % L->block[0];
      th->tid[1] = (t / L->block[0]) % L->block[1]; th->tid[2] = t / (L->block[0] * L->block[1]); th->lin = t;
      th->lane = t & 31; th->ld = R[t].depot; }}
    for (;;) {{
      for (uint32_t t = 0; t < n; t++) if (st[t] == 0) {{
        int r = {fn}_step(L, B, &R[t]);
        if (r < 0) {{ rc = -1; break; }}
        st[t] = r == 0 ? 3 : (uint8_t)r;
        if (st[t] == 3) {{ x[t] = 0; x[n + t] = 0; }}
      }}
      if (rc) break;
      int woke = 0;
      for (uint32_t w = 0; w < n; w += 32) {{
        uint32_t end = w + 32 < n ? w + 32 : n; int at = 0;
        for (uint32_t t = w; t < end; t++) at |= st[t] == 2;
        if (at) {{ for (uint32_t t = w; t < end; t++) if (st[t] == 2) st[t] = 0; woke = 1; }}
      }}
      if (woke) continue;
      for (uint32_t t = 0; t < n; t++) if (st[t] == 1) {{ st[t] = 0; woke = 1; }}
      if (!woke) break;
    }}
  }}
  free(R); free(st); free(x); free(B->sh);
  return rc;
}}
{undef}"""

    def _yield(self, code: int, before: str = "", after: str = "") -> str:
        self.resume += 1
        k = self.resume
        return f"{before} TH->resume = {k}; return {code}; R_{k}: ; {after}"

    def insn(self, s: str, i: int) -> str:
        pred, op, mods, ops = self._split(s)
        c = self._insn(op, mods, ops, i, s)
        if pred is not None:
            neg, p = pred
            cond = self.val(p, "pred")
            c = f"if ({'!' if neg else ''}{cond}) {{ {c} }}"
        return c

    def _type(self, mods: list[str], s: str) -> str:
        ts = [m for m in mods if m in _TYPES]
        if not ts:
            raise PtxError(f"{self.name}: no type in `{s}`")
        return ts[-1]

    def _insn(self, op: str, mods: list[str], ops: list[str], i: int, s: str) -> str:  # noqa: C901
        m = set(mods)
        if op in ("bra", "brx"):
            return f"goto L_{_cname(ops[0])};"
        if op in ("ret", "exit"):
            return "RET;"
        if op in ("membar", "fence", "prefetch", "prefetchu", "pmevent", "trap", "nanosleep", "discard",
                  "griddepcontrol"):
            if op == "trap":
                return f"FAULT(-4, 0, 0, 0, {i});"
            return ";"
        if op == "ld" or op == "ldu":
            return self._ld(mods, ops, i)
        if op == "st":
            return self._st(mods, ops, i)
        if op in ("atom", "red"):
            return self._atom(op, mods, ops, i)
        if op == "mov":
            return self._mov(mods, ops)
        if op == "cvta":
            t = self._type(mods, s)
            a = self.val(ops[1], t)
            space = next((x for x in mods if x in _SPACES), "global")
            if space == "shared":
                e = f"({a} - (uint64_t)SH)" if "to" in m else f"((uint64_t)SH + {a})"
            elif space == "local":
                e = f"({a} - (uint64_t)LD)" if "to" in m else f"((uint64_t)LD + {a})"
            else:
                e = a
            return self.put(ops[0], t, e)
        if op == "cvt":
            return self._cvt(mods, ops, s)
        if op == "setp":
            return self._setp(mods, ops, s)
        if op == "set":
            return self._set(mods, ops, s)
        if op == "selp":
            t = self._type(mods, s)
            return self.put(ops[0], t, f"({self.val(ops[3], 'pred')} ? {self.val(ops[1], t)} : {self.val(ops[2], t)})")
        if op == "slct":
            ts = [x for x in mods if x in _TYPES]
            t, ct = ts[0], ts[1]
            return self.put(ops[0], t, f"({self.val(ops[3], ct)} >= 0 ? {self.val(ops[1], t)} : {self.val(ops[2], t)})")
        if op in ("bar", "barrier"):
            if "warp" in m:
                return self._yield(2)
            if "arrive" in m or "red" in m:
                raise PtxError(f"{self.name}: `{s}` (barrier arrive/reduce) is not supported on the CPU device yet")
            return self._yield(1)
        if op == "shfl":
            return self._shfl(mods, ops, s)
        if op == "vote":
            return self._vote(mods, ops, s)
        if op == "activemask":
            return self.put(ops[0], "b32", "(NTHR - (LIN & ~31u) >= 32 ? 0xffffffffu : "
                                          "((1u << (NTHR - (LIN & ~31u))) - 1u))")
        if op == "call":
            return self._call(ops, s)
        return self._arith(op, mods, ops, s)

    def _vec(self, tok: str) -> list[str]:
        tok = tok.strip()
        if tok.startswith("{"):
            return [x.strip() for x in tok[1:-1].split(",")]
        return [tok]

    def _ld(self, mods, ops, i):
        t = self._type(mods, " ".join(mods))
        space = next((x for x in mods if x in _SPACES), "generic")
        dsts = self._vec(ops[0])
        size = SIZE[t]
        ck, ptr = self.address(ops[1], space, size * len(dsts), False, i)
        ct = CTYPE.get(t, UNSIGNED.get(size))
        out = [ck, f"{{ unsigned char* p_ = {ptr};"]
        for j, d in enumerate(dsts):
            if t == "b128":
                raise PtxError(f"{self.name}: 128-bit loads are not supported on the CPU device yet")
            out.append(f"{{ {ct} v_; memcpy(&v_, p_ + {j * size}, {size}); {self.put(d, t, 'v_')} }}")
        out.append("}")
        return " ".join(out)

    def _st(self, mods, ops, i):
        t = self._type(mods, " ".join(mods))
        space = next((x for x in mods if x in _SPACES), "generic")
        srcs = self._vec(ops[1])
        size = SIZE[t]
        ck, ptr = self.address(ops[0], space, size * len(srcs), True, i)
        ct = CTYPE.get(t, UNSIGNED.get(size))
        out = [ck, f"{{ unsigned char* p_ = {ptr};"]
        for j, v in enumerate(srcs):
            out.append(f"{{ {ct} v_ = {self.val(v, t)}; memcpy(p_ + {j * size}, &v_, {size}); }}")
        out.append("}")
        return " ".join(out)

    def _atom(self, op, mods, ops, i):
        t = self._type(mods, " ".join(mods))
        space = next((x for x in mods if x in _SPACES), "generic")
        kinds = {"add", "min", "max", "inc", "dec", "and", "or", "xor", "exch", "cas"}
        k = next(x for x in mods if x in kinds)
        if op == "red":
            ops = ["_"] + ops
        size = SIZE[t]
        ct = CTYPE[t]
        ck, ptr = self.address(ops[1], space, size, True, i)
        b = self.val(ops[2], t)
        new = {"add": f"(({ct})(old + b_))" if t[0] == "f" else f"(({ct})((uint64_t)old + (uint64_t)b_))",
               "min": "(b_ < old ? b_ : old)", "max": "(b_ > old ? b_ : old)",
               "inc": f"((old >= b_) ? ({ct})0 : ({ct})(old + 1))",
               "dec": f"((old == 0 || old > b_) ? b_ : ({ct})(old - 1))",
               "and": "(old & b_)", "or": "(old | b_)", "xor": "(old ^ b_)", "exch": "b_",
               "cas": f"(old == b_ ? {self.val(ops[3], t) if len(ops) > 3 else 'b_'} : old)"}[k]
        if t[0] == "f" and k in ("min", "max"):
            new = f"f{k}{'f' if t == 'f32' else ''}(old, b_)"
        put = self.put(ops[0], t, "old") if ops[0] != "_" else ""
        # a compare-and-swap loop on the bits: atomic between the host threads that run blocks at once
        ut = UNSIGNED[size]
        return (f"{ck} {{ {ut}* q_ = ({ut}*){ptr}; {ct} b_ = {b}; {ut} ob_ = __atomic_load_n(q_, __ATOMIC_RELAXED); "
                f"{ct} old; for (;;) {{ memcpy(&old, &ob_, {size}); {ct} n_ = {new}; {ut} nb_; "
                f"memcpy(&nb_, &n_, {size}); "
                f"if (__atomic_compare_exchange_n(q_, &ob_, nb_, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) break; }} "
                f"{put} }}")

    def _mov(self, mods, ops):
        t = self._type(mods, " ".join(mods))
        d, a = ops[0], ops[1]
        if a.startswith("{"):  # pack
            parts = self._vec(a)
            w = SIZE[t] // len(parts)
            ut = UNSIGNED[w]
            expr = " | ".join(f"((({UNSIGNED[SIZE[t]]}){self.val(p, 'b' + str(8 * w))}) << {8 * w * j})"
                              for j, p in enumerate(parts))
            return self.put(d, "b" + str(8 * SIZE[t]), f"({expr})") if ut else ""
        if d.startswith("{"):  # unpack
            parts = self._vec(d)
            w = SIZE[t] // len(parts)
            src = self.val(a, "b" + str(8 * SIZE[t]))
            return " ".join(self.put(p, "b" + str(8 * w), f"({UNSIGNED[w]})({src} >> {8 * w * j})")
                            for j, p in enumerate(parts) if p != "_")
        return self.put(d, t, self.val(a, t))

    def _cvt(self, mods, ops, s):
        ts = [x for x in mods if x in _TYPES]
        dt, at = ts[0], ts[1]
        rnd = next((x for x in mods if x in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi", "rna", "rs")), None)
        sat = "sat" in mods
        a = self.val(ops[1], at)
        fl = {"f32", "f64", "f16", "bf16"}
        if at == "f16":
            a, at = f"h2f({a})", "f32"
        elif at == "bf16":
            a, at = f"bh2f({a})", "f32"
        if dt in ("f16", "bf16"):
            e = f"{'f2h' if dt == 'f16' else 'f2bh'}((float)({a}))"
            if sat:
                e = f"{'f2h' if dt == 'f16' else 'f2bh'}(satf((float)({a})))"
            return self.put(ops[0], dt, e)
        if dt in fl and at in fl:
            fn = {"rni": "rint", "rzi": "trunc", "rmi": "floor", "rpi": "ceil"}.get(rnd or "")
            f = "f" if dt == "f32" else ""
            e = f"({CTYPE[dt]})({a})"
            if fn:
                e = f"{fn}{f}({e})" if at == dt else f"({CTYPE[dt]}){fn}({a})"
            if sat:
                e = f"sat{'f' if dt == 'f32' else 'd'}({e})"
            return self.put(ops[0], dt, e)
        if dt in fl:  # int -> float
            e = f"({CTYPE[dt]})({a})"
            if sat:
                e = f"sat{'f' if dt == 'f32' else 'd'}({e})"
            return self.put(ops[0], dt, e)
        if at in fl:  # float -> int: rounded, then saturated as the GPU does
            fn = {"rni": "rint", "rzi": "trunc", "rmi": "floor", "rpi": "ceil"}.get(rnd or "rzi", "trunc")
            x = f"{fn}((double)({a}))"
            size = SIZE[dt]
            if dt[0] == "s":
                e = (f"sat_s64({x})" if size == 8 else
                     f"sat_s({x}, {-(1 << (8 * size - 1))}.0, {(1 << (8 * size - 1)) - 1}.0)")
            else:
                e = f"sat_u64({x})" if size == 8 else f"sat_u({x}, {(1 << (8 * size)) - 1}.0)"
            return self.put(ops[0], dt, f"({CTYPE[dt]})({e})")
        # int -> int: read as the source type (sign), then wrap or saturate to the destination's
        if sat:
            size = SIZE[dt]
            lo = -(1 << (8 * size - 1)) if dt[0] == "s" else 0
            hi = (1 << (8 * size - 1)) - 1 if dt[0] == "s" else (1 << (8 * size)) - 1
            e = f"({CTYPE[dt]})((int64_t)({a}) < {lo}ll ? {lo}ll : ((int64_t)({a}) > {hi}ll ? {hi}ll : (int64_t)({a})))"
            return self.put(ops[0], dt, e)
        return self.put(ops[0], dt, f"({CTYPE[dt]})({a})")

    _CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "lo": "<", "ls": "<=",
            "hi": ">", "hs": ">="}

    def _compare(self, cmp: str, t: str, a: str, b: str) -> str:
        if t[0] == "f":
            nan = f"(isnan({a}) || isnan({b}))"
            if cmp == "num":
                return f"(!{nan})"
            if cmp == "nan":
                return nan
            if cmp.endswith("u") and cmp[:-1] in self._CMP:
                return f"({nan} || ({a} {self._CMP[cmp[:-1]]} {b}))"
            if cmp == "ne":
                return f"(!{nan} && ({a} != {b}))"
            return f"({a} {self._CMP[cmp]} {b})"
        return f"({a} {self._CMP[cmp]} {b})"

    def _setp(self, mods, ops, s):
        t = self._type(mods, s)
        cmp = mods[0]
        boolop = next((x for x in mods[1:] if x in ("and", "or", "xor")), None)
        a, b = self.val(ops[1], t), self.val(ops[2], t)
        if t in ("f16", "bf16"):
            a, b = (f"h2f({a})", f"h2f({b})") if t == "f16" else (f"bh2f({a})", f"bh2f({b})")
            t = "f32"
        e = self._compare(cmp, t, a, b)
        dst = ops[0].split("|")
        cop = {"and": "&&", "or": "||", "xor": "!="}
        if boolop:
            c = self.val(ops[3], "pred")
            first = f"(({e}) {cop[boolop]} ({c}))"
            second = f"((!({e})) {cop[boolop]} ({c}))"
        else:
            first, second = e, f"(!{e})"
        out = f"{{ int c_ = {first}; int d_ = {second}; {self.put(dst[0].strip(), 'pred', 'c_')}"
        if len(dst) > 1:
            out += " " + self.put(dst[1].strip(), "pred", "d_")
        return out + " (void)d_; }"

    def _set(self, mods, ops, s):
        ts = [x for x in mods if x in _TYPES]
        dt, st = ts[0], ts[1]
        e = self._compare(mods[0], st, self.val(ops[1], st), self.val(ops[2], st))
        if len(ops) > 3:
            boolop = next(x for x in mods[1:] if x in ("and", "or", "xor"))
            c = {"and": "&&", "or": "||", "xor": "!="}[boolop]
            e = f"(({e}) {c} ({self.val(ops[3], 'pred')}))"
        true = "1.0f" if dt == "f32" else f"({CTYPE[dt]})~0ull"
        return self.put(ops[0], dt, f"({e} ? {true} : ({CTYPE[dt]})0)")

    def _shfl(self, mods, ops, s):
        mode = next(x for x in mods if x in ("up", "down", "bfly", "idx"))
        dst = ops[0].split("|")
        a = self.val(ops[1], "b32")
        before = f"B->xchg[TH->wpar][TH->lin] = {a};"
        b, c = self.val(ops[2], "u32"), self.val(ops[3], "u32")
        j = {"up": "int32_t j_ = (int32_t)lane_ - (int32_t)bv_; int p_ = j_ >= (int32_t)max_;",
             "down": "int32_t j_ = (int32_t)lane_ + (int32_t)bv_; int p_ = j_ <= (int32_t)max_;",
             "bfly": "int32_t j_ = (int32_t)(lane_ ^ bv_); int p_ = j_ <= (int32_t)max_;",
             "idx": "int32_t j_ = (int32_t)(min_ | (bv_ & ~mask_)); int p_ = j_ <= (int32_t)max_;"}[mode]
        after = (f"{{ uint32_t lane_ = TH->lane, bv_ = {b} & 31u, cv_ = {c}; uint32_t mask_ = (cv_ >> 8) & 31u, "
                 f"cl_ = cv_ & 31u; uint32_t max_ = (lane_ & mask_) | (cl_ & ~mask_), min_ = lane_ & mask_; "
                 f"(void)min_; {j} if (!p_) j_ = (int32_t)lane_; uint32_t src_ = (TH->lin & ~31u) + (uint32_t)j_; "
                 f"uint32_t v_ = (uint32_t)(src_ < B->nthreads ? B->xchg[TH->wpar][src_] : B->xchg[TH->wpar][TH->lin]);"
                 f" TH->wpar ^= 1; {self.put(dst[0].strip(), 'b32', 'v_')} "
                 + (self.put(dst[1].strip(), "pred", "p_") if len(dst) > 1 else "") + " }")
        return self._yield(2, before, after)

    def _vote(self, mods, ops, s):
        mode = next(x for x in mods if x in ("all", "any", "uni", "ballot"))
        a = self.val(ops[1], "pred")
        before = f"B->xchg[TH->wpar][TH->lin] = 2u | ({a} ? 1u : 0u);"
        gather = ("uint32_t w0_ = TH->lin & ~31u, bal_ = 0, live_ = 0; for (uint32_t l_ = 0; l_ < 32 && w0_ + l_ < "
                  "B->nthreads; l_++) { uint64_t x_ = B->xchg[TH->wpar][w0_ + l_]; if (x_ & 2) live_ |= 1u << l_; "
                  "if (x_ & 1) bal_ |= 1u << l_; } TH->wpar ^= 1;")
        res = {"ballot": ("b32", "bal_"), "any": ("pred", "bal_ != 0"), "all": ("pred", "bal_ == live_"),
               "uni": ("pred", "(bal_ == 0 || bal_ == live_)")}[mode]
        return self._yield(2, before, f"{{ {gather} {self.put(ops[0], res[0], res[1])} }}")

    def _call(self, ops, s):
        # call{.uni} (ret), name, (args);  or  call name, (args);
        names = [o for o in ops if not o.startswith("(")]
        args = next((o for o in reversed(ops) if o.startswith("(")), "()")
        fn = names[0].strip()
        argl = [x.strip() for x in args.strip("()").split(",") if x.strip()]
        if fn == "cudaGraphSetConditional":
            h, v = (self.cp(x) for x in argl)
            return f"L->set_cond(L->ctx, {h}[0], (uint32_t){v}[0]);"
        raise PtxError(f"{self.name}: it calls {fn}, which the CPU device cannot run yet")

    def _arith(self, op, mods, ops, s):  # noqa: C901
        m = set(mods)
        t = self._type(mods, s)
        size = SIZE[t]
        ct = CTYPE[t]
        ut = UNSIGNED.get(size, "uint64_t")
        fl = t in ("f32", "f64")
        f = "f" if t == "f32" else ""
        if t in ("f16", "bf16", "f16x2", "bf16x2"):
            raise PtxError(f"{self.name}: half-precision arithmetic (`{s}`) is not supported on the CPU device yet")
        v = [self.val(o, t) for o in ops[1:]] if op not in ("shl", "shr", "bfe", "bfi", "mul", "mad", "prmt",
                                                             "popc", "clz", "bfind", "brev", "testp", "copysign",
                                                             "lop3", "rem", "div") else []
        d = ops[0]
        if op in ("add", "sub"):
            sym = "+" if op == "add" else "-"
            if fl:
                e = f"({v[0]} {sym} {v[1]})"
                if "sat" in m:
                    e = f"sat{'f' if f else 'd'}({e})"
                return self.put(d, t, e)
            if "sat" in m and t == "s32":
                return self.put(d, t, f"(int32_t)sat_s((double)((int64_t){v[0]} {sym} (int64_t){v[1]}), "
                                      "-2147483648.0, 2147483647.0)")
            return self.put(d, t, f"({ct})(({ut}){v[0]} {sym} ({ut}){v[1]})")
        if op == "mul" or op == "mad":
            wide = "wide" in m
            hi = "hi" in m
            a, b = self.val(ops[1], t), self.val(ops[2], t)
            cterm = ""
            if op == "mad":
                ctype = (("s" if t[0] == "s" else "u") + str(16 * size)) if wide else t
                cterm = self.val(ops[3], ctype)
            if fl:
                e = f"fma{f}({a}, {b}, {cterm})" if op == "mad" else f"({a} * {b})"
                if "sat" in m:
                    e = f"sat{'f' if f else 'd'}({e})"
                return self.put(d, t, e)
            if wide:
                wt = ("int" if t[0] == "s" else "uint") + f"{16 * size}_t"
                e = f"(({wt}){a} * ({wt}){b})"
                if op == "mad":
                    e = f"({wt})((uint{16 * size}_t){e} + (uint{16 * size}_t){cterm})"
                return self.put(d, ("s" if t[0] == "s" else "u") + str(16 * size), e)
            if hi:
                if size == 8:
                    w = "__int128" if t[0] == "s" else "unsigned __int128"
                    e = f"({ct})((({w}){a} * ({w}){b}) >> 64)"
                else:
                    w = ("int" if t[0] == "s" else "uint") + f"{16 * size}_t"
                    e = f"({ct})((({w}){a} * ({w}){b}) >> {8 * size})"
            else:
                e = f"({ct})(({ut}){a} * ({ut}){b})"
            if op == "mad":
                e = f"({ct})(({ut}){e} + ({ut}){cterm})"
            return self.put(d, t, e)
        if op == "fma":
            e = f"fma{f}({v[0]}, {v[1]}, {v[2]})"
            return self.put(d, t, f"sat{'f' if f else 'd'}({e})" if "sat" in m else e)
        if op in ("div", "rem"):
            a, b = self.val(ops[1], t), self.val(ops[2], t)
            if fl:
                return self.put(d, t, f"({a} / {b})")
            fn = (op[:3] + ("s" if t[0] == "s" else "u"))
            return self.put(d, t, f"({ct}){fn}({a}, {b})")
        if op == "neg":
            return self.put(d, t, f"(-{v[0]})" if fl else f"({ct})(0 - ({ut}){v[0]})")
        if op == "abs":
            return self.put(d, t, f"fabs{f}({v[0]})" if fl else f"({ct})({v[0]} < 0 ? 0 - ({ut}){v[0]} : {v[0]})")
        if op in ("min", "max"):
            if fl:
                return self.put(d, t, f"f{op}{f}({v[0]}, {v[1]})")
            cmp = "<" if op == "min" else ">"
            return self.put(d, t, f"({v[0]} {cmp} {v[1]} ? {v[0]} : {v[1]})")
        if op in ("and", "or", "xor"):
            sym = {"and": "&", "or": "|", "xor": "^"}[op]
            if t == "pred":
                sym = {"and": "&&", "or": "||", "xor": "!="}[op]
            return self.put(d, t, f"({v[0]} {sym} {v[1]})")
        if op == "not":
            return self.put(d, t, f"(!{v[0]})" if t == "pred" else f"({ct})~{v[0]}")
        if op == "cnot":
            return self.put(d, t, f"({ct})({v[0]} == 0)")
        if op in ("shl", "shr"):
            a, b = self.val(ops[1], t), self.val(ops[2], "u32")
            w = 8 * size
            if op == "shl":
                return self.put(d, t, f"({b} >= {w}u ? ({ct})0 : ({ct})(({ut}){a} << {b}))")
            if t[0] == "s":
                return self.put(d, t, f"({ct})({a} >> ({b} >= {w}u ? {w - 1}u : {b}))")
            return self.put(d, t, f"({b} >= {w}u ? ({ct})0 : ({ct})({a} >> {b}))")
        if op in ("rcp", "sqrt", "rsqrt", "sin", "cos", "lg2", "ex2", "tanh"):
            x = self.val(ops[1], t)
            e = {"rcp": f"(1.0{f} / {x})" if f else f"(1.0 / {x})", "sqrt": f"sqrt{f}({x})",
                 "rsqrt": f"(1.0{f} / sqrt{f}({x}))" if f else f"(1.0 / sqrt({x}))", "sin": f"sin{f}({x})",
                 "cos": f"cos{f}({x})", "lg2": f"log2{f}({x})", "ex2": f"exp2{f}({x})", "tanh": f"tanh{f}({x})"}[op]
            return self.put(d, t, e)
        if op == "copysign":
            return self.put(d, t, f"copysign{f}({self.val(ops[2], t)}, {self.val(ops[1], t)})")
        if op == "testp":
            x = self.val(ops[1], t)
            kind = mods[0]
            e = {"finite": f"isfinite({x})", "infinite": f"isinf({x})", "number": f"!isnan({x})",
                 "notanumber": f"isnan({x})", "normal": f"isnormal({x})",
                 "subnormal": f"(fpclassify({x}) == FP_SUBNORMAL)"}[kind]
            return self.put(d, "pred", e)
        if op == "popc":
            return self.put(d, "u32", f"(uint32_t)__builtin_popcountll((uint64_t){self.val(ops[1], t)})")
        if op == "clz":
            x = self.val(ops[1], t)
            return self.put(d, "u32", f"({x} ? (uint32_t)__builtin_clz{'ll' if size == 8 else ''}({x}) : "
                                      f"{8 * size}u)")
        if op == "brev":
            return self.put(d, t, f"brev{8 * size}({self.val(ops[1], t)})")
        if op == "bfind":
            return self.put(d, "u32", f"bfind{8 * size}({self.val(ops[1], t)}, {int(t[0] == 's')})")
        if op == "bfe":
            a = self.val(ops[1], t)
            p, n = self.val(ops[2], "u32"), self.val(ops[3], "u32")
            fn = "bfe_s" if t[0] == "s" else "bfe_u"
            return self.put(d, t, f"({ct}){fn}({a}, {p}, {n}, {8 * size})")
        if op == "bfi":
            a, b = self.val(ops[1], t), self.val(ops[2], t)
            p, n = self.val(ops[3], "u32"), self.val(ops[4], "u32")
            return self.put(d, t, f"({ct})bfi({a}, {b}, {p}, {n}, {8 * size})")
        if op == "prmt":
            a, b, c = (self.val(o, "b32") for o in ops[1:4])
            if len(mods) > 1:
                raise PtxError(f"{self.name}: `{s}` (a prmt mode) is not supported on the CPU device yet")
            return self.put(d, "b32", f"prmt({a}, {b}, {c})")
        if op == "lop3":
            a, b, c, lut = (self.val(o, "b32") for o in ops[1:5])
            return self.put(d, "b32", f"lop3({a}, {b}, {c}, {lut})")
        raise PtxError(f"{self.name}: the CPU device cannot run `{s}` yet")
