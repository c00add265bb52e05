"""The planner's per-block emission, specialised once per block shape.

``_Planner.emit_block`` is the planner's inner loop: for each block, in topological order, it gives every port
and internal connection its buffer, checks the count parameters against those buffers, and emits one node
per kernel with its arguments. Its loops walk the block's ports, scalars and kernel parameters, facts of the
block's *shape* (its ``ports``, ``scalars``, ``kernels`` and ``internals`` tuples, which the blocks made from
one kernel share). A pipeline of 1000 such blocks walks the same shape 1000 times.

:func:`emitter` writes, once per shape, a Python function that does what ``emit_block`` does for a block of
that shape with those loops unrolled and the facts they look up folded into constants: which parameter is a
pointer fed by which port, which scalar feeds which argument, each buffer's label suffix, dtype and count
(measured on 1000 ``scalar_mul`` blocks: the emission takes ~4 µs a block instead of ~9, a third of ``plan()``).
It is the technique of ``attrs`` and ``dataclasses`` (a method written from the class's fields), applied to a
block shape.

The function covers the common case only; ``emitter`` returns None for any shape outside it, and
``emit_block`` keeps the general path for those and for any block the pipeline reshapes or that a delayed
connection feeds (see ``emit_block``):

- kernels only (a library call keeps the general path: device scalars, recaptured parameters),
- no append port (a counter buffer and its reset node),
- every pointer parameter fed by a port or an internal connection and every other parameter given a value
  (anything else is an error the general path reports),
- port names and internal names each unique.

The result is the general path's, field for field and in the same insertion order of every map (the
``Replanner`` relies on that order): ``tests/unit/test_emit.py`` plans a corpus of pipelines both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..model._bounds import count_problem
from ..model._describe import BlockEntry, CallSpec, PortRef
from ..model._graphplan import BufferArg, BufferPlan, KernelNodePlan, ScalarArg
from ..model._memo import by_identity

ENABLED = True  # (tests compare against the general path by turning it off)


def _written(ports: tuple, scalars: tuple, kernels: tuple, internals: tuple) -> Callable | None:
    return _write(ports, scalars, kernels, internals) if ENABLED else None


# ``emitter(ports, scalars, kernels, internals)``: the specialised emission of blocks of this shape,
# ``fn(planner, block, sources)``, or None where the shape needs the general path; written once per shape and
# looked up by the parts' identities
emitter = by_identity(_written, parts=4, limit=1024)


def clear() -> None:
    """Forget every shape's function (tests turning ``ENABLED`` on and off)."""
    emitter.table.clear()  # type: ignore[attr-defined]


class _Source:
    """The text of one function and the constants it names (``c0``, ``c1``, ...: anything that is not a plain
    string, int or None, so that ``repr`` never has to round-trip it)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}

    def line(self, text: str, depth: int = 1) -> None:
        self.lines.append("    " * depth + text)

    def const(self, value: Any) -> str:
        if value is None or type(value) in (str, int, bool):
            return repr(value)
        name = f"c{len(self.consts)}"
        self.consts[name] = value
        return name


def _write(ports: tuple, scalars: tuple, kernels: tuple, internals: tuple) -> Callable | None:
    """The function's text for this shape, compiled; None for a shape outside the common case."""
    if any(isinstance(k, CallSpec) for k in kernels) or any(p.counter is not None for p in ports):
        return None
    if len({p.name for p in ports}) != len(ports) or len({i.name for i in internals}) != len(internals):
        return None
    defaults: dict[str, Any] = {}
    for s in scalars:
        defaults.setdefault(s.name, s.default)
    scalar_of = {(pin.kernel, pin.param): s.name for s in scalars for pin in s.pins}  # (as _plan._scalar_facts)
    counted = [(s.name, tuple(s.counts)) for s in scalars if s.counts]
    counted_names = tuple(dict.fromkeys(c for _, counts in counted for c in counts))

    src = _Source()
    src.line("def emit(self, b, sources):", 0)
    src.line("bid = b.id")
    src.line("label = b.desc.name")
    src.line("values = b.values")
    src.line("desc = self.desc")
    src.line("bindings = desc.bindings")
    src.line("fed = desc.fed")
    src.line("port_buffers = self.port_buffers")
    src.line("buffers = self.buffers")
    src.line("by_key = self.by_key")
    pin_var: dict[tuple[str, int], str] = {}
    port_var: dict[str, str] = {}

    def new_buffer(var: str, key: str, label: str, dtype: Any, count: int, kind: str, depth: int) -> None:
        # (as _Planner.buffer, inline)
        src.line(f"k = {key}", depth)
        src.line(f"{var} = by_key.get(k)", depth)
        src.line(f"if {var} is None:", depth)
        src.line(f"{var} = by_key[k] = len(buffers)", depth + 1)
        src.line(f"buffers.append(_new(BufferPlan, ({var}, k, {label}, {src.const(dtype)}, {src.const(count)}, "
                 f"{kind})))", depth + 1)

    for j, p in enumerate(ports):
        var, name = f"p{j}", repr(p.name)
        src.line(f"ref = _new(PortRef, (bid, {name}))")
        if p.direction == "in":
            src.line("s = sources.get(ref)")
            src.line(f"{var} = port_buffers.get(s) if s is not None else None")
            src.line(f"if {var} is None:")
            src.line('kind = "external" if ref in bindings else "port" if ref in fed else "zeros"', 2)
            depth = 2
        else:
            src.line('kind = "external" if ref in bindings else "port"' if p.direction == "out" else
                     'kind = "external" if ref in bindings else "port" if ref in fed else "zeros"')
            depth = 1
        new_buffer(var, f'("port", bid, {name})', f"label + {'.' + p.name!r}", p.dtype, p.extent, "kind", depth)
        src.line(f"port_buffers[ref] = {var}")
        port_var[p.name] = var
        for pin in p.pins:
            pin_var[pin.kernel, pin.param] = var
    tied = {c: port_var.get(c) for c in counted_names}
    for j, ib in enumerate(internals):
        var = f"i{j}"
        new_buffer(var, f'("internal", bid, {ib.name!r})', f"label + {'/' + ib.name!r}", ib.dtype, ib.count,
                   '"internal"', 1)
        for pin in (ib.writer, *ib.readers):
            pin_var[pin.kernel, pin.param] = var
        if ib.name in tied:
            tied[ib.name] = var

    # the count parameters against the buffers they count (as emit_block: the first that does not fit hands
    # the whole check, with its messages, to _check_counts)
    counters = {name for name, _ in counted}
    if counted:
        src.line("clamped = None")
        src.line("if not self.report.errors:")
        src.line("while True:", 2)
        tied_text = "{" + ", ".join(f"{c!r}: {tied[c] or 'None'}" for c in counted_names) + "}"
        for name, counts in counted:
            tests = "".join(f" and v <= buffers[{tied[c]}].count" for c in counts if tied[c] is not None)
            src.line(f"v = values.get({name!r}, {src.const(defaults[name])})", 3)
            src.line(f"if not (type(v) is int and v >= 0{tests}):", 3)
            src.line(f"clamped = _check_counts(self, b, None, {tied_text})", 4)
            src.line("break", 4)
        src.line("break", 3)

    src.line("buffer_args = self.buffer_args")
    src.line("slots = self.slots")
    src.line("nodes = self.nodes")
    src.line("kernel_nodes = self.kernel_nodes")
    src.line("launches = b.launches")
    scalar_var: dict[str, str] = {}
    arg_var: dict[str, str] = {}
    for step in kernels:
        sname = step.name
        src.line("nid = len(nodes)")
        args: list[str] = []
        reads: list[str] = []
        writes: list[str] = []
        for i, prm in enumerate(step.code.signature.params):
            key = (sname, i)
            if prm.kind == "pointer":
                fed_by = pin_var.get(key)
                if fed_by is None:
                    return None  # a pointer nothing feeds: the general path reports it
                var = fed_by
                if var not in arg_var:
                    arg_var[var] = a = f"a_{var}"
                    src.line(f"{a} = buffer_args.get({var})")
                    src.line(f"if {a} is None:")
                    src.line(f"{a} = buffer_args[{var}] = _new(BufferArg, ({var},))", 2)
                args.append(arg_var[var])
                if prm.direction != "out" and var not in reads:
                    reads.append(var)
                if prm.direction != "in" and var not in writes:
                    writes.append(var)
                continue
            scalar_name = scalar_of.get(key)
            if scalar_name is None:
                if prm.default is None or isinstance(prm.default, str):
                    return None  # a parameter without a value: the general path reports it
                args.append(f"ScalarArg(bid, None, {src.const(prm.dtype)}, {src.const(prm.size)}, "
                            f"{src.const(prm.default)})")
                continue
            name = scalar_name
            sv = scalar_var.get(name)
            if sv is None:
                sv = scalar_var[name] = f"s{len(scalar_var)}"
                src.line(f"{sv} = values.get({name!r}, {src.const(defaults[name])})")
                if name in counters:
                    src.line(f"if clamped and {name!r} in clamped:")
                    src.line(f"{sv} = clamped[{name!r}]", 2)
            args.append(f"_new(ScalarArg, (bid, {name!r}, {src.const(prm.dtype)}, {src.const(prm.size)}, {sv}))")
            src.line(f"slot = (bid, {name!r})")
            src.line("if slot in slots:")
            src.line(f"slots[slot].append((nid, {i}))", 2)
            src.line("else:")
            src.line(f"slots[slot] = [(nid, {i})]", 2)
        launch = src.const(step.launch)
        code_key = src.const(step.code.key)
        tuple_text = "(" + "".join(a + ", " for a in args) + ")"
        src.line(f"nodes.append(_new(KernelNodePlan, (nid, bid, {sname!r}, {code_key}, "
                 f"launches.get({sname!r}) or {launch}, {tuple_text}, {_frozen(reads)}, {_frozen(writes)}, "
                 f"label + {repr('/' + sname)})))")
        src.line(f"kernel_nodes[(bid, {sname!r})] = nid")
    src.line("return None")

    namespace: dict[str, Any] = {"_new": tuple.__new__, "PortRef": PortRef, "BufferPlan": BufferPlan,
                                 "BufferArg": BufferArg, "ScalarArg": ScalarArg, "KernelNodePlan": KernelNodePlan,
                                 "_check_counts": check_counts, **src.consts}
    text = "\n".join(src.lines) + "\n"
    names = "/".join(k.name for k in kernels)
    exec(compile(text, f"<rxcuda emit: block of {names}>", "exec"), namespace)  # noqa: S102 (our own text)
    fn = namespace["emit"]
    fn.source = text  # type: ignore[attr-defined]  # (for a reader: rxcuda.plan._emit.emitter(...).source)
    return fn



def _frozen(names: list[str]) -> str:
    return f"frozenset(({''.join(n + ', ' for n in names)}))" if names else "frozenset()"


def check_counts(planner, b: BlockEntry, shaped, tied: Mapping[str, int | None]) -> dict[str, int]:
    """A count parameter (``ScalarSpec.counts``) whose value this plan would pass exceeds a buffer it counts,
    or is negative: an error naming the parameter, the port and its size (``rxcuda.model._bounds``), so the
    plan is refused and the last good graph keeps running instead of a kernel indexing past a buffer. A count
    that follows a size (``ScalarSpec.size_of``: a ``"size"`` default) and was set above what its buffers hold
    now (set while they were larger, then resized back) shrinks with them instead: returns those values."""
    clamped: dict[str, int] = {}  # (emit_block calls this only while the plan has no error: see there)
    d = b.desc
    buffers = planner.buffers
    for s in d.scalars:
        if not s.counts:
            continue
        value = b.value(s.name)
        if shaped is not None and s.name in shaped.values:
            value = shaped.values[s.name]
        smallest = min((buffers[i].count for c in s.counts if (i := tied.get(c)) is not None), default=None)
        if smallest is None or (type(value) is int and 0 <= value <= smallest):
            continue  # fits: the common case, decided without building the message's pieces
        caps = {c: buffers[tied[c]].count for c in s.counts if tied.get(c) is not None}
        inputs = [p.name for p in d.ports if p.direction == "in" and p.counter is None]
        found = count_problem(d.name, s.name, value, caps, inputs)
        if found is not None and s.size_of is not None and value > 0:
            clamped[s.name] = cap = min(caps.values())
            planner.report.warning(f"{d.name}.{s.name} = {value} is more than port '{found[1]}' holds ({cap} "
                                   f"elements); {s.name} follows the size of {s.size_of[0]}, so the frames pass "
                                   f"{cap}. Set {s.name} <= {cap} to silence this", f"{d.name}.{s.name}", b.id)
        elif found is not None:
            planner.report.error(found[0], f"{d.name}.{s.name}", b.id)
    return clamped
