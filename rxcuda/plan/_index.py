"""The pipeline, indexed for checking one change at a time.

``plan()`` validates a whole description; an engine that is told one connection at a time must not: on a
1000-block chain that made declaring the pipeline quadratic (28.6 s). A :class:`PipelineIndex` keeps the
blocks (their names and ports), the connections, each input's source and the block adjacency, so that a new
connection is checked in time proportional to what it touches: its two blocks' ports, and for a cycle the
blocks downstream of its target. The messages are the planner's own (``check_connection``, ``cycle_message``).
"""

from __future__ import annotations

from ..model._describe import BlockDescription, Connection, PortRef
from ..model._errors import ValidationError
from ._checks import check_connection
from ._order import cycle_message


class PipelineIndex:
    """Blocks, connections and bound inputs of a pipeline, kept up to date one change at a time.

    Every method costs what the change touches, not what the pipeline holds. A refused change raises
    ValidationError and leaves the index as it was. Not thread-safe: an engine calls it under its model lock.
    It reads only a block's name and ports, which a block keeps for as long as it is in the pipeline.

    >>> from rxcuda.lowlevel import BlockDescription, Connection, Pin, PortRef, PortSpec
    >>> def block(name):
    ...     return BlockDescription(name, ports=(PortSpec("x", "in", "f32", 16, (Pin("k", 0),)),
    ...                                          PortSpec("out", "out", "f32", 16, (Pin("k", 1),))))
    >>> index = PipelineIndex()
    >>> index.add_block(1, block("first")); index.add_block(2, block("second"))
    >>> index.add_connection(Connection(PortRef(1, "out"), PortRef(2, "x")))
    >>> index.add_connection(Connection(PortRef(2, "out"), PortRef(1, "x")))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rxcuda.model._errors.ValidationError: the connections form a cycle through blocks first, second; ...
    >>> index.connections
    (Connection(src=PortRef(block=1, port='out'), dst=PortRef(block=2, port='x')),)
    """

    def __init__(self) -> None:
        self._blocks: dict[int, BlockDescription] = {}
        self._names: dict[str, int] = {}
        self._next_suffix: dict[str, int] = {}  # where free_name resumes looking, per base name
        self._connections: dict[Connection, None] = {}  # insertion order
        self._sources: dict[PortRef, PortRef] = {}  # input -> the output feeding it
        self._touching: dict[int, dict[Connection, None]] = {}  # block -> connections at either end
        self._succ: dict[int, dict[int, int]] = {}  # block -> downstream block -> number of connections
        self._pred: dict[int, dict[int, int]] = {}  # block -> upstream block -> number of connections
        self._bound: dict[int, set[str]] = {}  # block -> its inputs bound to user arrays

    # -- blocks ------------------------------------------------------------------------------------------
    def free_name(self, name: str) -> str:
        """``name`` if no block has it, else the first free ``name_2``, ``name_3``, ... (amortized O(1))."""
        if name not in self._names:
            return name
        i = self._next_suffix.get(name, 2)
        while f"{name}_{i}" in self._names:
            i += 1
        self._next_suffix[name] = i + 1
        return f"{name}_{i}"

    def add_block(self, block_id: int, desc: BlockDescription) -> None:
        """Add a block. Refuses an id or a name already in the pipeline (``free_name`` finds a free name)."""
        if block_id in self._blocks:
            raise ValidationError(f"block '{desc.name}' (id {block_id}) appears twice in the pipeline; a block is "
                                  "added once (create another Block for a second copy)", subject=desc.name)
        other = self._names.get(desc.name)
        if other is not None:
            raise ValidationError(f"two blocks are named '{desc.name}' (ids {other} and {block_id}); give each "
                                  "block its own name", subject=desc.name)
        self._blocks[block_id] = desc
        self._names[desc.name] = block_id
        self._touching[block_id] = {}
        self._succ[block_id] = {}
        self._pred[block_id] = {}

    def remove_block(self, block_id: int) -> tuple[Connection, ...]:
        """Remove a block with its connections and bindings; returns the connections removed."""
        desc = self._blocks.pop(block_id)
        del self._names[desc.name]
        removed = tuple(self._touching[block_id])
        for c in removed:
            self._forget(c)
        del self._touching[block_id], self._succ[block_id], self._pred[block_id]
        self._bound.pop(block_id, None)
        return removed

    def __len__(self) -> int:
        return len(self._blocks)

    # -- connections -------------------------------------------------------------------------------------
    @property
    def connections(self) -> tuple[Connection, ...]:
        """Every connection, in the order they were added."""
        return tuple(self._connections)

    def source(self, dst: PortRef) -> PortRef | None:
        """The output connected to input ``dst``, or None."""
        return self._sources.get(dst)

    def check_connection(self, conn: Connection) -> None:
        """Raise ValidationError if ``conn`` cannot be added: a block or port missing, the wrong direction,
        different dtypes or sizes, an input already connected or bound, or a cycle. Changes nothing."""
        check_connection(conn, self._blocks, self._sources, _BoundView(self._bound))
        names = [] if conn.delay else self._cycle(conn.src.block, conn.dst.block)  # a delay closes no cycle
        if names:
            raise ValidationError(cycle_message(names), subject=names[0])

    def add_connection(self, conn: Connection) -> None:
        """Check ``conn`` (see :meth:`check_connection`) and add it."""
        self.check_connection(conn)
        s, d = conn.src.block, conn.dst.block
        self._connections[conn] = None
        self._sources[conn.dst] = conn.src
        self._touching[s][conn] = None
        self._touching[d][conn] = None
        if conn.delay:  # it orders no blocks: the adjacency (for cycles) leaves it out
            return
        self._succ[s][d] = self._succ[s].get(d, 0) + 1
        self._pred[d][s] = self._pred[d].get(s, 0) + 1

    def remove_connection(self, conn: Connection) -> bool:
        """Remove ``conn``; False (and nothing changes) when it is not in the pipeline."""
        if conn not in self._connections:
            return False
        self._forget(conn)
        return True

    def _forget(self, conn: Connection) -> None:
        s, d = conn.src.block, conn.dst.block
        del self._connections[conn]
        del self._sources[conn.dst]
        self._touching[s].pop(conn, None)
        self._touching[d].pop(conn, None)
        if conn.delay:
            return
        for adj, a, b in ((self._succ, s, d), (self._pred, d, s)):
            left = adj[a][b] - 1
            if left:
                adj[a][b] = left
            else:
                del adj[a][b]

    def _cycle(self, src: int, dst: int) -> list[str]:
        """Names (sorted) of the blocks a new edge src -> dst would put on a cycle; [] when it makes none.

        The index holds no cycle, so every cycle the edge makes passes through it: its blocks are those
        reachable from dst that reach src. The search from dst stops as soon as it meets src."""
        if src == dst:
            return [self._blocks[src].name]
        succ = self._succ
        seen, stack = {dst}, [dst]
        while stack:
            for nxt in succ[stack.pop()]:
                if nxt == src:
                    return self._cycle_members(src, dst)
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return []

    def _cycle_members(self, src: int, dst: int) -> list[str]:
        downstream = self._reach(dst, self._succ)
        upstream = self._reach(src, self._pred)
        return sorted(self._blocks[b].name for b in downstream & upstream)

    @staticmethod
    def _reach(start: int, adj: dict[int, dict[int, int]]) -> set[int]:
        seen, stack = {start}, [start]
        while stack:
            for nxt in adj[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    # -- bindings ----------------------------------------------------------------------------------------
    def bind(self, ref: PortRef) -> None:
        """Record that ``ref`` holds a user array (a connection into it is then refused)."""
        self._bound.setdefault(ref.block, set()).add(ref.port)

    def unbind(self, ref: PortRef) -> None:
        ports = self._bound.get(ref.block)
        if ports is not None:
            ports.discard(ref.port)


class _BoundView:
    """``ref in view`` over the index's bound ports, for check_connection."""

    __slots__ = ("_bound",)

    def __init__(self, bound: dict[int, set[str]]):
        self._bound = bound

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, PortRef) and ref.port in self._bound.get(ref.block, ())
