"""The CPU backend: NumPy runs a plan, one Python function per group (the CUDA backend, ``_cuda.py``, compiles
the same groups into one kernel each). The results are NumPy's own, bit for bit: each op is the NumPy function of
the same name, with NumPy's floating-point warnings off (a program computes the same IEEE values on either backend
and warns on neither: the warning would come at evaluation, far from the op that was written). :func:`evaluate`
walks the plan for both backends, giving each group to its device's backend.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._cache import ResultCache, Stats, key
from ._graph import Node
from ._ops import REDUCERS, UFUNCS, index_of
from ._passes import Group, Plan


def leaf_value(node: Node):
    if node.op == "const":
        return node.attrs[0].array
    return np.broadcast_to(np.asarray(node.attrs[0], node.dtype), node.shape)  # a read-only view, no copy


def run_op(node: Node, args: list, xp=np):
    """One op over arrays of ``xp`` (NumPy, or CuPy for the CUDA backend's op-by-op path)."""
    op = node.op
    if op in UFUNCS:
        out = UFUNCS[op](*args)
    elif op == "where":
        out = np.where(*args)
    elif op == "cast":
        out = args[0].astype(node.attrs[0])
    elif op in REDUCERS:
        axes, keepdims = node.attrs
        out = REDUCERS[op](args[0], axis=axes, keepdims=keepdims)
    elif op == "reshape":
        out = xp.reshape(args[0], node.attrs[0])
    elif op == "transpose":
        out = xp.transpose(args[0], node.attrs[0])
    elif op == "broadcast_to":
        out = xp.broadcast_to(args[0], node.attrs[0])
    elif op == "getitem":
        out = args[0][index_of(node.attrs[0])]
    elif op == "matmul":
        out = xp.matmul(*args)
    elif op == "copy":
        from ._cuda import backend

        out = backend(node).copy(node, args[0])
    else:  # pragma: no cover - every op of OPS is above
        raise NotImplementedError(f"the CPU backend has no op {op!r}")
    out = xp.asarray(out)
    if out.dtype != node.dtype:  # NumPy scalars of reductions over no axes, for one
        out = out.astype(node.dtype)
    return out


def compile_group(group: Group, plan: Plan, xp=np) -> Callable[[list], list]:
    """One Python function that runs the whole group: its inputs' arrays in, its outputs' arrays out (``xp``:
    the array module, NumPy here; the CUDA backend passes CuPy for a group it runs op by op)."""
    slots = {n: k for k, n in enumerate(group.inputs)}
    steps = []
    for n in group.nodes:
        slots[n] = len(slots)
        steps.append((n, [slots[i] for i in plan.inputs_of(n)]))
    outs = [slots[n] for n in group.outputs]

    def run(inputs: list) -> list:
        env = list(inputs)
        with np.errstate(all="ignore"):  # IEEE results (log(0) = -inf), no warnings: as the CUDA backend gives
            for node, args in steps:
                env.append(run_op(node, [env[a] for a in args], xp))
        return [env[k] for k in outs]

    return run


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
                from ._cuda import backend

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
