"""What the PTX translator (``_ptxc``) shares: PTX types as C types, the C every translated module starts with
(the launch record, the helpers), the records it makes, and the small readers of PTX text."""

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
  const uint64_t* lo; const uint64_t* lim;    /* per kernel argument and access size 2^k (5 each): the lowest
                                                 address, and the last offset from it an access may start at */
  const uint64_t* alo; const uint64_t* ahi; int64_t nalloc;  /* every allocation, sorted */
  const uint64_t* globals;                    /* the module's .global/.const variables */
  void* ctx; void (*set_cond)(void* ctx, uint64_t handle, uint32_t value);
  int32_t workers, pad_;                      /* host threads running blocks at once */
  /* out: the first illegal access */
  int32_t fault, fault_arg, fault_write, fault_size, fault_insn; uint64_t fault_addr;
  uint32_t fault_block[3], fault_thread[3];
} RxLaunch;
typedef struct RxBlk { uint32_t ctaid[3]; unsigned char* sh; uint64_t shsize; uint64_t* xchg;
  uint32_t* present; uint32_t nthreads; } RxBlk;  /* xchg: a lane's value at a warp operation; present: per warp,
                                                     the lanes that reached it */
typedef struct RxThr { int32_t resume; uint32_t tid[3], lin, lane; unsigned char* ld; } RxThr;
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
/* a hot update: the arguments from a kernelParams array into the packed buffer; 1 where an 8-byte one changed */
int rx_pack(unsigned char* dst, void* const* args, const uint32_t* offsets, const uint32_t* sizes, int n) {
  int moved = 0;
  for (int i = 0; i < n; i++) { if (sizes[i] == 8 && memcmp(dst + offsets[i], args[i], 8)) moved = 1;
    memcpy(dst + offsets[i], args[i], sizes[i]); }
  return moved; }
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
