"""Chains: several library calls (and kernels) captured as one child-graph node.

A chain is itself a :class:`~rxcuda.libraries.LibraryCall`, so it is a block like any other. Its steps
run in order on the capturing stream. **Names are wires**: each step parameter is known in the chain
by its own name, or by the name a step's mapping gives it; parameters that share a chain name share one
buffer (or one scalar). Names listed in ``internal`` are buffers the chain allocates itself (in
``setup``) and keeps out of its ports — temporaries between steps. Everything else becomes a chain
parameter, with a direction seen from outside: read before any step writes it -> ``in`` (``inout`` if a
later step writes it), written first -> ``out``.

Device scalars stay device scalars (the engine's slot pointer is handed to every step that reads the
name); host scalars of any step recapture the whole chain when they change.

>>> from rxcuda.libraries import gemm, scal, rfft
>>> c = chain(gemm(64, 32, 16), (scal(64 * 32, alpha=0.5), {"x": "c", "alpha": "gain"}),
...           (rfft(32, batch=64), {"x": "c", "y": "spectrum"}), internal=("c",), name="mm_scale_fft")
>>> [p.name for p in c.params]
['a', 'b', 'alpha', 'gain', 'spectrum']
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ..cuda import _launch
from ..model import _dtypes
from ..model._describe import CallSpec, CaptureArgs, KernelCode, KernelParam, Launch
from . import _handles as H
from ._common import LibraryCall, check_name, invalid, param_counts

_WRITES = ("out", "inout", "counter")
_READS = ("in", "inout", "counter")


@attrs.define
class _Wire:
    name: str
    kind: str
    dtype: str | None
    count: int | None
    device: bool
    default: object
    first: str  # direction of the first access
    writes: bool
    users: list


def _normalise_steps(op: str, steps) -> list[tuple[CallSpec, dict[str, str]]]:
    if not steps:
        raise invalid(op, "steps", "a chain needs at least one step (a CallSpec or (CallSpec, mapping))")
    out = []
    for i, step in enumerate(steps):
        mapping: Mapping[str, str] = {}
        if isinstance(step, tuple) and len(step) == 2 and isinstance(step[1], Mapping):
            step, mapping = step
        if not isinstance(step, CallSpec):
            raise invalid(
                op,
                f"steps[{i}]",
                f"expected a CallSpec or (CallSpec, {{param: name}}), got {type(step).__name__}",
            )
        names = {p.name for p in step.params}
        for src, dst in mapping.items():
            if src not in names:
                have = ", ".join(p.name for p in step.params) or "none"
                raise invalid(
                    op,
                    f"steps[{i}]",
                    f"step '{step.name}' has no parameter '{src}' to rename (it has: {have})",
                )
            if not isinstance(dst, str) or not dst.isidentifier():
                raise invalid(op, f"steps[{i}]", f"'{src}' must map to an identifier, got {dst!r}")
        out.append((step, dict(mapping)))
    return out


def _wires(op: str, steps, internal: tuple[str, ...]) -> dict[str, _Wire]:
    wires: dict[str, _Wire] = {}
    for i, (spec, mapping) in enumerate(steps):
        counts = param_counts(spec)
        seen_ptr: dict[str, str] = {}
        where = f"step {i} '{spec.name}'"
        for p in spec.params:
            cname = mapping.get(p.name, p.name)
            device = (not p.is_pointer) and p.name in spec.device_scalars
            count = counts.get(p.name) if p.is_pointer else None
            if p.is_pointer:
                if cname in seen_ptr:
                    raise invalid(
                        op,
                        cname,
                        f"{where} binds both '{seen_ptr[cname]}' and '{p.name}' to one "
                        f"buffer; a call cannot alias its own buffers — rename one",
                    )
                seen_ptr[cname] = p.name
            w = wires.get(cname)
            if w is None:
                wires[cname] = _Wire(
                    cname,
                    p.kind,
                    p.dtype,
                    count,
                    device,
                    p.default,
                    p.direction,
                    p.is_pointer and p.direction in _WRITES,
                    [(i, p.name)],
                )
                continue
            if w.kind != p.kind:
                raise invalid(
                    op,
                    cname,
                    f"is a {w.kind} in one step and a {p.kind} in {where}; give one of them another name",
                )
            if w.dtype is not None and p.dtype is not None and w.dtype != p.dtype:
                raise invalid(
                    op,
                    cname,
                    f"dtype {w.dtype} of an earlier step does not match {p.dtype} of "
                    f"{where}; connect buffers of one type",
                )
            if p.is_pointer:
                if w.count is not None and count is not None and w.count != count:
                    raise invalid(
                        op,
                        cname,
                        f"holds {w.count} elements in an earlier step but {where} expects {count}; match the shapes",
                    )
                w.count = w.count if w.count is not None else count
                w.writes = w.writes or p.direction in _WRITES
            elif w.device != device:
                raise invalid(
                    op,
                    cname,
                    f"is a device scalar in one step and a host scalar in {where}; give them different names",
                )
            w.dtype = w.dtype or p.dtype
            w.users.append((i, p.name))
    for name in internal:
        w = wires.get(name)
        if w is None:
            raise invalid(op, "internal", f"'{name}' is not a parameter of any step; known: {', '.join(wires)}")
        if w.kind != "pointer":
            raise invalid(op, "internal", f"'{name}' is a scalar; only buffers can be internal")
        if w.first in _READS:
            step = w.users[0]
            raise invalid(
                op,
                "internal",
                f"'{name}' is read by step {step[0]} ('{step[1]}') before any step "
                f"writes it; expose it as a port or reorder the steps",
            )
        if w.count is None:
            raise invalid(
                op,
                "internal",
                f"'{name}' has no known element count (every step using it is a "
                f"plain CallSpec); wrap the step with counts",
            )
        if w.dtype is None or w.dtype not in _dtypes.TYPE_NAMES:
            raise invalid(op, "internal", f"'{name}' has no known element type; give its steps a dtype")
    return wires


def _external_direction(w: _Wire) -> str:
    if w.first in _READS:
        return "inout" if w.writes else "in"
    return "out"


class _ChainState:
    def __init__(self, res, states, buffers):
        self.resources = res
        self.states = states
        self.buffers = buffers


def chain(*steps, internal=(), name: str = "chain") -> LibraryCall:
    """Compose calls (and kernels, see :func:`kernel`) into one captured node.

    ``steps``: each a CallSpec, or ``(CallSpec, {step_param: chain_name})`` to rename its parameters.
    ``internal``: chain names of buffers the chain allocates itself (written by a step before any read).
    """
    op = "chain"
    check_name(op, name)
    if isinstance(internal, str):
        internal = (internal,)
    internal = tuple(internal)
    norm = _normalise_steps(op, steps)
    wires = _wires(op, norm, internal)

    params: list[KernelParam] = []
    counts: dict[str, int] = {}
    dscalars: list[str] = []
    for w in wires.values():
        if w.name in internal:
            continue
        if w.kind == "pointer":
            params.append(
                KernelParam(name=w.name, kind="pointer", size=8, dtype=w.dtype, direction=_external_direction(w))
            )
            if w.count is not None:
                counts[w.name] = w.count
        else:
            size = _dtypes.itemsize(w.dtype) if w.dtype in _dtypes.TYPE_NAMES else 8
            params.append(KernelParam(name=w.name, kind="scalar", size=size, dtype=w.dtype, default=w.default))
            if w.device:
                dscalars.append(w.name)

    # per step: (param name, chain name, how) with how in {"ptr", "internal", "dev", "host"}
    plans = []
    for spec, mapping in norm:
        plan = []
        for p in spec.params:
            cname = mapping.get(p.name, p.name)
            if p.is_pointer:
                how = "internal" if cname in internal else "ptr"
            else:
                how = "dev" if p.name in spec.device_scalars else "host"
            plan.append((p.name, cname, how))
        plans.append(tuple(plan))
    internal_bytes = {n: wires[n].count * _dtypes.itemsize(wires[n].dtype) for n in internal}
    specs = tuple(s for s, _ in norm)

    def setup(device_ordinal: int):
        res = H.Resources(device_ordinal)
        states = []
        try:
            buffers = {n: res.alloc(b).ptr for n, b in internal_bytes.items()}
            for spec in specs:
                states.append(spec.setup(device_ordinal) if spec.setup is not None else None)
        except BaseException:
            _teardown_states(specs, states)
            res.close()
            raise
        return _ChainState(res, states, buffers)

    def teardown(state):
        if state is None:
            return
        try:
            _teardown_states(specs, state.states)
        finally:
            state.resources.close()

    def sub_args(args: CaptureArgs, plan, sub_state) -> CaptureArgs:
        st = args.state
        pointers = {}
        values = {}
        for pname, cname, how in plan:
            if how == "ptr" or how == "dev":
                pointers[pname] = args.pointers[cname]
            elif how == "internal":
                pointers[pname] = st.buffers[cname]
            else:
                values[pname] = args.values[cname]
        return CaptureArgs(stream=args.stream, pointers=pointers, values=values, state=sub_state)

    def prepare(args: CaptureArgs):
        for spec, plan, sub_state in zip(specs, plans, args.state.states, strict=True):
            if getattr(spec, "prepare", None) is not None:
                spec.prepare(sub_args(args, plan, sub_state))

    def record(args: CaptureArgs):
        for spec, plan, sub_state in zip(specs, plans, args.state.states, strict=True):
            spec.record(sub_args(args, plan, sub_state))

    has_prepare = any(getattr(s, "prepare", None) is not None for s in specs)
    key = ("chain", tuple((s.key, tuple(sorted(m.items()))) for s, m in norm), tuple(sorted(internal)))
    ws = sum(getattr(s, "workspace_bytes", 0) for s in specs) + sum(internal_bytes.values())
    return LibraryCall(
        name=name,
        params=tuple(params),
        record=record,
        key=key,
        device_scalars=tuple(dscalars),
        setup=setup,
        teardown=teardown,
        counts=counts,
        workspace_bytes=ws,
        summary="chain: " + " -> ".join(s.name for s in specs),
        prepare=prepare if has_prepare else None,
    )


def _teardown_states(specs, states) -> None:
    errors = []
    for spec, state in reversed(list(zip(specs, states, strict=False))):
        if spec.teardown is not None and state is not None:
            try:
                spec.teardown(state)
            except Exception as e:
                errors.append(e)
    if errors:
        raise errors[0]


# -- kernels inside a chain -------------------------------------------------------------------------------
def kernel(
    code: KernelCode, launch: Launch, counts: Mapping[str, int] | None = None, name: str | None = None
) -> LibraryCall:
    """An engine kernel (:class:`KernelCode` + :class:`Launch`) as a call, to put inside a :func:`chain`.

    ``counts`` gives the element count of pointer parameters (needed for internal buffers and joins).
    A scalar whose default is ``"size"`` defaults to the largest count (or the launch's thread count).
    Its scalars are host scalars: a change recaptures the chain. The module is loaded in ``setup``.
    """
    op = "kernel"
    if not isinstance(code, KernelCode):
        raise invalid(op, "code", f"expected a KernelCode, got {type(code).__name__}")
    if not isinstance(launch, Launch):
        raise invalid(op, "launch", f"expected a Launch (e.g. Launch.for_threads(n)), got {type(launch).__name__}")
    name = name or code.entry
    check_name(op, name)
    counts = dict(counts or {})
    sig = code.signature.params
    names = {p.name for p in sig}
    for k, v in counts.items():
        if k not in names:
            raise invalid(
                op,
                "counts",
                f"kernel '{code.entry}' has no parameter '{k}' (it has: {', '.join(names) or 'none'})",
            )
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise invalid(op, "counts", f"count of '{k}' must be a positive int, got {v!r}")
    size = max(counts.values()) if counts else launch.threads

    def resolved(p: KernelParam) -> KernelParam:
        if p.is_pointer or p.default not in ("size", None):
            return p
        return attrs.evolve(p, default=size if p.default == "size" else 0)

    params = tuple(resolved(p) for p in sig)
    entry = code.entry

    def setup(device_ordinal: int):
        st = H.Resources(device_ordinal)
        try:
            st.extra["function"] = st.load(code)
        except BaseException:
            st.close()
            raise
        return st

    def record(args: CaptureArgs):
        values = [args.pointers[p.name] if p.is_pointer else args.values[p.name] for p in params]
        _launch.launch_kernel(args.state.extra["function"], launch, args.stream, params, values)

    return LibraryCall(
        name=name,
        params=params,
        record=record,
        key=("kernel", code.key, launch),
        setup=setup,
        teardown=H.close_resources,
        counts=counts,
        summary=f"kernel {entry} grid={launch.grid} block={launch.block}",
    )
