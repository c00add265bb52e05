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

from ._ptxdefs import (
    _DECL,
    _SPACES,
    _SYNC_OPS,
    _TYPES,
    _VAR,
    CTYPE,
    HEADER,
    SIZE,
    UNSIGNED,
    Kernel,
    Module,
    Param,
    PtxError,
    Variable,
    _cname,
    _imm_value,
    _is_imm,
    _parse_var,
    _split_operands,
    _strip,
)
from ._ptxops import Instructions

__all__ = ["Kernel", "Module", "Param", "PtxError", "Variable", "translate"]


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


def _as(expr: str, frm: str, to: str) -> str:
    """``expr``, a value of PTX type (or register kind) ``frm``, as a C value of type ``to``: a predicate is 0 or 1;
    bits are reinterpreted between a float and an integer type (PTX moves bits, ``mov.b32 %f1, %r1``); floats
    convert between their widths and integers cast."""
    floats = ("f32", "f64")
    if to == "pred":
        return f"(({expr}) != 0)"
    ct = CTYPE.get(to, UNSIGNED.get(SIZE.get(to, 4), "uint32_t"))
    if frm not in floats and to not in floats:
        return f"(({ct})({expr}))"
    if frm in floats and to in floats:
        return f"(({ct})({expr}))"
    if frm in floats:
        return f"(({ct}){'f2u' if frm == 'f32' else 'd2u'}({expr}))"
    return f"u2f((uint32_t)({expr}))" if to == "f32" else f"u2d((uint64_t)({expr}))"


class _Kernel(Instructions):
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
        window = self.shared.get(tok, self.local.get(tok))  # (an offset in the block's or the thread's memory)
        if window is None and tok in self.dynamic:
            window = -(-self.shared_size // 16) * 16
        if window is not None:
            return f"((uint64_t){window}u)"
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
            return self.reg(tok) if t == "pred" else _as(self.reg(tok), self.regs[tok], t)
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
        return f"{r} = {_as(expr, t, k)};"

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
        if isinstance(prov, tuple) and prov[0] == "p" and size in (1, 2, 4, 8, 16):
            # one compare: the launch gives each (argument, access size) the lowest address and the last offset such
            # an access may start at (rxcuda.cuda._cpukernel.Prepared._bind)
            j, k = prov[1], size.bit_length() - 1
            ck = (f"{{ uint64_t a_ = {a}; if (__builtin_expect(a_ - LO({j}, {k}) > LIM({j}, {k}), 0)) "
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

    def _yield(self, code: int, before: str = "", after: str = "") -> str:
        """Return ``code`` to the block's scheduler and resume here; a warp operation (code 2) returns again (4)
        once it has read what the other lanes wrote (``after``), so that all lanes read before any goes on."""
        self.resume += 1
        k = self.resume
        out = f"{before} TH->resume = {k}; return {code}; R_{k}: ; {after}"
        if code == 2:
            self.resume += 1
            out += f" TH->resume = {self.resume}; return 4; R_{self.resume}: ;"
        return out

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
