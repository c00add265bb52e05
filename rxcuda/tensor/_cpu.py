"""The CPU backend: NumPy runs a plan, one Python function per group (the CUDA backend, ``_cuda.py``, compiles
the same groups into one kernel each). The results are NumPy's own, bit for bit: each op is the NumPy function of
the same name. :func:`evaluate` walks the plan for both backends, giving each group to its device's backend.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._cache import ResultCache, Stats
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
        for node, args in steps:
            env.append(run_op(node, [env[a] for a in args], xp))
        return [env[k] for k in outs]

    return run


def evaluate(plan: Plan, keys: dict, cache: ResultCache | None, stats: Stats) -> dict[Node, object]:
    """Run ``plan`` and return the outputs' arrays (NumPy on cpu, CuPy on cuda); every group output goes into
    ``cache``. A group runs on the backend of its device (a copy's: the target's)."""
    cuda = None
    for n in plan.nodes:
        if n.device == "cuda" and n not in plan.known:
            from ._cuda import backend

            cuda = backend(n)
            break
    values: dict[Node, object] = {}
    for n in plan.nodes:
        if n in plan.known:
            values[n] = cache.get(keys[n]) if cache is not None else None
        elif n.op in ("const", "full"):
            values[n] = leaf_value(n) if n.device == "cpu" else cuda.leaf_value(n)
    for g in plan.groups:
        run = compile_group(g, plan) if g.nodes[0].device == "cpu" else cuda.compile_group(g, plan)
        results = run([values[i] for i in g.inputs])
        if g.kind == "view":
            stats.views += 1
        else:
            stats.launches += 1
        stats.nodes += len(g.nodes)
        for n, v in zip(g.outputs, results, strict=True):
            if isinstance(v, np.ndarray) and v.flags.writeable:
                v = v.view()
                v.flags.writeable = False  # cached results are shared: nobody writes them in place
            values[n] = v
            if cache is not None:
                cache.put(keys[n], v)
    return {o: values[o] if cuda is None else cuda.array(values[o]) for o in plan.outputs}
