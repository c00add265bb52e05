"""Kernels on the CPU device: a PTX module translated to C (``_ptxc``), compiled once by the host's C compiler,
loaded through ctypes, and launched block after block on the calling thread.

A module is compiled into ``cache_dir()/cpu`` keyed by a digest of its C and the compiler (``cc -O2``, ~0.1-0.3 s for
a small module), and loaded from there afterwards. A launch names every allocation the driver holds (for the
address checks) and each pointer argument's own allocation; an access outside them stops the launch and raises
:class:`IllegalAddress` naming the kernel, the argument, the address and the thread.

>>> import numpy as np
>>> from rxcuda.cuda import _cpukernel
>>> src = (_cpukernel.example_ptx())
>>> module = _cpukernel.load(src)
>>> x = np.arange(4, dtype=np.float32)
>>> module.launch("twice", (1, 1, 1), (4, 1, 1), [x.ctypes.data, 4], allocations=[(x.ctypes.data, x.nbytes)])
>>> x.tolist()
[0.0, 2.0, 4.0, 6.0]
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import struct
import subprocess
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from . import _ptxc
from ._paths import cache_dir

PtxError = _ptxc.PtxError
# host threads that run a launch's blocks at once (OpenMP; a launch of fewer than 65536 threads runs on one):
# RXCUDA_CPU_THREADS, else every core. Idle workers sleep rather than spin between launches (OMP_WAIT_POLICY, set
# before the first module loads the OpenMP runtime, unless the environment already says).
WORKERS = int(os.environ.get("RXCUDA_CPU_THREADS", "0") or 0) or (os.cpu_count() or 1)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_lock = threading.Lock()
_memo: dict[bytes, CpuModule] = {}


class IllegalAddress(RuntimeError):
    """A kernel on the CPU device read or wrote outside memory it may use (the GPU's CUDA_ERROR_ILLEGAL_ADDRESS)."""


class _Launch(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("params", ctypes.c_void_p),
                ("shared_dyn", ctypes.c_uint64), ("lo", ctypes.c_void_p), ("lim", ctypes.c_void_p),
                ("alo", ctypes.c_void_p), ("ahi", ctypes.c_void_p), ("nalloc", ctypes.c_int64),
                ("globals", ctypes.c_void_p), ("ctx", ctypes.c_void_p), ("set_cond", ctypes.c_void_p),
                ("workers", ctypes.c_int32), ("pad_", ctypes.c_int32),
                ("fault", ctypes.c_int32), ("fault_arg", ctypes.c_int32), ("fault_write", ctypes.c_int32),
                ("fault_size", ctypes.c_int32), ("fault_insn", ctypes.c_int32), ("fault_addr", ctypes.c_uint64),
                ("fault_block", ctypes.c_uint32 * 3), ("fault_thread", ctypes.c_uint32 * 3)]


SET_COND = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32)


# -march=native: fma.rn is one instruction instead of a libm call (saxpy at 2^20: 4.3 -> see docs/cpu.md); the
# cache key holds the host's CPU flags, so a cache shared between machines never loads code for another CPU
_FLAGS = [f for f in os.environ.get("RXCUDA_CPU_CFLAGS", "-O3 -march=native").split()]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _compiler() -> list[str]:
    """The host's C compiler as an argument list: $CC, Python's own, or the first of cc, gcc, clang found."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = shlex.split(cc)
    if not argv or shutil.which(argv[0]) is None:
        for name in ("cc", "gcc", "clang"):
            if shutil.which(name):
                return [name]
        raise FileNotFoundError(f"no C compiler found (tried {cc!r}, cc, gcc, clang)")
    return argv


def _compile(source: str) -> Path:
    cc = _compiler()
    digest = hashlib.sha256(source.encode() + repr((cc, _FLAGS, _cpu_flags())).encode()).hexdigest()[:20]
    out_dir = cache_dir() / "cpu"
    out = out_dir / f"k-{digest}.so"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, src = tempfile.mkstemp(prefix=".k-", suffix=".c", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    fd, tmp = tempfile.mkstemp(prefix=".k-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        # -fno-strict-aliasing: registers are reinterpreted through memcpy anyway; no -ffast-math: the GPU's IEEE
        # results are what the CPU device reproduces (no contraction either: PTX says where it fuses, with fma)
        cmd = [*cc, *_FLAGS, "-fopenmp", "-shared", "-fPIC", "-fno-strict-aliasing", "-ffp-contract=off", "-w", src,
               "-o", tmp, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise RuntimeError(f"the C compiler refused the CPU device's translation ({' '.join(cmd)}): "
                               f"{(done.stderr or done.stdout).strip()[:1500]}")
        os.replace(tmp, out)
    finally:
        for p in (src, tmp):
            if os.path.exists(p):
                os.unlink(p)
    return out


class CpuModule:
    """A translated, compiled PTX module: its kernels by name, launched with :meth:`launch`."""

    def __init__(self, module: _ptxc.Module, lib: ctypes.CDLL):
        self.module = module
        self.lib = lib
        self.kernels = {k.name: k for k in module.kernels}
        self._fns = {}
        for k in module.kernels:
            fn = getattr(lib, f"rx_{_c_ident(k.name)}")
            fn.argtypes = [ctypes.POINTER(_Launch)]
            fn.restype = ctypes.c_int
            self._fns[k.name] = fn
        # the module's .global/.const variables, in host memory
        self.repack = lib.rx_pack
        self.repack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        self.repack.restype = ctypes.c_int
        self.variables = [np.frombuffer(v.init.ljust(v.size, b"\0"), dtype=np.uint8).copy() for v in module.variables]
        self.globals = np.array([a.ctypes.data for a in self.variables] or [0], dtype=np.uint64)

    def function(self, name: str):
        return self._fns[name]

    def pack(self, name: str, values: Sequence[int | float | bytes]) -> bytes:
        """The kernel's parameter buffer from one value per parameter (ints and floats by the PTX type, bytes as
        they are)."""
        k = self.kernels[name]
        buf = bytearray(k.params_size)
        for p, v in zip(k.params, values, strict=True):
            if isinstance(v, (bytes, bytearray)):
                raw = bytes(v)[:p.size]
            elif p.type in ("f32", "f64"):
                raw = struct.pack("<f" if p.type == "f32" else "<d", float(v))
            else:
                raw = (int(v) & ((1 << (8 * p.size)) - 1)).to_bytes(p.size, "little")
            buf[p.offset:p.offset + len(raw)] = raw
        return bytes(buf)

    def prepare(self, name: str, grid, block, params: bytes, shared: int, allocations: Allocations,
                ctx=None, set_cond=None) -> Prepared:
        """A launch of ``name`` ready to run any number of times (:meth:`Prepared.run`)."""
        return Prepared(self, name, grid, block, params, shared, allocations, set_cond)

    def launch(self, name: str, grid, block, values, *, shared: int = 0,
               allocations: Sequence[tuple[int, int]] = ()) -> None:
        """Launch ``name`` once with ``values`` (one per parameter) over ``allocations`` ((address, bytes) pairs)."""
        table = Allocations()
        for a, n in allocations:
            table.add(a, n)
        self.prepare(name, grid, block, self.pack(name, values), shared, table).run()


def _c_ident(name: str) -> str:
    import re
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


class Allocations:
    """The memory a kernel may touch: (address, bytes) of every live allocation, sorted, as two NumPy arrays
    (the C side searches them)."""

    def __init__(self) -> None:
        self._spans: dict[int, int] = {}
        self.version = 0
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, address: int, nbytes: int) -> None:
        self._spans[int(address)] = int(nbytes)
        self._changed()

    def remove(self, address: int) -> None:
        self._spans.pop(int(address), None)
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        self._arrays = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            lo = np.array(sorted(self._spans) or [0], dtype=np.uint64)
            hi = lo + np.array([self._spans.get(int(a), 0) for a in lo], dtype=np.uint64)
            self._arrays = (lo, hi)
        return self._arrays

    def find(self, address: int) -> tuple[int, int] | None:
        """(start, bytes) of the allocation holding ``address``, or None."""
        lo, hi = self.arrays()
        i = int(np.searchsorted(lo, np.uint64(address), side="right")) - 1
        if i >= 0 and int(lo[i]) <= address < int(hi[i]):
            return int(lo[i]), int(hi[i] - lo[i])
        return None


class Prepared:
    """One kernel launch's record (grid, block, parameters, the allocations each pointer argument points into),
    made once and run as often as wanted: what an executable graph's kernel node holds."""

    def __init__(self, module: CpuModule, name: str, grid, block, params: bytes, shared: int,
                 allocations: Allocations, set_cond: Callable | None = None):
        self.module = module
        self.kernel = module.kernels[name]
        self.fn = module.function(name)
        self.allocations = allocations
        self._params = ctypes.create_string_buffer(bytes(params).ljust(max(self.kernel.params_size, 1), b"\0"))
        n = len(self.kernel.params)
        self._lo = np.zeros(max(n, 1), dtype=np.uint64)  # each argument's allocation: start, bytes
        self._span = np.zeros(max(n, 1), dtype=np.uint64)
        self._blo = np.zeros(5 * max(n, 1), dtype=np.uint64)  # what the C checks compare (see _bind)
        self._blim = np.zeros(5 * max(n, 1), dtype=np.uint64)
        self._cb = set_cond
        self._rec = _Launch()
        r = self._rec
        r.grid[:] = [int(g) for g in grid]
        r.block[:] = [int(b) for b in block]
        r.params = ctypes.addressof(self._params)
        r.shared_dyn = int(shared)
        r.lo, r.lim = self._blo.ctypes.data, self._blim.ctypes.data
        r.globals = module.globals.ctypes.data
        r.set_cond = ctypes.cast(set_cond, ctypes.c_void_p).value if set_cond is not None else None
        r.workers = WORKERS
        self._seen = -1
        self._pointers = [p.offset for p in self.kernel.params if p.size == 8 and p.type != "f64"]
        self._offsets = np.array([p.offset for p in self.kernel.params] or [0], dtype=np.uint32)
        self._sizes = np.array([p.size for p in self.kernel.params] or [0], dtype=np.uint32)
        self._repack, self._n = module.repack, len(self.kernel.params)
        self._n_c = ctypes.c_int(self._n)
        # ctypes objects, not ints: the hot update's call converts nothing but the argument array's address
        self._params_ptr = ctypes.c_void_p(ctypes.addressof(self._params))
        self._offsets_ptr = ctypes.c_void_p(self._offsets.ctypes.data)
        self._sizes_ptr = ctypes.c_void_p(self._sizes.ctypes.data)
        self._bind()

    def _bind(self) -> None:
        """Find each pointer argument's allocation (again after the driver's allocations changed)."""
        raw = self._params.raw
        for i, p in enumerate(self.kernel.params):
            if p.size != 8 or p.type in ("f64",):
                continue
            v = int.from_bytes(raw[p.offset:p.offset + 8], "little")
            found = self.allocations.find(v)
            lo, span = found if found is not None else (v, 0)
            self._lo[i], self._span[i] = lo, span
            for k in range(5):  # an access of 2^k bytes at a passes where a - lo <= span - 2^k (one compare)
                s = 1 << k
                # (where none fits: a base no user address reaches, so a - base exceeds the limit 0 for all)
                self._blo[5 * i + k], self._blim[5 * i + k] = (lo, span - s) if span >= s else (1 << 63, 0)
        lo, hi = self.allocations.arrays()
        self._alo, self._ahi = lo, hi
        self._rec.alo, self._rec.ahi, self._rec.nalloc = lo.ctypes.data, hi.ctypes.data, len(lo)
        self._seen = self.allocations.version

    def repack(self, args_ptr: int) -> None:
        """New parameter values read from a ``kernelParams`` array (one pointer per parameter), in C: the hot update's
        path (the allocations are looked up again only where a pointer changed)."""
        if self._repack(self._params_ptr, args_ptr, self._offsets_ptr, self._sizes_ptr, self._n_c):
            self._seen = -1

    def set_params(self, params: bytes) -> None:
        """New parameter values (a hot update): written in place; the pointer arguments' allocations are looked up
        again only where a pointer changed."""
        old = self._params.raw
        ctypes.memmove(self._params, params, min(len(params), len(old)))
        if any(old[o:o + 8] != params[o:o + 8] for o in self._pointers):
            self._seen = -1

    def run(self) -> None:
        if self._seen != self.allocations.version:
            self._bind()
        r = self._rec
        if self.fn(ctypes.byref(r)):
            self._raise()

    def _raise(self) -> None:
        r = self._rec
        k = self.kernel
        arg = r.fault_arg
        what = "write" if r.fault_write else "read"
        where = (f"thread ({', '.join(map(str, r.fault_thread))}) of block ({', '.join(map(str, r.fault_block))})")
        insn = k.instructions[r.fault_insn] if 0 <= r.fault_insn < len(k.instructions) else "?"
        r.fault = 0
        if arg == -4:
            raise IllegalAddress(f"kernel '{k.name}' trapped (`{insn}`) in {where}")
        if arg == -2:
            raise IllegalAddress(f"kernel '{k.name}': a {r.fault_size}-byte shared-memory {what} at offset "
                                 f"{r.fault_addr} is past the block's {r.fault_size and 'shared memory'} "
                                 f"({where}; `{insn}`)")
        if arg == -3:
            raise IllegalAddress(f"kernel '{k.name}': a {r.fault_size}-byte local-memory {what} at offset "
                                 f"{r.fault_addr} is outside the thread's local memory ({where}; `{insn}`)")
        a = int(r.fault_addr)
        if arg >= 0:
            p = k.params[arg]
            lo, span = int(self._lo[arg]), int(self._span[arg])
            if span == 0:
                buf = f"argument {arg} ({p.name}) points at no allocation ({lo:#x})"
            elif a >= lo + span:
                buf = (f"{a + r.fault_size - lo - span} bytes past the end of argument {arg} ({p.name}: a buffer of "
                       f"{span} bytes at {lo:#x})")
            else:
                buf = f"{lo - a} bytes before argument {arg} ({p.name}: a buffer of {span} bytes at {lo:#x})"
        else:
            near = self.allocations.find(a)
            buf = "in no allocation" if near is None else f"past the allocation at {near[0]:#x} ({near[1]} bytes)"
        raise IllegalAddress(f"illegal address in kernel '{k.name}': a {r.fault_size}-byte {what} at {a:#x}, {buf} "
                             f"({where}; `{insn}`)")


class CompressedPtx(Exception):
    """A fatbin whose PTX is compressed, with no decompressor here."""


def ptx_of(image: bytes) -> bytes | None:
    """The PTX text of a module image: PTX itself, or the first PTX a fatbin carries (zstd-compressed PTX, nvcc's
    default since CUDA 12.8, where the ``zstandard`` package is installed); None for machine code alone (a cubin,
    or a fatbin of cubins). Raises CompressedPtx for compressed PTX it cannot read."""
    head = image[:4]
    if head == b"\x7fELF":
        return None
    if head == b"\x50\xed\x55\xba":  # a fatbin: a header, then entries (kind 1 = PTX, 2 = ELF)
        hsize = int.from_bytes(image[4:8], "little") >> 16 or 16
        end = hsize + int.from_bytes(image[8:16], "little")
        at = hsize
        compressed = False
        while at + 64 <= min(end, len(image)):
            kind = int.from_bytes(image[at:at + 2], "little")
            hdr = int.from_bytes(image[at + 4:at + 8], "little")
            size = int.from_bytes(image[at + 8:at + 16], "little")
            flags = int.from_bytes(image[at + 40:at + 48], "little")
            payload = image[at + hdr:at + hdr + size]
            if kind == 1 and not flags & 0xA000:  # PTX, stored as it is
                return payload.rstrip(b"\0")
            if kind == 1 and flags & 0x8000:  # PTX compressed with zstd
                try:
                    import zstandard  # type: ignore[import-not-found]
                except ImportError:
                    compressed = True
                else:
                    length = int.from_bytes(image[at + 56:at + 64], "little")
                    return zstandard.ZstdDecompressor().decompress(payload, max_output_size=length).rstrip(b"\0")
            elif kind == 1:
                compressed = True
            at += hdr + size
        if compressed:
            raise CompressedPtx
        return None
    text = image.lstrip()
    if text.startswith(b"//") or text.startswith(b".version") or b".entry" in image[:65536]:
        return image.rstrip(b"\0")
    return None


def shipped_conditions(image: bytes) -> bytes | None:
    """The PTX of rxcuda's own condition and stamp kernels, for their fatbin (which carries cubins only)."""
    pkg = resources.files("rxcuda.cuda")
    try:
        if image == (pkg / "_conditions.fatbin").read_bytes():
            return (pkg / "_conditions.ptx").read_bytes()
    except OSError:
        return None
    return None


def load(ptx: str | bytes) -> CpuModule:
    """Translate, compile (cached on disk) and load a PTX module."""
    key = hashlib.sha256(ptx if isinstance(ptx, bytes) else ptx.encode()).digest()
    hit = _memo.get(key)
    if hit is not None:
        return hit
    module = _ptxc.translate(ptx)
    with _lock:
        path = _compile(module.source)
        lib = ctypes.CDLL(str(path))
        loaded = _memo[key] = CpuModule(module, lib)
    return loaded


def example_ptx() -> str:
    """A small PTX kernel (``twice(float* x, unsigned n)``: x[i] *= 2), for examples and tests."""
    return """.version 8.0
.target sm_75
.address_size 64
.visible .entry twice(.param .u64 p, .param .u32 n)
{
  .reg .pred %p<2>; .reg .b32 %r<4>; .reg .f32 %f<3>; .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n];
  mov.u32 %r2, %tid.x; setp.ge.u32 %p1, %r2, %r1; @%p1 bra DONE;
  mul.wide.u32 %rd2, %r2, 4; add.s64 %rd3, %rd1, %rd2;
  ld.global.f32 %f1, [%rd3]; add.f32 %f2, %f1, %f1; st.global.f32 [%rd3], %f2;
DONE:
  ret;
}
"""
