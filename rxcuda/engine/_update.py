"""Applying an update plan to the running graph: a table from tier to handler, highest tier first.

- Structure: rebuild (``Builder.build``); when it succeeds it read every current value, so the lower tiers
  are subsumed. When it fails, the lower tiers still reach the last good graph: nothing is lost.
- Code: load the new module and swap the function in the exec node, keeping its arguments.
- Parameters: the one path for values, rebound arrays and launch geometry. A value goes through the
  compiled graph's patch table (``CompiledGraph.patches``) into its nodes' argument storage (one exec-node
  update per node); a library scalar in device memory is one copy; a host scalar of a library call, or an
  array a library call reads, recaptures that call node alone with the drained value -- reported as the
  Recapture tier.

A parameter's value travels one way: the setter folds it into the pending plan, the drain hands it here, and
it is written where the running graph reads it (argument storage, device memory, a capture). One
AppliedUpdate is published per applied plan (``_notify``).
"""

from __future__ import annotations

import math
import time
from types import ModuleType

from ..cuda import _native, _nvtx
from ..cuda._fast import FastDriver, native_call
from ..model._describe import PortRef
from ..model._events import Tier, merge_tiers
from ..streams._broadcast import Broadcast
from ..streams._coalesce import UpdatePlan
from ._build import Builder, codes_in_use, runs_code, write_device_scalar
from ._records import applied_update
from ._runtime import Runtime

_PARAMETERS = (Tier.PARAMETERS,)
_now = time.perf_counter_ns


class _HotTable(dict):
    """A dict that makes a missing entry on first lookup (``table[key]``) with ``make(key)`` and keeps it."""

    def __init__(self, make) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, key):
        value = self[key] = self._make(key)
        return value


def _hot_apply(targets: tuple, limit: int | None, raise_for):
    """The hot path's ``apply(value) -> bool`` for a parameter that kernel nodes alone read (see
    ``Updater._hot_entry``): ``targets`` their ((typed view of the argument storage, index, bound exec-node
    update), ...); ``limit`` a count parameter's smallest buffer in the running plan (a value outside
    [0, limit] is left to the general path, which reports it), None for any other parameter."""
    if len(targets) == 1 and limit is None:  # the common case: one kernel node reads it
        ((view, idx, update),) = targets

        def one(value) -> bool:
            view[idx] = value
            err = update()
            if err:
                raise_for(err)
            return True

        return one
    lo, hi = (0, limit) if limit is not None else (-math.inf, math.inf)

    def each(value) -> bool:
        if not lo <= value <= hi:
            return False
        for view, idx, update in targets:
            view[idx] = value
            err = update()
            if err:
                raise_for(err)
        return True

    return each


def _native_apply(native, targets: tuple, limit: int | None):
    """``_hot_apply``'s function made by the compiled path (rxcuda.cuda._native): each target's argument as
    (type character, address in the argument storage), and its exec-node update as the driver function's address
    and arguments that its bound update holds (``FastDriver.node_updater``), or the bound update itself where it
    calls the driver otherwise (a null driver). None where an argument's type is one the compiled path does not
    write (the Python path then)."""
    out = []
    for _nid, view, idx, update in targets:
        dt = view.dtype
        kind = _NATIVE_KINDS.get((dt.kind, dt.itemsize))
        if kind is None:
            return None
        fn, exec_h, node, params = native_call(update)
        out.append((kind, view.ctypes.data + idx * view.itemsize, fn, exec_h, node, params, update, view))
    return native.Apply(tuple(out), *((0, limit) if limit is not None else (None, None)), FastDriver.raise_for)


# (NumPy kind, itemsize) -> the type character the compiled path writes (fixed widths: C's long differs by OS)
_NATIVE_KINDS = {("f", 2): "e", ("f", 4): "f", ("f", 8): "d", ("i", 1): "b", ("i", 2): "h", ("i", 4): "i",
                 ("i", 8): "q", ("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q", ("b", 1): "?"}


def _drain_one(pending, table, updates: tuple | None = None) -> tuple:
    """The drain of ``Updater.apply_pending`` in Python, as the compiled ``drain_one`` does it: under the pending
    plan's lock, take its values and reset its count; a single value whose hot entry takes it is applied here.
    (names, None, events) when it was; (None, the values for the general path, events) otherwise. ``updates``,
    where someone observes applied updates: (observers, make, frame, tiers, broadcast); a value applied here
    is then published as make((frame, tiers, names, seconds, events))."""
    t0 = _now() if updates is not None else 0
    lock, params = pending._lock, pending._params
    lock.acquire()  # (nothing between can raise)
    events = pending.count
    pending.count = pending.others  # 0 unless a change of another kind just arrived (drained next time)
    if len(params) != 1:
        pending._params = {}
        lock.release()
        return None, params, events
    key, value = params.popitem()  # (its dict stays: no new one made and the old one freed)
    lock.release()
    apply, names = table[key]
    if apply is not None and apply(value):
        if updates is not None:  # Broadcast.emit, inline
            observers, make, frame, tiers, broadcast = updates
            done = make((frame, tiers, names, (_now() - t0) / 1e9, events))
            for observer in observers:
                try:
                    observer.on_next(done)
                except Exception as e:
                    broadcast.failed(e, done)
        return names, None, events
    return None, {key: value}, events


class Updater:
    """Applies what is pending before a frame. ``updates`` publishes one AppliedUpdate per applied plan."""

    def __init__(self, rt: Runtime, builder: Builder):
        self.rt = rt
        self.builder = builder
        self.updates = Broadcast(on_error=self._subscriber_failed)
        self.recaptures = 0
        self.applied = 0  # calls of apply_pending that had something to apply
        self._limits_plan: object = None  # the running plan whose count limits _limits holds (_count_limits)
        self._limits: dict = {}
        # the hot table of the running graph (see _hot_entry), made again when the graph or its plan changes
        self._hot_graph: object = None
        self._hot_plan: object = None
        self._hot: _HotTable = _HotTable(self._hot_entry)
        self.native: ModuleType | None  # the compiled parameter path (rxcuda.cuda._native); None: the Python one
        self.use_native(True)  # (sets it, and the drain that goes with it)
        self._handlers = {
            Tier.STRUCTURE: self._structure,
            Tier.CODE: self._code,
            Tier.PARAMETERS: self._parameters,
        }
        if _nvtx.instrument(self, apply_pending="apply", apply_values="apply parameters"):  # Nsight collecting
            for tier in (Tier.STRUCTURE, Tier.CODE):
                self._handlers[tier] = _nvtx.ranged(self._handlers[tier], f"apply {tier}")

    def use_native(self, on: bool) -> bool:
        """Take the compiled parameter path (``on``, where it builds) or the Python one; True when the compiled
        one is in use. The two give the same results (tests/unit/test_native.py); the benchmarks run both."""
        self.native = _native.hotpath() if on else None
        self._drain_one = self.native.drain_one if self.native is not None else _drain_one
        self._hot_graph = None  # the hot table is made again, with the path's functions
        return self.native is not None

    # -- entry points --------------------------------------------------------------------------------
    def apply_pending(self, raise_errors: bool = False, background: bool = False) -> tuple[Tier, ...]:
        """Apply everything pending. Values alone (the common case) skip the plan object, and one value that
        kernel nodes alone read goes straight through the hot table (:meth:`_hot_entry`) to its nodes' exec
        updates: a dict lookup and one call that checks a count's limit, writes and updates.

        ``background`` (``engine.run``'s frames): a structural change is prepared off this thread and swapped
        in by a later call once ready (rxcuda.engine._prepare); otherwise it is applied before this returns."""
        rt = self.rt
        self.applied += 1  # what a GPU-driven batch compares to know its copy of the graph is stale
        if rt.preparing:
            return self._while_preparing(raise_errors, background)
        pending = rt.pending
        g = rt.graph
        if g is None or pending.others:
            up = pending.drain()
            return self.apply(up, raise_errors, background) if up else ()
        if self._hot_graph is not g or self._hot_plan is not g.plan:
            self._rearm(g)
        observed = self.updates.observers
        # the drain of values alone: one value that kernel nodes alone read is applied (and its AppliedUpdate
        # published) by the drain itself
        names, params, events = self._drain_one(
            pending, self._hot,
            (observed, applied_update, rt.frame + 1, _PARAMETERS, self.updates) if observed else None)
        if names is not None:
            return _PARAMETERS
        return self._general(params, events, observed, _now() if observed else 0, raise_errors)

    def _general(self, params: dict, events: int, observed, t0: int, raise_errors: bool) -> tuple[Tier, ...]:
        """The values ``apply_pending`` drained that its hot path did not take: through the count limits and
        the one Parameters path."""
        limits = self._limits
        if limits:  # count parameters: the last check before a value reaches the GPU (rxcuda.engine._bounds)
            params = self._within(params, limits)
        if not params:
            return ()
        tiers = self.apply_values(params, raise_errors=raise_errors)
        if observed:
            self._notify({bid for bid, _ in params}, tiers, t0, events)
        return tiers

    def _while_preparing(self, raise_errors: bool, background: bool) -> tuple[Tier, ...]:
        """A new graph is being prepared off the frame thread: swap it in once ready (``background``) or
        wait for it (a direct tick), then apply what is pending."""
        prep = self.builder.prep
        done: tuple[Tier, ...] = ()
        if not background:
            done = prep.settle(self, raise_errors)
        elif prep.ready:
            done = prep.swap(self)
        up = self.rt.pending.drain()
        if up:
            done += self.apply(up, raise_errors, background)
        return tuple(dict.fromkeys(done))

    def apply(self, up: UpdatePlan, raise_errors: bool = False, background: bool = False) -> tuple[Tier, ...]:
        """Apply a drained plan, highest tier first; returns the tiers that were applied. ``background``: see
        ``apply_pending``; without it a preparation in flight is waited for and swapped in first."""
        t0 = _now()
        rt = self.rt
        done: list[Tier] = []
        handed = False  # the structural change went to the preparation worker: its swap is reported then
        if rt.preparing and not background:
            done.extend(self.builder.prep.settle(self, raise_errors))
        tiers = up.tiers
        if rt.graph is None and Tier.STRUCTURE not in tiers:
            tiers = (Tier.STRUCTURE,) + tiers  # nothing runs yet: the first build reads every value
        for tier in tiers:
            if tier is Tier.STRUCTURE and background and rt.graph is not None and rt.devices is None:
                self.builder.prep.request(up)  # built off this thread; the lower tiers reach the running graph
                handed = True
                continue
            result = self._handlers[tier](up, raise_errors)
            done.extend(result)
            if tier is Tier.STRUCTURE and result:
                break  # the rebuild read every current value: the lower tiers are subsumed
            if rt.graph is None:
                break  # no graph to apply anything else to
        if rt.preparing:  # the graph being prepared gets what the running one got, before its first launch
            self.builder.prep.log(up)
        out = tuple(dict.fromkeys(done))
        if self.updates.observers and (out or not handed):
            self._notify(up.blocks(), out, t0, up.events)
        return out

    def rebuild_now(self) -> None:
        """``engine.rebuild()``: apply what is pending and rebuild, raising instead of reporting."""
        if self.rt.preparing:
            self.builder.prep.settle(self, raise_errors=True)
        up = self.rt.pending.drain()
        if up is not None:
            self.apply(up, raise_errors=True)
        if up is None or not up.structure:
            self.builder.build(raise_errors=True)

    def ensure_built(self, ref=None):
        """The running graph after applying what is pending (a first build when there is none yet); a
        RuntimeError saying why when there is still none. While a new graph is prepared and nothing else is
        pending, a port of the running graph (``ref``) is read there (its last frame) without waiting."""
        rt = self.rt
        g = rt.graph
        if (rt.preparing and ref is not None and g is not None and not rt.pending.count
                and (ref in g.plan.port_buffers or ref in g.plan.counters)):
            return g
        if rt.pending.count or rt.graph is None or rt.preparing:
            applied = self.apply(rt.pending.drain() or UpdatePlan())
            if applied:  # the next frame is the first to run with them: it reports them
                rt.carried = merge_tiers(rt.carried, applied)
        if rt.graph is None:
            log = rt.reporter.log
            why = log[-1].message if log else "nothing was built"
            raise RuntimeError(f"the pipeline has no working graph yet: {why}")
        return rt.graph

    # -- handlers: each returns the tiers it applied ----------------------------------------------
    def replay(self, up: UpdatePlan) -> None:
        """Apply the lower tiers of ``up`` to a graph just swapped in (what the old one got while it was
        prepared): code of kernels it has, values, rebound arrays and launches."""
        g = self.rt.graph
        if g is None:
            return
        code = {k: c for k, c in up.code.items() if k in g.plan.kernel_nodes}
        if code:
            self._code(UpdatePlan(code=code), False)
        if up.params or up.rebinds or up.launches:
            self._parameters(up, False)

    def _structure(self, up: UpdatePlan, raise_errors: bool) -> tuple[Tier, ...]:
        if self.rt.preparing:  # (new code for a block the running graph lacks) the next preparation takes it
            self.builder.prep.request(up)
            return ()
        if not self.builder.build(raise_errors):
            return ()
        # a resize the running graph took in place (exec-node updates only) is the Parameters tier
        return (Tier.PARAMETERS,) if self.builder.last_in_place else (Tier.STRUCTURE,)

    def _code(self, up: UpdatePlan, raise_errors: bool) -> tuple[Tier, ...]:
        rt = self.rt
        g = rt.running()
        # new code for a block that is not in the running graph (its first build failed): rebuild it
        if any(k not in g.plan.kernel_nodes and k[0] in rt.blocks for k in up.code):
            return self._structure(up, raise_errors)
        swapped = False
        for (bid, kernel), code in up.code.items():
            nid = g.plan.kernel_nodes.get((bid, kernel))
            block = rt.blocks.get(bid)
            if nid is None or block is None:
                continue
            try:
                loaded = rt.modules.load(code)
                g.set_function(nid, loaded.function)
                g.flush()
            except Exception as e:
                g.discard(nid)
                rt.reporter.error(e, block, "code swap")
                if raise_errors:
                    raise
                continue
            runs_code(g, nid, code.key)
            self.builder.codes.add(code.key)  # kept loaded by a swap while the old graph may still run
            if not rt.preparing:  # (the worker may have loaded modules the running graph does not use yet)
                rt.modules.prune(codes_in_use(g.plan) | g.keeps)
            block.state, block.message = "ok", ""
            rt.reporter.refresh()
            swapped = True
        return (Tier.CODE,) if swapped else ()

    def _parameters(self, up: UpdatePlan, raise_errors: bool) -> tuple[Tier, ...]:
        g = self.rt.running()
        # a launch of a kernel with no single node (a block in an unrolled loop's body) reaches it by a rebuild
        if any(k not in g.plan.kernel_nodes and k[0] in self.rt.blocks for k in up.launches):
            return self._structure(up, raise_errors)
        limits = self._limits if self._limits_plan is g.plan else self._count_limits(g)
        params = self._within(up.params, limits) if limits else up.params
        return self.apply_values(params, up.rebinds, up.launches, raise_errors)

    # -- the hot table ---------------------------------------------------------------------------------
    def _rearm(self, g) -> None:
        """Start a hot table for the running graph ``g`` (entries are made on first use)."""
        self._hot_graph, self._hot_plan = g, g.plan
        if self._limits_plan is not g.plan:
            self._count_limits(g)
        self._hot = _HotTable(self._hot_entry)

    def _hot_entry(self, key: tuple[int, str]) -> tuple:
        """(block id, parameter) -> (apply, names) for the hot path. ``apply(value)`` writes the value into the
        argument storage of the kernel nodes that read it and makes their exec-node updates, True when it did;
        False, having done nothing, for a count value past its smallest buffer in the running plan (the general
        path reports it). None instead of ``apply`` when the value also goes elsewhere (device memory, a
        recapture: the general path). ``names``: the AppliedUpdate's blocks. Made once per parameter and
        graph, with everything it needs bound (views, indices, the bound updates, the count limit), so a
        change costs one call."""
        g = self._hot_graph
        targets, plain = g.patches[key]  # type: ignore[attr-defined]
        block = self.rt.blocks.get(key[0])
        names = (block.name,) if block is not None else (f"#{key[0]}",)
        if not plain:
            return None, names
        limit = self._limits.get(key)
        bound = limit[0] if limit is not None else None
        apply = _native_apply(self.native, targets, bound) if self.native is not None else None
        if apply is None:
            apply = _hot_apply(tuple((view, idx, update) for _nid, view, idx, update in targets), bound,
                               g.fast.raise_for)  # type: ignore[attr-defined]
        return apply, names

    # -- count parameters ------------------------------------------------------------------------------
    def _count_limits(self, g) -> dict:
        """(block id, parameter) -> the element count of the smallest buffer it counts, in the running plan
        ``g.plan`` (cached per plan). A value checked at ``set`` against a shape that a resize then shrank is
        caught here, before it reaches the GPU."""
        from ._bounds import plan_limits

        self._limits_plan, self._limits = g.plan, plan_limits(g.plan, self.rt.blocks)
        return self._limits

    def _within(self, params: dict, limits: dict) -> dict:
        """``params`` without the count values past their buffers (each reported as an error diagnostic)."""
        bad = [key for key, v in params.items() if key in limits and not 0 <= v <= limits[key][0]]
        if not bad:
            return params
        from ._bounds import report_late_refusal

        for key in bad:
            report_late_refusal(self.rt, key, params[key], limits[key])
        return {k: v for k, v in params.items() if k not in bad}

    # -- the one Parameters path ---------------------------------------------------------------------
    def apply_values(self, params: dict, rebinds: dict | None = None, launches: dict | None = None,
                     raise_errors: bool = False) -> tuple[Tier, ...]:
        """Write drained values through the patch table (kernel nodes), into device memory (library scalars
        there) or into the captures of the library calls that read them; rebind arrays; set launches."""
        g = self.rt.running()
        p = g.plan
        patches = g.patches
        recapture: dict[int, dict] = {}  # call node -> the drained values (parameter -> value) it is captured with
        patched = bool(launches)  # anything written into kernel/memset nodes or device memory
        for key, value in params.items():
            targets, plain = patches[key]
            if targets:
                patched = True
                for nid, view, idx, _update in targets:
                    view[idx] = value
                    g.mark(nid)
            if plain:
                continue
            sid = p.device_scalars.get(key)
            if sid is not None:
                patched = True
                write_device_scalar(self.rt, sid, value)
            for nid in p.recapture.get(key, ()):
                recapture.setdefault(nid, {})[key[1]] = value
        for (bid, port), ext in (rebinds or {}).items():
            buf = p.port_buffers.get(PortRef(bid, port))
            if buf is not None and p.buffers[buf].kind == "external":
                calls = g.set_buffer(buf, ext.ptr)
                patched = patched or len(calls) < len(g.consumers.get(buf, ()))
                for nid in calls:
                    recapture.setdefault(nid, {})
        for (bid, kernel), launch in (launches or {}).items():
            nid = p.kernel_nodes.get((bid, kernel))
            if nid is not None:
                g.set_launch(nid, launch)
        g.flush()
        done = [Tier.PARAMETERS] if patched or not recapture else []
        if any([self._recapture(nid, values, raise_errors) for nid, values in recapture.items()]):
            done.insert(0, Tier.RECAPTURE)
        return tuple(done)

    def _recapture(self, nid: int, changed: dict, raise_errors: bool) -> bool:
        """Capture a call node again with the drained values ``changed`` (parameter name -> value) and, for
        its other scalars, the values of its last capture."""
        rt = self.rt
        g = rt.running()
        block = rt.blocks.get(getattr(g.plan.nodes[nid], "block", None))
        last = g.nodes[nid].args  # the CaptureArgs it runs with now
        try:
            g.recapture(nid, lambda node, pointers: self.builder.capture(node, pointers, last, changed))
        except Exception as e:
            rt.reporter.error(e, block, "recapture")
            if raise_errors:
                raise
            return False
        self.recaptures += 1
        return True

    # -- reporting (an AppliedUpdate is made by _records.applied_update, here and in the drains) -------
    def _notify(self, block_ids, tiers: tuple, t0: int, events: int) -> None:
        blocks = self.rt.blocks
        names = tuple(sorted({blocks[b].name if b in blocks else f"#{b}" for b in block_ids}))
        self.updates.emit(applied_update((self.rt.frame + 1, tiers, names, (_now() - t0) / 1e9, events)))

    def _subscriber_failed(self, err: Exception, item) -> None:
        self.rt.reporter.warn("engine.updates", f"a subscriber raised {type(err).__name__}: {err}")

    def close(self) -> None:
        self.updates.close()
