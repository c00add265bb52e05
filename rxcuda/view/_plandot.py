"""The picture of a :class:`~rxcuda.GraphPlan` as DOT text (``to_dot(plan)``, ``plan.to_dot()``): kernel,
library call, memset, copy and region nodes with their dependency edges, labelled with the buffers that order
them, region bodies as clusters. Pure Python, deterministic.

>>> import numpy as np, rxcuda
>>> with rxcuda.Engine(driver=rxcuda.cuda.NullDriver()) as engine:
...     mul = engine.add(rxcuda.Block.from_kernel("kernels/scalar_mul.ptx", size=64))
...     engine.write(mul["x"], np.ones(64, np.float32))
...     _ = engine.tick()
...     text = plan_dot(engine.plan)
>>> text.splitlines()[0], "grid" in text
('digraph plan {', True)
"""

from __future__ import annotations

from ..cuda.nodes import KINDS, REGION_NAMES
from ..model._graphplan import (
    CallNodePlan,
    CopyNodePlan,
    GraphPlan,
    KernelNodePlan,
    MemsetNodePlan,
    RegionNodePlan,
)
from ._dottext import _FONT, _lines, quote, size_text

# -- the graph plan -----------------------------------------------------------------------------------------
_NODE_STYLE = {
    KernelNodePlan: 'shape=box, style="rounded,filled", fillcolor="#e8f0fe"',
    CallNodePlan: 'shape=box3d, style=filled, fillcolor="#e6f4ea"',
    MemsetNodePlan: 'shape=note, style=filled, fillcolor="#f1f3f4"',
    CopyNodePlan: 'shape=cds, style=filled, fillcolor="#fef7e0"',
    RegionNodePlan: 'shape=diamond, style=filled, fillcolor="#f3e8fd"',
}


def _dims(d: tuple[int, ...]) -> str:
    d = tuple(d)
    while len(d) > 1 and d[-1] == 1:
        d = d[:-1]
    return "x".join(str(v) for v in d)


def plan_dot(gp: GraphPlan) -> str:
    buffers = {b.id: b for b in gp.buffers}
    regions = {n.id: n for n in gp.nodes if (k := KINDS.get(type(n))) is not None and k.conditional}
    # (region node id, body) -> cluster key; a region's own cluster holds its anchor node
    body_key: dict[tuple[int, int], str] = {}
    children: dict[str | None, list[str]] = {None: []}
    labels: dict[str, str] = {}
    for r in regions.values():
        key = f"cluster_node_{r.id}"
        labels[key] = f"{REGION_NAMES.get(r.kind, r.kind)} region: {r.label}"
        parent = gp.parents.get(r.id)
        children.setdefault(body_key[parent] if parent else None, []).append(key)
        children.setdefault(key, [])
        if r.bodies > 1:
            for k in range(r.bodies):
                sub = f"{key}_body{k}"
                labels[sub] = ("then", "else")[k] if r.kind == "ifelse" and k < 2 else f"body {k}"
                children[key].append(sub)
                children.setdefault(sub, [])
                body_key[(r.id, k)] = sub
        else:
            body_key[(r.id, 0)] = key
    members: dict[str | None, list[str]] = {}
    for n in gp.nodes:
        where = f"cluster_node_{n.id}" if n.id in regions else (
            body_key.get(gp.parents[n.id]) if n.id in gp.parents else None)
        members.setdefault(where, []).append(_plan_node(n, buffers))

    def emit(key: str | None, indent: str) -> list[str]:
        out: list[str] = []
        inner = indent
        if key is not None:
            out.append(f"{indent}subgraph {key} {{")
            inner = indent + "  "
            out.append(f'{inner}label={quote(labels[key])}; style="rounded"; color="#8430ce";')
        out += [inner + line for line in members.get(key, [])]
        for child in children.get(key, []):
            out += emit(child, inner)
        if key is not None:
            out.append(f"{indent}}}")
        return out

    total = sum(b.nbytes for b in gp.buffers)
    out = ["digraph plan {",
           f"  graph [rankdir=TB, compound=true, {_FONT}, fontsize=11, labelloc=t, "
           f"label={quote(f'{len(gp.nodes)} graph nodes, {len(gp.buffers)} buffers ({size_text(total)})')}];",
           f"  node [{_FONT}, fontsize=10];",
           f"  edge [{_FONT}, fontsize=8, color=\"#5f6368\"];"]
    out += emit(None, "  ")
    for n in gp.nodes:
        for d in gp.deps[n.id]:
            u = gp.nodes[d]
            shared = sorted((u.writes & (n.reads | n.writes)) | (u.reads & n.writes))
            names = [buffers[b].label for b in shared if b in buffers]
            if len(names) > 3:
                names = names[:3] + [f"+{len(names) - 3} more"]
            attrs = [f"label={quote(', '.join(names))}"] if names else []
            if d in regions:
                attrs.append(f"ltail=cluster_node_{d}")
            out.append(f"  n{d} -> n{n.id}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    out.append("}")
    return "\n".join(out) + "\n"


def _plan_node(n, buffers) -> str:
    kind = KINDS.get(type(n))
    # a node kind the CUDA layer does not know: still drawn, by its type
    text = _lines(*kind.describe(n, buffers)) if kind is not None else _lines(getattr(n, "label", ""),
                                                                               type(n).__name__)
    return f"n{n.id} [{_NODE_STYLE.get(type(n), 'shape=box')}, label={text}];"


__all__ = ["plan_dot"]
