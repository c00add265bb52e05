"""CUDA C++ compiled at run time with NVRTC, cached on disk and in memory.

``compile_cuda(source_or_path)`` turns CUDA C++ into a :class:`KernelCode` the engine loads: a cubin for
the device's own architecture by default (``sm_90`` where no device is present), or PTX on request.

The parameters of the kernel come from its ``extern "C" __global__`` declaration (``_cdecl.py``: names,
element types, directions, defaults, ``__launch_bounds__``). They are checked against the compiled code
(the cubin's ``EIATTR_KPARAM_INFO`` records, or the PTX ``.entry``), so a declaration that was misread is
an error, never a wrong launch.

Caching (``_cache.py``): the compiled image is stored on disk under ``cache_dir()``, keyed by the source,
the contents of every header it includes from disk, the options, the architecture and the NVRTC version.
An in-process memo on top answers a repeated request in microseconds. ``cache_stats()`` counts memory
hits, disk hits and misses. ``warm_up()`` pays NVRTC's first-call start-up (~200 ms) in a background
thread; the engine does not call it (that thread would compete with its first builds for the GIL).

Why cubin by default: PTX from a newer NVRTC than the driver (here NVRTC 13.5, driver 13.0) may not JIT;
a cubin for the device's real architecture loads on any driver of the same major version.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import inspect
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import attrs

from ..cuda import _nvrtc as _cuda_nvrtc
from ..cuda import _nvtx
from ..cuda._nvrtc import NvrtcRejected
from ..model._describe import KernelCode, KernelSignature
from ..model._errors import CompileError
from ._arch import check_arch, default_arch
from ._cache import CacheStats, cache_dir, disk_key, entries_info, open_disk_cache
from ._cdecl import ANNOTATION_MACROS, mangled_kernels, parse_declarations
from ._diagnostics import Diagnostic, compile_error, parse_diagnostics
from ._headers import (
    header_files,
    headers_digest,
    includes_system_headers,
    missing_header_hint,
    toolkit_include_dir,
)
from ._paths import decode_text, missing_file_message

log = logging.getLogger("rxcuda")

Target = Literal["cubin", "ptx"]
DEFAULT_BLOCK_SIZE = 256


# ---------------------------------------------------------------------------------------------------
# NVRTC
# ---------------------------------------------------------------------------------------------------
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library in use."""
    return _cuda_nvrtc.version()


_CompileFailed = NvrtcRejected  # NVRTC rejected the source; ``args[0]`` is its log


def _compile(text: str, name: str, opts, target: str) -> tuple[bytes, str]:
    return _cuda_nvrtc.compile_source(text, name, opts, target)


@functools.cache
def _option_names() -> tuple[str, ...]:
    from cuda.core import ProgramOptions

    return tuple(inspect.signature(ProgramOptions).parameters)


_OWN_OPTIONS = {"name": "name=", "arch": "arch=", "include_path": "include_paths=", "define_macro": "defines=",
                "std": "std="}


def _check_options(options: Mapping[str, object]) -> dict[str, object]:
    """``options`` sorted by name; a ValueError names an option ProgramOptions does not have (with the
    close ones) or one compile_cuda sets through its own argument."""
    names = _option_names()
    for key in options:
        if key in _OWN_OPTIONS:
            raise ValueError(f"option {key!r} is set by compile_cuda's own argument {_OWN_OPTIONS[key]}; pass it "
                             f"there instead of in options")
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(f"unknown compile option {key!r}{hint} (options are cuda.core.ProgramOptions "
                             f"fields, e.g. 'use_fast_math', 'max_register_count', 'lineinfo')")
    return dict(sorted(options.items()))


# ---------------------------------------------------------------------------------------------------
# compiled modules
# ---------------------------------------------------------------------------------------------------
@attrs.frozen(eq=False)
class CompiledModule:
    """One compiled translation unit: its image and the signature of each ``extern "C"`` kernel in it.
    ``block_sizes`` holds the ``__launch_bounds__`` of the kernels that declare one."""

    image: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    format: Target
    arch: str
    name: str
    kernels: Mapping[str, KernelSignature]
    log: str = ""
    cached: str = "miss"  # how this request was answered: 'memory', 'disk' or 'miss'
    block_sizes: Mapping[str, int] = attrs.Factory(dict)

    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in parse_diagnostics(self.log) if d.severity == "warning")

    def kernel_code(self, entry: str | None = None, *, origin: str | None = None, block_size: int | None = None,
                    shared_mem: int = 0) -> KernelCode:
        """The :class:`KernelCode` of one kernel (the only one when ``entry`` is ``None``). ``block_size``
        defaults to the kernel's ``__launch_bounds__``, else 256; a larger one than the bound is an error
        (the launch would fail on the GPU)."""
        entry = _choose_entry(self.name, list(self.kernels), entry)
        bound = self.block_sizes.get(entry)
        if block_size is None:
            block_size = bound or DEFAULT_BLOCK_SIZE
        elif isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"'block_size' must be a positive int (got {block_size!r})")
        elif bound is not None and block_size > bound:
            raise ValueError(f"block_size={block_size} exceeds __launch_bounds__({bound}) of kernel '{entry}' "
                             f"in {self.name}: a launch that large fails on the GPU; use block_size <= {bound}")
        return KernelCode(entry=entry, image=self.image, format=self.format, signature=self.kernels[entry],
                          origin=origin or self.name, block_size=block_size, shared_mem=shared_mem)


def _choose_entry(name: str, entries: list[str], entry: str | None, source: str | None = None) -> str:
    if entry is not None:
        if entry in entries:
            return entry
        hint = ""
        if source is not None and entry in mangled_kernels(source):
            hint = f"; '{entry}' is not extern \"C\": declare it extern \"C\" __global__ void {entry}(...)"
        else:
            close = difflib.get_close_matches(entry, entries, n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise CompileError(f"{name}: no kernel '{entry}' (its extern \"C\" kernels: "
                           f"{', '.join(entries) or 'none'}){hint}")
    if len(entries) == 1:
        return entries[0]
    if not entries:
        raise CompileError(f"{name}: no extern \"C\" __global__ kernel found; declare one as "
                           f"extern \"C\" __global__ void name(...)")
    raise CompileError(f"{name}: several kernels ({', '.join(entries)}); say which one with entry=")


def cubin_param_sizes(image: bytes) -> dict[str, tuple[int, ...] | None]:
    """Each kernel of a cubin mapped to its parameter sizes (``None`` where they cannot be read)."""
    from ._files import cubin_params

    return cubin_params(image) or {}


def _signatures(text: str, name: str, image: bytes, target: str
                ) -> tuple[dict[str, KernelSignature], dict[str, int]]:
    decls = parse_declarations(text, name)
    sizes: dict[str, tuple[int, ...] | None] = {}
    if target == "cubin":
        sizes = cubin_param_sizes(image)
    else:
        from ._ptx import parse_ptx

        sizes = {k: tuple(p.size for p in v) for k, v in parse_ptx(image.decode(errors="replace")).items()}
    kernels, bounds = {}, {}
    for entry, decl in decls.items():
        if entry not in sizes and sizes:
            continue  # declared but not defined here: not in the image
        kernels[entry] = decl.signature(sizes.get(entry))
        if decl.block_size is not None:
            bounds[entry] = decl.block_size
    return kernels, bounds


_ANNOTATION_PRELUDE = "".join(
    f"#ifndef {name.split('(')[0]}\n#define {name}{(' ' + value) if value else ''}\n#endif\n"
    for name, value in ANNOTATION_MACROS
) + "#line 1\n"


def _with_annotation_macros(text: str) -> str:
    """The source with the empty ``RX_*`` annotation macros defined in front when it uses any (``#line 1``
    keeps line numbers). Defined in the source rather than as ``-D`` flags so that a source without them
    compiles (and is cached) exactly as the user wrote it."""
    return _ANNOTATION_PRELUDE + text if "RX_" in text else text


def _macros(defines) -> tuple[tuple[str, str], ...]:
    out: dict[str, str] = {}
    if defines is None:
        pass
    elif isinstance(defines, Mapping):
        for k, v in defines.items():
            out[str(k)] = "1" if v is None else str(v)
    else:
        for d in defines:
            k, _, v = str(d).partition("=")
            out[k] = v if "=" in str(d) else "1"
    return tuple(out.items())


_SOURCE_SUFFIXES = (".cu", ".cuh")


def read_source(source: str | os.PathLike | bytes) -> tuple[str, Path | None]:
    """The text of a source given as CUDA C++ (text or UTF-8 bytes) or a path to a file, and the path.
    A string is a path when it is one line without ``__global__``."""
    if isinstance(source, bytes | bytearray):
        return decode_text(bytes(source), "the CUDA source", CompileError), None
    if isinstance(source, str) and not source.strip():
        raise CompileError("the CUDA source is empty: pass CUDA C++ text (with an extern \"C\" __global__ "
                           "kernel) or the path of a .cu file")
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and "\n" not in source and "__global__" not in source
    ):
        path = Path(source)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            msg = missing_file_message(path, _SOURCE_SUFFIXES, "CUDA source file")
            if path.suffix.lower() not in _SOURCE_SUFFIXES and isinstance(source, str):
                msg += " (a string without a newline or __global__ is read as a path)"
            raise CompileError(msg) from None
        except IsADirectoryError:
            raise CompileError(f"{path}: is a folder, not a CUDA source file") from None
        except OSError as e:
            raise CompileError(f"{path}: cannot read: {e.strerror or e}") from None
        return decode_text(data, str(path), CompileError), path
    if not isinstance(source, str):
        raise TypeError(f"a CUDA source must be a str or a path (got {type(source).__name__})")
    return source, None


# ---------------------------------------------------------------------------------------------------
# the compiler
# ---------------------------------------------------------------------------------------------------
class Compiler:
    """NVRTC with a disk cache (``cache_dir``; ``False`` to disable) and an in-process memo.

    Thread-safe: the memo and statistics are guarded by a lock; compilations run outside it.
    """

    def __init__(self, cache_dir: str | os.PathLike | None | Literal[False] = None):
        self._root = None if cache_dir is False else Path(cache_dir) if cache_dir is not None else None
        self._use_default_dir = cache_dir is None
        self._disk = None
        self._disk_opened = False
        self._lock = threading.Lock()
        self._memo: dict[bytes, CompiledModule] = {}
        self._stats = CacheStats()

    # -- cache ---------------------------------------------------------------------------------------
    @property
    def directory(self) -> Path | None:
        if self._use_default_dir:
            return cache_dir() / "programs"
        return self._root

    def _disk_cache(self):
        if not self._disk_opened:
            with self._lock:
                if not self._disk_opened:
                    d = self.directory
                    if d is not None:
                        try:
                            self._disk = open_disk_cache(d)
                        except OSError as e:  # a read-only home: compile without a disk cache
                            log.warning("compile cache disabled (%s: %s)", d, e)
                            self._disk = None
                    self._disk_opened = True
        return self._disk

    def stats(self) -> CacheStats:
        with self._lock:
            return self._stats

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = CacheStats()

    def clear(self, memory: bool = True, disk: bool = True) -> None:
        """Forget compiled code: the memo and/or every entry on disk."""
        with self._lock:
            if memory:
                self._memo.clear()
        if disk:
            cache = self._disk_cache()
            if cache is not None:
                cache.clear()

    def _count(self, field: str, seconds: float = 0.0) -> None:
        with self._lock:
            s = self._stats
            self._stats = attrs.evolve(s, **{field: getattr(s, field) + 1},
                                       compile_seconds=s.compile_seconds + seconds)

    # -- compile -------------------------------------------------------------------------------------
    def compile_module(
        self,
        source: str | os.PathLike,
        *,
        arch: str | None = None,
        target: Target | None = None,
        include_paths: Sequence[str | os.PathLike] = (),
        defines: Mapping[str, str | int | float | None] | Sequence[str] | None = None,
        std: str | None = None,
        name: str | None = None,
        options: Mapping[str, object] | None = None,
    ) -> CompiledModule:
        """Compile a source (text, or a path to a .cu file) to a :class:`CompiledModule` (``target``: a cubin, or
        PTX where the CPU device runs the kernels: :func:`default_target`)."""
        text, path = read_source(source)
        target = target or default_target()
        if target not in ("cubin", "ptx"):
            raise ValueError(f"target must be 'cubin' or 'ptx' (got {target!r})")
        arch = check_arch(arch or default_arch(), target)
        name = name or (str(path) if path is not None else "source.cu")
        includes = tuple(str(Path(p)) for p in include_paths)
        macros = _macros(defines)
        extra_opts = _check_options(options or {})
        # the toolkit's own headers (<cuda_fp16.h>, ...): its folder goes last, after the user's
        toolkit = None
        if includes_system_headers(text) and not extra_opts.get("use_bundled_headers"):
            toolkit = toolkit_include_dir()
        search = includes + ((str(toolkit),) if toolkit is not None else ())
        hdigest = headers_digest(header_files(text, path.parent if path is not None else None, includes))
        memo_key = hashlib.sha256(repr((text, target, arch, search, macros, std, name,
                                        tuple(extra_opts.items()), hdigest)).encode()).digest()
        with self._lock:
            hit = self._memo.get(memo_key)
            if hit is not None:
                s = self._stats
                self._stats = attrs.evolve(s, memory_hits=s.memory_hits + 1)
        if hit is not None:
            return attrs.evolve(hit, cached="memory")

        from cuda.core import ProgramOptions

        opts = ProgramOptions(name=name, arch=arch, include_path=list(search) or None,
                              define_macro=list(macros) or None, **({"std": std} if std else {}), **extra_opts)
        compiled_text = _with_annotation_macros(text)
        cache = self._disk_cache()
        key = disk_key(compiled_text, target, opts, hdigest) if cache is not None else None
        image = cache.get(key) if cache is not None else None
        log_text, how, seconds = "", "disk", 0.0
        if image is None:
            how = "miss"
            t0 = time.perf_counter()
            try:
                with _nvtx.range(f"compile {name}"):  # an NVTX range under Nsight, else a no-op
                    image, log_text = _compile(compiled_text, name, opts, target)
            except _CompileFailed as e:
                raise compile_error(name, e.args[0], "NVRTC", missing_header_hint(e.args[0], toolkit)) from None
            finally:
                seconds = time.perf_counter() - t0
            if cache is not None:
                try:
                    cache[key] = image
                except OSError as e:
                    log.warning("could not write the compile cache: %s", e)
        self._count("misses" if how == "miss" else "disk_hits", seconds)
        kernels, bounds = _signatures(text, name, image, target)
        module = CompiledModule(image=bytes(image), format=target, arch=arch, name=name, kernels=kernels,
                                log=log_text, cached=how, block_sizes=bounds)
        with self._lock:
            self._memo[memo_key] = module
        return module

    def compile_cuda(self, source: str | os.PathLike, entry: str | None = None, *, block_size: int | None = None,
                     shared_mem: int = 0, **kwargs) -> KernelCode:
        """Compile and return the :class:`KernelCode` of one kernel; see :func:`compile_cuda`."""
        module = self.compile_module(source, **kwargs)
        try:
            chosen = _choose_entry(module.name, list(module.kernels), entry)
        except CompileError:
            text, _ = read_source(source)
            _choose_entry(module.name, list(module.kernels), entry, text)  # raises, with a hint
            raise
        return module.kernel_code(chosen, block_size=block_size, shared_mem=shared_mem)


def default_target() -> Target:
    """What NVRTC compiles to when nobody says: a cubin for the GPU, PTX where the CPU device runs kernels in this
    process (it runs PTX; a GPU loads PTX too, through the driver's JIT)."""
    from ..cuda._cpu import wants_ptx

    return "ptx" if wants_ptx() else "cubin"


# ---------------------------------------------------------------------------------------------------
# the process-wide compiler
# ---------------------------------------------------------------------------------------------------
_default: list[Compiler] = []
_default_lock = threading.Lock()


def default_compiler() -> Compiler:
    """The compiler :func:`compile_cuda` uses (its disk cache is ``cache_dir()/programs``)."""
    with _default_lock:
        if not _default:
            _default.append(Compiler())
        return _default[0]


def set_default_compiler(compiler: Compiler) -> Compiler:
    """Replace the process-wide compiler (tests use a temporary cache); returns the previous one."""
    with _default_lock:
        prev = _default[0] if _default else Compiler()
        _default[:] = [compiler]
        return prev


def compile_cuda(
    source: str | os.PathLike,
    entry: str | None = None,
    *,
    arch: str | None = None,
    target: Target | None = None,
    include_paths: Sequence[str | os.PathLike] = (),
    defines: Mapping[str, str | int | float | None] | Sequence[str] | None = None,
    std: str | None = None,
    name: str | None = None,
    options: Mapping[str, object] | None = None,
    block_size: int | None = None,
    shared_mem: int = 0,
) -> KernelCode:
    """Compile CUDA C++ (text, or a path to a ``.cu`` file) and return one kernel's :class:`KernelCode`.

    ``entry`` names the kernel (needed when the source has several ``extern "C" __global__`` kernels).
    ``arch``: ``'sm_90'``-style for a cubin (default: the current device's, else ``sm_90``);
    ``target='ptx'`` for PTX (the default where the CPU device runs kernels: :func:`default_target`).
    ``defines`` as ``{"N": 4}`` or ``["N=4", "FAST"]``; ``options`` passes any
    other :class:`cuda.core.ProgramOptions` field (``{"use_fast_math": True}``); ``std`` (``"c++20"``)
    only when the NVRTC default (C++17) will not do. ``block_size`` defaults to the kernel's
    ``__launch_bounds__``, else 256. The CUDA toolkit's headers (``<cuda_fp16.h>``) are found where a
    toolkit is installed (``$CUDA_HOME``, NVIDIA's wheels, ``/usr/local/cuda``). Raises
    :class:`CompileError` with ``diagnostics`` (file, line, column, message) when NVRTC fails, and
    ValueError for an unknown ``arch`` or option.

    >>> code = compile_cuda('extern "C" __global__ void scale(float* x, float s, int n)'
    ...                     '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= s; }')
    >>> [p.describe() for p in code.signature.params]
    ['f32* x (out)', 'f32 s', 'i32 n']
    """
    return default_compiler().compile_cuda(
        source, entry, arch=arch, target=target, include_paths=include_paths, defines=defines, std=std,
        name=name, options=options, block_size=block_size, shared_mem=shared_mem,
    )


def compile_module(source: str | os.PathLike, **kwargs) -> CompiledModule:
    """Compile a source to a :class:`CompiledModule` (all its kernels); arguments as :func:`compile_cuda`."""
    return default_compiler().compile_module(source, **kwargs)


def cache_stats() -> CacheStats:
    """Memory hits, disk hits and misses of the process-wide compiler."""
    return default_compiler().stats()


def clear_cache(memory: bool = True, disk: bool = True) -> Path | None:
    """Empty the process-wide compile cache; returns its directory."""
    c = default_compiler()
    c.clear(memory=memory, disk=disk)
    return c.directory


def cache_info() -> dict[str, object]:
    """Directory, number of entries and bytes on disk of the compile cache."""
    return entries_info(default_compiler().directory)


# ---------------------------------------------------------------------------------------------------
# warming up
# ---------------------------------------------------------------------------------------------------
_warm: dict[str, object] = {"thread": None, "seconds": None}
_warm_lock = threading.Lock()


def warm_up(arch: str | None = None, *, background: bool = True) -> threading.Thread | None:
    """Pay NVRTC's first-call start-up (~200 ms: loading the library and its builtins) now, off the frame
    path: in a daemon thread by default (returned; join it to wait), or inline. Idempotent.

    cuda.core is imported here, on the caller's thread, before the thread starts: its first import is not
    thread-safe, and the caller may compile at once."""
    from cuda.core import Program, ProgramOptions  # noqa: F401  (both imported on this thread: see above)

    arch = arch or default_arch()

    def run():
        t0 = time.perf_counter()
        try:
            src = 'extern "C" __global__ void rx_warm_up(float* x) { x[threadIdx.x] += 1.0f; }'
            _cuda_nvrtc.compile_cubin(src, ProgramOptions(arch=arch))
        except Exception as e:  # warming is best-effort; the real compile will report the problem
            log.warning("NVRTC warm-up failed: %s", e)
        _warm["seconds"] = time.perf_counter() - t0

    with _warm_lock:
        thread = _warm["thread"]
        if thread is None:
            thread = threading.Thread(target=run, name="rxcuda-nvrtc-warm-up", daemon=True)
            _warm["thread"] = thread
            thread.start()
    if not background:
        thread.join()
    return thread
