"""The JSON sidecar: what a kernel's parameters mean (names, element types, directions, defaults).

A kernel file tells sizes, not meaning (see ``_ptx.py``). A sidecar ``<stem>.json`` beside it adds
meaning::

    {"entry": "vector_add", "block_size": 256, "shared_mem": 0,
     "params": [{"name": "a", "type": "f32*", "direction": "in"},
                {"name": "out", "type": "f32*", "direction": "out"},
                {"name": "n", "type": "i32", "default": "size"}]}

A scalar may declare ``"min"``, ``"max"`` and ``"step"`` (``{"name": "scale", "type": "f32", "min": 0,
"max": 10, "step": 0.1}``): setting a value outside ``[min, max]`` is refused, and the live view's slider
uses all three.

An integer scalar that is an element count says which pointer parameters it counts: ``{"name": "n", "type":
"i32", "default": "size", "counts": ["a", "b", "out"]}`` (the kernel touches ``a``, ``b`` and ``out`` only
below ``n``). A value above the smallest of their buffers, or below 0, is then refused wherever it is set
(``rxcuda.model._bounds``).

:func:`read_sidecar` validates it strictly (unknown keys are typos, not extensions); :func:`merge` checks
it against the kernel's real parameters and produces the :class:`KernelSignature` the engine uses.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..model import _dtypes
from ..model._describe import DIRECTIONS, Direction, KernelParam, KernelSignature, check_range
from ..model._errors import KernelFileError
from ._paths import decode_text

_TOP_KEYS = ("entry", "block_size", "shared_mem", "params", "append", "structs")
_PARAM_KEYS = ("name", "type", "direction", "default", "min", "max", "step", "counts")
_APPEND_KEYS = ("data", "counter")
_TYPE_CHOICES = ", ".join([*_dtypes.TYPE_NAMES, *(t + "*" for t in _dtypes.TYPE_NAMES), "void*"])
POINTER_SIZE = 8


@attrs.frozen
class SidecarParam:
    """One entry of ``params``. ``dtype`` is the element type of a pointer (``None`` for ``void*``) or the
    type of a scalar. ``default`` is a number or ``"size"``; scalars only."""

    name: str
    dtype: str | None
    pointer: bool
    direction: Direction = "in"
    default: float | int | str | None = None
    min: float | int | None = None  # the scalar's declared range and control step (the live view's slider)
    max: float | int | None = None
    step: float | int | None = None
    counts: tuple[str, ...] = ()  # the pointer parameters this count scalar counts

    @property
    def size(self) -> int:
        return POINTER_SIZE if self.pointer else _dtypes.itemsize(self.dtype)

    def spelled(self) -> str:
        """The type as a sidecar writes it: ``'f32*'``, ``'void*'``, ``'i32'``."""
        return f"{self.dtype or 'void'}*" if self.pointer else str(self.dtype)


@attrs.frozen
class Append:
    """An append output: the data pointer and its u32 counter, both named by parameter name."""

    data: str
    counter: str


@attrs.frozen
class Sidecar:
    """A validated sidecar. ``params`` is ``None`` when the sidecar leaves the parameters to the kernel."""

    entry: str | None = None
    params: tuple[SidecarParam, ...] | None = None
    block_size: int = 256
    shared_mem: int = 0
    append: Append | None = None
    path: str = "<sidecar>"

    def signature(self, entry: str | None = None) -> KernelSignature:
        """The signature from the sidecar alone, for code whose parameters cannot be read (a compressed
        fatbin); the engine should check it against the loaded function's ``arguments_info``."""
        name = entry or self.entry
        if name is None:
            raise KernelFileError(f"{self.path}: 'entry' is required here", path=self.path)
        if self.params is None:
            raise KernelFileError(
                f"{self.path}: 'params' is required: the kernel's parameters cannot be read from its code",
                path=self.path,
            )
        params = tuple(kernel_param(p, p.size, p.size) for p in self.params)
        return KernelSignature(entry=name, params=params)


def read_sidecar(path: str | Path) -> Sidecar:
    """Read and validate a sidecar file. Raises :class:`KernelFileError` naming the file and the field."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise KernelFileError(f"{path}: sidecar not found", path=str(path)) from None
    except OSError as e:
        raise KernelFileError(f"{path}: cannot read sidecar: {e.strerror or e}", path=str(path)) from None
    text = decode_text(data, str(path), lambda m: KernelFileError(m, path=str(path)))
    return parse_sidecar(text, str(path))


def parse_sidecar(data: str | Mapping[str, Any], path: str = "<sidecar>") -> Sidecar:
    """Validate a sidecar given as JSON text or an already-decoded mapping.

    >>> parse_sidecar('{"params": [{"name": "x", "type": "f32*"}]}').params[0].direction
    'inout'
    """

    def fail(msg: str) -> KernelFileError:
        return KernelFileError(f"{path}: {msg}", path=path)

    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise fail(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, Mapping):
        raise fail(f"a sidecar must be a JSON object (got {type(data).__name__})")
    _check_keys(data, _TOP_KEYS, "", fail)

    entry = data.get("entry")
    if entry is not None and (not isinstance(entry, str) or not entry):
        raise fail(f"'entry' must be a non-empty string (got {entry!r})")
    block_size = data.get("block_size", 256)
    if not _is_int(block_size) or not 1 <= block_size <= 1024:
        raise fail(f"'block_size' must be an int from 1 to 1024 (got {block_size!r})")
    shared_mem = data.get("shared_mem", 0)
    if not _is_int(shared_mem) or shared_mem < 0:
        raise fail(f"'shared_mem' must be a non-negative int, in bytes (got {shared_mem!r})")

    structs = _parse_structs(data.get("structs", {}), fail)
    params = None
    if "params" in data:
        raw = data["params"]
        if not isinstance(raw, list):
            raise fail(f"'params' must be a list of objects (got {type(raw).__name__})")
        params = [_parse_param(p, i, fail, structs) for i, p in enumerate(raw)]
        seen: dict[str, int] = {}
        for i, p in enumerate(params):
            if p.name in seen:
                raise fail(f"params[{i}] ('{p.name}'): the name is already used by params[{seen[p.name]}]")
            seen[p.name] = i
        _check_counts(params, fail)

    append = None
    if "append" in data:
        append, params = _parse_append(data["append"], params, fail)
    if params is not None:
        for i, p in enumerate(params):
            if p.direction == "counter" and (append is None or append.counter != p.name):
                raise fail(
                    f"params[{i}] ('{p.name}'): direction 'counter' belongs to an append output; add "
                    f'"append": {{"data": "<data pointer>", "counter": "{p.name}"}}'
                )
    return Sidecar(
        entry=entry,
        params=None if params is None else tuple(params),
        block_size=block_size,
        shared_mem=shared_mem,
        append=append,
        path=path,
    )


def _parse_structs(raw: Any, fail) -> dict[str, str]:
    """``"structs": {"Particle": {"pos": "float3", "vel": "float3", "mass": "f32"}}``: name -> dtype name,
    in order (a struct may use those before it)."""
    if not isinstance(raw, Mapping):
        raise fail('\'structs\' must be an object like {"Particle": {"pos": "float3", "mass": "f32"}}')
    found: dict[str, str] = {}
    for name, fields in raw.items():
        if not isinstance(fields, Mapping):
            raise fail(f"structs: '{name}' must be an object of field names to types, like "
                       '{"pos": "float3", "mass": "f32"}')
        try:
            found[name] = _dtypes.struct(name, fields, known=found)
        except ValueError as e:
            raise fail(f"structs: {e}") from None
    return found


def _parse_param(raw: Any, i: int, fail, structs: Mapping[str, str] | None = None) -> SidecarParam:
    if not isinstance(raw, Mapping):
        raise fail(f'params[{i}] must be an object like {{"name": "x", "type": "f32*"}} (got {raw!r})')
    name = raw.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise fail(f"params[{i}]: 'name' must be an identifier such as 'out' (got {name!r})")
    where = f"params[{i}] ('{name}')"
    _check_keys(raw, _PARAM_KEYS, where + ": ", fail)
    if "type" not in raw:
        raise fail(f"{where}: 'type' is required; one of {_TYPE_CHOICES}")
    spelled = raw["type"]
    if not isinstance(spelled, str):
        raise fail(f"{where}: 'type' must be one of {_TYPE_CHOICES} (got {spelled!r})")
    text = spelled.strip()
    pointer = text.endswith("*")
    base = text[:-1].strip() if pointer else text
    if pointer and base == "void":
        dtype = None
    elif structs and base in structs:
        dtype = structs[base]
    else:
        try:
            dtype = _dtypes.dtype_name(base)
        except ValueError:
            raise fail(f"{where}: 'type' must be one of {_TYPE_CHOICES} (got {spelled!r}); pointers may also point "
                       "to a vector type ('float4*') or a struct declared under 'structs' ('Particle*')") from None
    if not pointer and (_dtypes.vector_layout(dtype) or _dtypes.struct_type(dtype)):
        raise fail(f"{where}: a {_dtypes.describe(dtype)} is passed by pointer ('{spelled}*'); a scalar parameter "
                   "takes one number: pass its components as separate scalars")

    direction = raw.get("direction", "inout" if pointer else "in")
    if direction not in DIRECTIONS:
        raise fail(f"{where}: 'direction' must be one of {', '.join(DIRECTIONS)} (got {direction!r})")
    if not pointer and direction != "in":
        raise fail(f"{where}: a scalar is always an input; 'direction' must be 'in' (got {direction!r})")
    if direction == "counter" and (not pointer or dtype != "u32"):
        raise fail(f"{where}: a counter must have 'type' 'u32*' (got {spelled!r})")

    default = raw.get("default")
    if default is not None:
        if pointer:
            raise fail(f"{where}: a pointer takes no 'default'; connect or bind a buffer to it instead")
        if isinstance(default, str):
            if default != "size":
                raise fail(f"{where}: 'default' must be a number or \"size\" (got {default!r})")
            if _dtypes.is_float(dtype):
                raise fail(f"{where}: 'default' \"size\" is an element count; give '{spelled}' an int type")
        elif isinstance(default, bool) or not isinstance(default, int | float) or not math.isfinite(default):
            raise fail(f"{where}: 'default' must be a number or \"size\" (got {default!r})")
        elif not _dtypes.is_float(dtype):
            if isinstance(default, float):
                if not default.is_integer():
                    raise fail(f"{where}: 'default' {default!r} is not an integer, but 'type' is '{spelled}'")
                default = int(default)
            info = _int_range(dtype)
            if not info[0] <= default <= info[1]:
                raise fail(f"{where}: 'default' {default} does not fit '{spelled}' ({info[0]} to {info[1]})")
    lo, hi, step = (raw.get(k) for k in ("min", "max", "step"))
    if pointer and (lo, hi, step) != (None, None, None):
        raise fail(f"{where}: a pointer takes no 'min', 'max' or 'step'; those bound a scalar's value")
    try:
        lo, hi, step = check_range(where, dtype, lo, hi, step, default)
    except ValueError as e:
        raise fail(str(e)) from None
    counts = raw.get("counts", ())
    if "counts" in raw:
        if pointer or _dtypes.is_float(dtype):
            raise fail(f"{where}: 'counts' belongs on an integer scalar that is an element count (this is "
                       f"'{spelled}'); put it on the count, e.g. {{\"name\": \"n\", \"type\": \"i32\", "
                       f"\"counts\": [\"x\", \"out\"]}}")
        if not isinstance(counts, list) or not counts or not all(isinstance(c, str) for c in counts):
            raise fail(f"{where}: 'counts' must be a non-empty list of pointer parameter names, like "
                       f'["x", "out"] (got {counts!r})')
        counts = tuple(dict.fromkeys(counts))
    return SidecarParam(name=name, dtype=dtype, pointer=pointer, direction=direction, default=default, min=lo,
                        max=hi, step=step, counts=counts)


def _check_counts(params: list[SidecarParam], fail) -> None:
    """Every name a scalar's 'counts' lists is a pointer parameter of the same kernel."""
    pointers = [p.name for p in params if p.pointer]
    for i, p in enumerate(params):
        for c in p.counts:
            if c not in pointers:
                close = difflib.get_close_matches(c, pointers, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise fail(f"params[{i}] ('{p.name}'): 'counts' names '{c}', which is not a pointer parameter"
                           f"{hint}; the pointers are {', '.join(pointers) or 'none'}")


def _parse_append(raw: Any, params: list[SidecarParam] | None, fail):
    if not isinstance(raw, Mapping):
        raise fail('\'append\' must be an object like {"data": "out", "counter": "count"}')
    _check_keys(raw, _APPEND_KEYS, "append: ", fail)
    for key in _APPEND_KEYS:
        if not isinstance(raw.get(key), str):
            raise fail(f"append: '{key}' must name a parameter (got {raw.get(key)!r})")
    append = Append(data=raw["data"], counter=raw["counter"])
    if params is None:
        raise fail("'append' needs 'params', to say which parameters are the data pointer and the counter")
    by_name = {p.name: (i, p) for i, p in enumerate(params)}
    names = ", ".join(by_name) or "none"
    for key in _APPEND_KEYS:
        if getattr(append, key) not in by_name:
            raise fail(f"append: '{key}' names '{getattr(append, key)}', which is not a parameter ({names})")
    if append.data == append.counter:
        raise fail("append: 'data' and 'counter' must be different parameters")
    params = list(params)
    i, data = by_name[append.data]
    if not data.pointer:
        raise fail(f"append: 'data' must be a pointer, but params[{i}] ('{data.name}') is '{data.spelled()}'")
    if data.direction not in ("out", "inout"):
        raise fail(f"append: 'data' is written by the kernel; params[{i}] ('{data.name}') has direction "
                   f"'{data.direction}', make it 'out'")
    i, counter = by_name[append.counter]
    if not counter.pointer or counter.dtype != "u32":
        raise fail(f"append: 'counter' must be a 'u32*', but params[{i}] ('{counter.name}') is "
                   f"'{counter.spelled()}'")
    if counter.direction == "inout":
        # 'inout' is a pointer's default: the append section is what says this pointer is a counter.
        params[i] = attrs.evolve(counter, direction="counter")
    elif counter.direction != "counter":
        raise fail(f"append: params[{i}] ('{counter.name}') is the counter, so its direction must be "
                   f"'counter' (got '{counter.direction}')")
    return append, params


def merge(sidecar: Sidecar, kernel: KernelSignature) -> KernelSignature:
    """The kernel's signature with the sidecar's names, types, directions and defaults.

    ``kernel`` holds the real parameters (from PTX or cubin); the sidecar must agree with them in count
    and size, must not call a 4-byte parameter a pointer, and must not call an integer a float or the other
    way round where the kernel's type is known. A 64-bit parameter PTX read as a pointer may be declared
    any 8-byte scalar (PTX cannot tell them apart). Raises :class:`KernelFileError` naming the parameter.
    """
    path = sidecar.path

    def fail(msg: str) -> KernelFileError:
        return KernelFileError(f"{path}: {msg}", path=path)

    if sidecar.entry is not None and sidecar.entry != kernel.entry:
        raise fail(f"the sidecar describes entry '{sidecar.entry}', not '{kernel.entry}'")
    if sidecar.params is None:
        return kernel
    theirs = kernel.params
    if len(sidecar.params) != len(theirs):
        listing = ", ".join(f"{p.name}: {_kernel_spelled(p)}" for p in theirs) or "no parameters"
        raise fail(
            f"'params' lists {len(sidecar.params)} parameters but kernel '{kernel.entry}' takes "
            f"{len(theirs)} ({listing}); list one entry per kernel parameter, in order"
        )
    out = []
    for i, (mine, real) in enumerate(zip(sidecar.params, theirs, strict=True)):
        prefix = f"params[{i}] ('{mine.name}'): the sidecar says {_sidecar_spelled(mine)} but kernel "
        prefix += f"'{kernel.entry}' parameter {i} ({real.name}) is {_kernel_spelled(real)}"
        if mine.pointer and real.size != POINTER_SIZE and _suggest(real) is not None:
            raise fail(
                f"{prefix}; a pointer takes 8 bytes: use {_a(real.size)}-byte type such as "
                f"{_suggest(real)}, or check the parameter order"
            )
        if mine.size != real.size and real.kind == "pointer":
            raise fail(f"{prefix}; write '{mine.spelled()}*' if it is a pointer, else an 8-byte type ('i64')")
        if mine.size != real.size and _suggest(real) is None:
            raise fail(f"{prefix}; a sidecar cannot describe a {real.size}-byte value (a struct passed by "
                       "value) yet: leave out 'params' to use the kernel's own")
        if mine.size != real.size:
            raise fail(f"{prefix}; use {_a(real.size)}-byte type such as {_suggest(real)}, or fix the kernel")
        typed = real.kind == "scalar" and real.dtype is not None
        if typed and not mine.pointer and _dtypes.is_float(mine.dtype) != _dtypes.is_float(real.dtype):
            raise fail(f"{prefix}; use {_suggest(real)}, or fix the kernel")
        if typed and mine.pointer and _dtypes.is_float(real.dtype):
            raise fail(f"{prefix}; use '{real.dtype}', or fix the kernel")
        out.append(kernel_param(mine, real.size, real.align))
    return KernelSignature(entry=kernel.entry, params=tuple(out))


def kernel_param(p, size: int, align: int) -> KernelParam:
    """A KernelParam from a declared parameter (a SidecarParam or a source declaration: anything with
    name, pointer, dtype, direction and default)."""
    return KernelParam(
        name=p.name,
        kind="pointer" if p.pointer else "scalar",
        size=size,
        dtype=p.dtype,
        direction=p.direction if p.pointer else "in",
        default=p.default,
        align=align,
        min=getattr(p, "min", None),
        max=getattr(p, "max", None),
        step=getattr(p, "step", None),
        counts=tuple(getattr(p, "counts", ())),
    )


def _sidecar_spelled(p: SidecarParam) -> str:
    if p.pointer:
        return f"'{p.spelled()}' (a pointer, 8 bytes)"
    return f"'{p.spelled()}' ({'a float' if _dtypes.is_float(p.dtype) else 'an integer'}, {p.size} bytes)"


def _kernel_spelled(p: KernelParam) -> str:
    if p.kind == "pointer":
        return f"{p.size} bytes (a pointer or a 64-bit integer)"
    if p.dtype is None:
        return f"{p.size} bytes of any type"
    return f"{_a(p.size)}-byte {p.dtype} ({'a float' if _dtypes.is_float(p.dtype) else 'an integer'})"


def _suggest(p: KernelParam) -> str | None:
    """A sidecar type (quoted) that fits the kernel's parameter."""
    if p.kind == "scalar" and p.dtype is not None:
        # nvcc writes `int` as .u32, so a u32 is as likely an i32
        return "'i32' or 'u32'" if p.dtype == "u32" else f"'{p.dtype}'"
    return {1: "'u8'", 2: "'u16'", 4: "'i32'", 8: "'i64'"}.get(p.size)


def _a(n: int) -> str:
    return f"an {n}" if n in (8, 11, 18) else f"a {n}"


def _int_range(dtype: str) -> tuple[int, int]:
    bits = 8 * _dtypes.itemsize(dtype)
    return (0, 2**bits - 1) if dtype.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_keys(obj: Mapping, allowed: tuple[str, ...], where: str, fail) -> None:
    for key in obj:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            # abbreviations ('dir') are too short for difflib's ratio; match them as prefixes
            close = close or [a for a in allowed if len(str(key)) >= 3 and a.startswith(str(key))]
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise fail(f"{where}unknown key {key!r}{hint}; allowed keys: {', '.join(allowed)}")
