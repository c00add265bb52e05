"""The Structure tier: plan -> load -> allocate -> build (capturing library calls) -> instantiate or update.

A new graph is swapped in only when every step succeeded; otherwise the last good graph keeps running and
the failure is reported on the block it concerns. Port buffers are kept across rebuilds (keyed by port and
size), and library state (handles, plans, workspaces) lives per block and call until the block leaves.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from itertools import accumulate
from operator import attrgetter, itemgetter
from types import FrameType
from typing import Any, cast

import attrs
import numpy as np

from ..blocks._regions import stamp_code
from ..cuda import _inplace, _nvtx
from ..cuda._graph import CompiledGraph, capture_graph
from ..cuda._memory import DeviceBuffer, copy_dtod_async, copy_htod_async
from ..cuda._profile import StampRing
from ..cuda.nodes import kind_of
from ..model import _dtypes
from ..model._describe import CallSpec, CaptureArgs, KernelSpec, PortRef
from ..model._errors import KernelFileError
from ..model._graphplan import (
    BufferArg,
    CallNodePlan,
    GraphPlan,
    HandleArg,
    KernelNodePlan,
    ScalarArg,
    sizes_in_bytes,
)
from ..plan._liveness import holds_own_value
from ..plan._plan import Replanner
from ..plan._profile import add_stamps
from ..plan._shapes import in_place as in_place_delta
from . import _devbuild
from ._delaystate import DelayState
from ._prepare import Preparer
from ._profile import LOW_OCCUPANCY, occupancy
from ._resize import _fits as fits
from ._resize import try_in_place
from ._runtime import Runtime
from ._shapes_io import follow_shapes

_ID = attrgetter("id")


class _BlockFailure(Exception):
    """A step failed for a known block (its kernel would not load, say)."""

    def __init__(self, block: int, error: Exception):
        super().__init__(str(error))
        self.block = block
        self.error = error


@attrs.define(eq=False)
class Prepared:
    """A graph built and instantiated, not running yet (``Builder.prepare``): what ``Builder.install`` swaps in.
    ``in_place``: the change is a resize the running graph takes by exec-node updates (nothing was built)."""

    desc: Any  # the PipelineDescription it was planned from
    gp: GraphPlan
    new: CompiledGraph | None
    buffers: dict  # (buffer key, bytes) -> DeviceBuffer: what the new graph uses
    pointers: dict  # buffer id -> device pointer
    new_delays: tuple  # keys of previous-frame buffers made for it
    acquired: tuple = ()  # buffers taken from the pool for it
    in_place: bool = False
    # worked out on the worker, so that the swap does not walk the pipeline: the blocks built, the code keys
    # the graph runs, and the keys of the running graph's buffers that it no longer uses
    ids: frozenset = frozenset()
    codes: frozenset = frozenset()
    unused: tuple = ()
    flagged: tuple | None = None  # the blocks with a state to clear (None: look at every block at the swap)


def _caller_level() -> int:
    """The ``stacklevel`` of warnings.warn, called by the function that calls this, that names the first frame
    outside rxcuda (the user's ``engine.tick()``, say)."""
    frame: FrameType | None = sys._getframe(1)  # (stacklevel 1: the function that warns)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("rxcuda."):
        frame, level = frame.f_back, level + 1
    return level


class Builder:
    """Builds the pipeline into a compiled graph and owns what outlives one graph: port buffers, library
    state. The code each node runs is its running plan's ``code_key`` (kept true by code swaps: ``runs_code``)."""

    def __init__(self, rt: Runtime, on_built: Callable[[], None]):
        self.rt = rt
        self._on_built = on_built  # e.g. upload host data written before its port had a buffer
        self.buffers: dict[tuple, DeviceBuffer] = {}
        self.library_state: dict[tuple, object] = {}
        self.library_teardown: dict[tuple, Callable] = {}
        self.rebuilds = 0
        self.last_build_ms: float | None = None  # how long the last successful rebuild took
        self._occupancy_warnings: list = []
        self.resized_in_place = 0  # resizes the running graph took by exec-node updates (see _resize)
        self.grown = 0  # builds that grew the running graph's template in place (rxcuda.cuda._inplace.grow)
        self.shrunk = 0  # builds that took nodes off the running graph's end in place (rxcuda.cuda._inplace.shrink)
        self.extended = 0  # builds that put nodes added at the end into spare nodes (rxcuda.cuda._inplace.extend)
        # the last build's shared groups, by their first buffer: (their buffers, largest sizes: see _group_sizes)
        self._group_bytes: dict[int, tuple] = {}
        self.last_in_place = False
        self.delays = DelayState(rt)  # what previous-frame buffers hold across rebuilds
        self._capturing = threading.Lock()  # the capture stream and library handles: one capture at a time
        self.prep = Preparer(rt, self)  # structural changes prepared off the frame thread (engine.run)
        self.codes: set[str] = set()  # the code keys the running graph runs (or ran: see Updater._code)
        self.planner = Replanner()  # plans again only from the first block that changed (rxcuda.plan._plan)
        _nvtx.instrument(self, build="rebuild", capture="capture")  # NVTX ranges, only under Nsight

    def build(self, raise_errors: bool = False) -> bool:
        """Plan, load, allocate, build and instantiate (or update the running executable in place); swap in
        only on success. Returns success.

        The cyclic garbage collector is paused meanwhile: a build makes tens of thousands of small objects
        for a large pipeline, and the collections they trigger would each walk every live object (measured:
        a 1000-block rebuild took 24 ms with the collector paused and 28-54 ms without). Before it resumes,
        what the build made (the plan and graph objects, long-lived) moves to the oldest generation (a freeze
        and an unfreeze: two list splices), so the first young collection after it does not walk them all (the
        null driver's first tick of 1000 blocks: 34.4 -> 31.2 ms); young garbage cycles of the moment go
        there too and wait for the next full collection."""
        paused = gc.isenabled()
        if paused:
            gc.disable()
        t0 = time.perf_counter()
        try:
            ok = self._build(raise_errors)
            if ok:
                self.last_build_ms = (time.perf_counter() - t0) * 1e3
                follow_shapes(self.rt)
            return ok
        finally:
            if paused:
                if not gc.get_freeze_count():  # (no one else's frozen objects to thaw)
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()

    def _build(self, raise_errors: bool) -> bool:
        rt = self.rt
        desc = rt.snapshot()
        if not desc.blocks:
            self.retire(None, {})
            self.release_library_state(keep=set())
            return True
        try:
            job = self.prepare(desc, background=False)
        except Exception as e:
            self.report_failure(e, raise_errors)
            return False
        if job is not None:
            self.install(job)
        return True

    def prepare(self, desc, background: bool) -> Prepared | None:
        """Plan ``desc``, load its kernels, allocate and zero new buffers, capture library calls, build and
        instantiate the new graph. Nothing the running graph uses is changed: buffers it uses are only
        reused (its frames end before the new graph's first launch, on the same stream). Raises on failure,
        having released what it made.

        ``background``: on the preparation worker (rxcuda.engine._prepare): the new graph is instantiated anew
        and a resize that fits is only recognized (``Prepared.in_place``); on the frame thread, a resize that
        fits is applied to the running graph here (None is returned) and the running executable graph is
        updated in place when the topology allows."""
        rt = self.rt
        acquired: list[DeviceBuffer] = []
        new: CompiledGraph | None = None
        ring = None
        warnings_before = self._occupancy_warnings
        try:
            gp = self.planner.plan(desc, reuse_memory=rt.reuse_memory)
            if rt.stamps:  # profiling: a timestamp node per block or kernel (rxcuda.engine._profile)
                gp = add_stamps(gp, desc, rt.stamps)
            if rt.devices is not None:  # several devices: a graph each, built and swapped in on the frame thread
                assert not background, "several devices' graphs are not prepared off the frame thread"
                _devbuild.build(self, desc, gp, False)  # raises on failure: the last good graphs keep running
                return None
            running = rt.graph
            if running is not None and background and gp.shapes != running.plan.shapes:
                delta = in_place_delta(running.plan, gp)
                if delta is not None and fits(self, running, gp, delta.buffers):
                    return Prepared(desc, gp, None, {}, {}, (), in_place=True)
            if not background and running is not None and try_in_place(self, desc, gp):
                return None  # only shapes changed, and still fit: done in place
            functions = {}
            for node in gp.nodes:
                # the kernels' code, loaded (once per code: a thousand blocks of one kernel share it); a kernel
                # node whose code is loaded already is passed over before the look-up of its kind (1000
                # nodes: 0.37 -> 0.08 ms)
                if type(node) is KernelNodePlan and node.code_key in functions:
                    continue
                if (n := kind_of(node).kernel_of(node)) is not None and n.code_key not in functions:
                    spec = desc.block(n.block).desc.kernel(n.kernel)
                    assert isinstance(spec, KernelSpec)
                    try:
                        functions[n.code_key] = rt.modules.load(spec.code).function
                    except KernelFileError as e:
                        raise _BlockFailure(n.block, e) from e
            pointers, buffers = {}, {}
            storage = gp.storage
            sizes, self._group_bytes = self._group_bytes, {}
            for group in gp.shared:  # memory reuse: one allocation per group, sized for its largest member
                members = itemgetter(*group)(gp.buffers)  # (groups have two members or more: a tuple)
                self._group_bytes[group[0]] = sized = _group_sizes(sizes.get(group[0]), members)
                nbytes = sized[1][-1]
                key = (("shared", gp.buffers[group[0]].key), nbytes)  # never a buffer's own key
                buf = self.buffers.get(key)
                if buf is None:
                    buf = rt.pool.acquire(nbytes)
                    acquired.append(buf)
                buffers[key] = buf
                for m in group:
                    pointers[m] = buf.ptr
            for b in gp.buffers:
                if b.kind == "external":
                    pointers[b.id] = rt.bindings[PortRef(b.key[1], b.key[2])].ptr
                    continue
                if storage and b.id in storage:
                    continue
                key = (b.key, b.nbytes)
                buf = self.buffers.get(key)
                if buf is None:
                    buf = rt.pool.acquire(b.nbytes, mapped=b.kind == "mapped")
                    acquired.append(buf)
                buffers[key] = buf
                pointers[b.id] = buf.ptr
            if acquired:  # new buffers start zeroed: a few memsets over adjacent buffers, on the engine's stream
                rt.pool.zero(acquired, rt.stream)
            ids = frozenset(map(_ID, desc.blocks))  # (the blocks present: what shrink or grow may drop, what is kept)
            if gp.stamps is not None:
                ring = StampRing(rt.api, rt.modules.load(stamp_code()).function, len(gp.stamps.names))
            if not background and running is not None and ring is None and running.api is rt.api:
                # nodes removed from the end: disabled in the running executable graph, which carries on (nothing
                # instantiated); nodes added after the end (and some removed): the running graph's template grows
                # in place. (Nothing below can fail once shrink took the running executable graph over.)
                new = _inplace.shrink(running, gp, functions, pointers, ids)
                if new is not None:
                    self.shrunk += 1
                elif (new := _inplace.extend(running, gp, functions, pointers, ids, self.capture)) is not None:
                    self.extended += 1
                else:
                    new = _inplace.grow(running, gp, functions, pointers, ids, capture=self.capture)
                    if new is not None:
                        self.grown += 1
            if new is None:
                new = CompiledGraph(gp, functions, pointers, rt.device.context, capture=self.capture, fast=rt.fast,
                                    api=rt.api, stamps=ring, previous=running)
            ring = None  # the graph owns it now (closes it with itself)
            if rt.stamps == "kernel":
                self._occupancy(gp, functions)
            if new.exec is not None:
                pass  # grown (instantiated already), shrunk or extended (the running one)
            elif background or running is None or not new.adopt_exec(running):
                new.instantiate(spares=True)
                if background:  # its first launch, on the frame thread, then finds it on the device
                    new.upload(rt.stream)
        except BaseException:
            self._occupancy_warnings = warnings_before
            if new is not None:
                new.close()
            elif ring is not None:
                ring.close()
            for buf in acquired:
                rt.pool.release(buf)
            raise
        new_delays = tuple(k[0] for k in buffers if k[0][0] == "delay" and k not in self.buffers) if gp.delays \
            else ()
        return Prepared(desc, gp, new, buffers, pointers, new_delays, acquired=tuple(acquired),
                        ids=ids, codes=frozenset(codes_in_use(gp) | new.keeps),
                        unused=tuple(k for k in self.buffers if k not in buffers),
                        flagged=tuple(b for b in list(rt.blocks.values()) if b.state != "ok" or b.message
                                      or b._warnings) if background else None)

    def discard(self, job: Prepared) -> None:
        """Free what a preparation made that will never run (the engine closed meanwhile)."""
        if job.new is not None:
            job.new.close()
        for buf in job.acquired:
            self.rt.pool.release(buf)

    def report_failure(self, e: Exception, raise_errors: bool) -> None:
        """A build failed: the last good graph keeps running; mark the blocks it concerns and say why."""
        rt = self.rt
        failure = e.block if isinstance(e, _BlockFailure) else None
        err = e.error if isinstance(e, _BlockFailure) else e
        block = rt.blocks.get(failure) if failure else rt.reporter.block_for(err)
        if rt.graph is None:  # there is no last good graph to keep: say so
            rt.reporter.error(err, block, "build", keeps="no graph runs until it is fixed")
            # Nothing runs, and rxcuda's log goes nowhere until the application configures logging: a warning
            # reaches stderr under Python's default filter, pointing at the user's line, once per engine and
            # message (a failure that every tick or read meets again is shown once), and the application can
            # filter it, route it to logging (logging.captureWarnings) or make it raise (-W error). A rebuild that
            # fails while the last good graph runs stops nothing: it is only logged and published.
            message = f"rxcuda: {rt.reporter.log[-1].message}"
            if message not in rt.reporter.warned:
                rt.reporter.warned.add(message)
                warnings.warn(message, RuntimeWarning, stacklevel=_caller_level())
        else:
            rt.reporter.error(err, block, "rebuild")
        # the planner reports every error at once (ValidationError.problems): mark each block it names
        named: dict[int, list[str]] = {}
        for p in getattr(err, "problems", ()):
            if p.severity == "error" and p.block in rt.blocks and rt.blocks[p.block] is not block:
                named.setdefault(p.block, []).append(p.message)
        for bid, messages in named.items():
            rt.blocks[bid].state, rt.blocks[bid].message = "error", "\n".join(messages)
            rt.reporter.state = "error"
        if raise_errors:
            raise err from None

    def install(self, job: Prepared, later: Callable[[Callable[[], None]], None] | None = None) -> bool:
        """Swap a prepared graph in, on the frame thread, between frames: what must see the last frame's
        values happens here (kept ports' values carried out of shared memory, device scalars, delays that were
        reconnected); then the old graph goes. ``later(fn)``: run ``fn`` off the frame thread once the GPU is
        done with the old graph (its destruction, library state of blocks that left); None does it here, after
        a wait. Returns False when a resize recognized as fitting no longer fits (nothing changed then)."""
        rt = self.rt
        desc, gp = job.desc, job.gp
        if job.in_place:
            return rt.graph is not None and try_in_place(self, desc, gp)
        old = rt.graph
        pointers = job.pointers
        if job.acquired and desc.kept and old is not None and old.plan.shared:
            self._carry_kept(old, gp, desc.kept, pointers)
        for (bid, name), sid in gp.device_scalars.items():
            host = np.array([desc.block(bid).value(name)], dtype=_dtypes.to_numpy(gp.buffers[sid].dtype))
            DeviceBuffer(pointers[sid], host.nbytes, api=rt.api).upload(host, rt.stream)
        keep = job.ids
        if later is None:
            self.retire(job.new, job.buffers, defer=True)  # (its modules are pruned once it is gone)
            self.delays.built(gp, desc, pointers, job.new_delays)  # frame-0 values of new or reconnected delays
            self.release_library_state(keep=set(keep))
            if old is None:
                rt.modules.prune(job.codes)
        else:  # the old graph's frames may still run: it, and what only it used, go once they are done
            rt.graph = job.new
            for key in job.unused:  # memory reused only by work queued after this on the engine's stream
                rt.pool.release(self.buffers[key])
            self.buffers = job.buffers
            self.delays.built(gp, desc, pointers, job.new_delays)
            gone = [(self.library_state.pop(k), self.library_teardown.pop(k, None))
                    for k in [k for k in self.library_state if k[0] not in keep]]
            rt.modules.prune(job.codes | self.codes)  # the old graph's: unloaded at the next swap, once it is gone
            if old is not None or gone:
                later(lambda: self._retire_later(old, gone))
        self.codes = set(job.codes)
        self.rebuilds += 1
        self.report_built(gp, keep, job.flagged)
        self._on_built()
        return True

    def report_built(self, gp, keep, flagged=None) -> None:
        """After a build is in: the blocks it kept lose the plan's and occupancy's old warnings, the new plan's
        warnings (and this build's occupancy warnings) are published, and a block that had an error or a
        warning and has none now recovers with an info diagnostic. ``flagged``: the blocks to look at (None:
        every block); shared by the one-device and the several-devices builds."""
        rt = self.rt
        was = {}
        for b in list(rt.blocks.values()) if flagged is None else flagged:
            if (b.state != "ok" or b.message or b._warnings) and b.id in keep and b.id in rt.blocks:
                was[b.id] = b.state
                b._warnings.pop("plan", None)
                b._warnings.pop("occupancy", None)
                b.state, b.message = ("warning", next(iter(b._warnings.values()))) if b._warnings else ("ok", "")
        if was or rt.reporter.state != "ok":
            rt.reporter.refresh()
        for w in gp.warnings:  # it planned, but probably not as meant: say so once per rebuild
            rt.reporter.warn(w.subject, w.message, rt.blocks.get(w.block) if w.block is not None else None,
                             source="plan")
        for subject, message, block in self._occupancy_warnings:
            rt.reporter.warn(subject, message, block, source="occupancy")
        for bid, state in was.items():  # a block that had an error or a warning and has none now
            b = rt.blocks[bid]
            if state in ("error", "warning") and b.state == "ok":
                b.state = state
                rt.reporter.recover(b, why="the rebuild succeeded")

    def _retire_later(self, old: CompiledGraph | None, gone: list) -> None:
        """Off the frame thread: wait for the frames queued so far, then free the old graph and the library
        state of blocks that left."""
        self.rt.synchronize()
        if old is not None:
            old.close()
        for state, teardown in gone:
            if teardown is not None:
                teardown(state)

    def _occupancy(self, gp, functions) -> None:
        """Theoretical occupancy of every kernel node (profiling per kernel): kept in ``rt.occupancy``, and a
        warning for each kernel below 25 %, naming the numbers and what raises it."""
        rt = self.rt
        per_sm = rt.device.max_threads_per_sm()
        rt.occupancy = {}
        self._occupancy_warnings = []
        for node in gp.nodes:
            n = kind_of(node).kernel_of(node)
            if n is None or any(isinstance(x, HandleArg) for x in n.args):  # (a condition kernel is ours)
                continue
            threads = n.launch.block[0] * n.launch.block[1] * n.launch.block[2]
            occ = occupancy(rt.api, functions[n.code_key], threads, n.launch.shared_mem, per_sm)
            rt.occupancy[(n.block, n.kernel)] = occ
            if occ < LOW_OCCUPANCY:  # published once the build is in (with the plan's warnings)
                self._occupancy_warnings.append((
                    n.label, f"{n.label}: theoretical occupancy {occ:.0%} ({threads} threads per block, "
                    f"{n.launch.shared_mem} bytes of dynamic shared memory): fewer warps than the SM could hold "
                    "hide less latency; use more threads per block, fewer registers (__launch_bounds__) or less "
                    "shared memory", rt.blocks.get(n.block)))

    def _carry_kept(self, old: CompiledGraph, gp, kept, pointers) -> None:
        """A kept port that shared memory in the running graph gets memory of its own in the new one: copy
        its value over where the shared memory still holds it (it was the last of its group to use it)."""
        rt, was = self.rt, old.plan
        for ref in kept:
            bid, old_bid = gp.port_buffers.get(ref), was.port_buffers.get(ref)
            if (bid is None or old_bid is None or old_bid not in was.storage or bid in gp.storage
                    or gp.buffers[bid].nbytes != was.buffers[old_bid].nbytes or not holds_own_value(was, old_bid)):
                continue
            copy_dtod_async(pointers[bid], old.pointers[old_bid], gp.buffers[bid].nbytes, rt.stream, api=rt.api)

    def retire(self, new: CompiledGraph | None, buffers: dict, defer: bool = False) -> None:
        """Make ``new`` the running graph; free the old one and the buffers it alone used. ``defer``: the old
        graph's destruction (``cuGraphExecDestroy``, ~0.4 ms for 1000 nodes on an H200), and then the unloading
        of the modules only it ran, wait in ``rt.after_launch`` for the next frame's launch, so that they overlap
        that frame on the GPU."""
        rt = self.rt
        old, rt.graph = rt.graph, new
        if old is not None:
            rt.synchronize()  # the old exec may be running; wait before its buffers go back to the pool
            if defer:
                rt.after_launch.append(lambda: self._gone(old))
            else:
                old.close()
        if not defer and rt.after_launch:
            rt.launched()
        for key, buf in self.buffers.items():
            if key not in buffers:
                rt.pool.release(buf)
        self.buffers = buffers
        if new is None:
            rt.modules.prune(set())

    def _gone(self, old: CompiledGraph) -> None:
        """Destroy a graph a rebuild replaced, then unload the modules that only it ran."""
        old.close()
        self.rt.modules.prune(self.codes)

    def release_library_state(self, keep: set[int]) -> None:
        """Tear down handles/plans/workspaces of calls whose block left (the old graph is already retired)."""
        for skey in [k for k in self.library_state if k[0] not in keep]:
            state = self.library_state.pop(skey)
            teardown = self.library_teardown.pop(skey, None)
            if teardown is not None:
                teardown(state)

    def capture(self, node: CallNodePlan, pointers, last: CaptureArgs | None = None,
                changed: Mapping[str, float | int] | None = None) -> tuple[object, CaptureArgs]:
        """Capture one library call node with ``pointers``. Its scalars: in a build, the plan's values (the
        plan was made from the current ones); captured again (``last``: the CaptureArgs it runs with), the
        drained values ``changed`` (parameter name -> value) and, for the others, those of the last capture.
        Never ``block.params``: a value set since the drain is the next frame's. One capture at a time: the
        preparation worker and the frame thread's recaptures share the capture stream and library handles."""
        with self._capturing:
            return self._capture(node, pointers, last, changed)

    def _capture(self, node: CallNodePlan, pointers, last: CaptureArgs | None,
                 changed: Mapping[str, float | int] | None) -> tuple[object, CaptureArgs]:
        rt = self.rt
        block = rt.blocks[node.block]
        spec = block.description.kernel(node.call)
        assert isinstance(spec, CallSpec)
        # per block and call: two blocks never share a workspace; a rebuild reuses the handles
        skey = (block.id, spec.name, spec.key)
        if skey not in self.library_state:
            setup: Any = spec.setup
            self.library_state[skey] = setup(rt.device.ordinal) if setup else None
            if spec.teardown:
                self.library_teardown[skey] = cast(Callable, spec.teardown)
        ptrs: dict[str, int] = {}
        values: dict[str, float | int] = {}
        for prm, arg in zip(spec.params, node.args, strict=True):
            if isinstance(arg, BufferArg):
                ptrs[prm.name] = pointers[arg.buffer]
            elif isinstance(arg, ScalarArg):
                if changed and arg.name is not None and arg.name in changed:
                    values[prm.name] = changed[arg.name]
                else:
                    values[prm.name] = last.values.get(prm.name, arg.value) if last is not None else arg.value
        args = CaptureArgs(int(rt.capture_stream), ptrs, values, self.library_state[skey])
        prepare = getattr(spec, "prepare", None)
        if prepare is not None:  # outside the capture: e.g. re-seeding a cuRAND generator
            prepare(args)
        return capture_graph(rt.capture_stream, cast(Callable, spec.record), args, api=rt.api), args

    def close(self) -> None:
        """Free the graph, the buffers and the library state (the caller waited for the GPU); a preparation
        in flight is waited for and thrown away."""
        self.prep.close()
        self.retire(None, {})
        if self.rt.devices is not None:
            _devbuild.release(self)
        self.release_library_state(keep=set())


def _group_sizes(was: tuple | None, members: tuple) -> tuple[tuple, list[int]]:
    """(``members``, the largest size in bytes among ``members[:i + 1]`` for each i): the last build's, ``was``,
    for the same group (by its first buffer), extended where it only grew at the end or cut where it only lost
    its last members, as a re-plan's groups mostly do (the chain's group with a block added or removed at the
    end: 0.44 ms for 500 members, recomputed)."""
    if was is not None:
        old, largest = was
        n = min(len(old), len(members))
        if old[:n] == members[:n]:
            if n == len(members):
                return members, largest[:n]
            return members, largest + list(accumulate(sizes_in_bytes(members[n:]), max, initial=largest[-1]))[1:]
    return members, list(accumulate(sizes_in_bytes(members), max))


def codes_in_use(gp: GraphPlan) -> set[str]:
    """The code keys a graph of plan ``gp`` runs (what the module cache keeps loaded)."""
    keys = {n.code_key for n in gp.nodes if isinstance(n, KernelNodePlan)}
    if gp.stamps is not None:
        keys.add(stamp_code().key)
    return keys


def runs_code(g: CompiledGraph, nid: int, key: str) -> None:
    """Kernel node ``nid`` of the running graph ``g`` runs the code ``key`` now (a Code-tier swap): its plan
    says so, so the plan stays the one place that tells which code each node runs."""
    was = g.plan.nodes[nid]
    assert isinstance(was, KernelNodePlan)
    node = was._replace(code_key=key)
    g.plan = attrs.evolve(g.plan, nodes=g.plan.nodes[:nid] + (node,) + g.plan.nodes[nid + 1:])
    local = getattr(g, "_local", None)
    if local is not None:  # several devices: the device's graph, its plan and node keep their own ids
        device_graph, lid = local(nid)
        runs_code(device_graph, lid, key)
        return
    g.nodes[nid].plan = node


def write_device_scalar(rt: Runtime, buffer_id: int, value) -> None:
    """A library scalar that lives in device memory (cuBLAS alpha/beta): one copy on the engine's stream."""
    g = rt.running()
    b = g.plan.buffers[buffer_id]
    host = np.array([value], dtype=_dtypes.to_numpy(b.dtype))
    # pageable HtoD is staged before the call returns, so `host` may go; stream order puts it before the launch
    copy_htod_async(g.pointers[buffer_id], host.ctypes.data, host.nbytes, rt.stream, api=rt.api)
