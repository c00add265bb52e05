"""The PTX translator's instructions (memory, moves and conversions, comparisons, warp operations, arithmetic) and the
C function each kernel becomes around them: a loop over blocks and threads, or threads as coroutines. A mixin of
``_ptxc._Kernel``, which holds the operands, registers and addresses these read and write."""

from __future__ import annotations

from ._ptxdefs import _SPACES, _TYPES, CTYPE, SIZE, UNSIGNED, PtxError, _cname


class Instructions:
    """One method per kind of PTX instruction, each returning its C statement."""

    name: str
    regs: dict[str, str]
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
                 "#undef LIM\n#undef FAULT\n#undef STRAY\n#undef RET\n")
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
#define LO(j, k) lo_[(j) * 5 + (k)]
#define LIM(j, k) lim_[(j) * 5 + (k)]
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
  uint64_t lo_[{np_ * 5}], lim_[{np_ * 5}]; memcpy(lo_, L->lo, sizeof lo_); memcpy(lim_, L->lim, sizeof lim_);
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
#define LO(j, k) L->lo[(j) * 5 + (k)]
#define LIM(j, k) L->lim[(j) * 5 + (k)]
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
  uint64_t* x = (uint64_t*)calloc((size_t)n, 8); B->xchg = x;
  B->present = (uint32_t*)calloc((size_t)n / 32 + 1, 4);
  int rc = 0;
  for (uint32_t cz = 0; cz < L->grid[2] && !rc; cz++) for (uint32_t cy = 0; cy < L->grid[1] && !rc; cy++)
  for (uint32_t cx = 0; cx < L->grid[0] && !rc; cx++) {{
    B->ctaid[0] = cx; B->ctaid[1] = cy; B->ctaid[2] = cz;
    memset(R, 0, n * sizeof({fn}_regs)); memset(st, 0, n); memset(x, 0, 8 * (size_t)n);
    for (uint32_t t = 0; t < n; t++) {{ RxThr* th = &R[t].th; th->tid[0] = t % L->block[0];
      th->tid[1] = (t / L->block[0]) % L->block[1]; th->tid[2] = t / (L->block[0] * L->block[1]); th->lin = t;
      th->lane = t & 31; th->ld = R[t].depot; }}
    for (;;) {{
      for (uint32_t t = 0; t < n; t++) if (st[t] == 0) {{
        int r = {fn}_step(L, B, &R[t]);
        if (r < 0) {{ rc = -1; break; }}
        st[t] = r == 0 ? 3 : (uint8_t)r;
      }}
      if (rc) break;
      /* a warp operation takes two steps: every lane there writes its value (2), then every one of them reads
         (4) before any goes on, so no lane's next value overwrites one a slower lane has still to read */
      int woke = 0;
      for (uint32_t w = 0; w < n; w += 32) {{
        uint32_t end = w + 32 < n ? w + 32 : n, read = 0, wrote = 0;
        for (uint32_t t = w; t < end; t++) {{ read |= (uint32_t)(st[t] == 4) << (t - w);
          wrote |= (uint32_t)(st[t] == 2) << (t - w); }}
        uint32_t go = read ? read : wrote;
        if (go) {{ if (!read) B->present[w / 32] = wrote;
          for (uint32_t t = w; t < end; t++) if (go >> (t - w) & 1) st[t] = 0; woke = 1; }}
      }}
      if (woke) continue;
      for (uint32_t t = 0; t < n; t++) if (st[t] == 1) {{ st[t] = 0; woke = 1; }}
      if (!woke) break;
    }}
  }}
  free(R); free(st); free(x); free(B->present); free(B->sh);
  return rc;
}}
{undef}"""


    def _vec(self, tok: str) -> list[str]:
        tok = tok.strip()
        if tok.startswith("{"):
            return [x.strip() for x in tok[1:-1].split(",")]
        return [tok]

    def _ld(self, mods, ops, i):
        return self._access(mods, ops[1], self._vec(ops[0]), False, i)

    def _st(self, mods, ops, i):
        return self._access(mods, ops[0], self._vec(ops[1]), True, i)

    def _access(self, mods, addr: str, regs: list[str], write: bool, i: int) -> str:
        """A load (``regs`` the destinations) or a store (``regs`` the values), one register or a vector."""
        t = self._type(mods, " ".join(mods))
        if t == "b128":
            raise PtxError(f"{self.name}: 128-bit loads and stores are not supported on the CPU device yet")
        space = next((x for x in mods if x in _SPACES), "generic")
        size = SIZE[t]
        ck, ptr = self.address(addr, space, size * len(regs), write, i)
        ct = CTYPE.get(t, UNSIGNED.get(size))
        out = [ck, f"{{ unsigned char* p_ = {ptr};"]
        for j, r in enumerate(regs):
            if write:
                out.append(f"{{ {ct} v_ = {self.val(r, t)}; memcpy(p_ + {j * size}, &v_, {size}); }}")
            else:
                out.append(f"{{ {ct} v_; memcpy(&v_, p_ + {j * size}, {size}); {self.put(r, t, 'v_')} }}")
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
        before = f"B->xchg[TH->lin] = {a};"
        b, c = self.val(ops[2], "u32"), self.val(ops[3], "u32")
        j = {"up": "int32_t j_ = (int32_t)lane_ - (int32_t)bv_; int p_ = j_ >= (int32_t)max_;",
             "down": "int32_t j_ = (int32_t)lane_ + (int32_t)bv_; int p_ = j_ <= (int32_t)max_;",
             "bfly": "int32_t j_ = (int32_t)(lane_ ^ bv_); int p_ = j_ <= (int32_t)max_;",
             "idx": "int32_t j_ = (int32_t)(min_ | (bv_ & ~mask_)); int p_ = j_ <= (int32_t)max_;"}[mode]
        after = (f"{{ uint32_t lane_ = TH->lane, bv_ = {b} & 31u, cv_ = {c}; uint32_t mask_ = (cv_ >> 8) & 31u, "
                 f"cl_ = cv_ & 31u; uint32_t max_ = (lane_ & mask_) | (cl_ & ~mask_), min_ = lane_ & mask_; "
                 f"(void)min_; {j} if (!p_) j_ = (int32_t)lane_; uint32_t src_ = (TH->lin & ~31u) + (uint32_t)j_; "
                 f"uint32_t v_ = (uint32_t)(src_ < B->nthreads ? B->xchg[src_] : B->xchg[TH->lin]);"
                 f" {self.put(dst[0].strip(), 'b32', 'v_')} "
                 + (self.put(dst[1].strip(), "pred", "p_") if len(dst) > 1 else "") + " }")
        return self._yield(2, before, after)

    def _vote(self, mods, ops, s):
        mode = next(x for x in mods if x in ("all", "any", "uni", "ballot"))
        a = self.val(ops[1], "pred")
        before = f"B->xchg[TH->lin] = {a} ? 1u : 0u;"
        gather = ("uint32_t w0_ = TH->lin & ~31u, bal_ = 0, live_ = 0; for (uint32_t l_ = 0; l_ < 32 && w0_ + l_ < "
                  "B->nthreads; l_++) { if (B->present[w0_ >> 5] >> l_ & 1) { live_ |= 1u << l_; "
                  "if (B->xchg[w0_ + l_] & 1) bal_ |= 1u << l_; } }")
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
