"""Reading PTX text: the header (``.version``, ``.target``) and each ``.entry``'s parameter list.

Only what the engine needs to launch a kernel is parsed: names, types, sizes and alignments of the entry
parameters, in order. Instruction bodies are skipped.

A PTX parameter says how many bytes it takes, not what it means: nvcc writes a pointer and a
``long long`` alike as ``.u64``, and an ``int`` as ``.u32``. :func:`signature_from_ptx` therefore reads
every 64-bit integer as a pointer of unknown element type; the JSON sidecar (``_sidecar.py``) says what a
parameter really is, and is checked against these sizes.
"""

from __future__ import annotations

import difflib
import re

import attrs

from ..model._describe import KernelParam, KernelSignature
from ..model._errors import KernelFileError

# bytes per PTX fundamental type; texture/sampler/surface references are 64-bit opaque handles
_TYPE_SIZES: dict[str, int] = {
    "b8": 1, "b16": 2, "b32": 4, "b64": 8, "b128": 16,
    "u8": 1, "u16": 2, "u32": 4, "u64": 8,
    "s8": 1, "s16": 2, "s32": 4, "s64": 8,
    "f16": 2, "f16x2": 4, "bf16": 2, "f32": 4, "f64": 8,
    "texref": 8, "samplerref": 8, "surfref": 8,
}
_STATE_SPACES = ("global", "const", "local", "shared")
# A PTX identifier: a letter, or one of _ $ % followed by at least one more character.
_IDENT = r"(?:[A-Za-z][\w$]*|[_$%][\w$]+)"
_ENTRY_RE = re.compile(r"\.entry\s+(" + _IDENT + r")")
_NAME_RE = re.compile(r"^(" + _IDENT + r")(?:\[(\d*)\])?$")
_VERSION_RE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)
_TARGET_RE = re.compile(r"^\s*\.target\s+([^\n;]+)", re.MULTILINE)


@attrs.frozen
class PtxParam:
    """One ``.param`` of a PTX ``.entry``, as written.

    ``size`` covers the whole parameter (``count`` elements for an array such as ``.b8 s[16]``, which is
    how nvcc passes a struct by value). ``align`` is the parameter's own alignment: the explicit
    ``.align N`` before the type, else the type's size. ``ptr`` is set for ``.ptr``-annotated pointers
    (Triton writes them); ``ptr_space`` and ``ptr_align`` then describe the memory pointed to.
    """

    name: str
    ptx_type: str
    size: int
    align: int
    count: int | None = None
    ptr: bool = False
    ptr_space: str | None = None
    ptr_align: int | None = None

    @property
    def is_array(self) -> bool:
        return self.count is not None


def strip_comments(text: str) -> str:
    """``text`` with ``//`` and ``/* */`` comments blanked out; quoted strings (``.file``) are kept.

    Newlines inside block comments are kept so that later messages could still count lines.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            # A path in a .file directive may contain "//"; copy the string through its closing quote.
            j = text.find('"', i + 1)
            j = n if j < 0 else j + 1
            out.append(text[i:j])
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise KernelFileError("unterminated /* comment in PTX")
            out.append("\n" * text.count("\n", i, j))
            i = j + 2
        else:
            j = i
            while j < n and text[j] not in '"/':
                j += 1
            if j == i:  # a lone '/' (division never appears at top level, but be safe)
                j += 1
            out.append(text[i:j])
            i = j
    return "".join(out)


def ptx_version(text: str) -> tuple[int, int]:
    """The PTX ISA version from the ``.version`` directive, e.g. ``(9, 0)``."""
    m = _VERSION_RE.search(strip_comments(text))
    if m is None:
        raise KernelFileError("PTX has no '.version' directive; is this really a .ptx file?")
    return int(m.group(1)), int(m.group(2))


def ptx_target(text: str) -> str:
    """The first architecture named by the ``.target`` directive, e.g. ``'sm_75'``.

    ``.target sm_90a, texmode_independent`` gives ``'sm_90a'``.
    """
    m = _TARGET_RE.search(strip_comments(text))
    if m is None:
        raise KernelFileError("PTX has no '.target' directive; is this really a .ptx file?")
    return m.group(1).split(",")[0].strip()


def check_ptx(text: str, path: str | None = None) -> None:
    """Raise :class:`KernelFileError` (naming ``path``) unless ``text`` looks like a whole PTX module: a
    ``.version`` and a ``.target`` directive, and every ``.entry`` with a body whose braces close. A file
    cut short (a copy or a build interrupted) is caught here, at load, rather than by the driver later.
    """
    where = f"{path}: " if path else ""

    def fail(why: str) -> KernelFileError:
        return KernelFileError(f"{where}{why}; the file is incomplete or not PTX - rebuild it (rxcuda kernels "
                               f"build, or nvcc -ptx)", path=path)

    try:
        clean = strip_comments(text)
    except KernelFileError as e:
        raise fail(str(e)) from None
    if _VERSION_RE.search(clean) is None:
        raise fail("no '.version' directive")
    if _TARGET_RE.search(clean) is None:
        raise fail("no '.target' directive")
    depth = 0
    for k, c in enumerate(clean):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                raise fail(f"a '}}' without its '{{' at line {clean.count(chr(10), 0, k) + 1}")
    if depth:
        raise fail(f"{depth} '{{' never closed (the file ends at line {clean.count(chr(10)) + 1})")
    for m in _ENTRY_RE.finditer(clean):
        i = m.end()
        while i < len(clean) and clean[i].isspace():
            i += 1
        if i < len(clean) and clean[i] == "(":
            i = clean.find(")", i) + 1
            if i == 0:
                continue  # an unterminated parameter list: parse_ptx names it
        # between the parameter list and the body only performance directives (.maxntid 128, ...) appear
        brace, semi = clean.find("{", i), clean.find(";", i)
        if brace < 0 or 0 <= semi < brace:
            raise fail(f"entry '{m.group(1)}' has no body")


def parse_ptx(text: str, path: str | None = None) -> dict[str, tuple[PtxParam, ...]]:
    """Every ``.entry`` (visible or not) of a PTX module mapped to its parameters, in file order.

    >>> parse_ptx(".entry k(.param .u64 k_param_0, .param .f32 k_param_1) { ret; }")["k"][1].ptx_type
    'f32'

    Raises :class:`KernelFileError` (with ``path``) for an unterminated parameter list or a parameter
    that cannot be read.
    """
    where = f"{path}: " if path else ""
    try:
        clean = strip_comments(text)
    except KernelFileError as e:
        raise KernelFileError(where + str(e), path=path) from None
    entries: dict[str, tuple[PtxParam, ...]] = {}
    for m in _ENTRY_RE.finditer(clean):
        name = m.group(1)
        i = m.end()
        while i < len(clean) and clean[i].isspace():
            i += 1
        if i >= len(clean) or clean[i] != "(":
            entries[name] = ()  # `.entry k {` : no parameter list at all
            continue
        close = clean.find(")", i)
        # A parameter list holds no parentheses, so a '{' before the ')' means the ')' is missing.
        brace = clean.find("{", i)
        if close < 0 or 0 <= brace < close:
            raise KernelFileError(
                f"{where}unterminated parameter list of entry '{name}': no ')' after its '('", path=path
            )
        body = clean[i + 1 : close].strip()
        decls = body.split(",") if body else []
        entries[name] = tuple(_parse_param(d, name, k, where, path) for k, d in enumerate(decls))
    return entries


def _parse_param(decl: str, entry: str, index: int, where: str, path: str | None) -> PtxParam:
    def fail(why: str) -> KernelFileError:
        shown = " ".join(decl.split()) or "empty"
        return KernelFileError(f"{where}entry '{entry}', parameter {index} ({shown}): {why}", path=path)

    tokens = decl.split()
    if not tokens or tokens[0] != ".param":
        raise fail("expected '.param <type> <name>'")
    # Arrays may be written `name [16]` or `name[ 16 ]`; glue the brackets back to the name.
    rest = re.sub(r"\s*\[\s*(\d*)\s*\]", r"[\1]", " ".join(tokens[1:])).split()
    if not rest:
        raise fail("expected '.param <type> <name>'")
    name_m = _NAME_RE.match(rest[-1])
    if name_m is None:
        raise fail(f"cannot read a parameter name from {rest[-1]!r}")
    ptx_type = None
    align = None
    ptr = False
    ptr_space = None
    ptr_align = None
    directives = rest[:-1]
    k = 0
    while k < len(directives):
        d = directives[k]
        if d == ".align":
            if k + 1 >= len(directives) or not directives[k + 1].isdigit():
                raise fail("'.align' must be followed by a number")
            value = int(directives[k + 1])
            # After `.ptr`, `.align N` is the alignment of the memory pointed to, not of the parameter.
            if ptr:
                ptr_align = value
            else:
                align = value
            k += 2
            continue
        if d == ".ptr":
            ptr = True
        elif ptr and d.lstrip(".") in _STATE_SPACES:
            ptr_space = d.lstrip(".")
        elif d.lstrip(".") in _TYPE_SIZES and ptx_type is None:
            ptx_type = d.lstrip(".")
        else:
            raise fail(f"unexpected {d!r}")
        k += 1
    if ptx_type is None:
        raise fail(f"no type; expected one of {', '.join('.' + t for t in _TYPE_SIZES)}")
    if ptr and ptx_type not in ("u64", "b64", "s64", "u32", "b32", "s32"):
        raise fail(f"'.ptr' on a .{ptx_type} parameter; a pointer is an integer type")
    count_text = name_m.group(2)
    count = None
    if count_text is not None:
        if not count_text or int(count_text) <= 0:
            raise fail("an array parameter needs a positive length, e.g. name[16]")
        count = int(count_text)
    elem = _TYPE_SIZES[ptx_type]
    return PtxParam(
        name=name_m.group(1),
        ptx_type=ptx_type,
        size=elem * (count or 1),
        align=align if align is not None else elem,
        count=count,
        ptr=ptr,
        ptr_space=ptr_space,
        ptr_align=ptr_align,
    )


# PTX scalar type -> rxcuda dtype. The .bN types are untyped bits (any N-bit value), so they get no dtype.
_SCALAR_DTYPES: dict[str, str] = {
    "u8": "u8", "u16": "u16", "u32": "u32", "u64": "u64",
    "s8": "i8", "s16": "i16", "s32": "i32", "s64": "i64",
    "f16": "f16", "f32": "f32", "f64": "f64",
}


def signature_from_ptx(text: str, entry: str, path: str | None = None) -> KernelSignature:
    """The :class:`KernelSignature` of ``entry`` as far as PTX can tell.

    - ``.u64`` / ``.b64`` (and anything marked ``.ptr``) becomes a ``pointer`` (8 bytes, ``dtype=None``,
      direction ``'inout'``). PTX cannot tell a pointer from a 64-bit integer: nvcc writes both as
      ``.u64``. A sidecar that says ``"i64"`` turns it back into a scalar.
    - ``.f32``/``.f64``/``.f16`` and ``.uN``/``.sN`` become scalars of that type (``s32`` -> ``'i32'``).
      nvcc writes ``int`` as ``.u32``, so an ``int`` parameter reads as ``'u32'`` until a sidecar says
      ``'i32'``.
    - ``.bN`` scalars (untyped bits) and arrays (structs passed by value, e.g. ``.align 8 .b8 s[16]``)
      become scalars with ``dtype=None``: their size is known, their meaning is not.

    Names are the PTX names, with the ``<entry>_param_`` prefix nvcc and Triton add rewritten to ``arg``
    (``vector_add_param_3`` -> ``'arg3'``).
    """
    entries = parse_ptx(text, path)
    if entry not in entries:
        raise KernelFileError(_no_entry_message(entry, list(entries), path), path=path)
    prefix = f"{entry}_param_"
    params = []
    for p in entries[entry]:
        name = "arg" + p.name[len(prefix) :] if p.name.startswith(prefix) else p.name
        params.append(_kernel_param(p, name))
    return KernelSignature(entry=entry, params=tuple(params))


def _kernel_param(p: PtxParam, name: str) -> KernelParam:
    if p.ptr or (not p.is_array and p.ptx_type in ("u64", "b64")):
        return KernelParam(name=name, kind="pointer", size=p.size, direction="inout", align=p.align)
    dtype = None if p.is_array else _SCALAR_DTYPES.get(p.ptx_type)
    return KernelParam(name=name, kind="scalar", size=p.size, dtype=dtype, align=p.align)


def _no_entry_message(entry: str, names: list[str], path: str | None) -> str:
    where = f"{path}: " if path else ""
    if not names:
        return f"{where}no entry '{entry}': the PTX has no '.entry' at all (a kernel must be __global__)"
    msg = f"{where}no entry '{entry}'; entries: {', '.join(names)}"
    # A C++ kernel's name is mangled (_Z10vector_addPKfS0_Pfi) unless it is declared extern "C".
    mangled = [n for n in names if n.startswith("_Z") and entry in n]
    close = mangled or difflib.get_close_matches(entry, names, n=3)
    if close:
        msg += f" (did you mean {', '.join(repr(c) for c in close)}?)"
    if mangled:
        msg += '; declare the kernel extern "C" to keep its plain name'
    return msg
