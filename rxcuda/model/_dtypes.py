"""Scalar types: the names used in sidecars, their NumPy dtypes, C spellings and PTX parameter types."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

# sidecar / user spelling -> numpy dtype
_BY_NAME: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    # complex (FFT ports) and bfloat16 (stored as raw 16-bit words; NumPy has no bf16)
    "c64": np.dtype(np.complex64),
    "c128": np.dtype(np.complex128),
    "bf16": np.dtype(np.uint16),
}
_ALIASES = {
    "float": "f32", "float32": "f32", "double": "f64", "float64": "f64", "half": "f16", "float16": "f16",
    "int": "i32", "int32": "i32", "int64": "i64", "int16": "i16", "int8": "i8",
    "uint": "u32", "unsigned": "u32", "uint32": "u32", "uint64": "u64", "uint16": "u16", "uint8": "u8",
    "s8": "i8", "s16": "i16", "s32": "i32", "s64": "i64",
    "complex64": "c64", "complex128": "c128", "bfloat16": "bf16",
}
_C_NAMES = {
    "f16": "__half", "f32": "float", "f64": "double", "i8": "signed char", "i16": "short", "i32": "int",
    "i64": "long long", "u8": "unsigned char", "u16": "unsigned short", "u32": "unsigned int",
    "u64": "unsigned long long", "c64": "float2", "c128": "double2", "bf16": "__nv_bfloat16",
}
TYPE_NAMES: tuple[str, ...] = tuple(_BY_NAME)
_SIZES: dict[str, int] = {name: d.itemsize for name, d in _BY_NAME.items()}


def dtype_name(dtype) -> str:
    """Canonical short name ('f32', 'i32', ...) of a dtype-like or a name. Raises ValueError with the choices."""
    if isinstance(dtype, str):
        if dtype in _BY_NAME:  # a canonical name: scalar, vector or struct
            return dtype
        key = dtype.strip()
        found = _STRUCT_BY_NAME.get(key) or _parse_struct_key(key)  # struct names keep their case
        if found is not None:
            return found
        key = key.lower()
        key = _ALIASES.get(key, key)
        if key in _BY_NAME:
            return key
        raise ValueError(f"unknown scalar type {dtype!r}; use one of {', '.join(TYPE_NAMES)} (or a vector type "
                         "such as float4, or a struct declared with rxcuda.struct)")
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"unknown scalar type {dtype!r}; use one of {', '.join(TYPE_NAMES)}") from e
    for name, candidate in _BY_NAME.items():
        if candidate == dt:
            return name
    raise ValueError(f"unsupported dtype {dt}; use one of {', '.join(TYPE_NAMES)}")


def to_numpy(dtype) -> np.dtype:
    """NumPy dtype of a name or dtype-like."""
    if isinstance(dtype, str):  # the common case (planning, building): a canonical name, one lookup
        found = _BY_NAME.get(dtype)
        if found is not None:
            return found
    return _BY_NAME[dtype_name(dtype)]


def c_name(dtype) -> str:
    """C/CUDA spelling of a scalar type."""
    return _C_NAMES[dtype_name(dtype)]


def is_float(dtype) -> bool:
    return dtype_name(dtype).startswith("f")


def itemsize(dtype) -> int:
    if type(dtype) is str:  # the common case (planning, building): a canonical name, one lookup
        size = _SIZES.get(dtype)
        if size is not None:
            return size
    return to_numpy(dtype).itemsize


# C/CUDA spellings a kernel declaration may use (sizes as on every CUDA platform, LP64) -> short name
_FROM_C: dict[str, str] = {
    "float": "f32", "double": "f64", "half": "f16", "__half": "f16", "__nv_bfloat16": "bf16",
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


def from_c_name(ctype: str) -> str | None:
    """Short name of a C/CUDA scalar type as a declaration spells it (``'unsigned int'`` -> ``'u32'``);
    ``None`` for a type rxcuda does not know (a struct, ``bool``, a template)."""
    return _FROM_C.get(" ".join(ctype.split()))


# -- CUDA vector types ---------------------------------------------------------------------------------
# name -> (scalar, lanes, size, alignment), as CUDA's vector_types.h lays them out (LP64: long is 64-bit)
_VECTOR_LAYOUT: dict[str, tuple[str, int, int, int]] = {}
for _c, _s in (("char", "i8"), ("uchar", "u8"), ("short", "i16"), ("ushort", "u16"), ("int", "i32"),
               ("uint", "u32"), ("longlong", "i64"), ("ulonglong", "u64"), ("float", "f32"), ("double", "f64")):
    _w = _BY_NAME[_s].itemsize
    # two lanes align to their size, three to one lane, four to their size (at most 16 bytes)
    for _lanes, _align in ((2, 2 * _w), (3, _w), (4, min(4 * _w, 16))):
        _VECTOR_LAYOUT[f"{_c}{_lanes}"] = (_s, _lanes, _lanes * _w, _align)
_VECTOR_LAYOUT["half2"] = ("f16", 2, 4, 4)
_VECTOR_ALIASES = {f"{a}{n}": f"{b}{n}" for a, b in (("long", "longlong"), ("ulong", "ulonglong"))
                   for n in (2, 3, 4)}
_VECTOR_ALIASES["__half2"] = "half2"
#: The CUDA vector types rxcuda knows (``float4``, ``int2``, ...): ports of these carry one vector per element.
VECTOR_NAMES: tuple[str, ...] = tuple(_VECTOR_LAYOUT)
_LANE_NAMES = ("x", "y", "z", "w")


def _vector_numpy(name: str) -> np.dtype:
    scalar, lanes, size, _align = _VECTOR_LAYOUT[name]
    return np.dtype({"names": list(_LANE_NAMES[:lanes]), "formats": [_BY_NAME[scalar]] * lanes, "itemsize": size})


for _name in VECTOR_NAMES:
    _BY_NAME[_name] = _vector_numpy(_name)
    _C_NAMES[_name] = "__half2" if _name == "half2" else _name
    _FROM_C[_name] = _name
for _alias, _name in _VECTOR_ALIASES.items():
    _ALIASES[_alias] = _name
    _FROM_C[_alias] = _name
# the CUDA libraries' complex types are float2/double2 in C; rxcuda calls them c64/c128
_FROM_C.update({"cuFloatComplex": "c64", "cufftComplex": "c64", "cuComplex": "c64",
                "cuDoubleComplex": "c128", "cufftDoubleComplex": "c128"})
_COMPATIBLE = {frozenset(("c64", "float2")), frozenset(("c128", "double2"))}


def vector_layout(dtype) -> tuple[str, int, int, int] | None:
    """(scalar type, lanes, size, alignment) of a vector type, e.g. ``('f32', 4, 16, 16)`` for float4;
    ``None`` for any other type."""
    if not isinstance(dtype, str):
        return None
    return _VECTOR_LAYOUT.get(dtype) or _VECTOR_LAYOUT.get(_ALIASES.get(dtype, ""))


def alignment(dtype) -> int:
    """The alignment in bytes CUDA gives the type (a scalar's is its size, a vector's or struct's its own)."""
    name = dtype_name(dtype)
    layout = _VECTOR_LAYOUT.get(name)
    if layout is not None:
        return layout[3]
    struct = _STRUCTS.get(name)
    if struct is not None:
        return struct.align
    return _BY_NAME[name].itemsize


def compatible(a: str | None, b: str | None) -> bool:
    """Whether a port of element type ``a`` may feed one of type ``b``: the same type, either unknown, or the
    same data under two names (``c64`` and ``float2``, ``c128`` and ``double2``)."""
    return a is None or b is None or a == b or frozenset((a, b)) in _COMPATIBLE


def describe(dtype: str | None) -> str:
    """A type for messages: ``'f32'``, ``'float4 (4 x f32, 16 bytes)'``, ``'struct Particle (28 bytes)'``."""
    if dtype is None:
        return "any type"
    layout = vector_layout(dtype)
    if layout is not None:
        return f"{dtype} ({layout[1]} x {layout[0]}, {layout[2]} bytes)"
    struct = _STRUCTS.get(dtype)
    if struct is not None:
        return f"struct {struct.name} ({struct.size} bytes)"
    return dtype


# -- structs ---------------------------------------------------------------------------------------------
class StructField(NamedTuple):
    """A field of a struct: its name, type, array length (0: not an array) and byte offset."""

    name: str
    dtype: str
    length: int
    offset: int


class StructType(NamedTuple):
    """A plain C struct: fields laid out by the C rules (each at a multiple of its alignment, the size a
    multiple of the largest alignment). ``key`` is its canonical dtype name, ``Name{field:type,...}``."""

    name: str
    fields: tuple[StructField, ...]
    size: int
    align: int
    key: str


_STRUCTS: dict[str, StructType] = {}  # canonical name -> layout
_STRUCT_BY_NAME: dict[str, str] = {}  # bare name -> the canonical name declared last
_STRUCT_LOCK = threading.Lock()


def struct(name: str, fields=None, *, known: Mapping[str, str] | None = None, align: int = 0, **kwargs) -> str:
    """Declare a plain struct and return its dtype name, usable wherever a type name is (ports, sidecars).

    ``fields``: (name, type) pairs or a mapping in declaration order; a type is a scalar (``'f32'``,
    ``'float'``), a vector (``'float3'``), a struct declared before (by name), or an array ``'f32[4]'``.
    Keyword arguments add fields too (``struct("P", pos="float3", mass="f32")``). ``known`` maps struct
    names local to one source to their dtype names (they win over the process-wide ones). The layout follows
    C: each field at a multiple of its alignment, the size rounded up to the largest one (or to ``align``,
    as ``__align__(n)`` asks). In NumPy a vector field is a subarray: ``arr["pos"]`` has shape (n, 3).
    Raises ValueError naming the field.

    >>> p = struct("Particle", {"pos": "float3", "vel": "float3", "mass": "f32"})
    >>> p, itemsize(p)
    ('Particle{pos:float3,vel:float3,mass:f32}', 28)
    >>> to_numpy(p).fields["mass"][1]
    24
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a struct name must be an identifier (got {name!r})")
    items = list(fields.items()) if isinstance(fields, Mapping) else list(fields or ())
    items += list(kwargs.items())
    if not isinstance(align, int) or isinstance(align, bool) or align < 0 or align & (align - 1):
        raise ValueError(f"struct {name}: 'align' must be a power of two (got {align!r})")
    if not items:
        raise ValueError(f"struct {name} has no fields; give it at least one")
    out, seen, offset, natural = [], set(), 0, 1
    for item in items:
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise ValueError(f"struct {name}: fields are (name, type) pairs (got {item!r})")
        fname, ftype = item
        if not isinstance(fname, str) or not fname.isidentifier():
            raise ValueError(f"struct {name}: field name {fname!r} is not an identifier")
        if fname in seen:
            raise ValueError(f"struct {name}: field '{fname}' is declared twice")
        seen.add(fname)
        base, length = _split_array(ftype, f"struct {name}: field '{fname}'")
        try:
            fdtype = (known or {}).get(base) or dtype_name(base)
        except ValueError:
            raise ValueError(f"struct {name}: field '{fname}' has type {ftype!r}, which is not a scalar "
                             f"({', '.join(TYPE_NAMES)}), a vector type (float2, float3, float4, int4, ...) or a "
                             "struct declared before it") from None
        falign = alignment(fdtype)
        offset = -(-offset // falign) * falign
        out.append(StructField(fname, fdtype, length, offset))
        offset += _BY_NAME[fdtype].itemsize * max(length, 1)
        natural = max(natural, falign)
    whole = max(natural, align)
    size = -(-offset // whole) * whole
    key = name + "{" + ",".join(f"{f.name}:{f.dtype}" + (f"[{f.length}]" if f.length else "") for f in out) + "}"
    if whole > natural:
        key += f"@{whole}"
    with _STRUCT_LOCK:
        if key not in _STRUCTS:
            _STRUCTS[key] = StructType(name, tuple(out), size, whole, key)
            _BY_NAME[key] = np.dtype({
                "names": [f.name for f in out],
                "formats": [_field_numpy(f) for f in out],
                "offsets": [f.offset for f in out],
                "itemsize": size,
            })
            _C_NAMES[key] = name
        _STRUCT_BY_NAME[name] = key
    return key


def _field_numpy(f: StructField):
    """A field's NumPy format: a vector as a subarray of its lanes (``arr["pos"]`` is (n, 3) floats)."""
    layout = _VECTOR_LAYOUT.get(f.dtype)
    base, shape = (_BY_NAME[layout[0]], (layout[1],)) if layout else (_BY_NAME[f.dtype], ())
    shape = ((f.length,) if f.length else ()) + shape
    return (base, shape) if shape else base


def _split_array(spelled, where: str) -> tuple[str, int]:
    if not isinstance(spelled, str):
        raise ValueError(f"{where}: a type must be a str such as 'f32' or 'float3' (got {spelled!r})")
    text = spelled.strip()
    if text.endswith("]") and "[" in text:
        base, _, count = text[:-1].rpartition("[")
        if not count.strip().isdigit() or int(count) <= 0:
            raise ValueError(f"{where}: an array length must be a positive int (got {spelled!r})")
        return base.strip(), int(count)
    return text, 0


def struct_type(dtype) -> StructType | None:
    """The layout of a struct dtype (its canonical or bare name); ``None`` for any other type."""
    if not isinstance(dtype, str):
        return None
    return _STRUCTS.get(dtype) or _STRUCTS.get(_STRUCT_BY_NAME.get(dtype, ""))


def _parse_struct_key(key: str) -> str | None:
    """Declare a struct from its canonical name (``Name{a:f32,b:float3}``), e.g. one read back from a plan;
    ``None`` if ``key`` is not one."""
    align = 0
    head, at, tail = key.rpartition("@")
    if at and tail.isdigit() and head.endswith("}"):
        key, align = head, int(tail)
    if "{" not in key or not key.endswith("}"):
        return None
    name, _, body = key[:-1].partition("{")
    fields, depth, start = [], 0, 0
    for i, ch in enumerate(body + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            part = body[start:i]
            fname, sep, ftype = part.partition(":")
            if not sep:
                return None
            inner = ftype.rsplit("[", 1)[0] if ftype.endswith("]") and not ftype.endswith("}") else ftype
            if "{" in inner and _parse_struct_key(inner) is None:
                return None
            fields.append((fname, ftype))
            start = i + 1
    try:
        return struct(name, fields, align=align)
    except ValueError:
        return None


# -- host arrays for ports of any element type ---------------------------------------------------------
def host_dtype(dtype) -> tuple[np.dtype, tuple[int, ...]]:
    """How a host array holds one element: (NumPy dtype, trailing shape). A vector is its lanes on a last
    axis (float4 -> (float32, (4,))), a scalar or struct one item (f32 -> (float32, ()))."""
    layout = vector_layout(dtype)
    if layout is not None:
        return _BY_NAME[layout[0]], (layout[1],)
    return to_numpy(dtype), ()


def elements_of(dtype, array: np.ndarray, where: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """The array as the port's elements: (a C-contiguous array whose bytes are the elements, the element
    shape). A vector port takes its scalar type with the lanes on a last axis (float4: float32 (..., 4)) or a
    structured array of the vector's layout; a struct port a structured array of the same layout. Raises
    ValueError saying what the port takes."""
    arr = np.asarray(array)
    if dtype is None:
        return np.ascontiguousarray(arr), arr.shape
    want, lanes = host_dtype(dtype)
    exact = to_numpy(dtype)
    if arr.dtype == exact:
        if lanes:  # a structured array of the vector's layout: the same bytes, lanes on a last axis
            return np.ascontiguousarray(arr).view(want).reshape(arr.shape + lanes), arr.shape
        return np.ascontiguousarray(arr), arr.shape
    if lanes and arr.dtype == want:
        if arr.ndim and arr.shape[-1] == lanes[0]:
            return np.ascontiguousarray(arr), arr.shape[:-1]
        last = arr.shape[-1] if arr.ndim else "no"
        raise ValueError(f"{where} takes {describe(dtype)}: pass a {want} array shaped (..., {lanes[0]}) with the "
                         f"lanes on the last axis (this one has shape {arr.shape}, {last} on its last axis)")
    struct_layout = struct_type(dtype)
    if struct_layout is not None and arr.dtype.names is not None and _same_layout(arr.dtype, exact):
        return np.ascontiguousarray(arr), arr.shape
    if lanes:
        hint = f"a {want} array shaped (..., {lanes[0]})"
    elif struct_layout is not None:
        hint = f"a structured array with dtype rxcuda.numpy_dtype('{struct_layout.name}')"
    else:
        raise ValueError(f"{where} takes {describe(dtype)}, got {arr.dtype}; convert with .astype('{exact}')")
    raise ValueError(f"{where} takes {describe(dtype)}, got {arr.dtype}; pass {hint}")


def _same_layout(a: np.dtype, b: np.dtype) -> bool:
    """Same size and the same field types at the same offsets (the names may differ)."""
    if a.itemsize != b.itemsize or len(a.names or ()) != len(b.names or ()):
        return False
    fa = sorted((off, str(t)) for t, off, *_ in (a.fields or {}).values())
    fb = sorted((off, str(t)) for t, off, *_ in (b.fields or {}).values())
    return fa == fb


def host_layout(dtype, shape: tuple[int, ...]) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, NumPy dtype) of a host array holding ``shape`` elements of ``dtype`` (vector lanes on a last axis;
    None: bytes)."""
    if dtype is None:
        return tuple(shape), np.dtype(np.uint8)
    want, lanes = host_dtype(dtype)
    return tuple(shape) + lanes, np.dtype(want)


def empty_host(dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A new host array for ``shape`` elements of ``dtype`` (vector lanes on a last axis; None: bytes)."""
    return np.empty(*host_layout(dtype, shape))


def check_out(out, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Raise ValueError (naming the array to make) unless ``out`` is a writable C-contiguous NumPy array of
    ``shape`` and ``dtype``: what ``read(port, out=out)`` copies into."""
    if (isinstance(out, np.ndarray) and out.dtype == dtype and out.shape == tuple(shape) and out.flags.c_contiguous
            and out.flags.writeable):
        return
    got = (f"{out.dtype} {out.shape}{'' if out.flags.c_contiguous else ', not C-contiguous'}"
           f"{'' if out.flags.writeable else ', read-only'}" if isinstance(out, np.ndarray) else type(out).__name__)
    raise ValueError(f"read(..., out=...) needs a writable C-contiguous NumPy array of {dtype} {tuple(shape)} for "
                     f"this port (got {got}); make one with numpy.empty({tuple(shape)}, numpy.{dtype.name})")


def numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype of an element type: a scalar's, a vector type's (a structured x, y, z, w), or a
    struct's (structured, at the struct's offsets, vector fields as subarrays), for arrays a port takes.

    >>> numpy_dtype("float4").itemsize, numpy_dtype("f32")
    (16, dtype('float32'))
    """
    return to_numpy(dtype)


def format_bytes(nbytes: int) -> str:
    """Bytes for people, to three significant digits: ``"12 B"``, ``"16 KiB"``, ``"3.91 KiB"``, ``"1.5 MiB"``.

    >>> format_bytes(4096), format_bytes(4000), format_bytes(3 << 20)
    ('4 KiB', '3.91 KiB', '3 MiB')
    """
    value, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(nbytes)} B" if unit == "B" else f"{value:.3g} {unit}"
