"""The result cache: a realized result keyed by the structure of the graph that computes it and by its inputs'
identity and versions, so evaluating the same program again with unchanged inputs runs nothing, and a changed
input invalidates exactly the results that depend on it.

A node's key is its structural id (``Node.sid``: op, attributes, shape, dtype, device and the same of everything
below it, interned when the node is made) with the buffer serial number and version of each ``const`` leaf it
reads (``Node.leaves``): equal keys compute equal values. Buffers a tensor owns bump their version on every
write through rxcuda; arrays from outside count as changed at every evaluation (:func:`touch_outside`) unless
marked unchanged, so a result is never stale.

>>> import numpy as np
>>> from ._ops import full
>>> a, b = full((2,), 1.0, np.float32, "cpu"), full((2,), 1.0, np.float32, "cpu")
>>> k = keys([a, b])
>>> k[a] == k[b]
True
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import attrs

from ._graph import Node


def key(node: Node) -> tuple:
    """``node``'s result key: its structural id and the (serial, version) of each leaf it reads."""
    return (node.sid, tuple((leaf.attrs[0].serial, leaf.attrs[0].version) for leaf in node.leaves))


def keys(nodes: Iterable[Node]) -> dict[Node, tuple]:
    """Each node's result key (:func:`key`)."""
    return {n: key(n) for n in nodes}


def touch_outside(nodes: Iterable[Node]) -> None:
    """Count every outside array among ``nodes`` as changed (each once), unless it is marked unchanged."""
    seen = set()
    for n in nodes:
        if n.op == "const":
            buf = n.attrs[0]
            if not buf.owned and not buf.unchanged and buf.serial not in seen:
                seen.add(buf.serial)
                buf.bump()


@attrs.define
class Stats:
    """What evaluations did since the last reset: ``evaluations`` (realize calls that needed something),
    ``launches`` (groups run, a kernel each on a GPU; views excluded), ``views`` (view groups: no launch),
    ``nodes`` (ops computed), ``hits`` (requested results the cache already had) and ``plans`` (evaluations that
    ran the passes: a structure not seen before; a repeat over new arrays reuses its runnable program). On CUDA,
    ``compiles`` counts the kernels the CUDA backend made for a group structure it had not seen (each PTX written
    from the IR, or an NVRTC build where PTX does not cover the group; a structure seen before is a lookup), and
    ``upgrades`` the tuned NVRTC builds that replaced such a first kernel (see ``wait_compiled``).

    >>> import numpy as np, rxcuda.tensor as rt
    >>> rt.reset_stats()
    >>> _ = (rt.tensor(np.ones(3)) * 2).numpy()
    >>> s = rt.stats()
    >>> (s.evaluations, s.launches, s.compiles)  # on the CPU backend nothing is compiled
    (1, 1, 0)
    """

    evaluations: int = 0
    launches: int = 0
    views: int = 0
    nodes: int = 0
    hits: int = 0
    plans: int = 0
    compiles: int = 0
    upgrades: int = 0


STATS = Stats()
"""The process's counters (``rxcuda.tensor.stats()`` reports a copy): evaluations count into them, and so does
the CUDA backend's kernel factory."""


class ResultCache:
    """Results by key, least recently used dropped first once they hold more than ``limit`` bytes."""

    def __init__(self, limit: int = 512 << 20):
        self.limit = limit
        self.bytes = 0
        self._items: OrderedDict[tuple, object] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key) -> bool:
        return key in self._items

    def get(self, key):
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key, value) -> None:
        if key in self._items:
            return
        size = int(getattr(value, "nbytes", 0))
        if size > self.limit:
            return
        self._items[key] = value
        self.bytes += size
        while self.bytes > self.limit:
            _, old = self._items.popitem(last=False)
            self.bytes -= int(getattr(old, "nbytes", 0))

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
