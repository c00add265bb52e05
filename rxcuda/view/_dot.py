"""Pictures of the graph: DOT text for an engine, a pipeline description or a graph plan, in pure Python.

``to_dot(x)`` draws

* an :class:`~rxcuda.Engine` or a :class:`~rxcuda.lowlevel.PipelineDescription` as the pipeline: one node per
  block (its input ports on the left, its output ports on the right, each with its type and shape, then its
  parameters), one edge per connection from the output port to the input port, labelled with what flows
  (``f32[4096]`` and its size in bytes); a delayed connection is dashed and labelled ``delay 1``; inputs the
  user feeds or binds are marked ``(fed)`` / ``(bound)``; regions are clusters labelled ``If check.flag``,
  ``For n=5``, ... (an ``IfElse`` holds two, ``then`` and ``else``), composite instances are clusters too
  (nested ones nested), and so is each device of an engine over several (``device 1``). An engine's blocks
  are coloured by state: ok green, warning amber (the block's state, or a warning about it in
  ``engine.diagnostic_log``), error red, not built grey;
* a :class:`~rxcuda.GraphPlan` node by node: kernel, library call, memset, copy and region nodes with their
  dependency edges (labelled with the buffers that order them), region bodies as clusters.

The text is deterministic (blocks, connections and regions in the pipeline's order), so it can be compared
and diffed. ``save_graph`` renders it through Graphviz (the ``graphviz`` Python package and the system ``dot``
program, both optional) or writes the text itself for ``.dot``. ``save_driver_graph`` asks the CUDA driver for
its own picture of the graph it runs (``cuGraphDebugDotPrint``), for debugging the build itself: the engine's own
method (``engine.save_driver_graph``, rxcuda.engine._views), which needs nothing from here.

>>> import rxcuda
>>> from rxcuda.cuda import NullDriver
>>> with rxcuda.Engine(driver=NullDriver()) as engine:
...     add = engine.add(rxcuda.Block.from_kernel("vector_add", size=1024))
...     text = rxcuda.to_dot(engine)
>>> text.splitlines()[0]
'digraph pipeline {'
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

from ..blocks._composite import CompositeInstance
from ..cuda.nodes import REGION_NAMES
from ..engine._engine import Engine
from ..model._describe import BlockEntry, KernelSpec, PipelineDescription, PortRef, PortSpec
from ..model._errors import RxcudaError
from ..model._graphplan import GraphPlan
from ..model._regions import RegionSpec
from ..model._words import counted
from ._dottext import (  # noqa: F401 - quote, size_text and type_text: importable from here as before
    _FONT,
    _h,
    _ident,
    _lines,
    _nbytes,
    _value_text,
    quote,
    size_text,
    type_text,
)
from ._plandot import plan_dot

# block state -> (fill, border) colours; None: a description, which has no states
STATE_COLOURS: Mapping[str | None, tuple[str, str]] = {
    "ok": ("#e6f4ea", "#1e8e3e"),
    "warning": ("#fef7e0", "#e37400"),
    "error": ("#fce8e6", "#d93025"),
    "not built": ("#f1f3f4", "#80868b"),
    None: ("#ffffff", "#5f6368"),
}
_WORST_FIRST = ("error", "warning", "not built", "ok")
_MESSAGE_CHARS = 80  # a state message longer than this is cut in the label (the tooltip holds all of it)
FORMATS = ("svg", "png", "pdf", "dot", "gv")


class GraphvizNotFoundError(RxcudaError, RuntimeError):
    """Rendering a picture needs Graphviz: the ``graphviz`` Python package and the system ``dot`` program.
    The message says which one is missing and how to install it; ``.dot`` files need neither."""


# -- the pipeline -------------------------------------------------------------------------------------------
class _Container:
    """A cluster of the pipeline picture: a region, one body of an IfElse, or a composite instance."""

    def __init__(self, key: str, label: str, style: str, blocks: set[int]):
        self.key = key
        self.label = label
        self.style = style  # graph attributes as statements: 'style="dashed"; color="#8430ce"'
        self.blocks = blocks
        self.children: list[_Container] = []
        self.placeholder: str | None = None  # an empty body gets one invisible-looking node, so it is drawn


class _Pipeline:
    """Builds the DOT text of a pipeline (see the module docstring)."""

    def __init__(self, desc: PipelineDescription, *, states: Mapping[int, str] | None = None,
                 messages: Mapping[int, str] | None = None, composites=(), plan: GraphPlan | None = None,
                 title: str = ""):
        self.desc = desc
        self.states = states
        self.messages = messages or {}
        self.shapes: dict[PortRef, tuple[int, ...]] = dict(desc.shapes)
        if plan is not None:
            self.shapes.update(plan.shapes)
        self.composites = composites
        self.title = title
        self.ids = {b.id for b in desc.blocks}
        self.regions = {r.id: r for r in desc.regions if r.id in self.ids}
        self.sources = {c.dst: c for c in desc.connections}
        # extra output rows: count ports (``items.count``) that a connection reads
        self.extra: dict[int, list[PortSpec]] = {}
        for c in desc.connections:
            if c.src.block in self.ids:
                entry = desc.block(c.src.block)
                if not any(p.name == c.src.port for p in entry.desc.ports):
                    try:
                        spec = entry.desc.port(c.src.port)
                    except KeyError:
                        continue
                    if all(p.name != spec.name for p in self.extra.get(entry.id, [])):
                        self.extra.setdefault(entry.id, []).append(spec)
        self.port_ids: dict[PortRef, str] = {}

    # ports ----------------------------------------------------------------------------------------------
    def ports(self, entry: BlockEntry) -> list[PortSpec]:
        return list(entry.desc.ports) + self.extra.get(entry.id, [])

    def shape(self, ref: PortRef, spec: PortSpec) -> tuple[int, ...]:
        found = self.shapes.get(ref)
        if found is not None:
            return tuple(found)
        return tuple(getattr(spec, "shape", None) or (spec.count,))

    def port_id(self, ref: PortRef) -> str:
        return self.port_ids[ref]

    def _assign_port_ids(self, entry: BlockEntry) -> None:
        taken: set[str] = set()
        for spec in self.ports(entry):
            base = ("i_" if spec.direction == "in" else "o_") + _ident(spec.name)
            pid, k = base, 2
            while pid in taken:
                pid, k = f"{base}_{k}", k + 1
            taken.add(pid)
            self.port_ids[PortRef(entry.id, spec.name)] = pid

    # states ---------------------------------------------------------------------------------------------
    def state(self, block_id: int) -> str | None:
        return None if self.states is None else self.states.get(block_id, "not built")

    # the picture ----------------------------------------------------------------------------------------
    def text(self) -> str:
        for entry in self.desc.blocks:
            self._assign_port_ids(entry)
        root = self._tree()
        out = ["digraph pipeline {",
               f"  graph [rankdir=LR, {_FONT}, fontsize=11, labelloc=t, label={quote(self.title)}];",
               f"  node [shape=plaintext, {_FONT}, fontsize=10];",
               f"  edge [{_FONT}, fontsize=9, color=\"#5f6368\"];"]
        out += self._emit(root, "  ")
        for c in self.desc.connections:
            if c.src.block in self.ids and c.dst.block in self.ids:
                out.append("  " + self._edge(c))
        out.append("}")
        return "\n".join(out) + "\n"

    def link_type(self, c) -> tuple[str | None, tuple[int, ...], int | None]:
        """What travels on connection ``c``: (dtype, shape, bytes or None); the live view sends the same."""
        src_spec = self.desc.block(c.src.block).desc.port(c.src.port)
        dst_spec = self.desc.block(c.dst.block).desc.port(c.dst.port)
        dtype = src_spec.dtype if src_spec.dtype is not None else dst_spec.dtype
        shape = self.shape(c.src, src_spec)
        return dtype, shape, _nbytes(dtype, shape)

    def _edge(self, c) -> str:
        dtype, shape, nbytes = self.link_type(c)
        what = [type_text(dtype, shape), size_text(nbytes) if nbytes is not None else ""]
        attrs = []
        if c.delay:
            attrs += ["style=dashed", 'color="#1a73e8"', 'fontcolor="#1a73e8"', "constraint=false"]
            what.insert(0, f"delay {c.delay}")
        attrs.insert(0, f"label={_lines(*what)}")
        tail = f"b{c.src.block}:{self.port_id(c.src)}"
        head = f"b{c.dst.block}:{self.port_id(c.dst)}"
        return f"{tail} -> {head} [{', '.join(attrs)}];"

    # clusters -------------------------------------------------------------------------------------------
    def _total(self, block_id: int, seen: frozenset[int] = frozenset()) -> set[int]:
        """A block and, for a region, every block inside it (nested regions included)."""
        out = {block_id}
        region = self.regions.get(block_id)
        if region is not None and block_id not in seen:
            for m in region.members:
                if m in self.ids:
                    out |= self._total(m, seen | {block_id})
        return out

    def _region_label(self, r: RegionSpec) -> str:
        entry = self.desc.block(r.id)
        head = REGION_NAMES.get(r.kind, r.kind)
        src = self.sources.get(PortRef(r.id, "condition"))
        if src is not None and src.src.block in self.ids:
            cond = f"{self.desc.block(src.src.block).desc.name}.{src.src.port}"
        else:
            cond = "(no condition connected)"
        if r.kind == "for":
            text = f"{head} n={_value_text(entry.value('n'))}"
        elif r.kind == "while":
            text = f"{head} {cond} (at most {_value_text(entry.value('max_iterations'))} passes)"
        else:
            text = f"{head} {cond}"
        name = entry.desc.name
        return text if name == r.kind else f"{text}: {name}"

    def _tree(self) -> _Container:
        root = _Container("", "", "", set(self.ids))
        owner: dict[int, _Container] = {}  # region id -> the container of the body it sits in
        made: dict[int, tuple[_Container, tuple[_Container, ...]]] = {}
        for r in self.regions.values():
            box = _Container(f"cluster_region_{r.id}", self._region_label(r),
                             'style="rounded,filled"; fillcolor="#f8f0fc"; color="#8430ce"', self._total(r.id))
            if r.kind == "ifelse":
                bodies = tuple(
                    _Container(f"cluster_region_{r.id}_{part}", part, 'style="dashed"; color="#8430ce"',
                               set().union(*(self._total(m) for m in body if m in self.ids)))
                    for part, body in zip(("then", "else"), r.bodies, strict=True))
                box.children.extend(bodies)
                for b in bodies:
                    if not b.blocks:
                        b.placeholder = f"{b.key.removeprefix('cluster_')}_empty"
            else:
                bodies = (box,)
            made[r.id] = (box, bodies)
            for body, members in zip(bodies, r.bodies, strict=True):
                for m in members:
                    owner[m] = body
        region_of = {id(body): rid for rid, (_, bodies) in made.items() for body in bodies}
        for rid, (box, _) in made.items():
            parent, seen = owner.get(rid), {rid}
            up = parent
            while up is not None:  # a hand-made description may nest regions in a circle: draw those at the top
                outer = region_of[id(up)]
                if outer in seen:
                    parent = None
                    break
                seen.add(outer)
                up = owner.get(outer)
            (parent or root).children.append(box)
        placement = self.desc.placement
        if placement:  # several devices: a cluster each, holding its blocks (and the regions placed there)
            boxes = []
            for d in sorted({placement.get(b, 0) for b in self.ids}):
                members = {b for b in self.ids if placement.get(b, 0) == d}
                box = _Container(f"cluster_device_{d}", f"device {d}",
                                 'style="rounded,dashed"; color="#188038"; fontcolor="#188038"', members)
                box.children = [k for k in root.children if k.blocks <= members]
                boxes.append(box)
            root.children = [k for k in root.children if not any(k in b.children for b in boxes)] + boxes
        counter = [0]  # numbers the composite clusters across every instance
        for inst in self.composites:
            self._place(root, inst, counter)
        return root

    def _place(self, root: _Container, inst, counter: list[int]) -> None:
        """Put composite instance ``inst`` (then its nested ones) into the tree, where its blocks are."""
        blocks = {b.id for b in inst.blocks} & self.ids
        if blocks:
            node = root
            while True:
                inner = next((k for k in node.children if k.blocks >= blocks), None)
                if inner is None:
                    break
                node = inner
            crossing = [k for k in node.children if k.blocks & blocks and not k.blocks <= blocks]
            if not crossing:
                d = inst.description
                of = f" (of {d.name})" if inst.name.rsplit("/", 1)[-1] != d.name else ""
                box = _Container(f"cluster_composite_{counter[0]}", f"composite {inst.name}{of}",
                                 'style="rounded"; color="#1a73e8"; fontcolor="#1a73e8"', blocks)
                counter[0] += 1
                box.children = [k for k in node.children if k.blocks <= blocks]
                node.children = [k for k in node.children if not k.blocks <= blocks] + [box]
            # else: a region cuts through the composite; its blocks are drawn where the regions put them
        for m in inst.members.values():
            if isinstance(m, CompositeInstance):
                self._place(root, m, counter)

    def _emit(self, box: _Container, indent: str) -> list[str]:
        out: list[str] = []
        inner = indent
        if box.key:
            out.append(f"{indent}subgraph {box.key} {{")
            inner = indent + "  "
            out.append(f"{inner}label={quote(box.label)}; {box.style};")
        placed = set().union(*(k.blocks for k in box.children)) if box.children else set()
        for entry in self.desc.blocks:
            if entry.id in box.blocks and entry.id not in placed:
                out.append(inner + self._node(entry))
        if box.placeholder:
            out.append(f'{inner}{box.placeholder} [label="(empty)", fontcolor="#80868b"];')
        for child in box.children:
            out += self._emit(child, inner)
        if box.key:
            out.append(f"{indent}}}")
        return out

    # block nodes ----------------------------------------------------------------------------------------
    def _node(self, entry: BlockEntry) -> str:
        state = self.state(entry.id)
        fill, border = STATE_COLOURS.get(state, STATE_COLOURS[None])
        ins = [p for p in self.ports(entry) if p.direction == "in"]
        outs = [p for p in self.ports(entry) if p.direction != "in"]
        rows = [f'<TR><TD COLSPAN="2" BGCOLOR="{border}"><FONT COLOR="#ffffff"><B>{_h(entry.desc.name)}</B>'
                f"</FONT></TD></TR>"]
        steps = ", ".join(f"kernel {k.code.entry}" if isinstance(k, KernelSpec) else f"call {k.name}"
                          for k in entry.desc.kernels)
        sub = [s for s in (steps, state) if s]
        if entry.id in self.regions:
            sub.insert(0, f"region {self.regions[entry.id].kind}")
        if sub:
            rows.append(f'<TR><TD COLSPAN="2"><FONT POINT-SIZE="8">{_h(" | ".join(sub))}</FONT></TD></TR>')
        message = self.messages.get(entry.id, "")
        if message and state in ("error", "warning"):
            cut = message if len(message) <= _MESSAGE_CHARS else message[: _MESSAGE_CHARS - 3] + "..."
            rows.append(f'<TR><TD COLSPAN="2"><FONT POINT-SIZE="8" COLOR="{border}">{_h(cut)}</FONT></TD></TR>')
        for i in range(max(len(ins), len(outs))):
            cells = []
            for side, align in ((ins, "LEFT"), (outs, "RIGHT")):
                if i < len(side):
                    spec = side[i]
                    ref = PortRef(entry.id, spec.name)
                    cells.append(f'<TD PORT="{self.port_id(ref)}" ALIGN="{align}">{_h(self._port_text(ref, spec))}'
                                 "</TD>")
                else:
                    cells.append("<TD></TD>")
            rows.append(f"<TR>{''.join(cells)}</TR>")
        params = [f"{s.name} = {_value_text(entry.value(s.name))}" for s in entry.desc.scalars]
        if params:
            lines = '<BR ALIGN="LEFT"/>'.join(_h(p) for p in params)
            rows.append(f'<TR><TD COLSPAN="2" ALIGN="LEFT"><FONT POINT-SIZE="8">{lines}<BR ALIGN="LEFT"/>'
                        f"</FONT></TD></TR>")
        table = (f'<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="0" CELLPADDING="3" COLOR="{border}" '
                 f'BGCOLOR="{fill}">{"".join(rows)}</TABLE>')
        attrs = [f"label=<{table}>"]
        if message:
            attrs.append(f"tooltip={quote(message)}")
        return f"b{entry.id} [{', '.join(attrs)}];"

    def _port_text(self, ref: PortRef, spec: PortSpec) -> str:
        text = f"{spec.name}: {type_text(spec.dtype, self.shape(ref, spec))}"
        notes = []
        if spec.counter is not None:
            notes.append("append")
        if ref in self.desc.bindings:
            notes.append("bound")
        if ref in self.desc.fed:
            notes.append("fed")
        return text + (f" ({', '.join(notes)})" if notes else "")


def _engine_parts(engine: Engine) -> dict:
    """What the pipeline picture takes from an engine: its description, plan, states and composites."""
    desc = engine.describe()
    blocks = engine.blocks
    warned: dict[int, str] = {}
    for d in engine.diagnostic_log:  # the latest warning about a block
        if d.severity == "warning" and d.block is not None:
            warned[d.block] = d.message
    states: dict[int, str] = {}
    messages: dict[int, str] = {}
    for b in blocks:
        candidates = {b.state} | ({"warning"} if b.id in warned else set())
        states[b.id] = next((s for s in _WORST_FIRST if s in candidates), b.state)
        message = b.message or warned.get(b.id, "")
        if states[b.id] == "warning" and b.state != "warning":
            message = warned[b.id]
        if message:
            messages[b.id] = message
    device = getattr(engine.device, "name", "a GPU")
    title = (f"engine on {device}: frame {engine.frame}, {counted(len(desc.blocks), 'block')}, "
             f"{counted(len(desc.connections), 'connection')}")
    return {"states": states, "messages": messages, "composites": engine.composites, "plan": engine.plan,
            "title": title, "desc": desc}


# -- the public functions -----------------------------------------------------------------------------------
def to_dot(x, *, plan: GraphPlan | None = None) -> str:
    """DOT text for an engine, a pipeline description or a graph plan (see the module docstring).

    An ``Engine`` is drawn as its pipeline with each block's state, its composite instances, and the shapes
    of the graph now running; a ``PipelineDescription`` as the same picture without states (``plan``: a plan
    of it, whose resolved shapes the ports then show); a ``GraphPlan`` node by node. Pure Python: no GPU,
    no Graphviz. ``engine.to_dot()`` and ``plan.to_dot()`` are the same function.

    >>> import rxcuda
    >>> with rxcuda.Engine(driver=rxcuda.cuda.NullDriver()) as engine:
    ...     mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=64))
    ...     text = engine.to_dot()
    >>> f"b{mul.id} [label=<" in text, "x: f32[64]" in text
    (True, True)
    """
    if isinstance(x, Engine):
        parts = _engine_parts(x)
        return _Pipeline(parts.pop("desc"), **parts).text()
    if isinstance(x, PipelineDescription):
        if plan is not None and not isinstance(plan, GraphPlan):
            raise TypeError(f"'plan' is a GraphPlan of the description (rxcuda.plan(desc)), got {plan!r}")
        title = f"pipeline: {counted(len(x.blocks), 'block')}, {counted(len(x.connections), 'connection')}"
        return _Pipeline(x, plan=plan, title=title).text()
    if isinstance(x, GraphPlan):
        if plan is not None:
            raise TypeError("'plan' goes with a PipelineDescription; a GraphPlan is drawn by itself")
        return plan_dot(x)
    raise TypeError(f"to_dot draws an Engine, a PipelineDescription (engine.describe()) or a GraphPlan "
                    f"(engine.plan, rxcuda.plan(desc)); got {type(x).__name__}")


def format_of(path: pathlib.Path, format: str | None) -> str:
    """The format ``save_graph`` writes ``path`` in: ``format``, else the file's suffix; a ValueError for one
    it does not write."""
    if format is None:
        fmt = path.suffix.lstrip(".").lower()
        if not fmt:
            raise ValueError(f"cannot tell the format of {str(path)!r} (no suffix): name the file .svg, .png, "
                             ".pdf or .dot, or pass format='svg'")
    elif isinstance(format, str):
        fmt = format.lower().lstrip(".")
    else:
        raise TypeError(f"'format' is a str such as 'svg' (got {format!r})")
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one save_graph writes; use one of {', '.join(FORMATS)}")
    return fmt


def render(text: str, format: str) -> bytes:
    """Run DOT ``text`` through Graphviz's ``dot`` into ``format`` (svg, png, pdf); raises
    :class:`GraphvizNotFoundError` saying how to install what is missing."""
    try:
        import graphviz  # optional: pip install graphviz (or the view extra)
    except ImportError:
        raise GraphvizNotFoundError(
            f"rendering {format} needs the graphviz Python package, which is not installed: pip install graphviz "
            "(or pip install '.[view]' in rxcuda's checkout), and Graphviz's dot program (apt install graphviz, "
            "brew install graphviz or conda install graphviz); or save as .dot, which needs neither") from None
    not_found = getattr(graphviz, "ExecutableNotFound", None)
    try:
        return graphviz.Source(text).pipe(format=format)
    except Exception as e:
        if not_found is not None and isinstance(e, not_found):
            raise GraphvizNotFoundError(
                f"rendering {format} needs Graphviz's dot program, which is not on the PATH: apt install graphviz, "
                "brew install graphviz or conda install graphviz (the graphviz Python package is only its "
                "interface); or save as .dot, which needs neither") from None
        raise


def save_graph(x, path, format: str | None = None, *, plan: GraphPlan | None = None) -> pathlib.Path:
    """Write a picture of ``x`` (an Engine, a PipelineDescription or a GraphPlan, as :func:`to_dot` draws it)
    to ``path``; returns the path.

    ``format`` (default: the file's suffix): ``svg``, ``png`` or ``pdf`` render through Graphviz (the
    ``graphviz`` Python package and the system ``dot``; :class:`GraphvizNotFoundError` says how to install
    what is missing), ``dot`` (or ``gv``) writes the DOT text itself and needs nothing. ``plan``: as for
    :func:`to_dot`, with a description.

    >>> rxcuda.save_graph(engine, "pipeline.svg")        # doctest: +SKIP
    >>> engine.save_graph("pipeline.dot")                # doctest: +SKIP
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"'path' is a file name or a path (got {path!r})")
    path = pathlib.Path(path)
    fmt = format_of(path, format)
    text = to_dot(x, plan=plan)
    if fmt in ("dot", "gv"):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(render(text, fmt))
    return path


def save_driver_graph(engine: Engine, path, *, verbose: bool = False) -> pathlib.Path:
    """Write the CUDA driver's own DOT picture of the graph the engine runs (``cuGraphDebugDotPrint``) to
    ``path``; returns the path: :meth:`rxcuda.Engine.save_driver_graph`, which says more.

    >>> rxcuda.view.save_driver_graph(engine, "driver.dot")           # doctest: +SKIP
    """
    if not isinstance(engine, Engine):
        raise TypeError(f"save_driver_graph takes an Engine (got {type(engine).__name__})")
    return engine.save_driver_graph(path, verbose=verbose)


__all__ = ["GraphvizNotFoundError", "render", "save_driver_graph", "save_graph", "to_dot"]
