"""Scalar types: the names used in sidecars, their NumPy dtypes, C spellings and PTX parameter types."""

from __future__ import annotations

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


def dtype_name(dtype) -> str:
    """Canonical short name ('f32', 'i32', ...) of a dtype-like or a name. Raises ValueError with the choices."""
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        key = _ALIASES.get(key, key)
        if key in _BY_NAME:
            return key
        raise ValueError(f"unknown scalar type {dtype!r}; use one of {', '.join(TYPE_NAMES)}")
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
