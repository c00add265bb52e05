"""The planner: a pure function from a pipeline description to a graph plan.

validate -> order blocks -> assign buffers to ports -> emit nodes in order -> derive dependencies from
buffer hazards -> map parameters to argument slots. Imports nothing from CUDA. It finds every problem in
one pass: each is a :class:`Problem` that names the block and port and says how to fix it, and errors are
raised together as one :class:`ValidationError` (``.problems``) once the pass is done.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..model._describe import (
    BlockEntry,
    CallSpec,
    KernelSpec,
    PipelineDescription,
    PortRef,
)
from ..model._errors import Problem
from ..model._graphplan import (
    Arg,
    BufferArg,
    BufferKind,
    BufferPlan,
    CallNodePlan,
    GraphPlan,
    KernelNodePlan,
    NodePlan,
    ScalarArg,
)
from ..model._memo import by_identity
from . import _appends, _delays, _liveness, _liveshare, _regions, _shapes
from ._checks import (
    _Checked,
    _inputs_kept,
    _order_after,
    _tail_edit,
    _validate_blocks,
    _validate_connections,
    _validate_inputs,
)
from ._emit import check_counts as _check_counts
from ._emit import emitter as _emitter
from ._order import Report, hazard_deps, hazard_deps_after, ordered_blocks

# The plan's named tuples made in the per-block loop are built as ``_new(Cls, (fields...))``: the same tuple
# without the Python-level ``__new__`` a named tuple's call goes through (0.1 us each, ~7 per block: plan() of
# 1000 blocks ~0.7 ms). Fields are positional, in the class's order.
_new = tuple.__new__


def check(desc: PipelineDescription) -> tuple[Problem, ...]:
    """Every problem with the pipeline, errors and warnings, in one pass; () when there is none. Raises
    nothing: :func:`plan` raises the errors among them as one ValidationError."""
    return _Planner(desc).run_checked()[1]


def validate(desc: PipelineDescription) -> None:
    """Raise one ValidationError for everything wrong with the pipeline (``.problems`` lists each)."""
    _Planner(desc).run()


def order_blocks(desc: PipelineDescription) -> tuple[BlockEntry, ...]:
    """Topological order of blocks by connections; ties keep insertion order. Raises on a cycle."""
    report = Report()
    order = ordered_blocks(desc, report)
    report.raise_errors()
    return order


class _Planner:
    def __init__(self, desc: PipelineDescription, reuse_memory: bool = False, previous: _Planner | None = None,
                 resumable: bool = False):
        self.desc = desc
        self.reuse_memory = reuse_memory
        self.previous = previous  # the last plan's planner: its leading blocks' work is reused (see _resume)
        self.resumable = resumable  # keep the marks a later plan resumes from (Replanner); plan() needs none
        self.order: tuple[BlockEntry, ...] = ()  # the blocks in the order emitted, and the plain connections
        self.sources: dict[PortRef, PortRef] = {}
        # after each block emitted in order (flat pipelines): (nodes, buffers, problems found while emitting) so far
        self.marks: list[tuple[int, int, int]] = []
        self.emitted_from = 0  # problems before the first block was emitted (those of the validation)
        self.reused = 0  # leading blocks whose nodes and buffers came from ``previous``
        self.deps: tuple[tuple[int, ...], ...] = ()  # the plan's dependencies (flat pipelines: see _hazards)
        self.kept_deps: tuple[tuple[int, ...], ...] = ()  # those of the nodes taken over from ``previous``
        self.kept_buffers = 0  # the buffers those nodes made (the others are used by the nodes after them alone)
        self.checked: _Checked | None = None  # the connections found in order, for the next re-plan
        self.ids: set[int] = set()  # the blocks' ids and names (name -> id) found, for the next re-plan
        self.names: dict[str, int] = {}
        self.inputs: tuple[Problem, ...] = ()  # what the check of the inputs found, for the next re-plan
        self.sharing: _liveshare.Sharing | None = None  # memory reuse's work, for the next re-plan (_liveshare)
        self.buffers: list[BufferPlan] = []
        self.by_key: dict[tuple, int] = {}
        self.nodes: list[NodePlan] = []
        self.port_buffers: dict[PortRef, int] = {}
        self.counters: dict[PortRef, int] = {}
        self.slots: dict[tuple[int, str], list[tuple[int, int]]] = {}
        # the plan's slots as tuples (for the next re-plan), and those of the blocks taken over (_take_over_all_but)
        self.slot_tuples: dict[tuple[int, str], tuple[tuple[int, int], ...]] = {}
        self.kept_slots: dict[tuple[int, str], tuple[tuple[int, int], ...]] | None = None
        self.device_scalars: dict[tuple[int, str], int] = {}
        self.recapture: dict[tuple[int, str], list[int]] = {}
        self.kernel_nodes: dict[tuple[int, str], int] = {}
        self.buffer_args: dict[int, BufferArg] = {}  # one per buffer: a value, shared by the nodes using it
        self.delayed: dict[PortRef, PortRef] = {}  # input -> the output feeding it through a delayed connection
        self.append_users: dict | None = None  # append port -> its readers, once a chain needs them (_appends)
        self.report = Report()
        self.resolved = _shapes.NOTHING  # shapes that differ from the declared ones (set in _run)
        self.parents: dict[int, tuple[int, int]] = {}  # body node -> (region node, body): see _regions
        self.region_setters: dict[int, int] = {}  # region node -> the kernel node that sets its condition
        self.region_steps: dict[int, int] = {}  # loop region node -> the kernel node closing each pass

    def buffer(self, key: tuple, label: str, dtype, count: int, kind: BufferKind) -> int:
        bid = self.by_key.get(key)
        if bid is None:
            bid = self.by_key[key] = len(self.buffers)
            self.buffers.append(_new(BufferPlan, (bid, key, label, dtype, count, kind)))
        return bid

    def run(self) -> GraphPlan:
        """The plan; raises one ValidationError for every error found (warnings ride on it, or on the plan)."""
        gp, report = self._run()
        report.raise_errors()
        assert gp is not None
        return gp

    def run_checked(self) -> tuple[GraphPlan | None, tuple[Problem, ...]]:
        """The plan (None when there are errors) and every problem found, raising nothing."""
        gp, report = self._run()
        return (None if report.errors else gp), tuple(report.problems)

    def _run(self) -> tuple[GraphPlan | None, Report]:
        desc, report, last = self.desc, self.report, self.previous if self.resumable else None
        # blocks and connections added at the end or taken off it since the last plan (a block added at the end
        # of a chain, or removed again): the checks, the order and the sources look at those alone
        tail = _tail_edit(last.desc, desc) if last is not None and last.checked is not None else None
        if tail is not None and last is not None:
            self.ids, self.names = last.ids.copy(), last.names.copy()
            for b in tail.removed:
                self.ids.discard(b.id)
                del self.names[b.desc.name]
        unique = _validate_blocks(desc, report, self.ids, self.names, len(desc.blocks) - len(tail.added) if tail
                                  else 0)
        reshaped, self.checked = _validate_connections(desc, report, last.checked if last is not None else None,
                                                       tail, self.resumable)
        if len(self.ids) != len(desc.blocks):
            tail = None  # an id repeated
        order = _order_after(last.order, tail, desc) if tail is not None and last is not None else None
        blocks = order or ordered_blocks(desc, report)
        before = len(report.problems)
        same = None  # leading blocks in order known to be as in the last plan, each port fed as before
        if tail is not None and last is not None and _inputs_kept(tail):
            if order is not None:
                same = len(order) - len(tail.added)
            removed = {b.id for b in tail.removed}
            report.problems.extend(p for p in last.inputs if p.block not in removed)  # (warnings alone)
            _validate_inputs(desc, tail.added, report, tail.new)
            sources, self.delayed = last.sources.copy(), last.delayed.copy()
            for c in tail.gone:
                (self.delayed if c.delay else sources).pop(c.dst, None)
            for c in tail.new:
                (self.delayed if c.delay else sources)[c.dst] = c.src
        else:
            _validate_inputs(desc, unique, report, desc.connections)
            sources, self.delayed = _delays.split_sources(desc.connections)
        self.inputs = tuple(report.problems[before:])
        if self.delayed:
            _delays.check_initials(desc, report)
        # every port's shape, in topological order (nothing to do unless something was resized or reshaped)
        self.resolved = _shapes.resolve(desc, blocks, sources, self.delayed, reshaped, report)
        # In topological order every connected input's source block has been emitted already, so one pass
        # gives each port its buffer and emits the block's nodes. With errors found above every block is still
        # emitted (only for the problems inside its kernels: the plan is dropped), so a block after a cycle or a
        # bad connection gets its own buffers.
        if desc.regions:  # levels: the top and each region body (rxcuda.plan._regions)
            _regions.plan_levels(self, blocks, sources, _regions.check_regions(desc, report))
        else:
            self.order, self.sources, self.emitted_from = blocks, sources, len(report.problems)
            start = self._resume(blocks, sources, same)  # (replaces the lists below when it takes work over)
            self._emit_flat(blocks[start:], sources)
        # delayed outputs: a copy node each, after every other node (so after the producer and every reader)
        delays = _delays.emit_copies(self.delayed, self.port_buffers, self.by_key, self.buffers,
                                     self.nodes) if self.delayed else {}
        if report.errors:
            return None, report
        gp = GraphPlan(
            nodes=tuple(self.nodes),
            deps=(_regions.region_deps(self.nodes, self.parents, self.region_setters, self.region_steps)
                  if desc.regions
                  else self._hazards()),
            buffers=tuple(self.buffers),
            port_buffers=self.port_buffers,
            counters=self.counters,
            slots=self._slot_tuples(),
            device_scalars=self.device_scalars,
            recapture={k: tuple(v) for k, v in self.recapture.items()},
            kernel_nodes=self.kernel_nodes,
            parents=self.parents,
            delays=delays,
            shapes=self.resolved.shapes,
            warnings=tuple(report.problems),  # no errors: all of them are warnings
        )
        if not self.reuse_memory:
            return gp, report
        if not self.resumable:
            return _liveness.share_memory(gp, desc), report
        prev = self.previous.sharing if self.previous is not None else None
        gp, self.sharing = _liveshare.share(gp, desc, prev, len(self.kept_deps) if prev is not None else 0)
        return gp, report

    def _slot_tuples(self) -> dict[tuple[int, str], tuple[tuple[int, int], ...]]:
        """The plan's slots, each list made a tuple: those of the blocks taken over are the last plan's (the
        maps were copied in the same order, and a block's slots are only added while it is emitted)."""
        kept = self.kept_slots
        if kept is None:
            out = {k: tuple(v) for k, v in self.slots.items()}
        else:
            out = kept
            slots = self.slots
            for k in list(slots)[len(kept):]:
                out[k] = tuple(slots[k])
        self.slot_tuples = out
        return out

    def _hazards(self) -> tuple[tuple[int, ...], ...]:
        """A flat pipeline's dependencies: the previous plan's for the nodes taken over, then the rest's."""
        nodes, kept = self.nodes, self.kept_deps
        if not kept:
            deps = hazard_deps(nodes)
        else:
            deps = kept if len(kept) == len(nodes) else hazard_deps_after(nodes, len(kept), kept, self.kept_buffers)
        self.deps = deps
        return deps

    def _resume(self, blocks: tuple[BlockEntry, ...], sources: Mapping[PortRef, PortRef], same: int | None) -> int:
        """Take over the previous plan's work for the leading blocks that are as they were: the same entry
        (id, description, values, launches) at the same place in the order, each port fed as before (the same
        source, binding, feeding). In topological order a block's nodes and buffers depend only on itself,
        its ports and the blocks before it, so those blocks' part of the plan is the previous one's, ids
        included (``same``: how many leading blocks are known to be so, or None: compared here). Returns how
        many blocks were taken over; 0 (emit everything) for pipelines with regions, delayed connections,
        appends or resolved shapes, and after errors."""
        prev = self.previous
        if (prev is None or not prev.marks or self.report.errors or self.delayed or prev.delayed
                or self.resolved is not _shapes.NOTHING or prev.resolved is not _shapes.NOTHING or prev.counters
                or prev.append_users is not None or prev.report.errors):
            return 0
        k = 0 if same is None else min(same, len(prev.marks))
        if same is None:
            desc, was = self.desc, prev.desc
            # the blocks with a port fed differently (source, binding, feeding): found by comparing the mappings
            # in bulk (set operations on dict views run in C), not port by port
            touched = {ref.block for ref, _ in sources.items() ^ prev.sources.items()}
            if desc.bindings or was.bindings:
                touched.update(ref.block for ref, _ in desc.bindings.items() ^ was.bindings.items())
            if desc.fed is not was.fed:
                touched.update(ref.block for ref in desc.fed ^ was.fed)
            for b, ob in zip(blocks[:len(prev.marks)], prev.order, strict=False):
                if (b is not ob and b != ob) or b.id in touched:
                    break
                k += 1
        if not k:
            return 0
        n_nodes, n_buffers, n_problems = prev.marks[k - 1]
        self.nodes = prev.nodes[:n_nodes]
        self.buffers = prev.buffers[:n_buffers]
        self.kept_deps = prev.deps[:n_nodes] if len(prev.deps) >= n_nodes else ()
        self.kept_buffers = n_buffers
        # (a block's slot lists are only appended to while it is emitted: shared, never changed again)
        dropped = prev.order[k:len(prev.marks)]
        if len(dropped) * 8 <= k:  # all but a few blocks at the end: copy the maps and take those blocks' out
            self._take_over_all_but(prev, dropped, n_buffers)
        else:
            ids = {b.id for b in blocks[:k]}
            self.by_key = {key: i for key, i in prev.by_key.items() if i < n_buffers}
            self.buffer_args = {i: a for i, a in prev.buffer_args.items() if i < n_buffers}
            self.port_buffers = {ref: i for ref, i in prev.port_buffers.items() if ref.block in ids}
            self.slots = {key: v for key, v in prev.slots.items() if key[0] in ids}
            self.device_scalars = {key: i for key, i in prev.device_scalars.items() if key[0] in ids}
            self.recapture = {key: v for key, v in prev.recapture.items() if key[0] in ids}
            self.kernel_nodes = {key: i for key, i in prev.kernel_nodes.items() if key[0] in ids}
        # what emitting them found (a clamped count, say), after this plan's own validation problems
        self.report.problems.extend(prev.report.problems[prev.emitted_from:prev.emitted_from + n_problems])
        self.marks = prev.marks[:k]
        self.reused = k
        return k

    def _take_over_all_but(self, prev: _Planner, dropped: tuple[BlockEntry, ...], n_buffers: int) -> None:
        """``_resume``'s maps when all but the ``dropped`` blocks (few, last in the previous order) are taken
        over: copies of the previous maps (C-level) without the keys those blocks' emission made (their
        buffers, ports, scalars and kernels), instead of filtering every key (measured on the null driver,
        1000 blocks: 0.1 ms against 0.5 ms)."""
        # (.copy(), not dict(): a dict that lost keys is copied item by item by dict(), at once by .copy())
        self.by_key, self.buffer_args = prev.by_key.copy(), prev.buffer_args.copy()
        self.port_buffers, self.slots, self.kept_slots = prev.port_buffers.copy(), prev.slots.copy(), \
            prev.slot_tuples.copy()
        self.device_scalars, self.recapture = prev.device_scalars.copy(), prev.recapture.copy()
        self.kernel_nodes = prev.kernel_nodes.copy()
        for i, bp in enumerate(prev.buffers[n_buffers:], n_buffers):
            self.by_key.pop(bp.key, None)
            self.buffer_args.pop(i, None)
        for b in dropped:
            bid, d = b.id, b.desc
            for p in d.ports:
                self.port_buffers.pop(PortRef(bid, p.name), None)
            for sc in d.scalars:
                self.slots.pop((bid, sc.name), None)
                self.kept_slots.pop((bid, sc.name), None)
                self.device_scalars.pop((bid, sc.name), None)
                self.recapture.pop((bid, sc.name), None)
            for step in d.kernels:
                self.kernel_nodes.pop((bid, step.name), None)

    def _emit_flat(self, blocks: tuple[BlockEntry, ...], sources: Mapping[PortRef, PortRef]) -> None:
        """``emit_block`` of each block in order (a flat pipeline), with a mark after each for a later re-plan
        (``resumable``). The per-shape function (rxcuda.plan._emit) is looked up once per run of blocks of
        one shape and called directly: the blocks of a chain of one kernel share every part of it."""
        marks, nodes, buffers, problems, first = self.marks, self.nodes, self.buffers, self.report.problems, \
            self.emitted_from
        resumable, general = self.resumable, bool(self.delayed or self.resolved.blocks)
        ports = scalars = kernels = internals = fast = None
        for b in blocks:
            d = b.desc
            if general:
                self.emit_block(b, sources)
            else:
                if d.ports is not ports or d.kernels is not kernels or d.scalars is not scalars \
                        or d.internals is not internals:
                    ports, scalars, kernels, internals = d.ports, d.scalars, d.kernels, d.internals
                    fast = _emitter(ports, scalars, kernels, internals)
                if fast is not None:
                    fast(self, b, sources)
                else:
                    self.emit_block(b, sources)
            if resumable:
                marks.append((len(nodes), len(buffers), len(problems) - first))

    def emit_block(self, b: BlockEntry, sources: Mapping[PortRef, PortRef]) -> None:
        d, bid, label = b.desc, b.id, b.desc.name
        # the common case, written once per block shape with its loops unrolled (rxcuda.plan._emit); the path
        # below for the rest, and for a block that a resize reshapes or a delayed connection may feed
        fast = _emitter(d.ports, d.scalars, d.kernels, d.internals)
        if fast is not None and not self.delayed and not (self.resolved.blocks and bid in self.resolved.blocks):
            fast(self, b, sources)
            return
        bindings, fed, nodes, port_buffers = self.desc.bindings, self.desc.fed, self.nodes, self.port_buffers
        buffer_args, slots, values = self.buffer_args, self.slots, b.values
        # what a resize changes in this block (None: nothing): counts, derived scalars, launches (see _shapes)
        shaped = self.resolved.blocks.get(bid) if self.resolved.blocks else None
        # (kernel, parameter index) -> buffer id or scalar name; plain tuples hash faster than Pins
        pin_buffer: dict[tuple[str, int], int] = {}
        by_name: dict[str, int] = {}
        for p, is_in, own, pins in _port_info(d.ports):
            ref = _new(PortRef, (bid, p.name))
            src = sources.get(ref) if is_in else None
            # no buffer for the source only after an error (a cycle, a bad connection): the plan is dropped
            buf = port_buffers.get(src) if src is not None else None
            prev = self.delayed.get(ref) if buf is None and self.delayed else None
            if prev is not None:  # a delayed input reads its source's previous-frame buffer
                buf = self.buffer(_delays.delay_key(prev), _delays.buffer_label(self.desc, prev), p.dtype,
                                  self.resolved.count_of(prev, p.extent), "delay")
            elif buf is None:
                kind: BufferKind = "external" if ref in bindings else "port" if own or ref in fed else "zeros"
                count = p.extent if shaped is None else shaped.counts.get(p.name, p.extent)
                buf = self.buffer(("port", bid, p.name), f"{label}.{p.name}", p.dtype, count, kind)
            port_buffers[ref] = by_name[p.name] = buf
            for pin in pins:
                pin_buffer[pin] = buf
            if p.counter is not None:  # one counter per append buffer, reset once (see _appends)
                _appends.emit_counter(self, bid, label, p, ref, src, pin_buffer)
        # ports and internal buffers some count parameter counts -> their buffer (checked below)
        _, counted, counted_names = _scalar_info(d.scalars)
        tied = dict(zip(counted_names, map(by_name.get, counted_names), strict=True)) if counted else None
        for ib in d.internals:
            count = ib.count if shaped is None else shaped.internals.get(ib.name, ib.count)
            iid = self.buffer(("internal", bid, ib.name), f"{label}/{ib.name}", ib.dtype, count, "internal")
            for pin in (ib.writer, *ib.readers):
                pin_buffer[pin.kernel, pin.param] = iid
            if tied is not None and ib.name in tied:
                tied[ib.name] = iid
        clamped = None
        if tied is not None and not self.report.errors:  # a plan refused already would only repeat its error
            buffers = self.buffers
            for counter, counts in counted:
                value = values[counter] if counter in values else b.value(counter)
                if shaped is not None and counter in shaped.values:
                    value = shaped.values[counter]
                if type(value) is int and value >= 0:  # fits every buffer it counts: the common case, no message
                    for c in counts:
                        i = tied[c]
                        if i is not None and value > buffers[i].count:
                            break
                    else:
                        continue
                clamped = _check_counts(self, b, shaped, tied)  # the whole check, with its messages
                break
        for step, call, sname, params in _step_info(d.kernels, d.scalars):
            args: list[Arg] = []
            reads: set[int] = set()
            writes: set[int] = set()
            nid = len(nodes)
            for i, prm, key, name, reads_it, writes_it in params:
                if key is not None:  # a pointer
                    fed_by = pin_buffer.get(key)
                    if fed_by is None:
                        self.report.error(f"{label}: parameter {i} ('{prm.name}') of '{sname}' is a pointer "
                                          "that no port or internal connection feeds; declare it as a port or "
                                          "connect it", label, bid)
                        continue
                    arg = buffer_args.get(fed_by)
                    if arg is None:
                        arg = buffer_args[fed_by] = _new(BufferArg, (fed_by,))
                    args.append(arg)
                    if reads_it:
                        reads.add(fed_by)
                    if writes_it:
                        writes.add(fed_by)
                    continue
                if name is None:
                    if prm.default is None or isinstance(prm.default, str):  # no value, or "size" unresolved
                        self.report.error(f"{label}: scalar parameter {i} ('{prm.name}') of '{sname}' has no "
                                          "value; declare it as a block parameter or give it a numeric default "
                                          "(new code whose parameters the block does not declare needs a new "
                                          "block)", label, bid)
                        continue
                    args.append(ScalarArg(bid, None, prm.dtype, prm.size, prm.default))
                    continue
                value = values[name] if name in values else b.value(name)
                if shaped is not None and name in shaped.values:  # a size that followed a resize
                    value = shaped.values[name]
                if clamped and name in clamped:  # a count that follows a size, set above the buffer it counts
                    value = clamped[name]
                args.append(_new(ScalarArg, (bid, name, prm.dtype, prm.size, value)))
                if call is None:
                    slot = (bid, name)
                    if slot in slots:
                        slots[slot].append((nid, i))
                    else:
                        slots[slot] = [(nid, i)]
                elif prm.name in call.device_scalars:
                    sid = self.buffer(("device_scalar", bid, name), f"{label}.{name}", prm.dtype, 1,
                                      "device_scalar")
                    self.device_scalars[(bid, name)] = sid
                    args[-1] = BufferArg(sid)
                    reads.add(sid)
                else:
                    self.recapture.setdefault((bid, name), []).append(nid)
            node: NodePlan
            if call is not None:
                node = CallNodePlan(nid, bid, sname, tuple(args), frozenset(reads), frozenset(writes),
                                    f"{label}/{sname}")
            else:
                assert isinstance(step, KernelSpec)
                launch = b.launches.get(sname) or step.launch
                if shaped is not None and sname in shaped.launches:  # a grid that followed a resize
                    launch = shaped.launches[sname]
                node = _new(KernelNodePlan, (nid, bid, sname, step.code.key, launch, tuple(args), frozenset(reads),
                                             frozenset(writes), f"{label}/{sname}"))
            self.kernel_nodes[(bid, sname)] = nid
            nodes.append(node)


class Replanner:
    """:func:`plan`, again and again as a pipeline changes: each call reuses the work of the previous one for
    the leading blocks (in topological order) that did not change, and gives the plan a fresh call would
    (``reused``: how many blocks the last call took over). Adding a block at the end of a chain, or removing
    the last one, re-plans that block alone; an edit in the middle re-plans from there on.

    >>> from rxcuda import Block
    >>> from rxcuda.lowlevel import BlockEntry, PipelineDescription, PortRef
    >>> blocks = [BlockEntry(i, Block.from_kernel("scalar_mul", size=4, name=f"m{i}").description)
    ...           for i in range(1, 4)]
    >>> def pipeline(entries):  # each block's input filled from the host
    ...     return PipelineDescription(tuple(entries), fed=frozenset(PortRef(b.id, "x") for b in entries))
    >>> planner = Replanner()
    >>> _ = planner.plan(pipeline(blocks[:2]))
    >>> gp = planner.plan(pipeline(blocks))
    >>> planner.reused, gp == plan(pipeline(blocks))
    (2, True)
    """

    def __init__(self) -> None:
        self._last: _Planner | None = None
        self.reused = 0

    def plan(self, desc: PipelineDescription, *, reuse_memory: bool = True) -> GraphPlan:
        """As :func:`plan` (same result, same errors)."""
        planner = _Planner(desc, reuse_memory, self._last, resumable=True)
        self._last = None
        gp, report = planner._run()
        planner.previous = None  # (keep one planner alive, not a chain of them)
        self.reused = planner.reused
        report.raise_errors()
        self._last = planner
        assert gp is not None
        return gp

    def forget(self) -> None:
        """Drop the previous plan's work: the next call plans from scratch."""
        self._last = None


def plan(desc: PipelineDescription, *, reuse_memory: bool = True) -> GraphPlan:
    """Validate a pipeline and plan its graph. Pure. Raises one ValidationError listing every error found
    (``.problems``, warnings included); the warnings of a pipeline that plans are ``GraphPlan.warnings``.

    ``reuse_memory``: let intermediate buffers whose lifetimes never overlap share memory (``GraphPlan.shared``,
    see ``rxcuda.plan._liveness``); False gives every buffer its own."""
    return _Planner(desc, reuse_memory).run()


def _scalar_facts(scalars: tuple) -> tuple[dict[tuple[str, int], str], tuple[tuple[str, tuple[str, ...]], ...],
                                           tuple[str, ...]]:
    """What emitting a block needs of its scalars (read only): (kernel, parameter index) -> the block scalar
    passed there; (name, what it counts) of each count parameter (``ScalarSpec.counts``); and every port or
    internal some scalar counts."""
    pins = {(pin.kernel, pin.param): s.name for s in scalars for pin in s.pins}
    counted = tuple((s.name, tuple(s.counts)) for s in scalars if s.counts)
    names = tuple(dict.fromkeys(c for _, counts in counted for c in counts))
    return pins, counted, names


_scalar_info = by_identity(_scalar_facts)  # once per ``scalars`` tuple: the blocks made from one kernel share it


def _port_facts(ports: tuple) -> tuple[tuple, ...]:
    """What emitting a block needs of each port alone: (port, an input, has a buffer of its own unless bound
    (an output, or an append port), the (kernel, parameter index) of each pin)."""
    return tuple((p, p.direction == "in", p.direction == "out" or p.counter is not None,
                  tuple((pin.kernel, pin.param) for pin in p.pins)) for p in ports)


def _step_facts(kernels: tuple, scalars: tuple) -> tuple[tuple, ...]:
    """What emitting a block needs of each kernel step alone: (step, the step if a library call, its name, per
    parameter (index, parameter, (kernel, index) if a pointer, the block scalar passed if one is, whether a
    pointer is read, whether it is written))."""
    scalar_of = _scalar_info(scalars)[0]
    out = []
    for step in kernels:
        call = step if isinstance(step, CallSpec) else None
        params = call.params if call is not None else step.code.signature.params
        facts = []
        for i, prm in enumerate(params):
            key = (step.name, i)
            pointer = prm.kind == "pointer"  # (direction: in, out, inout or counter)
            facts.append((i, prm, key if pointer else None, None if pointer else scalar_of.get(key),
                          pointer and prm.direction != "out", pointer and prm.direction != "in"))
        out.append((step, call, step.name, tuple(facts)))
    return tuple(out)


# once per ``ports`` tuple, and per ``kernels`` and ``scalars`` tuples: the blocks made from one kernel share them
_port_info = by_identity(_port_facts)
_step_info = by_identity(_step_facts, parts=2)
