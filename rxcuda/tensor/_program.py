"""The runner: a plan made runnable once (:class:`Program`), each group on its device's backend (the CPU
backend's functions from ``_cpu``, the CUDA backend's kernels from ``_cuda``; a copy between host and device on
the CUDA backend), its values moving through slots, its results going into the result cache.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._cache import ResultCache, Stats, key
from ._cpu import compile_group, leaf_value
from ._cuda import backend
from ._graph import Node
from ._passes import Plan


def leaf_versions(leaves: tuple[Node, ...]) -> list[tuple[int, int]]:
    """(serial, version) of each leaf's buffer: with a node's ``sid``, the parts of its result key."""
    return [(leaf.attrs[0].serial, leaf.attrs[0].version) for leaf in leaves]


class Program:
    """A plan made runnable once: every group's function (NumPy here; a CUDA group's kernel is resolved on its
    first run and kept), the slots its values move through, and what goes into the result cache.

    The same ``Program`` runs every later evaluation of a program with the same structure (equal ``Node.sid`` of
    the outputs, the same leaves aliasing the same buffers, the same passes): ``run`` takes only the new
    leaves' arrays, so a repeat costs the launches and not the passes. ``leaf_slots[k]`` receives leaf ``k`` of
    the request (``Node.leaves`` order of the outputs, merged); fills and cached values are fixed at build.
    """

    __slots__ = ("steps", "nslots", "fixed", "leaf_slots", "out_slots", "puts", "cuda", "launches", "views",
                 "nodes", "known_slots")

    def __init__(self, plan: Plan, leaves: tuple[Node, ...], known_values: dict[Node, object] | None = None):
        slot: dict[Node, int] = {}

        def at(n: Node) -> int:
            if n not in slot:
                slot[n] = len(slot)
            return slot[n]

        self.cuda = None
        for n in plan.nodes:
            if n.device == "cuda" and n not in plan.known:
                self.cuda = backend(n)
                break
        position = {id(leaf): k for k, leaf in enumerate(leaves)}
        self.fixed: list[tuple[int, object]] = []
        self.leaf_slots: list[tuple[int, int]] = []
        self.known_slots: list[tuple[int, Node]] = []
        for n in plan.nodes:
            if n in plan.known:
                self.known_slots.append((at(n), n))
            elif n.op == "const":
                self.leaf_slots.append((position[id(n)], at(n)))
            elif n.op == "full":
                self.fixed.append((at(n), leaf_value(n) if n.device == "cpu" else self.cuda.leaf_value(n)))
        self.steps: list[tuple[Callable[[list], list], list[int], list[int]]] = []
        self.puts: list[tuple[int, int, tuple[int, ...]]] = []  # (slot, sid, the leaves it reads)
        self.launches = self.views = self.nodes = 0
        for g in plan.groups:
            if g.kind == "copy":  # host <-> device: the CUDA backend, whichever side the result is on
                run = backend(g.nodes[0]).compile_group(g, plan)
            else:
                run = compile_group(g, plan) if g.nodes[0].device == "cpu" else self.cuda.compile_group(g, plan)
            self.steps.append((run, [at(i) for i in g.inputs], [at(o) for o in g.outputs]))
            if g.kind == "view":
                self.views += 1
            else:
                self.launches += 1
            self.nodes += len(g.nodes)
            if g.kind == "view":
                continue  # a view costs nothing to make again: caching it would only make plans differ
            for o in g.outputs:
                self.puts.append((at(o), o.sid, tuple(position[id(leaf)] for leaf in o.leaves)))
        self.out_slots = [at(o) for o in plan.outputs]
        self.nslots = len(slot)

    def run(self, leaves: tuple[Node, ...], cache: ResultCache | None, stats: Stats,
            versions: list | None = None) -> list:
        """The outputs' values for ``leaves`` (the request's leaves, at the positions this program was built
        for); every group output goes into ``cache``."""
        env: list = [None] * self.nslots
        for k, value in self.fixed:
            env[k] = value
        for k, s in self.leaf_slots:
            env[s] = leaves[k].attrs[0].array if self.cuda is None or leaves[k].device == "cpu" \
                else self.cuda.leaf_value(leaves[k])
        for s, n in self.known_slots:
            env[s] = cache.get(key(n)) if cache is not None else None
        for run, ins, outs in self.steps:
            for s, v in zip(outs, run([env[i] for i in ins]), strict=True):
                if type(v) is np.ndarray and v.flags.writeable:
                    v = v.view()
                    v.flags.writeable = False  # cached results are shared: nobody writes them in place
                env[s] = v
        stats.launches += self.launches
        stats.views += self.views
        stats.nodes += self.nodes
        if cache is not None:
            versions = versions or leaf_versions(leaves)
            for s, sid, reads in self.puts:
                cache.put((sid, tuple(versions[k] for k in reads)), env[s])
        if self.cuda is None:
            return [env[s] for s in self.out_slots]
        return [self.cuda.array(env[s]) for s in self.out_slots]

    def run_arrays(self, arrays: list, stats: Stats, keep: list | None = None) -> list:
        """The outputs for the leaf ``arrays`` (one per leaf, in this program's leaf order), outside the result
        cache: how ``rxcuda.tensor.function`` replays a trace. ``keep`` (a list) receives every value made, so a
        CUDA graph captured from this run keeps its buffers alive."""
        env: list = [None] * self.nslots
        for k, value in self.fixed:
            env[k] = value
        for k, s in self.leaf_slots:
            env[s] = arrays[k]
        for run, ins, outs in self.steps:
            for s, v in zip(outs, run([env[i] for i in ins]), strict=True):
                env[s] = v
        stats.launches += self.launches
        stats.views += self.views
        stats.nodes += self.nodes
        if keep is not None:
            keep.extend(env)
        if self.cuda is None:
            return [env[s] for s in self.out_slots]
        return [self.cuda.array(env[s]) for s in self.out_slots]

    def cached_any(self, versions: list, cache: ResultCache) -> bool:
        """Whether ``cache`` holds any value this program computes from these leaves (a plan that skips it
        would do less). Values that read no leaf (constants, such as a gradient's seed) do not count: they are
        cheap, and they would send every repeat back to the passes."""
        return any((sid, tuple(versions[k] for k in reads)) in cache for _, sid, reads in self.puts if reads)


def evaluate(plan: Plan, leaves: tuple[Node, ...], cache: ResultCache | None, stats: Stats) -> tuple[Program, list]:
    """Run ``plan`` (for a request whose merged leaves are ``leaves``): the :class:`Program` made from it and the
    outputs' values (NumPy on cpu, CuPy on cuda). A group runs on the backend of its device (a copy's: the
    target's)."""
    program = Program(plan, leaves)
    return program, program.run(leaves, cache, stats)
