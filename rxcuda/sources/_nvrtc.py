"""CUDA C++ compiled at run time with NVRTC, cached on disk and in memory.

``compile_cuda(source_or_path)`` turns CUDA C++ into a :class:`KernelCode` the engine loads: a cubin for
the device's own architecture by default (``sm_90`` where no device is present), or PTX on request.

The parameters of the kernel come from its ``extern "C" __global__`` declaration: names, element types,
and directions (``const T*`` is an input, ``T*`` an output). An author states what the declaration
cannot say with an annotation, either an empty macro that every compile defines or a comment that any
compiler ignores::

    extern "C" __global__ void blend(RX_IN const float* a,     // or: /*in*/ const float* a
                                     RX_INOUT float* acc,      // read and written: /*inout*/
                                     RX_COUNTER unsigned* n,   // an append counter: /*counter*/
                                     float w RX_DEFAULT(0.5),  // a scalar's default: /*= 0.5*/
                                     int count RX_SIZE)        // default = element count: /*size*/

An int scalar named ``n``, ``size``, ``count`` or ``num_elements`` defaults to the element count unless it
says otherwise. The declared parameters are checked against the compiled code (the cubin's
``EIATTR_KPARAM_INFO`` records, or the PTX ``.entry``), so a declaration that was misread is an error,
never a wrong launch.

Caching: the compiled image is stored in cuda.core's :class:`~cuda.core.utils.FileStreamProgramCache`
(atomic writes; safe for concurrent processes) under ``cache_dir()``, keyed by the source, the contents
of every header it includes from disk, the options, the architecture and the NVRTC version. An
in-process memo on top answers a repeated request in microseconds. ``cache_stats()`` counts memory hits,
disk hits and misses. ``warm_up()`` pays NVRTC's first-call start-up (~200 ms) in a background thread.

Why cubin by default: PTX from a newer NVRTC than the driver (here NVRTC 13.5, driver 13.0) may not JIT;
a cubin for the device's real architecture loads on any driver of the same major version.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import attrs

from ..model import _dtypes
from ..model._describe import KernelCode, KernelSignature
from ..model._errors import CompileError
from ._sidecar import kernel_param

Target = Literal["cubin", "ptx"]

#: Empty macros every compile defines, so ``RX_IN const float* a`` compiles anywhere rxcuda compiles it.
ANNOTATION_MACROS: tuple[tuple[str, str], ...] = (
    ("RX_IN", ""),
    ("RX_OUT", ""),
    ("RX_INOUT", ""),
    ("RX_COUNTER", ""),
    ("RX_SIZE", ""),
    ("RX_DEFAULT(x)", ""),
)
#: The same, as compiler flags (for nvcc).
ANNOTATION_FLAGS: tuple[str, ...] = tuple(f"-D{name}={value}" for name, value in ANNOTATION_MACROS)

_SIZE_NAMES = frozenset({"n", "size", "count", "num_elements"})
_ENV_DIR = "RXCUDA_CACHE_DIR"
_CACHE_CAP_BYTES = 1 << 30  # a soft cap; cuda.core evicts least recently read entries beyond it
_KEY_SALT = b"rxcuda-nvrtc-1"


# ---------------------------------------------------------------------------------------------------
# diagnostics
# ---------------------------------------------------------------------------------------------------
class Diagnostic(NamedTuple):
    """One message from the compiler: where (1-based line and column; column 0 if unknown) and what."""

    file: str
    line: int
    column: int
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" + (f":{self.column}" if self.column else "")
        return f"{where}: {self.severity}: {self.message}"


_DIAG_RE = re.compile(
    r"^(?P<file>.*?)\((?P<line>\d+)\): (?P<sev>catastrophic error|error|warning|remark|note)"
    r"(?: #[\w-]+)?: (?P<msg>.*)$"
)


def parse_diagnostics(log: str) -> tuple[Diagnostic, ...]:
    """The structured messages of an NVRTC log (``file(line): error: message`` plus a caret line)."""
    lines = log.replace("\x00", "").splitlines()
    out: list[Diagnostic] = []
    for k, text in enumerate(lines):
        m = _DIAG_RE.match(text)
        if m is None:
            continue
        column = 0
        # NVRTC echoes the source line indented by two spaces, then a caret under the offending column.
        if k + 2 < len(lines) and lines[k + 2].strip() == "^" and lines[k + 1].startswith("  "):
            column = lines[k + 2].index("^") - 1
        severity = "error" if m.group("sev") == "catastrophic error" else m.group("sev")
        out.append(Diagnostic(m.group("file"), int(m.group("line")), column, m.group("msg").strip(), severity))
    return tuple(out)


# ---------------------------------------------------------------------------------------------------
# reading kernel declarations
# ---------------------------------------------------------------------------------------------------
@attrs.frozen
class DeclaredParam:
    """One parameter as the source declares it. ``dtype`` is ``None`` for a type rxcuda does not know (a
    struct, ``void*``); ``direction`` and ``default`` are what the source says or implies, and the
    ``*_explicit`` flags tell whether an annotation said it."""

    name: str
    ctype: str
    pointer: bool
    dtype: str | None
    direction: str = "in"
    default: float | int | str | None = None
    direction_explicit: bool = False
    default_explicit: bool = False

    def spelled(self) -> str:
        """The sidecar spelling of the type: ``'f32*'``, ``'void*'``, ``'i32'``."""
        if self.pointer:
            return f"{self.dtype or 'void'}*"
        return str(self.dtype)


@attrs.frozen
class KernelDeclaration:
    """An ``extern "C" __global__`` function found in a source: its name, parameters and line."""

    entry: str
    params: tuple[DeclaredParam, ...]
    line: int = 0
    file: str = "<source>"
    block_size: int | None = None  # from __launch_bounds__(N), when the source says it

    def signature(self, sizes: Sequence[int] | None = None) -> KernelSignature:
        """The :class:`KernelSignature` of this kernel. ``sizes`` are the compiled parameters' sizes (from
        the cubin or PTX); they are checked against the declaration and give the size of any type rxcuda
        does not know. Raises :class:`CompileError` on a disagreement."""
        if sizes is not None and len(sizes) != len(self.params):
            listing = ", ".join(p.name for p in self.params) or "none"
            raise CompileError(
                f"{self.file}:{self.line}: kernel '{self.entry}' declares {len(self.params)} parameters "
                f"({listing}) but its compiled code takes {len(sizes)}; rxcuda could not read the "
                f"declaration (macros in the parameter list?) - spell the parameters out",
                diagnostics=(Diagnostic(self.file, self.line, 0, "parameter list could not be read"),),
            )
        params = []
        for i, p in enumerate(self.params):
            known = 8 if p.pointer else (_dtypes.itemsize(p.dtype) if p.dtype else None)
            real = sizes[i] if sizes is not None else None
            if known is not None and real is not None and known != real:
                raise CompileError(
                    f"{self.file}:{self.line}: parameter {i} ('{p.name}') of kernel '{self.entry}' is "
                    f"declared '{p.ctype}' ({known} bytes) but the compiled code passes {real} bytes",
                    diagnostics=(Diagnostic(self.file, self.line, 0, f"size of '{p.name}' disagrees"),),
                )
            size = known if known is not None else real
            if size is None:
                raise CompileError(
                    f"{self.file}:{self.line}: parameter '{p.name}' of kernel '{self.entry}' has type "
                    f"'{p.ctype}', whose size rxcuda cannot tell without compiling it",
                    diagnostics=(Diagnostic(self.file, self.line, 0, f"unknown type of '{p.name}'"),),
                )
            align = 8 if p.pointer else (size & -size if size < 8 else 8)
            params.append(kernel_param(p, size, align))
        return KernelSignature(entry=self.entry, params=tuple(params))


_C_TYPES: dict[str, str] = {
    "float": "f32", "double": "f64", "half": "f16", "__half": "f16",
    "int": "i32", "signed": "i32", "signed int": "i32", "int32_t": "i32",
    "unsigned": "u32", "unsigned int": "u32", "uint32_t": "u32", "uint": "u32",
    "short": "i16", "short int": "i16", "signed short": "i16", "int16_t": "i16",
    "unsigned short": "u16", "unsigned short int": "u16", "uint16_t": "u16",
    "char": "i8", "signed char": "i8", "int8_t": "i8", "unsigned char": "u8", "uint8_t": "u8",
    "long long": "i64", "long long int": "i64", "signed long long": "i64", "int64_t": "i64",
    "long": "i64", "long int": "i64", "ptrdiff_t": "i64",
    "unsigned long long": "u64", "unsigned long long int": "u64", "uint64_t": "u64",
    "unsigned long": "u64", "size_t": "u64",
}
_DROP_WORDS = frozenset({
    "__restrict__", "__restrict", "restrict", "volatile", "__grid_constant__", "struct", "class",
    "typename", "register", "__device__", "__constant__", "__shared__", "__global__"
})
_ANNOT_COMMENT_RE = re.compile(r"/\*\s*(in|out|inout|counter|size|=\s*[^*]*?)\s*\*/")
_ANNOT_RE = re.compile(r"\bRX_(INOUT|IN|OUT|COUNTER|SIZE)\b|\bRX_DEFAULT\s*\(([^()]*)\)")
_GLOBAL_RE = re.compile(r"\b__global__\b")
_ATTR_RE = r"(?:(?:__launch_bounds__|__cluster_dims__|__maxnreg__)\s*\([^()]*\)|__noinline__|static|inline)"
_HEAD_RE = re.compile(r"\s*(?:" + _ATTR_RE + r"\s*)*void\s+(?:" + _ATTR_RE + r"\s*)*([A-Za-z_]\w*)\s*\(")
_EXTERN_BLOCK_RE = re.compile(r'extern\s+"C"\s*\{')


def _clean_source(text: str) -> str:
    """Comments and preprocessor lines blanked (newlines kept, so offsets keep their line); annotation
    comments such as ``/*in*/`` turned into the matching ``RX_`` marker first."""

    def annot(m: re.Match) -> str:
        word = m.group(1).strip()
        if word.startswith("="):
            return f"RX_DEFAULT({word[1:].strip()})"
        return f"RX_{word.upper()}"

    text = _ANNOT_COMMENT_RE.sub(annot, text)
    out: list[str] = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":
            # a preprocessor line, with its continuations
            j = i
            while True:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                    break
                if k > 0 and text[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:k]))
            i = k
            continue
        if c in " \t":
            out.append(c)
            i += 1
            continue
        at_line_start = c == "\n"
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _matching(text: str, i: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at ``text[i]``, or -1."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for j, c in enumerate(text):
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:])
    return [p for p in (s.strip() for s in parts) if p and p != "void"]


def _literal(text: str) -> float | int | str:
    t = text.strip()
    if t == "size":
        return "size"
    body = t.lstrip("+-")
    sign = -1 if t.startswith("-") else 1
    try:
        if body.lower().startswith("0x"):
            return sign * int(body.rstrip("uUlL"), 16)
        stripped = body.rstrip("uUlL")
        if re.fullmatch(r"\d+", stripped):
            return sign * int(stripped)
        return sign * float(body.rstrip("fFlL"))
    except ValueError:
        raise ValueError(f"default {text!r} is not a number or 'size'") from None


def _parse_param(text: str, file: str, line: int) -> DeclaredParam:
    def fail(msg: str) -> CompileError:
        return CompileError(f"{file}:{line}: {msg}", diagnostics=(Diagnostic(file, line, 0, msg),))

    direction = None
    default = None
    default_explicit = False
    for m in _ANNOT_RE.finditer(text):
        word, value = m.group(1), m.group(2)
        if word == "SIZE":
            default, default_explicit = "size", True
        elif word is None:
            try:
                default, default_explicit = _literal(value), True
            except ValueError as e:
                raise fail(str(e)) from None
        else:
            direction = word.lower()
    text = _ANNOT_RE.sub(" ", text)
    if "=" in text:  # a C++ default argument
        text, value = text.split("=", 1)
        if not default_explicit:
            try:
                default, default_explicit = _literal(value), True
            except ValueError as e:
                raise fail(str(e)) from None
    text = re.sub(r"\b(?:__align__|alignas)\s*\([^()]*\)", " ", text)
    array = bool(re.search(r"\[[^\]]*\]\s*$", text))
    text = re.sub(r"\[[^\]]*\]\s*$", " ", text)
    tokens = re.findall(r"[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*|\*|&|<[^<>]*>", text)
    tokens = [t for t in tokens if t not in _DROP_WORDS]
    if not tokens or not re.fullmatch(r"[A-Za-z_]\w*", tokens[-1]):
        raise fail(f"cannot read the kernel parameter '{text.strip()}'; write it as 'type name'")
    name = tokens.pop()
    stars = tokens.count("*") + (1 if array else 0)
    first_star = tokens.index("*") if "*" in tokens else len(tokens)
    const = "const" in tokens[:first_star]
    base = [t for t in tokens if t not in ("*", "const", "&")]
    ctype = " ".join([*(["const"] if const else []), *base]) + ("*" * stars)
    base_name = " ".join(base)
    dtype = _C_TYPES.get(base_name)
    pointer = stars > 0
    if stars > 1 or "&" in tokens:
        dtype = None
    if pointer:
        explicit = direction is not None
        if direction is None:
            direction = "in" if const else "out"
        if direction == "counter" and dtype != "u32":
            raise fail(f"'{name}' is a counter, which must be an 'unsigned int*' (it is '{ctype}')")
        if default_explicit:
            raise fail(f"'{name}' is a pointer and takes no default; bind or connect a buffer to it")
        return DeclaredParam(name, ctype, True, dtype, direction, None, explicit, False)
    if direction not in (None, "in"):
        raise fail(f"'{name}' is a scalar, always an input; RX_{direction.upper()} belongs on pointers")
    if default == "size" and dtype is not None and _dtypes.is_float(dtype):
        raise fail(f"'{name}' defaults to the element count, so it needs an integer type (it is '{ctype}')")
    if not default_explicit and name in _SIZE_NAMES and dtype is not None and not _dtypes.is_float(dtype):
        default = "size"
    return DeclaredParam(name, ctype, False, dtype, "in", default, direction is not None, default_explicit)


def parse_declarations(source: str, file: str = "<source>") -> dict[str, KernelDeclaration]:
    """Every ``extern "C" __global__`` kernel of a CUDA C++ source, by name, in source order.

    Templates and kernels without ``extern "C"`` (their names are mangled) are skipped.

    >>> decl = parse_declarations('extern "C" __global__ void k(const float* a, float* b, int n) {}')
    >>> [(p.name, p.spelled(), p.direction, p.default) for p in decl["k"].params]
    [('a', 'f32*', 'in', None), ('b', 'f32*', 'out', None), ('n', 'i32', 'in', 'size')]
    """
    clean = _clean_source(source)
    blocks = []
    for m in _EXTERN_BLOCK_RE.finditer(clean):
        end = _matching(clean, m.end() - 1, "{", "}")
        blocks.append((m.end(), end if end >= 0 else len(clean)))
    found: dict[str, KernelDeclaration] = {}
    for m in _GLOBAL_RE.finditer(clean):
        start = max(clean.rfind(c, 0, m.start()) for c in ";{}")
        prefix = clean[start + 1 : m.start()]
        if re.search(r"\btemplate\b", prefix):
            continue
        extern_c = re.search(r'extern\s+"C"', prefix) is not None or any(a <= m.start() < b for a, b in blocks)
        head = _HEAD_RE.match(clean, m.end())
        if head is None or not extern_c:
            continue
        name = head.group(1)
        open_ = head.end() - 1
        close = _matching(clean, open_, "(", ")")
        if close < 0:
            continue
        line = clean.count("\n", 0, m.start()) + 1
        params = []
        offset = open_ + 1
        for raw in _split_params(clean[open_ + 1 : close]):
            pos = clean.find(raw, offset)
            offset = pos + len(raw) if pos >= 0 else offset
            params.append(_parse_param(raw, file, clean.count("\n", 0, max(pos, 0)) + 1))
        seen = set()
        for p in params:
            if p.name in seen:
                msg = f"kernel '{name}' has two parameters named '{p.name}'"
                raise CompileError(f"{file}:{line}: {msg}", diagnostics=(Diagnostic(file, line, 0, msg),))
            seen.add(p.name)
        bounds = re.search(r"__launch_bounds__\s*\(\s*(\d+)", head.group(0))
        found[name] = KernelDeclaration(entry=name, params=tuple(params), line=line, file=file,
                                        block_size=int(bounds.group(1)) if bounds else None)
    return found


def mangled_kernels(source: str) -> list[str]:
    """Names of ``__global__`` functions that are not ``extern "C"`` (for a helpful message)."""
    clean = _clean_source(source)
    names = []
    for m in _GLOBAL_RE.finditer(clean):
        head = _HEAD_RE.match(clean, m.end())
        if head:
            names.append(head.group(1))
    declared = parse_declarations(source)
    return [n for n in names if n not in declared]


# ---------------------------------------------------------------------------------------------------
# headers
# ---------------------------------------------------------------------------------------------------
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def header_files(source: str, base_dir: Path | None, include_paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The headers on disk a source includes, transitively, in the order first seen. Headers that are
    not found on disk (the CUDA headers NVRTC carries) are left out: NVRTC's version covers them."""
    paths = [Path(p) for p in include_paths]
    seen: dict[Path, None] = {}
    stack: list[tuple[str, Path | None]] = [(source, base_dir)]
    while stack:
        text, here = stack.pop()
        for m in _INCLUDE_RE.finditer(text):
            quote, name = m.group(1), m.group(2)
            candidates = ([here] if quote == '"' and here is not None else []) + paths
            for d in candidates:
                p = d / name
                if p.is_file():
                    p = p.resolve()
                    if p not in seen:
                        seen[p] = None
                        with contextlib.suppress(OSError):
                            stack.append((p.read_text(encoding="utf-8", errors="replace"), p.parent))
                    break
    return list(seen)


def _headers_digest(headers: Iterable[Path]) -> bytes:
    h = hashlib.sha256(_KEY_SALT)
    for p in headers:
        h.update(str(p).encode() + b"\0")
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(b"<unreadable>")
        h.update(b"\0")
    return h.digest()


# ---------------------------------------------------------------------------------------------------
# architecture and NVRTC
# ---------------------------------------------------------------------------------------------------
_arch_lock = threading.Lock()
_device_arch: list[str | None] = []


def device_arch() -> str | None:
    """``sm_XY`` of CUDA device 0, or ``None`` when there is no usable device (no driver, no GPU)."""
    with _arch_lock:
        if not _device_arch:
            arch = None
            try:
                from cuda.bindings import driver

                (err,) = driver.cuInit(0)
                if int(err) == 0:
                    err, dev = driver.cuDeviceGet(0)
                    if int(err) == 0:
                        attr = driver.CUdevice_attribute
                        err1, major = driver.cuDeviceGetAttribute(
                            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
                        err2, minor = driver.cuDeviceGetAttribute(
                            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
                        if int(err1) == 0 and int(err2) == 0:
                            arch = f"sm_{major}{minor}"
            except Exception:  # no driver library (DynamicLibNotFoundError), no device, ...
                arch = None
            _device_arch.append(arch)
        return _device_arch[0]


def default_arch() -> str:
    """The architecture to compile for: the current device's, else ``sm_90``."""
    return device_arch() or "sm_90"


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library in use."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


def _check(err, call: str) -> None:
    from cuda.bindings import nvrtc

    if int(err) != 0:
        _e, msg = nvrtc.nvrtcGetErrorString(err)
        raise CompileError(f"{call} failed: {msg.decode() if isinstance(msg, bytes) else msg}")


def _nvrtc_ptx(source: str, name: str, options: Sequence[bytes]) -> tuple[bytes, str]:
    """NVRTC to PTX through cuda.bindings. (cuda.core's ``Program.compile('ptx')`` asks the driver whether
    it could load the result, which fails where there is no driver.) Returns (ptx, log)."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), list(options))
        _e, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\x00").decode(errors="replace")
        if int(err) != 0:
            raise _compile_error(name, log)
        _e, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(prog, ptx)
        _check(err, "nvrtcGetPTX")
        return ptx.rstrip(b"\x00"), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_error(name: str, log: str, source: str | None = None) -> CompileError:
    log = log.replace("\x00", "").strip()
    diags = parse_diagnostics(log)
    errors = [d for d in diags if d.severity == "error"] or list(diags)
    if errors:
        shown = "\n".join(f"  {d}" for d in errors[:5])
        more = f"\n  ... and {len(errors) - 5} more" if len(errors) > 5 else ""
        message = f"NVRTC could not compile {name}: {len(errors)} error(s)\n{shown}{more}"
    else:
        message = f"NVRTC could not compile {name}:\n{log}"
    return CompileError(message, diagnostics=diags, log=log)


# ---------------------------------------------------------------------------------------------------
# the cache
# ---------------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    """Where compiled code is cached: ``$RXCUDA_CACHE_DIR``, else ``$XDG_CACHE_HOME/rxcuda`` or
    ``~/.cache/rxcuda`` (``%LOCALAPPDATA%\\rxcuda`` on Windows)."""
    env = os.environ.get(_ENV_DIR)
    if env:
        return Path(env).expanduser()
    if os.name == "nt":
        root = os.environ.get("LOCALAPPDATA")
        return (Path(root) if root else Path.home() / "AppData" / "Local") / "rxcuda"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rxcuda"


@attrs.frozen
class CacheStats:
    """Counts since the compiler was made (or its stats reset). ``compile_seconds`` is spent in NVRTC."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compile_seconds: float = 0.0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits

    @property
    def requests(self) -> int:
        return self.hits + self.misses


class _FileCache:
    """Fallback for a cuda.core without ``utils.FileStreamProgramCache``: atomic files, same layout idea."""

    def __init__(self, root: Path):
        self._entries = root / "entries"
        self._tmp = root / "tmp"
        self._entries.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)

    def _path(self, key: bytes) -> Path:
        d = hashlib.sha256(key).hexdigest()
        return self._entries / d[:2] / d[2:]

    def get(self, key: bytes, default=None):
        try:
            return self._path(key).read_bytes()
        except OSError:
            return default

    def __setitem__(self, key: bytes, value: bytes) -> None:
        import tempfile

        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._tmp)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(bytes(value))
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def clear(self) -> None:
        import shutil

        shutil.rmtree(self._entries, ignore_errors=True)
        self._entries.mkdir(parents=True, exist_ok=True)


def _open_disk_cache(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    try:
        from cuda.core.utils import FileStreamProgramCache
    except ImportError:
        return _FileCache(root)
    return FileStreamProgramCache(root, max_size_bytes=_CACHE_CAP_BYTES)


def _disk_key(source: str, target: str, opts, extra: bytes) -> bytes:
    try:
        from cuda.core.utils import make_program_cache_key
    except ImportError:
        h = hashlib.sha256(_KEY_SALT)
        for part in (source.encode(), target.encode(), b"\0".join(_option_bytes(opts, target)),
                     repr(nvrtc_version()).encode(), str(opts.name).encode(), extra):
            h.update(len(part).to_bytes(8, "big") + part)
        return h.digest()
    return make_program_cache_key(code=source, code_type="c++", options=opts, target_type=target,
                                  extra_digest=extra)


@attrs.frozen(eq=False)
class CompiledModule:
    """One compiled translation unit: its image and the signature of each ``extern "C"`` kernel in it."""

    image: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    format: Target
    arch: str
    name: str
    kernels: Mapping[str, KernelSignature]
    log: str = ""
    cached: str = "miss"  # how this request was answered: 'memory', 'disk' or 'miss'

    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in parse_diagnostics(self.log) if d.severity == "warning")

    def kernel_code(self, entry: str | None = None, *, origin: str | None = None, block_size: int = 256,
                    shared_mem: int = 0) -> KernelCode:
        """The :class:`KernelCode` of one kernel (the only one when ``entry`` is ``None``)."""
        entry = _choose_entry(self.name, list(self.kernels), entry)
        return KernelCode(entry=entry, image=self.image, format=self.format, signature=self.kernels[entry],
                          origin=origin or self.name, block_size=block_size, shared_mem=shared_mem)


def _choose_entry(name: str, entries: list[str], entry: str | None, source: str | None = None) -> str:
    if entry is not None:
        if entry in entries:
            return entry
        hint = ""
        if source is not None and entry in mangled_kernels(source):
            hint = f"; '{entry}' is not extern \"C\": declare it extern \"C\" __global__ void {entry}(...)"
        raise CompileError(f"{name}: no kernel '{entry}' (its extern \"C\" kernels: "
                           f"{', '.join(entries) or 'none'}){hint}")
    if len(entries) == 1:
        return entries[0]
    if not entries:
        raise CompileError(f"{name}: no extern \"C\" __global__ kernel found; declare one as "
                           f"extern \"C\" __global__ void name(...)")
    raise CompileError(f"{name}: several kernels ({', '.join(entries)}); say which one with entry=")


class Compiler:
    """NVRTC with a disk cache (``cache_dir``; ``None`` to disable) and an in-process memo.

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
                            self._disk = _open_disk_cache(d)
                        except OSError as e:  # a read-only home: compile without a disk cache
                            print(f"rxcuda: compile cache disabled ({d}: {e})", file=sys.stderr)
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
        target: Target = "cubin",
        include_paths: Sequence[str | os.PathLike] = (),
        defines: Mapping[str, str | int | float | None] | Sequence[str] | None = None,
        std: str | None = None,
        name: str | None = None,
        options: Mapping[str, object] | None = None,
    ) -> CompiledModule:
        """Compile a source (text, or a path to a .cu file) to a :class:`CompiledModule`."""
        text, path = _read_source(source)
        if target not in ("cubin", "ptx"):
            raise ValueError(f"target must be 'cubin' or 'ptx' (got {target!r})")
        arch = arch or default_arch()
        if target == "cubin" and arch.startswith("compute_"):
            raise ValueError(f"a cubin needs a real architecture such as 'sm_90' (got {arch!r})")
        name = name or (str(path) if path is not None else "source.cu")
        includes = tuple(str(Path(p)) for p in include_paths)
        macros = _macros(defines)
        extra_opts = dict(sorted((options or {}).items()))
        headers = header_files(text, path.parent if path is not None else None, includes)
        hdigest = _headers_digest(headers)
        memo_key = hashlib.sha256(repr((text, target, arch, includes, macros, std, name,
                                        tuple(extra_opts.items()), hdigest)).encode()).digest()
        with self._lock:
            hit = self._memo.get(memo_key)
            if hit is not None:
                s = self._stats
                self._stats = attrs.evolve(s, memory_hits=s.memory_hits + 1)
        if hit is not None:
            return attrs.evolve(hit, cached="memory")

        from cuda.core import ProgramOptions

        kwargs = dict(name=name, arch=arch, include_path=list(includes) or None, define_macro=list(macros) or None,
                      **({"std": std} if std else {}), **extra_opts)
        opts = ProgramOptions(**kwargs)
        compiled_text = _with_annotation_macros(text)
        cache = self._disk_cache()
        key = _disk_key(compiled_text, target, opts, hdigest) if cache is not None else None
        image = cache.get(key) if cache is not None else None
        log, how, seconds = "", "disk", 0.0
        if image is None:
            how = "miss"
            t0 = time.perf_counter()
            try:
                image, log = _compile(compiled_text, name, opts, target)
            finally:
                seconds = time.perf_counter() - t0
            if cache is not None:
                try:
                    cache[key] = image
                except OSError as e:
                    print(f"rxcuda: could not write the compile cache: {e}", file=sys.stderr)
        self._count("misses" if how == "miss" else "disk_hits", seconds)
        kernels = _signatures(text, name, image, target)
        module = CompiledModule(image=bytes(image), format=target, arch=arch, name=name, kernels=kernels,
                                log=log, cached=how)
        with self._lock:
            self._memo[memo_key] = module
        return module

    def compile_cuda(self, source: str | os.PathLike, entry: str | None = None, *, block_size: int = 256,
                     shared_mem: int = 0, **kwargs) -> KernelCode:
        """Compile and return the :class:`KernelCode` of one kernel; see :func:`compile_cuda`."""
        module = self.compile_module(source, **kwargs)
        try:
            chosen = _choose_entry(module.name, list(module.kernels), entry)
        except CompileError:
            text, _ = _read_source(source)
            _choose_entry(module.name, list(module.kernels), entry, text)  # raises, with a hint
            raise
        return module.kernel_code(chosen, block_size=block_size, shared_mem=shared_mem)


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


def _read_source(source: str | os.PathLike) -> tuple[str, Path | None]:
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and "\n" not in source and "__global__" not in source
    ):
        path = Path(source)
        try:
            return path.read_text(encoding="utf-8"), path
        except FileNotFoundError:
            raise CompileError(f"{path}: no such CUDA source file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise CompileError(f"{path}: cannot read: {e}") from None
    if not isinstance(source, str):
        raise TypeError(f"a CUDA source must be a str or a path (got {type(source).__name__})")
    return source, None


def _option_bytes(opts, target: str) -> list[bytes]:
    """NVRTC flags of a ProgramOptions (``as_bytes`` in cuda.core 1.x; older releases spell it
    differently, so fall back to the few fields rxcuda sets)."""
    try:
        return list(opts.as_bytes("nvrtc", target))
    except (AttributeError, TypeError):
        pass
    flags = [f"-arch={opts.arch}"]
    if opts.std:
        flags.append(f"--std={opts.std}")
    for d in opts.include_path or ():
        flags.append(f"--include-path={d}")
    for m in opts.define_macro or ():
        flags.append(f"--define-macro={m[0]}={m[1]}" if isinstance(m, tuple) else f"--define-macro={m}")
    return [f.encode() for f in flags]


def _compile(text: str, name: str, opts, target: str) -> tuple[bytes, str]:
    if target == "ptx":
        return _nvrtc_ptx(text, name, _option_bytes(opts, "ptx"))
    import io

    from cuda.core import Program

    logs = io.StringIO()
    try:
        obj = Program(text, "c++", options=opts).compile("cubin", logs=logs)
    except Exception as e:
        if type(e).__name__ == "NVRTCError" or "NVRTC_ERROR" in str(e):
            msg = str(e)
            log = msg.split("compilation log:", 1)[1] if "compilation log:" in msg else msg
            raise _compile_error(name, log) from None
        raise
    return bytes(obj.code), logs.getvalue().replace("\x00", "")


def cubin_param_sizes(image: bytes) -> dict[str, tuple[int, ...] | None]:
    """Each kernel of a cubin mapped to its parameter sizes (``None`` where they cannot be read)."""
    from ._files import cubin_params

    return cubin_params(image) or {}


def _signatures(text: str, name: str, image: bytes, target: str) -> dict[str, KernelSignature]:
    decls = parse_declarations(text, name)
    sizes: dict[str, tuple[int, ...] | None] = {}
    if target == "cubin":
        sizes = cubin_param_sizes(image)
    else:
        from ._ptx import parse_ptx

        sizes = {k: tuple(p.size for p in v) for k, v in parse_ptx(image.decode(errors="replace")).items()}
    out = {}
    for entry, decl in decls.items():
        if entry not in sizes and sizes:
            continue  # declared but not defined here: not in the image
        out[entry] = decl.signature(sizes.get(entry))
    return out


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
    target: Target = "cubin",
    include_paths: Sequence[str | os.PathLike] = (),
    defines: Mapping[str, str | int | float | None] | Sequence[str] | None = None,
    std: str | None = None,
    name: str | None = None,
    options: Mapping[str, object] | None = None,
    block_size: int = 256,
    shared_mem: int = 0,
) -> KernelCode:
    """Compile CUDA C++ (text, or a path to a ``.cu`` file) and return one kernel's :class:`KernelCode`.

    ``entry`` names the kernel (needed when the source has several ``extern "C" __global__`` kernels).
    ``arch``: ``'sm_90'``-style for a cubin (default: the current device's, else ``sm_90``);
    ``target='ptx'`` for PTX. ``defines`` as ``{"N": 4}`` or ``["N=4", "FAST"]``; ``options`` passes any
    other :class:`cuda.core.ProgramOptions` field (``{"use_fast_math": True}``); ``std`` (``"c++20"``)
    only when the NVRTC default (C++17) will not do. Raises
    :class:`CompileError` with ``diagnostics`` (file, line, column, message) when NVRTC fails.

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
    d = default_compiler().directory
    entries = 0
    size = 0
    if d is not None and (d / "entries").is_dir():
        for p in (d / "entries").rglob("*"):
            if p.is_file():
                entries += 1
                size += p.stat().st_size
    return {"directory": str(d) if d else None, "entries": entries, "bytes": size}


_warm = {"thread": None, "seconds": None}
_warm_lock = threading.Lock()


def warm_up(arch: str | None = None, *, background: bool = True) -> threading.Thread | None:
    """Pay NVRTC's first-call start-up (~200 ms: loading the library and its builtins) now, off the frame
    path: in a daemon thread by default (returned; join it to wait), or inline. Idempotent."""

    def run():
        t0 = time.perf_counter()
        try:
            from cuda.core import Program, ProgramOptions

            src = 'extern "C" __global__ void rx_warm_up(float* x) { x[threadIdx.x] += 1.0f; }'
            Program(src, "c++", options=ProgramOptions(arch=arch or default_arch())).compile("cubin")
        except Exception as e:  # warming is best-effort; the real compile will report the problem
            print(f"rxcuda: NVRTC warm-up failed: {e}", file=sys.stderr)
        _warm["seconds"] = time.perf_counter() - t0

    with _warm_lock:
        thread = _warm["thread"]
        if thread is not None:
            if not background:
                thread.join()
            return thread
        thread = threading.Thread(target=run, name="rxcuda-nvrtc-warm-up", daemon=True)
        _warm["thread"] = thread
        thread.start()
    if not background:
        thread.join()
    return thread


def load_code(source, *, arch: str | None = None) -> KernelCode | None:
    """A :class:`KernelCode` from anything this module compiles: a composed kernel (anything with a
    ``kernel_code`` method) or a ``.cu``/``.cuh`` path; ``None`` for anything else (a KernelCode, a .ptx
    path), which the caller handles."""
    if hasattr(source, "kernel_code") and callable(source.kernel_code):
        return source.kernel_code(arch=arch)
    if isinstance(source, str | os.PathLike) and Path(source).suffix in (".cu", ".cuh"):
        return compile_cuda(source, arch=arch)
    return None
