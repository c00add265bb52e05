"""The CPU backend: NumPy runs a plan, one Python function per group (what the CUDA backend will compile
into one kernel). The results are NumPy's own, bit for bit: each op is the NumPy function of the same name.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._cache import ResultCache, Stats
from ._graph import Node
from ._ops import REDUCERS, UFUNCS, index_of
from ._passes import Group, Plan


class CudaNotBuiltError(NotImplementedError):
    """A node on ``cuda`` was asked for: the CUDA backend is not built yet."""


def cuda_not_built(node: Node) -> CudaNotBuiltError:
    return CudaNotBuiltError(
        f"the CUDA backend is not built yet: this program has a {node.op} node {node.shape} on 'cuda', and "
        "today only the CPU backend (NumPy) evaluates tensor programs. Build the program on 'cpu' (the default) "
        "to run it; explain() shows the plan a CUDA backend will compile")


def leaf_value(node: Node):
    if node.op == "const":
        return node.attrs[0].array
    return np.broadcast_to(np.asarray(node.attrs[0], node.dtype), node.shape)  # a read-only view, no copy


def run_op(node: Node, args: list):
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
        out = np.reshape(args[0], node.attrs[0])
    elif op == "transpose":
        out = np.transpose(args[0], node.attrs[0])
    elif op == "broadcast_to":
        out = np.broadcast_to(args[0], node.attrs[0])
    elif op == "getitem":
        out = args[0][index_of(node.attrs[0])]
    elif op == "matmul":
        out = np.matmul(*args)
    elif op == "copy":
        raise cuda_not_built(node)
    else:  # pragma: no cover - every op of OPS is above
        raise NotImplementedError(f"the CPU backend has no op {op!r}")
    out = np.asarray(out)
    if out.dtype != node.dtype:  # NumPy scalars of reductions over no axes, for one
        out = out.astype(node.dtype)
    return out


def compile_group(group: Group, plan: Plan) -> Callable[[list], list]:
    """One Python function that runs the whole group: its inputs' arrays in, its outputs' arrays out."""
    slots = {n: k for k, n in enumerate(group.inputs)}
    steps = []
    for n in group.nodes:
        slots[n] = len(slots)
        steps.append((n, [slots[i] for i in plan.inputs_of(n)]))
    outs = [slots[n] for n in group.outputs]

    def run(inputs: list) -> list:
        env = list(inputs)
        for node, args in steps:
            env.append(run_op(node, [env[a] for a in args]))
        return [env[k] for k in outs]

    return run


def evaluate(plan: Plan, keys: dict, cache: ResultCache | None, stats: Stats) -> dict[Node, object]:
    """Run ``plan`` and return the outputs' arrays; every group output goes into ``cache``."""
    for n in plan.nodes:
        if n.device != "cpu" and n not in plan.known:
            raise cuda_not_built(n)
    values: dict[Node, object] = {}
    for n in plan.nodes:
        if n in plan.known:
            values[n] = cache.get(keys[n]) if cache is not None else None
        elif n.op in ("const", "full"):
            values[n] = leaf_value(n)
    for g in plan.groups:
        results = compile_group(g, plan)([values[i] for i in g.inputs])
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
    return {o: values[o] for o in plan.outputs}
