"""The checks that keep a parameter or a launch from making a kernel index past its buffers.

Every way a value reaches a count parameter (``Block.set``, ``Parameter.value =``, ``Parameter.bind``, a
composite's ``set``, the live view and the notebook widgets, which call the same setter) goes through
:func:`bounded`'s check, against the element counts the tied buffers have *now* (after ``engine.resize``).
The planner checks the same rule again whenever it plans (a rebuild, ``engine.replace``, a description
rebuilt from data): a count set by number that no longer fits fails that plan (a diagnostic; the last good
graph keeps running), one that follows a size is passed as that size (a plan warning). And the engine checks
each count value once more against the running plan before it patches the graph (:func:`plan_limits`), so a
value that passed ``set`` just before a resize shrank its buffer is dropped with an error diagnostic instead
of reaching the GPU. The rules are in ``rxcuda.model._bounds``.

Launch geometry (``Block.set_launch``): a kernel with a tied count parameter only touches its buffers below
that count (the author said so by declaring it), so threads beyond it do nothing and any thread count is
safe. A kernel with none gives rxcuda nothing to check against, so it may be launched with at most the threads
that cover its smallest buffer (rounded up to whole blocks), or the launch it was declared with where that
was given explicitly; more is refused with BoundsError.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable

from ..model._bounds import count_problem
from ..model._describe import KernelSpec, Launch, PortRef
from ..model._errors import BoundsError
from ..model._memo import by_identity
from ._engineside import side_of


def capacities(block, names: Iterable[str]) -> dict[str, int]:
    """name -> element count now, of ports and internal buffers of ``block``: in its engine (resized shapes
    included, a resize waiting for the next frame too), else as declared."""
    desc = block.description
    ports = {p.name: p for p in desc.ports}
    internals = {ib.name: ib for ib in desc.internals}
    side = side_of(block._engine)

    def count(name: str) -> int:
        spec = ports.get(name)
        if spec is not None:
            if side is None or spec.counter is not None:  # an append buffer keeps its capacity
                return spec.count
            return side.port_count(PortRef(block.id, name), spec)  # resized shapes are the engine's to know
        ib = internals[name]
        if side is not None and ib.like is not None and ib.like in ports:
            return count(ib.like)
        return ib.count

    return {n: count(n) for n in names if n in ports or n in internals}


def bounded(param, check: Callable, counts: tuple[str, ...]) -> Callable:
    """``check`` (the parameter's type and range check) followed by the count rule: a value above the element
    count of a buffer that parameter counts, or below 0, raises BoundsError and changes nothing.

    The setter is the hottest call a user makes, so the check costs a few attribute reads while nothing is
    resized (the declared counts hold, cached per description); only a resized pipeline looks up the shapes
    (:func:`capacities`). The engine checks the value once more before it reaches the GPU, with one comparison
    against the running plan's limit (``rxcuda.engine._update``'s hot table)."""
    block = param._block
    cached: list = [None, 0]  # [description, smallest declared count]: a description is immutable
    plain, lo, hi = param._plain, param._lo, param._hi  # the type's fast test (see Parameter.value), inline

    def check_count(v):
        if type(v) is not plain or not lo <= v <= hi:
            v = check(v)
        desc = block._desc
        if cached[0] is not desc:
            cached[0], cached[1] = desc, min(_declared(desc, counts).values(), default=-1)
        cap = cached[1]
        engine = block._engine
        if engine is not None:
            rt = engine._side.resizes  # (side_of, inline: EngineSide's attributes, read without a call)
            g = rt.graph
            if rt.shapes or (g is not None and g.plan.shapes):  # something was resized: the counts now
                cap = min(capacities(block, counts).values(), default=-1)
        if cap >= 0 and not 0 <= v <= cap:
            raise refusal(block, param.name, v, capacities(block, counts))
        return v

    return check_count


def _sizes_of(ports: tuple, internals: tuple) -> dict[str, int]:
    return {p.name: p.count for p in ports} | {ib.name: ib.count for ib in internals}


# per description parts, which the blocks declared from one kernel share (a block's first check ran these
# comprehensions each time: a third of a count parameter's construction)
_sizes = by_identity(_sizes_of, parts=2)


def _declared(desc, names: Iterable[str]) -> dict[str, int]:
    """name -> declared element count of the ports and internal buffers ``names`` of a block description."""
    sizes = _sizes(desc.ports, desc.internals)
    return {n: sizes[n] for n in names if n in sizes}


def refusal(block, name: str, value, caps: dict[str, int]) -> BoundsError:
    """The BoundsError for ``value`` of count parameter ``name`` of ``block`` (``caps``: its tied buffers)."""
    inputs = {p.name for p in block.description.ports if p.direction == "in" and p.counter is None}
    found = count_problem(block.name, name, value, caps, inputs)
    assert found is not None
    message, port, cap = found
    return BoundsError(message, block=block.name, parameter=name, port=port, capacity=cap, value=value)


def check_launch(block, kernel: str, launch: Launch) -> None:
    """Refuse ``launch`` for ``kernel`` of ``block`` when more threads could index past a buffer (see the
    module's docstring for the rule); BoundsError names the kernel, the smallest buffer and its size."""
    desc = block.description
    spec = desc.kernel(kernel)
    if not isinstance(spec, KernelSpec):
        return
    if any(s.counts and any(p.kernel == kernel for p in s.pins) for s in desc.scalars):
        return  # guarded by a checked count: extra threads do nothing
    touched = [p.name for p in desc.ports if any(pin.kernel == kernel for pin in p.pins)]
    touched += [ib.name for ib in desc.internals if any(p.kernel == kernel for p in (ib.writer, *ib.readers))]
    caps = capacities(block, touched)
    if not caps:
        return
    port, cap = min(caps.items(), key=lambda kv: kv[1])
    per_block = math.prod(launch.block)
    ipt = spec.code.items_per_thread
    threads = -(-cap // ipt)  # ceil: a thread may handle several elements
    cover = -(-threads // per_block) * per_block  # in whole blocks
    declared = spec.launch.threads if spec.grid_of is None else 0
    limit = max(cover, declared)
    if launch.threads > limit:
        raise BoundsError(
            f"{block.name}.{kernel}: a launch of {launch.threads} threads is more than port '{port}' holds "
            f"({cap} elements; {limit} threads cover it), and nothing says the kernel stops at the end of its "
            f"buffers (it has no count parameter tied to them), so it would index past the buffer. Launch at most "
            f"{limit} threads, give the kernel a count parameter that counts its ports (a sidecar's \"counts\", "
            f"RX_COUNTS(...)), or grow the buffer first: engine.resize(port, shape)",
            block=block.name, parameter="threads", port=port, capacity=cap, value=launch.threads)


def untied_kernels(block) -> list[str]:
    """The kernels of ``block`` loaded from a kernel file that take buffers but have no scalar tied to one:
    their bounds are the user's to keep (the engine says so once, in an "info" diagnostic, when the block is
    added). Generated kernels (composed, tensor) are left out: rxcuda writes their guards itself. Decided once
    per kernels and scalars (the blocks made from one kernel share theirs, whatever their names)."""
    desc = block.description
    return _UNTIED(desc.kernels, desc.scalars)


def _untied(kernels: tuple, scalars: tuple) -> list[str]:
    out = []
    for st in kernels:
        if not isinstance(st, KernelSpec):
            continue
        if any(s.counts and any(p.kernel == st.name for p in s.pins) for s in scalars):
            continue  # tied: the common case, decided without touching the file system
        if not any(p.is_pointer and p.direction != "counter" for p in st.code.signature.params):
            continue
        if _is_file(st.code.origin):
            out.append(st.name)
    return out


_UNTIED = by_identity(_untied, parts=2)


@functools.lru_cache(maxsize=1024)
def _is_file(origin: str) -> bool:
    """Whether a kernel's origin names a file (not a generated kernel's label); asked once per origin."""
    return os.path.isfile(origin)
