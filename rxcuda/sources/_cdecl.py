"""Reading ``extern "C" __global__`` kernel declarations from CUDA C++: names, element types, directions,
defaults and ``__launch_bounds__``, without compiling.

An author states what the declaration cannot say with an annotation, either an empty macro that every
compile defines or a comment that any compiler ignores::

    extern "C" __global__ void blend(RX_IN const float* a,     // or: /*in*/ const float* a
                                     RX_INOUT float* acc,      // read and written: /*inout*/
                                     RX_COUNTER unsigned* n,   // an append counter: /*counter*/
                                     float w RX_DEFAULT(0.5),  // a scalar's default: /*= 0.5*/
                                     int count RX_SIZE         // default = element count: /*size*/
                                               RX_COUNTS(a, acc)) // counts a and acc: /*counts a, acc*/

``const T*`` is an input, ``T*`` an output. An int scalar named ``n``, ``size``, ``count`` or
``num_elements`` defaults to the element count unless it says otherwise. ``__launch_bounds__(N)`` gives
the kernel's block size: both ``compile_cuda`` and ``rxcuda kernels build`` take it from here.

``RX_COUNTS(a, acc)`` says that an integer scalar is the element count of those pointer parameters (the kernel
touches them only below it): a value above the smallest of their buffers, or below 0, is then refused
wherever it is set (``rxcuda.model._bounds``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from ..model import _dtypes
from ..model._describe import KernelSignature
from ..model._errors import CompileError
from ._diagnostics import declaration_error
from ._sidecar import kernel_param

#: Empty macros every compile defines, so ``RX_IN const float* a`` compiles anywhere rxcuda compiles it.
ANNOTATION_MACROS: tuple[tuple[str, str], ...] = (
    ("RX_IN", ""),
    ("RX_OUT", ""),
    ("RX_INOUT", ""),
    ("RX_COUNTER", ""),
    ("RX_SIZE", ""),
    ("RX_DEFAULT(x)", ""),
    ("RX_COUNTS(...)", ""),
)
#: The same, as compiler flags (for nvcc).
ANNOTATION_FLAGS: tuple[str, ...] = tuple(f"-D{name}={value}" for name, value in ANNOTATION_MACROS)

_SIZE_NAMES = frozenset({"n", "size", "count", "num_elements"})


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
    counts: tuple[str, ...] = ()  # RX_COUNTS(a, b): the pointer parameters this count scalar counts

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
            raise declaration_error(
                self.file, self.line,
                f"kernel '{self.entry}' declares {len(self.params)} parameters ({listing}) but its compiled "
                f"code takes {len(sizes)}; rxcuda could not read the declaration (macros in the parameter "
                f"list?) - spell the parameters out",
            )
        params = []
        for i, p in enumerate(self.params):
            known = 8 if p.pointer else (_dtypes.itemsize(p.dtype) if p.dtype else None)
            real = sizes[i] if sizes is not None else None
            if known is not None and real is not None and known != real:
                raise declaration_error(
                    self.file, self.line,
                    f"parameter {i} ('{p.name}') of kernel '{self.entry}' is declared '{p.ctype}' ({known} "
                    f"bytes) but the compiled code passes {real} bytes",
                )
            size = known if known is not None else real
            if size is None:
                raise declaration_error(
                    self.file, self.line,
                    f"parameter '{p.name}' of kernel '{self.entry}' has type '{p.ctype}', whose size rxcuda "
                    f"cannot tell without compiling it",
                )
            align = 8 if p.pointer else (size & -size if size < 8 else 8)
            params.append(kernel_param(p, size, align))
        return KernelSignature(entry=self.entry, params=tuple(params))


_DROP_WORDS = frozenset({
    "__restrict__", "__restrict", "restrict", "volatile", "__grid_constant__", "struct", "class",
    "typename", "register", "__device__", "__constant__", "__shared__", "__global__"
})
_ANNOT_COMMENT_RE = re.compile(r"/\*\s*(in|out|inout|counter|size|=\s*[^*]*?|counts\s[^*]*?)\s*\*/")
_ANNOT_RE = re.compile(r"\bRX_(INOUT|IN|OUT|COUNTER|SIZE)\b|\bRX_DEFAULT\s*\(([^()]*)\)|\bRX_COUNTS\s*\(([^()]*)\)")
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
        if word.startswith("counts"):
            return f"RX_COUNTS({word[6:].strip()})"
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


def _parse_param(text: str, file: str, line: int, structs: dict[str, str] | None = None) -> DeclaredParam:
    def fail(msg: str) -> CompileError:
        return declaration_error(file, line, msg)

    direction = None
    default = None
    default_explicit = False
    counts: tuple[str, ...] = ()
    for m in _ANNOT_RE.finditer(text):
        word, value = m.group(1), m.group(2)
        if m.group(3) is not None:
            counts = tuple(dict.fromkeys(c for c in re.split(r"[\s,]+", m.group(3)) if c))
            if not counts or not all(re.fullmatch(r"[A-Za-z_]\w*", c) for c in counts):
                raise fail(f"RX_COUNTS({m.group(3)}) must name pointer parameters, like RX_COUNTS(x, out)")
        elif word == "SIZE":
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
    dtype = _dtypes.from_c_name(base_name)
    pointer = stars > 0
    if dtype is None and structs:  # a struct the source declares
        dtype = structs.get(base_name)
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
        if counts:
            raise fail(f"'{name}' is a pointer; RX_COUNTS belongs on the integer scalar that counts it")
        return DeclaredParam(name, ctype, True, dtype, direction, None, explicit, False)
    if direction not in (None, "in"):
        raise fail(f"'{name}' is a scalar, always an input; RX_{direction.upper()} belongs on pointers")
    if default == "size" and dtype is not None and _dtypes.is_float(dtype):
        raise fail(f"'{name}' defaults to the element count, so it needs an integer type (it is '{ctype}')")
    if counts and (dtype is None or _dtypes.is_float(dtype)):
        raise fail(f"'{name}' counts {', '.join(counts)}, so it needs an integer type (it is '{ctype}')")
    if not default_explicit and name in _SIZE_NAMES and dtype is not None and not _dtypes.is_float(dtype):
        default = "size"
    return DeclaredParam(name, ctype, False, dtype, "in", default, direction is not None, default_explicit, counts)


def parse_declarations(source: str, file: str = "<source>") -> dict[str, KernelDeclaration]:
    """Every ``extern "C" __global__`` kernel of a CUDA C++ source, by name, in source order.

    Templates and kernels without ``extern "C"`` (their names are mangled) are skipped.

    >>> decl = parse_declarations('extern "C" __global__ void k(const float* a, float* b, int n) {}')
    >>> [(p.name, p.spelled(), p.direction, p.default) for p in decl["k"].params]
    [('a', 'f32*', 'in', None), ('b', 'f32*', 'out', None), ('n', 'i32', 'in', 'size')]
    """
    clean = _clean_source(source)
    structs = parse_structs(clean, cleaned=True)
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
            params.append(_parse_param(raw, file, clean.count("\n", 0, max(pos, 0)) + 1, structs))
        seen = set()
        for p in params:
            if p.name in seen:
                msg = f"kernel '{name}' has two parameters named '{p.name}'"
                raise declaration_error(file, line, msg)
            seen.add(p.name)
        pointers = [p.name for p in params if p.pointer]
        for p in params:
            for c in p.counts:
                if c not in pointers:
                    raise declaration_error(file, line, f"'{p.name}' of kernel '{name}' counts '{c}', which is not "
                                            f"a pointer parameter (pointers: {', '.join(pointers) or 'none'})")
        found[name] = KernelDeclaration(entry=name, params=tuple(params), line=line, file=file,
                                        block_size=_launch_bounds(prefix + " " + head.group(0)))
    return found


_STRUCT_RE = re.compile(r"\b(typedef\s+)?struct\s+((?:(?:__align__|alignas)\s*\(\s*\d+\s*\)\s*)*)"
                        r"([A-Za-z_]\w*)?\s*((?:(?:__align__|alignas)\s*\(\s*\d+\s*\)\s*)*)\{")
_ALIGN_RE = re.compile(r"(?:__align__|alignas)\s*\(\s*(\d+)\s*\)")
_FIELD_RE = re.compile(r"^((?:const\s+|volatile\s+)*)([A-Za-z_][\w\s]*?)\s+([A-Za-z_]\w*)\s*(?:\[\s*(\d+)\s*\])?$")


def parse_structs(source: str, *, cleaned: bool = False) -> dict[str, str]:
    """The plain structs a CUDA C++ source declares (``struct Name { float3 pos; float mass; };`` or
    ``typedef struct { ... } Name;``), each declared as an rxcuda dtype (see ``rxcuda.struct``): name ->
    dtype name. A struct rxcuda cannot lay out (a field of an unknown type, a bit field, a member function)
    is left out: a pointer to it stays untyped, as any type rxcuda does not know.

    >>> parse_structs("struct P { float3 pos; float mass; };")["P"]
    'P{pos:float3,mass:f32}'
    """
    clean = source if cleaned else _clean_source(source)
    found: dict[str, str] = {}
    for m in _STRUCT_RE.finditer(clean):
        typedef, name = bool(m.group(1)), m.group(3)
        close = _matching(clean, m.end() - 1, "{", "}")
        if close < 0:
            continue
        if typedef:  # typedef struct [Tag] { ... } Name;
            tail = re.match(r"\s*([A-Za-z_]\w*)\s*;", clean[close + 1:])
            if tail is None:
                continue
            name = tail.group(1)
        if name is None:
            continue
        aligns = [int(a) for a in _ALIGN_RE.findall((m.group(2) or "") + (m.group(4) or ""))]
        try:
            fields = _struct_fields(clean[m.end():close], found)
            found[name] = _dtypes.struct(name, fields, known=found, align=max(aligns, default=0))
        except (ValueError, _Unreadable):
            continue
    return found


class _Unreadable(Exception):
    pass


def _struct_fields(body: str, known: dict[str, str]) -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    for raw in body.split(";"):
        decl = " ".join(raw.split())
        if not decl:
            continue
        if "(" in decl or "{" in decl or ":" in decl.replace("::", ""):
            raise _Unreadable(f"'{decl}' is not a plain field")
        if decl.startswith("static "):
            continue
        decl = _ALIGN_RE.sub(" ", decl).strip()
        head, *more = [d.strip() for d in decl.split(",")]
        m = _FIELD_RE.match(head)
        if m is None:
            raise _Unreadable(f"cannot read the field '{decl}'")
        ctype = " ".join(w for w in m.group(2).split() if w != "struct")
        for part in [head, *more]:
            fm = _FIELD_RE.match(part) if part is head else re.match(r"^([A-Za-z_]\w*)\s*(?:\[\s*(\d+)\s*\])?$", part)
            if fm is None:
                raise _Unreadable(f"cannot read the field '{part}'")
            fname, length = (fm.group(3), fm.group(4)) if part is head else (fm.group(1), fm.group(2))
            dtype = _dtypes.from_c_name(ctype) or known.get(ctype)
            if dtype is None:
                raise _Unreadable(f"field '{fname}' has type '{ctype}', which rxcuda does not know")
            fields.append((fname, f"{dtype}[{length}]" if length else dtype))
    return fields


_BOUNDS_RE = re.compile(r"__launch_bounds__\s*\(\s*([^,()]+)")


def _launch_bounds(head: str) -> int | None:
    """The block size ``__launch_bounds__(N, ...)`` states (before or after ``__global__``); ``None`` when
    there is none or N is not a literal (a macro: only the compiler knows it)."""
    m = _BOUNDS_RE.search(head)
    if m is None:
        return None
    try:
        return int(m.group(1).strip().rstrip("uUlL"), 0)
    except ValueError:
        return None


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
