"""The kernel factory: a generated kernel per structural IR, made once and kept (a repeat is a dict lookup).

A miss is answered in tiers. A factory that ``interpret``s (the CUDA backend's) first translates a group the
interpreter covers (``_interp``: one precompiled kernel runs it from a program in its parameters, no JIT at all).
Else PTX written straight from the IR (``_ptx.emit``: no NVRTC, the driver JITs
it in milliseconds); where the PTX emitter does not cover a group, the CUDA C++ of ``_codegen.generate`` through
rxcuda's NVRTC path. A tiered factory (``upgrade=True``, the CUDA backend's) then has NVRTC build the tuned C++
kernel of a PTX kernel's IR on a background thread once the kernel is launched a second time, and swaps it in at
a later launch (:meth:`GroupKernel.current`). ``fast_math`` kernels are NVRTC's ``--use_fast_math`` builds.
"""

from __future__ import annotations

import contextlib

from ._codegen import generate
from ._ir import ENTRY, Unsupported

_COMPILER: list = []  # one background thread for NVRTC (made on first use, by _background)


def _background():
    """The one thread that compiles in the background (made on first use). cuda.core's first import is not
    thread-safe, so it is made here, on the caller's thread, before that thread starts (without cuda.core each
    build fails in the thread and is reported where its result is asked for)."""
    if not _COMPILER:
        from concurrent.futures import ThreadPoolExecutor

        from ..cuda._nvrtc import import_compiler

        with contextlib.suppress(ImportError):
            import_compiler()
        _COMPILER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="rxcuda-nvrtc"))
    return _COMPILER[0]


def _nvrtc(ir: tuple, fast_math: bool):
    """The C++ of ``ir`` compiled through rxcuda's NVRTC path and cache (``--use_fast_math`` if asked)."""
    from ..sources._nvrtc import compile_cuda

    source = generate(ir)
    options = {"use_fast_math": True} if fast_math else None
    # (a cubin: the CUDA tensor backend launches it on a GPU, whatever device an engine of the process uses)
    return source, compile_cuda(source, entry=ENTRY, name=f"{ENTRY}{'_fast' if fast_math else ''}.cu",
                                options=options, target="cubin")


class KernelFactory:
    """Compiled kernels by structural IR: ``get(ir)`` makes each kernel once, then returns the same
    :class:`GroupKernel`.

    A miss first asks ``_ptx.emit`` for PTX written straight from the IR (under a millisecond; the driver
    JITs it when the kernel is loaded); where the PTX emitter does not cover the group (``Unsupported``) the
    C++ of :func:`generate` is compiled through rxcuda's NVRTC path and its cache. ``ptx_misses`` and
    ``nvrtc_misses`` count which way each miss went. ``ptx``: True (PTX where covered), False (always NVRTC,
    to compare the two), or the kinds (``("elementwise",)``) that may use PTX. ``stats``: a
    :class:`~._cache.Stats` whose ``compiles`` (every miss) and ``upgrades`` it counts too (the process factory
    counts into ``rxcuda.tensor.stats()``).

    **The interpreter** (``interpret=True``): once its one-off build (:meth:`warm` starts it on the background
    thread; NVRTC's disk cache makes it a file read in later processes) is ready, a miss of a group it covers
    (``_interp.program``) is answered by the interpreter kernel and a translated program: no JIT, so a new
    elementwise expression costs microseconds of host work instead of the JIT's milliseconds
    (``interp_misses`` counts them). With ``upgrade``, its tuned build replaces it as a PTX kernel's does.

    **Tiers** (``upgrade=True``, the process factory of the CUDA backend): a PTX kernel answers the miss in
    milliseconds; once it is launched a second time (a kernel that runs once is never rebuilt), NVRTC compiles
    the C++ kernel of the same IR (the tuned one: rows held in registers, vector loads) on a background thread,
    and :meth:`GroupKernel.current` swaps it in at the first launch after it is ready (``upgrades`` counts them;
    :meth:`wait` blocks until none is being built). ``fast_math=True``
    kernels (approximate float32 math, ``Passes(fast_math=True)``) are NVRTC's ``--use_fast_math`` build,
    keyed apart from the precise ones.

    >>> ir = (("elementwise", (4,), None, (("array", (4,), "<f4", (1,)), ("scalar", "<f4")),
    ...        (("mul", (), (4,), "<f4", (("i", 0), ("i", 1))),), (0,)))
    >>> factory = KernelFactory()
    >>> kernel = factory.get(ir)
    >>> kernel.code.cached, factory.ptx_misses, factory.nvrtc_misses, factory.get(ir) is kernel
    ('ptx', 1, 0, True)
    """

    def __init__(self, ptx: bool | tuple[str, ...] = True, upgrade: bool = False, stats=None,
                 interpret: bool = False):
        self._kernels: dict[tuple, GroupKernel] = {}
        self.interpret = interpret
        self._interpreter: list = []  # the interpreter's build (a Future, made by warm())
        self.interp_misses = 0
        self.stats = stats  # a Stats that also counts ``compiles`` and ``upgrades`` (the process's, for the backend)
        self.ptx = ptx
        self.upgrade = upgrade
        self.hits = 0
        self.misses = 0
        self.ptx_misses = 0
        self.nvrtc_misses = 0
        self.upgrades = 0

    def __len__(self) -> int:
        return len(self._kernels)

    def __contains__(self, ir: tuple) -> bool:
        return ir in self._kernels

    def get(self, ir: tuple, fast_math: bool = False) -> GroupKernel:
        key = ("fast_math", ir) if fast_math else ir
        kernel = self._kernels.get(key)
        if kernel is not None:
            self.hits += 1
            return kernel
        self.misses += 1
        if self.stats is not None:
            self.stats.compiles += 1
        if not fast_math and self.interpret:
            kernel = self._interpreted(ir)
            if kernel is not None:
                self._kernels[key] = kernel
                return kernel
        if not fast_math and (self.ptx is True or (self.ptx and ir[0] in self.ptx)):
            from ._ptx import _UNROLL, PtxCode, emit

            try:
                text = emit(ir, unroll=1 if self.upgrade else _UNROLL)  # a first tier: the least JIT time
            except Unsupported:
                pass
            else:
                self.ptx_misses += 1
                kernel = self._kernels[key] = GroupKernel(ir, text, PtxCode(ENTRY, text.encode() + b"\0"))
                if self.upgrade:
                    kernel.hot, kernel.factory = 2, self  # the build starts at its second launch
                return kernel
        source, code = _nvrtc(ir, fast_math)
        kernel = GroupKernel(ir, source, code)
        self.nvrtc_misses += 1
        self._kernels[key] = kernel
        return kernel

    def warm(self) -> None:
        """Start building the interpreter on the background thread (once; a no-op unless ``interpret``)."""
        if self.interpret and not self._interpreter:
            from ._interp import compile_interpreter

            self._interpreter.append(_background().submit(compile_interpreter))

    def interpreter(self, wait: bool = False) -> dict | None:
        """The interpreter's code per dtype once its build is ready (None before, unless ``wait``; None where it
        failed: then ``interpret`` turns off and the reason is logged once). A miss never waits for it."""
        if not self.interpret:
            return None
        if not self._interpreter:
            self.warm()
        build = self._interpreter[0]
        if not wait and not build.done():
            return None
        try:
            return build.result()
        except Exception as e:  # noqa: BLE001 - the PTX tier answers instead; the reason stays visible
            import logging

            self.interpret = False
            logging.getLogger("rxcuda").warning(
                "the tensor interpreter could not be built, new kernels take the PTX tier: %s: %s",
                type(e).__name__, e)
            return None

    def _interpreted(self, ir: tuple) -> GroupKernel | None:
        codes = self.interpreter()
        if codes is None:
            return None
        from ._interp import program

        prog = program(ir)
        if prog is None:
            return None
        self.interp_misses += 1
        kernel = GroupKernel(ir, f"// the tensor interpreter's program\n{prog.listing}\n", codes[prog.dtype])
        kernel.interp = prog
        if self.upgrade:
            kernel.hot, kernel.factory = 2, self  # the tuned build starts at its second launch
        return kernel

    def wait(self, timeout: float | None = None) -> int:
        """Block until every background compile has finished (or ``timeout`` seconds); how many are still
        pending. The swap itself happens at each kernel's next launch."""
        from concurrent.futures import wait

        pending = [k.pending for k in self._kernels.values() if k.pending is not None]
        _, left = wait(pending, timeout=timeout)
        return len(left)


class GroupKernel:
    """One generated kernel: its IR, source (PTX text or CUDA C++), compiled code (``code.image`` and
    ``code.entry`` to load), and (once loaded on a device) its function; ``pending``: the better build of the
    same IR while NVRTC makes it in the background (see :class:`KernelFactory`)."""

    __slots__ = ("ir", "source", "code", "function", "module", "pending", "factory", "failed", "hot", "interp")

    def __init__(self, ir: tuple, source: str, code):
        self.ir, self.source, self.code = ir, source, code
        self.function = self.module = self.pending = self.factory = self.failed = None
        self.interp = None  # the interpreter's program while the interpreter runs this kernel (see _interp)
        self.hot: int | None = None  # launches until the background build starts (None: no build)

    def launcher(self, function, kinds, sms: int = 132):
        """What launches ``function`` (the one :meth:`current` returned) with the arguments of ``kinds``: the
        interpreter's launcher while it runs this kernel, else a :class:`~rxcuda.cuda._kernels.KernelLauncher`."""
        if self.interp is not None:
            from ._interp import InterpLauncher

            return InterpLauncher(function, self.interp, sms=sms)
        from ..cuda._kernels import KernelLauncher

        return KernelLauncher(function, kinds)

    def current(self, load):
        """The function to launch: the loaded one, after swapping in the background build if it is ready
        (``load(code) -> (module, function)`` loads a build on the caller's device and thread). Counts the
        launches of a kernel that has a better build to come, and starts that build at the second. A failed
        background build keeps the first kernel and is kept in ``failed``."""
        if self.hot is not None:
            self.hot -= 1
            if self.hot <= 0:
                self.hot = None
                self.pending = _background().submit(_nvrtc, self.ir, False)
        pending = self.pending
        if pending is not None and pending.done():
            self.pending = None
            try:
                source, code = pending.result()
                module, function = load(code)
            except Exception as e:  # noqa: BLE001 - the first kernel keeps running; the reason stays visible
                self.failed = e
                import logging

                logging.getLogger("rxcuda").warning(
                    "the tuned build of a generated tensor kernel failed, its first (PTX) build keeps running: %s: "
                    "%s (GroupKernel.failed keeps the exception)", type(e).__name__, e)
            else:
                self.source, self.code, self.module, self.function = source, code, module, function
                self.interp = None
                if self.factory is not None:
                    self.factory.upgrades += 1
                    if self.factory.stats is not None:
                        self.factory.stats.upgrades += 1
        return self.function
