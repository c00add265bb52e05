"""Delayed connections (feedback across frames), for the planner.

A connection made with ``delay=1`` carries the value its output had at the end of the previous frame. The
planner gives every delayed *output* one previous-frame buffer (kind ``"delay"``, key ``("delay", block,
port)``), shared by all its delayed inputs, and emits one copy node per delayed output after every other node:
the copy refreshes the previous-frame buffer from the buffer the producer writes, so the next frame reads this
frame's value. A delayed connection orders no blocks, so it may close a cycle (a block may even feed itself).

Why a copy and not two buffers whose roles swap every frame: the copy is one mechanism for frames the host
launches (``tick()``) and frames a device loop runs back to back (a batch, where no host runs between
frames to swap pointers), bit for bit the same in both. It costs ``nbytes`` of device bandwidth per delayed
output per frame (a 16 MiB particle buffer: a few microseconds of GPU time); a swap would cost about 0.6 us of
host time per consumer node per frame (an exec-node update) and could not run inside a device loop.

The frame-0 value (``Connection.initial``): None for zeros, else an array of the port's element type and
count that :func:`initial_array` makes from what the user gave.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from ..model import _dtypes
from ..model._describe import BlockDescription, Connection, PipelineDescription, PortRef, PortSpec
from ..model._graphplan import BufferPlan, CopyNodePlan


def delay_key(src: PortRef) -> tuple:
    """The key of a delayed output's previous-frame buffer (stable across rebuilds, like a port's)."""
    return ("delay", src.block, src.port)


def initial_array(value, port: PortSpec, where: str) -> np.ndarray | None:
    """The frame-0 contents of a delayed output's previous-frame buffer, from what the user gave: None
    (zeros), a number (every element), or an array or list of ``port.count`` elements (any shape) of the
    port's element type. Returns a read-only 1-D array, or None; raises ValueError naming ``where`` (the
    connection, as the user wrote it) and the fix."""
    if value is None:
        return None
    dt = _dtypes.to_numpy(port.dtype) if port.dtype else np.dtype(np.uint8)
    kind = port.dtype or "untyped (bytes)"
    if isinstance(value, np.ndarray) and value.ndim and value.dtype != dt and _dtypes.vector_layout(port.dtype):
        lanes, _shape = _dtypes.elements_of(port.dtype, value, f"the initial value of {where}")  # (..., lanes)
        value = np.ascontiguousarray(lanes).view(dt)[..., 0]  # one float4 per element, as the port holds them
    if isinstance(value, np.ndarray) and value.ndim:  # an array keeps its type: no silent conversion
        arr = value
        if arr.dtype != dt:
            raise ValueError(f"the initial value of {where} has dtype {arr.dtype}, the port holds {kind}; convert "
                             f"it (initial=arr.astype('{dt}'))")
    elif hasattr(value, "__cuda_array_interface__") or (hasattr(value, "__dlpack__")
                                                         and not isinstance(value, np.generic | np.ndarray)):
        raise ValueError(f"the initial value of {where} is a device array; give a NumPy array (e.g. "
                         "cupy.asnumpy(arr)): it is uploaded once, when the previous-frame buffer is made")
    else:
        try:
            arr = np.asarray(value, dtype=dt)
        except (TypeError, ValueError) as e:
            raise ValueError(f"the initial value of {where} must be None (zeros), a number or an array of "
                             f"{port.count} {kind} elements (got {type(value).__name__}: {e})") from None
        if arr.ndim == 0:
            arr = np.full(port.count, arr, dtype=dt)
    if arr.size != port.count:
        raise ValueError(f"the initial value of {where} has {arr.size} elements, the port holds {port.count}; "
                         f"give a number (every element gets it) or {port.count} elements")
    out = np.array(arr, dtype=dt, order="C").reshape(-1)  # a copy: later changes to the caller's array don't leak
    out.flags.writeable = False
    return out


def same_initial(a, b) -> bool:
    """Whether two connections' initial values (None or arrays) give the same frame-0 contents."""
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


def split_sources(connections: Iterable[Connection]) -> tuple[dict[PortRef, PortRef], dict[PortRef, PortRef]]:
    """(input -> source of its plain connection, input -> source of its delayed connection)."""
    sources: dict[PortRef, PortRef] = {}
    delayed: dict[PortRef, PortRef] = {}
    for c in connections:
        (delayed if c.delay else sources)[c.dst] = c.src
    return sources, delayed


def direction_message(c: Connection, blocks: Mapping[int, BlockDescription]) -> str:
    """A delayed connection from an input port: name both ends and the outputs to take instead."""
    src_block, dst_block = blocks.get(c.src.block), blocks.get(c.dst.block)
    outputs = [p.name for p in src_block.ports if p.direction == "out"] if src_block is not None else []
    where = _where(c, blocks)
    src = where.split(" -> ")[0]
    fix = (f"connect one of {src_block.name}'s outputs instead ({', '.join(outputs)}): engine.connect("
           f"{src_block.name}['{outputs[0]}'], {dst_block.name if dst_block else '<block>'}['{c.dst.port}'], "
           "delay=1)") if src_block is not None and outputs else "connect the output that computes the value instead"
    return (f"cannot delay {where}: {src} is an input port, and a delayed connection carries the value an output "
            f"had at the end of the previous frame; {fix}")


MISMATCH_HINT = ("; a delayed connection copies the output into the input's previous-frame buffer each frame, so "
                 "both ends need the same element type and size")


def buffer_label(desc: PipelineDescription, src: PortRef) -> str:
    """The label of ``src``'s previous-frame buffer."""
    try:
        name = desc.block(src.block).label()
    except KeyError:  # reported elsewhere: the plan is dropped
        name = f"<block {src.block}>"
    return f"{name}.{src.port} (previous frame)"


def check_initials(desc: PipelineDescription, report) -> None:
    """Report a delayed connection whose initial value does not fit its output's port, and two delayed
    connections from one output with different initial values (they share one previous-frame buffer). Ports
    that are missing or of the wrong direction are reported elsewhere."""
    blocks = {b.id: b.desc for b in desc.blocks}
    given: dict[PortRef, tuple[Connection, np.ndarray]] = {}
    for c in desc.connections:
        if not c.delay or c.initial is None:
            continue
        src_block = blocks.get(c.src.block)
        port = next((p for p in src_block.ports if p.name == c.src.port), None) if src_block is not None else None
        if port is None or port.direction != "out":
            continue
        where = _where(c, blocks)
        block = blocks.get(c.dst.block)
        subject = block.name if block is not None else where
        try:
            arr = initial_array(c.initial, port, f"the delayed connection {where}")
        except ValueError as e:
            report.error(str(e), subject, c.dst.block)
            continue
        assert arr is not None
        other, other_arr = given.setdefault(c.src, (c, arr))
        if other is not c and not same_initial(other_arr, arr):
            report.error(f"the delayed connections {_where(other, blocks)} and {where} give different initial "
                         f"values; one output has one previous-frame buffer, shared by every delayed input it "
                         "feeds: give them the same initial value, or give it on one of them only", subject,
                         c.dst.block)


def emit_copies(delayed: Mapping[PortRef, PortRef], port_buffers: Mapping[PortRef, int],
                by_key: Mapping[tuple, int], buffers: list[BufferPlan], nodes: list) -> dict[int, int]:
    """Append one copy node per delayed output (producer buffer -> previous-frame buffer) to ``nodes``,
    after every other node, and return the delays of the plan (producer buffer id -> previous-frame id)."""
    delays: dict[int, int] = {}
    for src in dict.fromkeys(delayed.values()):
        cur = port_buffers.get(src)
        prev = by_key.get(delay_key(src))
        if cur is None or prev is None or cur in delays:  # None only after an error: the plan is dropped
            continue
        delays[cur] = prev
        label = buffers[prev].label.removesuffix(" (previous frame)")
        nodes.append(CopyNodePlan(len(nodes), cur, prev, buffers[prev].nbytes, f"delay {label}",
                                  frozenset((cur,)), frozenset((prev,))))
    return delays


def _where(c: Connection, blocks: Mapping[int, BlockDescription]) -> str:
    def label(ref: PortRef) -> str:
        b = blocks.get(ref.block)
        return f"{b.name}.{ref.port}" if b is not None else f"<block {ref.block}>.{ref.port}"

    return f"{label(c.src)} -> {label(c.dst)}"
