"""The CPU backend: NumPy runs a plan, one Python function per group (the CUDA backend, ``_cuda.py``, compiles
the same groups into one kernel each). The results are NumPy's own, bit for bit: each op is the NumPy function of
the same name, with NumPy's floating-point warnings off (a program computes the same IEEE values on either backend
and warns on neither: the warning would come at evaluation, far from the op that was written). The runner,
``_program.Program``, walks a plan for both backends, giving each group to its device's backend.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._graph import Node
from ._ops import REDUCERS, UFUNCS, index_of
from ._passes import Group, Plan

EXTRA: dict[str, Callable] = {}
"""Ops defined outside the core table (``_numpy``: argmax, cumsum, concatenate...): ``f(node, args, xp)``."""


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
    elif op in EXTRA:
        out = EXTRA[op](node, args, xp)
    else:  # a copy group runs on the CUDA backend (``Backend.copy``: one side of it is on cuda)
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
