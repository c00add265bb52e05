"""Structural IRs of tensor programs for the generator tests (C++, PTX, the factory), without a GPU."""

import numpy as np

from rxcuda.tensor import _ir
from rxcuda.tensor._cpu import leaf_value
from rxcuda.tensor._passes import plan


def irs(*tensors):
    """(group kind, IR) for each group of the plan; inputs that groups compute are contiguous arrays."""
    p = plan([t.node for t in tensors])
    out = []
    for g in p.groups:
        values = [leaf_value(i) if i.op in ("const", "full") else np.empty(i.shape, i.dtype) for i in g.inputs]
        out.append((g.kind, _ir.group_ir(g, p, values)))
    return out
