"""A picture of a distributed pipeline (DOT text, pure Python): one cluster per worker with its blocks, the
connections inside a worker drawn thin, the links between workers bold and labelled with their transport
(``ipc``: CUDA IPC on one host; ``host``: through Ray's object store) and the bytes one frame moves.

>>> from rxcuda.lowlevel import PipelineDescription
>>> from rxcuda.distributed import Worker
>>> from rxcuda.distributed._records import DistributedDescription
>>> text = distributed_dot(DistributedDescription(PipelineDescription(), {}, {"a": Worker(null=True)}, ()))
>>> text.splitlines()[:2]
['digraph distributed {', '  rankdir=LR;']
"""

from __future__ import annotations

import pathlib

from ..model import _dtypes
from ..view._dot import format_of, render
from ..view._dottext import quote
from ._records import DistributedDescription

LINK_COLOURS = {"ipc": "#1a73e8", "host": "#e37400"}


def distributed_dot(d: DistributedDescription) -> str:
    names = {b.id: b.desc.name for b in d.pipeline.blocks}
    lines = ["digraph distributed {", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];',
             '  edge [fontname="Helvetica", fontsize=10];']
    for i, (w, spec) in enumerate(d.workers.items()):
        where = "null driver" if spec.null else "CPU device" if spec.cpu else f"{spec.num_gpus:g} GPU" + (
            f" on {spec.node}" if spec.node else "")
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f"    label={quote(f'worker {w} ({where})')}; style=rounded;")
        for bid, on in d.placement.items():
            if on == w and bid in names:
                lines.append(f"    b{bid} [label={quote(names[bid])}];")
        lines.append("  }")
    crossing = {(ln.src, ln.dst): ln for ln in d.links}
    for c in d.pipeline.connections:
        ln = crossing.get((c.src, c.dst))
        port = f"{c.src.port} -> {c.dst.port}"
        if ln is None:
            lines.append(f"  b{c.src.block} -> b{c.dst.block} [label={quote(port)}"
                         + (", style=dashed" if c.delay else "") + "];")
        else:
            label = f"{port}\n{ln.transport} ({_dtypes.format_bytes(ln.nbytes)} a frame)"
            lines.append(f"  b{c.src.block} -> b{c.dst.block} [label={quote(label)}, penwidth=2.5, "
                         f"color={quote(LINK_COLOURS.get(ln.transport, 'black'))}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def save(text: str, path, format: str | None = None) -> pathlib.Path:
    """Write DOT ``text`` to ``path``: as text for ``.dot``, rendered through Graphviz otherwise."""
    path = pathlib.Path(path)
    fmt = format_of(path, format)
    if fmt in ("dot", "gv"):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(render(text, fmt))
    return path
