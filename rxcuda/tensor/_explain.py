"""``explain()``: a program as text — the passes and what each did, every node with where it runs, the
launches, and every copy between host and device: asked for (``.to()``) or pulled by an op that runs on one
backend only (``_ops.BACKENDS``; a pulled node is marked ``pulled by <op>``)."""

from __future__ import annotations

from ._graph import Node
from ._ops import PULLED, backends
from ._passes import Plan


def _attrs(n: Node) -> str:
    if n.op == "const":
        buf = n.attrs[0]
        return f"data #{buf.serial} v{buf.version}" + ("" if buf.owned else " (outside)")
    if n.op == "full":
        return f"value={n.attrs[0]!r}"
    if n.op in ("sum", "max", "min", "mean"):
        return f"axes={n.attrs[0]}" + (" keepdims" if n.attrs[1] else "")
    if n.op == "copy":
        return f"to {n.attrs[0]}"
    if n.op == "cast":
        return f"to {n.attrs[0]}"
    if n.op in ("reshape", "broadcast_to", "transpose"):
        return str(n.attrs[0])
    if n.op == "getitem":
        return "[" + ", ".join(":" if p == ("slice",) else ":".join(map(str, p[1:])) if p[0] == "slice"
                               else str(p[1]) if p[0] == "int" else "None" for p in n.attrs[0]) + "]"
    return ""


def explain(plan: Plan) -> str:
    names: dict[Node, str] = {}
    for n in [*plan.nodes, *plan.removed, *plan.merged]:
        names.setdefault(n, f"%{len(names)}")
    group_of = plan.group_of()
    p = plan.passes
    lines = [f"program: {len(plan.outputs)} output(s), {len(plan.nodes) + len(plan.removed) + len(plan.merged)} "
             f"nodes, {len(plan.nodes)} after passes, {sum(g.kind != 'view' for g in plan.groups)} launch(es)",
             "passes:"]

    def state(on: bool) -> str:
        return "" if on else " (off)"

    removed = ", ".join(f"{names[n]} {n.op}" for n in plan.removed)
    known = ", ".join(f"{names[n]} {n.op}" for n in plan.known)
    lines.append(f"  dead nodes{state(p.dead)}: removed {len(plan.removed)}" + (f" ({removed})" if removed else "")
                 + (f"; cached results used: {known}" if known else ""))
    merged = ", ".join(f"{names[a]} -> {names[b]}" for a, b in plan.merged.items())
    lines.append(f"  common subexpressions{state(p.cse)}: merged {len(plan.merged)}"
                 + (f" ({merged})" if merged else ""))
    fused = [g for g in plan.groups if len(g.nodes) > 1 and g.chains == 1 or g.chains > 1 and len(g.nodes) > g.chains]
    lines.append(f"  vertical fusion{state(p.vertical)}: {len(fused)} group(s) of several ops")
    wide = [g for g in plan.groups if g.chains > 1]
    lines.append(f"  horizontal fusion{state(p.horizontal)}: {len(wide)} launch(es) of several independent groups"
                 + ("" if not wide else " (" + ", ".join(f"g{g.index}: {g.chains}" for g in wide) + ")"))
    if p.fast_math:
        lines.append("  fast math: on (approximate float32 exp, log, sqrt and division in CUDA kernels)")
    pulled = [n for n in plan.nodes if n in PULLED]
    if pulled:
        lines.append(f"  device pulls: {len(pulled)} node(s) made on the backend of an op that runs on one only")
    lines.append("nodes:")
    outs = set(plan.outputs)
    for n in plan.nodes:
        g = group_of.get(n)
        where = f"g{g.index}" if g else ("cached" if n in plan.known else "leaf")
        args = " ".join(names[i] for i in plan.inputs_of(n))
        extra = " ".join(x for x in (_attrs(n), f"(pulled by {PULLED[n]})" if n in PULLED else "") if x)
        lines.append(f"  {names[n]:<4} {n.op:<12} {str(n.shape):<14} {str(n.dtype):<8} {n.device:<5} {where:<6} "
                     + " ".join(x for x in (args, extra, "-> output" if n in outs else "") if x).rstrip())
    lines.append("launches:")
    for g in plan.groups:
        ops = " ".join(n.op for n in g.nodes)
        over = f" over axes {g.axes}" if g.axes is not None else ""
        tag = f" [{g.pattern}]" if g.pattern else ""
        writes = " ".join(names[n] for n in g.outputs)
        kind = "view (no launch)" if g.kind == "view" else g.kind
        lines.append(f"  g{g.index} {kind} on {g.nodes[0].device} {g.space}{over}: {ops} -> {writes}{tag}")
    if not plan.groups:
        lines.append("  none")
    copies = [n for n in plan.nodes if n.op == "copy"]
    lines.append("copies:" + ("" if copies else " none"))
    for n in copies:
        (src,) = plan.inputs_of(n)
        by = PULLED.get(n)
        why = (f"pulled: {by} runs on {'/'.join(sorted(backends(by)))} only" if by is not None
               else f"asked: .to({n.device!r})")
        lines.append(f"  {names[n]} {src.device} -> {n.device} {n.shape} {n.dtype} ({why})")
    return "\n".join(lines)
