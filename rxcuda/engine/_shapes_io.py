"""Host arrays in and out of ports of any shape and element type, and resizing an input.

A port holds ``shape`` elements of its dtype. On the host a vector element (float4) is its lanes on a last
axis (a float32 array shaped (..., 4)), a struct element one item of a structured array; a port with strides
is gathered into (and scattered from) a C-contiguous array. ``engine.resize(port, shape)`` and
``engine.write(port, array, resize=True)`` give a host-fed or bound input a new shape; the planner resolves
what follows from it downstream at the next frame (``rxcuda.plan._shapes``).
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from ..model import _dtypes, _shapes
from ..model._describe import CountSpec, PortRef, PortSpec
from ..model._errors import ValidationError
from ..model._events import BlockChanged
from ..model._shapes import Shape, ShapeError, fmt
from ._runtime import Runtime


def current_shape(rt: Runtime, ref: PortRef, spec: PortSpec) -> Shape:
    """The shape the port has (in the running graph) or will have (a resize waiting for the next frame)."""
    pending = rt.shapes.get(ref)
    if pending is not None:
        return pending
    g = rt.graph
    return spec.shape if g is None else running_shape(g, ref, spec)


def running_shape(g, ref: PortRef, spec: PortSpec) -> Shape:
    """The shape the port has in the running graph ``g``."""
    shapes = getattr(g.plan, "shapes", None)
    return shapes.get(ref, spec.shape) if shapes else spec.shape


def follow_shapes(rt: Runtime) -> None:
    """After a graph was built or swapped in: a parameter that follows a port's shape (``ScalarSpec.size_of``,
    the ``n`` of ``Block.from_kernel(..., size=)``) reads the value the running graph passes where the port runs
    at another shape than declared (its input follows what feeds it, or it was resized), and its own value again
    where the port is back at its declared shape. The value it held is kept (``Block._derived``) and is what the
    planner reads (``Block._planned_values``); a value set while it follows is the user's from then on."""
    g = rt.graph
    shapes = getattr(getattr(g, "plan", None), "shapes", None) or {}
    for b in list(rt.blocks.values()):
        for s in b.description.scalars:
            if s.size_of is None:
                continue
            port, axis = s.size_of
            param = b.params._p[s.name]
            held = b._derived.get(s.name)
            own = held[0] if held is not None and param._value == held[1] else param._value
            shape = shapes.get(PortRef(b.id, port))
            running = None
            if shape is not None and (axis is None or -len(shape) <= axis < len(shape)):
                running = math.prod(shape) if axis is None else shape[axis]
            if running is None or running == own:
                b._derived.pop(s.name, None)
                param._value = own
            else:
                b._derived[s.name] = (own, running)
                param._value = running


def where(port) -> str:
    return f"{port.block.name}.{port.name}"


def host_elements(port, data, current: Shape, resize: bool) -> tuple[np.ndarray, Shape, Shape | None]:
    """Check ``data`` for ``engine.write``: (its bytes as a C-contiguous array laid out as the port's buffer,
    its element shape, the new shape when the write resizes the port, else None). Raises ValidationError
    saying what the port takes."""
    spec = port.spec
    name = where(port)
    try:
        arr, shape = _dtypes.elements_of(spec.dtype, data, name)
    except ValueError as e:
        raise ValidationError(str(e), subject=port.block.name) from None
    if spec.dtype is None:
        if arr.nbytes > max(math.prod(current), 4):
            raise ValidationError(f"{name} has no element type, so its buffer holds {math.prod(current)} bytes, and "
                                  f"{arr.nbytes} bytes do not fit; give the kernel's parameters types in a JSON "
                                  "sidecar (rxcuda kernels build writes one), or bind a device array",
                                  subject=port.block.name)
        return arr, shape, None
    if resize:
        shape = shape or (1,)
        new = None if shape == current else shape
        if spec.strides is not None and new is not None:
            raise ShapeError(f"{name} has strides {spec.strides} for its shape {fmt(spec.shape)}: a strided port "
                             "keeps its shape; write an array of that shape", subject=port.block.name)
        return (arr if spec.strides is None else _scatter(arr, spec)), shape, new
    n = math.prod(shape)
    count = math.prod(current)
    if n > count:
        raise ValidationError(f"{n} elements do not fit {name} ({count} elements, shape {fmt(current)}); to give "
                              f"the port the array's shape {fmt(shape)}, write with resize=True or call "
                              "engine.resize(port, shape)", subject=port.block.name)
    if spec.strides is not None:
        if shape != current:
            raise ValidationError(f"{name} is laid out with strides {spec.strides}: write a whole array of its "
                                  f"shape {fmt(current)} (got {fmt(shape)})", subject=port.block.name)
        arr = _scatter(arr, spec)
    return arr, shape, None


def _scatter(arr: np.ndarray, spec: PortSpec) -> np.ndarray:
    """A C-contiguous array of the elements laid out with the port's strides (gaps zero)."""
    flat = np.zeros(spec.extent * _lanes(spec.dtype), arr.dtype)
    _strided(flat, spec)[...] = arr
    return flat


def _lanes(dtype) -> int:
    layout = _dtypes.vector_layout(dtype)
    return layout[1] if layout else 1


def _strided(flat: np.ndarray, spec: PortSpec) -> np.ndarray:
    """The elements of a strided port's buffer (``flat``, as downloaded) as an array of the port's shape."""
    lanes = _lanes(spec.dtype)
    item = flat.itemsize * lanes
    assert spec.strides is not None
    shape = spec.shape + ((lanes,) if lanes > 1 else ())
    strides = tuple(s * item for s in spec.strides) + ((flat.itemsize,) if lanes > 1 else ())
    return np.lib.stride_tricks.as_strided(flat, shape, strides, writeable=True)


def empty_for_read(spec: PortSpec, shape: Shape, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the array engine.read returns, the array to download into): the same array unless the port is
    strided (then a buffer of its extent, gathered with :func:`gathered`). ``out``: the caller's array to read
    into (``engine.read(port, out=...)``), checked to be what a new one would be."""
    if out is None:
        out = _dtypes.empty_host(spec.dtype, shape)
    else:
        _dtypes.check_out(out, *_dtypes.host_layout(spec.dtype, shape))
    if spec.strides is None or spec.dtype is None:
        return out, out
    want, lanes = _dtypes.host_dtype(spec.dtype)
    return out, np.empty(spec.extent * (lanes[0] if lanes else 1), want)


def read_layout(spec, shape: Shape) -> tuple[Shape, np.dtype] | None:
    """(shape, dtype) of the array ``engine.read`` returns for a port of ``shape`` elements: vector lanes on a
    last axis, untyped ports as bytes; None for an append output or its count (as many as were appended)."""
    if isinstance(spec, CountSpec) or spec.counter is not None:
        return None
    return _dtypes.host_layout(spec.dtype, shape)


def gathered(out: np.ndarray, raw: np.ndarray, spec: PortSpec) -> np.ndarray:
    if raw is not out:
        out[...] = _strided(raw, spec)
    return out


def device_view(spec: PortSpec, shape: Shape) -> tuple[str, Shape]:
    """(dtype name, shape) of a CuPy view of the port's buffer: a vector's lanes on a last axis, a struct's
    bytes on a last axis (CuPy has no structured dtypes)."""
    if spec.dtype is None:
        return "u8", shape
    layout = _dtypes.vector_layout(spec.dtype)
    if layout is not None:
        return layout[0], shape + (layout[1],)
    struct = _dtypes.struct_type(spec.dtype)
    if struct is not None:
        return "u8", shape + (struct.size,)
    return spec.dtype, shape


def stream_layout(spec: PortSpec, count: int) -> tuple[str | None, int, tuple[int, ...]]:
    """(dtype, count, trailing axes) for a feed or a tap of the port: a vector port streams its lanes as
    scalars (count x lanes of them, shaped (..., lanes) again by the tap)."""
    layout = _dtypes.vector_layout(spec.dtype)
    if layout is not None:
        return layout[0], count * layout[1], (layout[1],)
    return spec.dtype, count, ()


def as_elements(ext, spec: PortSpec, name: str):
    """A bound device array seen as the port's elements: a vector port takes its scalar type with the lanes
    on a last axis (a float32 (n, 4) CuPy array is n float4). Anything else is returned as it is (the caller
    checks the dtype)."""
    layout = _dtypes.vector_layout(spec.dtype)
    if layout is None or ext.dtype != layout[0]:
        return ext
    if not ext.shape or ext.shape[-1] != layout[1]:
        raise ValidationError(f"{name} takes {_dtypes.describe(spec.dtype)}: bind a {layout[0]} array shaped "
                              f"(..., {layout[1]}) (this one has shape {tuple(ext.shape)})")
    shape = tuple(ext.shape[:-1]) or (1,)
    return attrs.evolve(ext, dtype=spec.dtype, count=math.prod(shape), shape=shape)


def retarget_taps(g, taps, layouts) -> None:
    """After a rebuild or a resize: each tap of a port whose shape changed reads the new element count, and
    emits arrays of the new shape (``layouts``: tap -> (spec, [shape it emits]))."""
    for ref, tap, _observer in taps:
        layout = layouts.get(tap)
        if layout is None:
            continue
        spec, cell = layout
        shape = running_shape(g, ref, spec)
        _dtype, count, lanes = stream_layout(spec, math.prod(shape))
        if count != tap.count:
            tap.resize(count)
        cell[0] = shape + lanes


def retarget_feeds(g, feeds, specs) -> None:
    """After a rebuild or a resize: each streamed input takes arrays of its port's new element count."""
    for ref, (feed, _sub) in feeds.items():
        spec = specs.get(ref)
        if spec is not None:
            feed.resize(stream_layout(spec, math.prod(running_shape(g, ref, spec)))[1])


# -- resizing ----------------------------------------------------------------------------------------------
def check_resize(rt: Runtime, ref: PortRef, port, shape) -> Shape:
    """The new shape of ``port`` after checking it may take it: an input that is host-fed, bound or not yet
    used (not connected: a connected input takes its source's shape), whose block lets it change shape (not a
    fixed N-D input, nor a fixed 1-D input asked for another element count). Raises ValidationError."""
    spec = port.spec
    name = where(port)
    try:
        shape = _shapes.check_shape(shape, "shape")
    except ValueError as e:
        raise ValidationError(f"{name}: {e}", subject=port.block.name) from None
    if spec.direction != "in":
        raise ShapeError(f"{name} is an output: its shape follows from its block's inputs (or is fixed); resize an "
                         "input upstream", subject=port.block.name)
    if spec.counter is not None:
        raise ShapeError(f"{name} is an append port: its capacity is fixed", subject=port.block.name)
    if rt.is_connected(ref):
        src = rt.connections[ref].src
        block = rt.blocks.get(src.block)
        raise ShapeError(f"{name} is connected from {block.name if block else src.block}.{src.port} and takes its "
                         "shape; resize the input where the data enters the pipeline", subject=port.block.name)
    if spec.strides is not None and shape != spec.shape:
        raise ShapeError(f"{name} is laid out with strides {spec.strides} for shape {fmt(spec.shape)}; a strided "
                         "port keeps its shape", subject=port.block.name)
    if spec.rule is None and not _shapes.accepts(spec.shape, shape):
        raise ShapeError(f"{name} has a fixed shape {fmt(spec.shape)} and cannot take {fmt(shape)}: its block "
                         "says so (a library call, or a port declared with an explicit shape); declare the port "
                         "with rule=Follow() to let it change", subject=port.block.name)
    return shape


def resize(rt: Runtime, ref: PortRef, port, shape: Shape) -> bool:
    """Record the new shape of an input (checked with :func:`check_resize`); it takes effect at the next
    frame. A port not yet fed or bound becomes host-fed. Returns True if anything changed."""
    spec = port.spec
    with rt.lock:
        before = rt.shapes.get(ref)
        current = before if before is not None else spec.shape
        g = rt.graph
        if before is None and g is not None and getattr(g.plan, "shapes", None):
            current = g.plan.shapes.get(ref, spec.shape)
        if shape == current and (ref in rt.fed or ref in rt.bindings):
            return False
        if shape == spec.shape:
            rt.shapes.pop(ref, None)
        else:
            rt.shapes[ref] = shape
        if ref not in rt.fed and ref not in rt.bindings:
            rt.fed.add(ref)
    rt.pending.add(BlockChanged(ref.block, port.block.name, f"input {port.name} resized to {fmt(shape)}"))
    return True
