"""Placement, pure: which worker holds which block, and the fragment each worker builds.

A distributed pipeline is one :class:`~rxcuda.lowlevel.PipelineDescription` plus a placement (block id ->
worker name). :func:`split` cuts it into one :class:`Fragment` per worker (the blocks placed there, the
connections between them, the inputs the user feeds) and a :class:`RemoteLink` per connection that crosses
workers, with the transport that carries it every frame: ``"ipc"`` (CUDA IPC: exported device memory and an
interprocess event, both workers on GPUs of one host; asked for between two null-driver workers of one host, the
same handshake with the bytes in shared memory) or ``"host"`` (through pinned host memory: a shared-memory board
on one host, Ray's object store across hosts; where a worker runs the null driver, or asked for).
:func:`frame_steps` says which workers a frame steps and which
producers' results each takes as arguments. Nothing here imports Ray or CUDA.

>>> from rxcuda.distributed import Worker
>>> workers = check_workers({"a": Worker(null=True), "b": Worker(null=True)})
>>> sorted(workers), workers["a"].ray_options()["num_gpus"]
(['a', 'b'], 0)
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping

import attrs

from ..model import _dtypes
from ..model._describe import KernelSpec, PipelineDescription, PortRef
from ..model._errors import ValidationError

TRANSPORTS = ("auto", "ipc", "host")


def _check_gpus(_self, _attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) <= 1:
        raise ValueError(f"'num_gpus' must be a number from 0 to 1 (got {value!r}): a worker holds one Engine on "
                         "one GPU, and a fraction (0.5) lets two workers share a GPU")


def _check_count(_self, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or float(value) < 0:
        raise ValueError(f"'{attribute.name}' must be a non-negative number (got {value!r})")


@attrs.frozen
class Worker:
    """What a worker asks Ray for: a share of one GPU (``num_gpus``, 1 by default; 0.5 lets two workers share
    one), CPUs, optionally a Ray node (its node id, or its IP address) to run on, and how often Ray restarts it
    when it dies (``max_restarts``). ``null=True`` runs the worker's engine on the null driver (no GPU: tests,
    CI, trying a pipeline's wiring on a laptop); ``cpu=True`` on the CPU device (docs/cpu.md: no GPU, kernels run
    on the CPU with real numbers: tests, CI). Neither asks Ray for a GPU; their ``ipc`` links carry the bytes in
    a shared-memory board.

    >>> Worker(num_gpus=0.5)
    Worker(num_gpus=0.5, num_cpus=0, node=None, null=False, cpu=False, max_restarts=3)
    >>> Worker(num_gpus=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Worker(num_gpus=0) has no GPU for its Engine; give num_gpus above 0 (0.5 shares a GPU), null=True ...
    """

    num_gpus: float = attrs.field(default=1, validator=_check_gpus)
    num_cpus: float = attrs.field(default=0, validator=_check_count)
    node: str | None = None
    null: bool = False
    cpu: bool = False
    max_restarts: int = attrs.field(default=3, validator=_check_count)

    def __attrs_post_init__(self):
        if self.null and self.cpu:
            raise ValueError("Worker(null=True, cpu=True): a worker runs the null driver or the CPU device, not both; "
                             "give one")
        if not self.gpuless and self.num_gpus == 0:
            raise ValueError("Worker(num_gpus=0) has no GPU for its Engine; give num_gpus above 0 (0.5 shares a "
                             "GPU), null=True for the null driver, or cpu=True for the CPU device")
        if self.node is not None and (not isinstance(self.node, str) or not self.node):
            raise ValueError(f"'node' must be a Ray node id or a node's IP address (got {self.node!r})")

    @property
    def gpuless(self) -> bool:
        """Whether the worker holds no GPU: it runs the null driver or the CPU device."""
        return self.null or self.cpu

    def ray_options(self) -> dict:
        """The options of the worker's Ray actor: resources, placement on a node, restarts."""
        opts: dict = {"num_gpus": 0 if self.gpuless else self.num_gpus, "num_cpus": self.num_cpus,
                      "max_restarts": int(self.max_restarts), "max_task_retries": 0}
        if self.node is not None:
            if _looks_like_ip(self.node):  # Ray gives every node a resource "node:<ip>"
                opts["resources"] = {f"node:{self.node}": 0.001}
            else:
                opts["node_id"] = self.node  # turned into a NodeAffinitySchedulingStrategy by the caller
        return opts


def _looks_like_ip(node: str) -> bool:
    parts = node.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts)


def check_workers(workers) -> dict[str, Worker]:
    """The workers by name, from an int (that many GPU workers ``w0``, ``w1``, ...), names (one GPU each), or a
    mapping name -> :class:`Worker`."""
    if isinstance(workers, bool):
        raise TypeError(f"'workers' takes a count, names, or a mapping name -> Worker (got {workers!r})")
    if isinstance(workers, int):
        if workers <= 0:
            raise ValueError(f"'workers' must be at least 1 (got {workers})")
        return {f"w{i}": Worker() for i in range(workers)}
    if isinstance(workers, Mapping):
        out = {}
        for name, w in workers.items():
            _check_name(name)
            if not isinstance(w, Worker):
                raise TypeError(f"workers['{name}'] must be a rxcuda.distributed.Worker (got {type(w).__name__})")
            out[name] = w
    elif isinstance(workers, list | tuple):
        out = {}
        for name in workers:
            _check_name(name)
            if name in out:
                raise ValueError(f"worker '{name}' is named twice in 'workers'")
            out[name] = Worker()
    else:
        raise TypeError(f"'workers' takes a count, names, or a mapping name -> Worker (got {type(workers).__name__})")
    if not out:
        raise ValueError("'workers' names no worker; give at least one")
    return out


def _check_name(name) -> None:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_" for c in name):
        raise ValueError(f"a worker's name is a non-empty str of letters, digits, '-' and '_' (got {name!r})")


def check_worker(name, workers: Mapping[str, Worker]) -> str:
    """``name`` if it is one of the workers; a ValidationError with a *did you mean* otherwise."""
    if name in workers:
        return name
    msg = f"no worker named {name!r} (workers: {', '.join(workers)})"
    same_case = [w for w in workers if w.lower() == str(name).lower()]
    close = same_case or difflib.get_close_matches(str(name), list(workers), n=1)
    if close:
        msg += f"; did you mean '{close[0]}'?"
    raise ValidationError(msg, subject=str(name))


@attrs.frozen
class RemoteLink:
    """A connection between blocks on two workers, carried every frame by ``transport`` (``"ipc"`` or
    ``"host"``). ``label`` reads ``"src.port -> dst.port"``; ``nbytes`` is what one frame moves. ``via``: where
    the two ends meet, ``"board"`` (a shared-memory board on one host: both steps run at once, no Ray call) or
    ``"store"`` (Ray's object store: the consumer's step takes the producer's result, so Ray runs it after);
    ``why``: why this transport was chosen."""

    src_worker: str
    src: PortRef
    dst_worker: str
    dst: PortRef
    transport: str
    label: str
    nbytes: int
    via: str = "board"
    why: str = ""


@attrs.frozen
class Fragment:
    """The part of the pipeline one worker builds: its blocks, the connections between them and which inputs
    are fed from the host (by the user, or by a ``host`` link), as a :class:`PipelineDescription`; the links
    that feed it (``imports``) and those it feeds (``exports``)."""

    worker: str
    description: PipelineDescription
    imports: tuple[RemoteLink, ...] = ()
    exports: tuple[RemoteLink, ...] = ()

    @property
    def block_names(self) -> tuple[str, ...]:
        return tuple(b.desc.name for b in self.description.blocks)


@attrs.frozen
class Split:
    """A pipeline cut into fragments: one per worker (empty where nothing is placed), every link between them,
    and the order frames visit the workers in (producers before their consumers)."""

    fragments: Mapping[str, Fragment]
    links: tuple[RemoteLink, ...]
    order: tuple[str, ...]


def split(desc: PipelineDescription, placement: Mapping[int, str], workers: Mapping[str, Worker], *,
          nodes: Mapping[str, str | None] | None = None, transports: Mapping[tuple, str] | None = None,
          offered: tuple[str, ...] = ()) -> Split:
    """Cut ``desc`` into one :class:`Fragment` per worker of ``workers`` following ``placement`` (block id ->
    worker). ``nodes`` (worker -> Ray node id, where known) decides where a link can be CUDA IPC and where a
    ``host`` link meets on a board; ``transports`` asks for one per connection ((src PortRef, dst PortRef) ->
    ``"auto"``, ``"ipc"`` or ``"host"``); ``offered``: the GPU transports Ray offers between actors (Ray Direct
    Transport, ``_ray.direct_transports``), named in a link's ``why``.

    Every problem found is reported at once in one ValidationError: a block placed nowhere or on an unknown
    worker, a delayed connection or a region across workers, workers whose links form a circle, IPC asked for
    where it cannot work."""
    nodes = dict(nodes or {})
    transports = dict(transports or {})
    problems: list[str] = []
    names = {b.id: b.desc.name for b in desc.blocks}
    where: dict[int, str] = {}
    for b in desc.blocks:
        w = placement.get(b.id)
        if w is None:
            problems.append(f"block '{b.desc.name}' is placed on no worker; add it with engine.add(block, on=...)")
        elif w not in workers:
            problems.append(f"block '{b.desc.name}' is placed on worker '{w}', which is not one of "
                            f"{', '.join(workers)}")
        else:
            where[b.id] = w
    links: list[RemoteLink] = []
    inner: dict[str, list] = {w: [] for w in workers}
    for c in desc.connections:
        ws, wd = where.get(c.src.block), where.get(c.dst.block)
        if ws is None or wd is None:
            continue
        label = f"{names[c.src.block]}.{c.src.port} -> {names[c.dst.block]}.{c.dst.port}"
        if ws == wd:
            inner[ws].append(c)
            continue
        if c.delay:
            problems.append(f"{label} is a delayed connection between workers '{ws}' and '{wd}'; a delay lives in "
                            "one graph: place both blocks on one worker")
            continue
        asked = transports.get((c.src, c.dst), "auto")
        transport, why = _transport(asked, workers[ws], workers[wd], nodes.get(ws), nodes.get(wd))
        if why:
            problems.append(f"{label}: {why}")
            continue
        spec = desc.block(c.src.block).desc.port(c.src.port)
        nbytes = math.prod(desc.shapes.get(c.src, ()) or spec.shape) * (_dtypes.itemsize(spec.dtype)
                                                                       if spec.dtype else 1)
        via, why = route(asked, transport, workers[ws], workers[wd], nodes.get(ws), nodes.get(wd), offered)
        links.append(RemoteLink(ws, c.src, wd, c.dst, transport, label, nbytes, via, why))
    for r in desc.regions:
        held = {where.get(m) for m in (r.id, *r.members)}
        if len(held) > 1:
            problems.append(f"region '{names.get(r.id, r.id)}' spans workers {', '.join(sorted(map(str, held)))}; "
                            "place a region and its bodies on one worker")
    order, circle = _order(list(workers), links)
    if circle:
        problems.append(f"the links between workers form a circle ({' -> '.join(circle)}); frames go from producer "
                        "to consumer: place the blocks of the circle on one worker")
    if problems:
        raise ValidationError("\n".join([f"{len(problems)} placement problems:", *(f"- {p}" for p in problems)])
                              if len(problems) > 1 else problems[0], subject="placement")
    fragments = {}
    for w in workers:
        mine = {b.id for b in desc.blocks if where[b.id] == w}
        imports = tuple(ln for ln in links if ln.dst_worker == w)
        exports = tuple(ln for ln in links if ln.src_worker == w)
        sub = PipelineDescription(
            blocks=tuple(b for b in desc.blocks if b.id in mine),
            connections=tuple(inner[w]),
            fed=frozenset({r for r in desc.fed if r.block in mine} | {ln.dst for ln in imports}),
            regions=tuple(r for r in desc.regions if r.id in mine),
            kept=frozenset({r for r in desc.kept if r.block in mine} | {ln.src for ln in exports}),
            shapes={r: s for r, s in desc.shapes.items() if r.block in mine},
        )
        fragments[w] = Fragment(w, sub, imports, exports)
    return Split(fragments, tuple(links), order)


def check_transport(asked: str, link: str, subject: str) -> None:
    """A ValidationError naming ``link`` where ``asked`` is no transport."""
    if asked not in TRANSPORTS:
        raise ValidationError(f"{link}: transport must be one of {', '.join(TRANSPORTS)} (got {asked!r})",
                              subject=subject)


def _one_host(src: Worker, dst: Worker, src_node, dst_node) -> bool:
    """Whether two workers run on one host: one Ray node, or (not placed yet) neither pinned to a node."""
    return (src_node is not None and src_node == dst_node) or (
        src_node is None and dst_node is None and src.node is None and dst.node is None)


def route(asked: str, transport: str, src: Worker, dst: Worker, src_node, dst_node,
          offered: tuple[str, ...] = ()) -> tuple[str, str]:
    """(where the ends of a link of ``transport`` meet, why the transport was chosen): ``"board"`` on one host,
    ``"store"`` (Ray's object store) across hosts."""
    one_host = _one_host(src, dst, src_node, dst_node)
    if transport == "ipc":
        return "board", ("asked for" if asked == "ipc" else "both workers on GPUs of one host: CUDA IPC") + (
            "" if not (src.gpuless or dst.gpuless) else "; workers without a GPU: the bytes in the board's shared "
            "memory")
    where = ("one host: through a shared-memory board, pinned, no Ray call" if one_host
             else "different hosts: through Ray's object store from pinned memory, the bytes never pickled")
    if asked == "host":
        return ("board" if one_host else "store"), f"asked for; {where}"
    if src.gpuless or dst.gpuless:
        return ("board" if one_host else "store"), f"a worker runs without a GPU; {where}"
    gpu = [t for t in offered if t.upper() in ("NCCL", "NIXL")]
    rdt = (f" (Ray offers {'/'.join(gpu)} between GPU actors (Ray Direct Transport); rxcuda does not carry links "
           "over it yet)" if gpu else " (Ray offers no GPU transport between actors here: Ray Direct Transport "
           "needs torch, and NIXL or an NCCL group)")
    return "store", where + rdt


def _transport(asked: str, src: Worker, dst: Worker, src_node, dst_node) -> tuple[str, str]:
    """(transport, '') or ('', why it cannot be the one asked for)."""
    if asked not in TRANSPORTS:
        return "", f"transport must be one of {', '.join(TRANSPORTS)} (got {asked!r})"
    gpus = not src.gpuless and not dst.gpuless
    one_host = _one_host(src, dst, src_node, dst_node)
    if asked == "ipc":
        if src.gpuless != dst.gpuless:  # two workers without a GPU may: their slots are shared host memory
            return "", "CUDA IPC needs both workers on a GPU, and one has none (the null driver or the CPU device); " \
                       "use transport='host'"
        if not one_host:
            return "", "CUDA IPC works between processes of one host, and these workers run on different nodes; " \
                       "use transport='host'"
        return "ipc", ""
    if asked == "host":
        return "host", ""
    return ("ipc" if gpus and one_host else "host"), ""


def frame_steps(split: Split, skip=frozenset()) -> dict[str, tuple[str, ...]]:
    """The workers one frame steps, producers first, each with the producers whose step's results it takes as
    arguments: those over links through Ray's object store (``via="store"``: Ray runs its step after theirs).
    Producers over links that meet on a board (``ipc``, and ``host`` on one host) are stepped alongside it: the
    board orders the two. A worker holding no block is not stepped, nor one in
    ``skip`` (restarting), nor one fed by a worker this frame does not step.
    """
    steps: dict[str, tuple[str, ...]] = {}
    for w in split.order:
        frag = split.fragments[w]
        if not frag.description.blocks or w in skip or any(ln.src_worker not in steps for ln in frag.imports):
            continue
        steps[w] = tuple(sorted({ln.src_worker for ln in frag.imports if ln.via == "store"}))
    return steps


def frame_plan(split: Split, skip=frozenset()) -> tuple[tuple[tuple[str, tuple[str, ...], bool], ...], tuple[str, ...]]:
    """:func:`frame_steps` as a frame submits them, made once per split and set of workers down: ((worker, the
    producers whose results it takes, whether its results are taken: its step returns two objects), ...) in
    order, and the workers holding blocks that this frame does not step."""
    steps = frame_steps(split, skip)
    takers = {p for producers in steps.values() for p in producers}
    active = [w for w in split.order if split.fragments[w].description.blocks]
    return (tuple((w, steps[w], w in takers) for w in active if w in steps),
            tuple(w for w in active if w not in steps))


def _order(workers: list[str], links: list[RemoteLink]) -> tuple[tuple[str, ...], list[str]]:
    """Workers with producers first (Kahn's algorithm, stable in the given order); a circle found, if any."""
    succ: dict[str, set[str]] = {w: set() for w in workers}
    for ln in links:
        succ[ln.src_worker].add(ln.dst_worker)
    indeg = {w: 0 for w in workers}
    for w in workers:
        for d in succ[w]:
            indeg[d] += 1
    ready = [w for w in workers if indeg[w] == 0]
    order: list[str] = []
    while ready:
        w = ready.pop(0)
        order.append(w)
        for d in sorted(succ[w], key=workers.index):
            indeg[d] -= 1
            if indeg[d] == 0:
                ready.append(d)
    if len(order) == len(workers):
        return tuple(order), []
    left = [w for w in workers if w not in order]
    circle, w = [left[0]], left[0]  # walk successors among the leftovers until one repeats
    while True:
        w = next(d for d in sorted(succ[w], key=workers.index) if d in left)
        if w in circle:
            return tuple(order), circle[circle.index(w):] + [w]
        circle.append(w)


def structure(frag: Fragment) -> tuple:
    """What a fragment is built from, parameter values aside (those travel as hot updates)."""
    d = frag.description
    return (tuple((b.id, b.desc, tuple(sorted(b.launches.items()))) for b in d.blocks), d.connections, d.fed,
            d.kept, tuple(sorted(d.shapes.items())), frag.imports, frag.exports, tuple(sorted(d.placement.items())))


def skeleton(structure: tuple) -> tuple:
    """A fragment's structure without its kernels' code (their parameter layouts kept) and launches: two
    fragments with one skeleton differ only in what a worker changes in place (``FragmentHost.retune``)."""
    blocks, *rest = structure
    return (tuple((bid, desc.name, desc.ports, desc.scalars, desc.internals,
                   tuple((k.name, k.code.signature.layout(), k.launch, k.grid_of) if isinstance(k, KernelSpec) else k
                         for k in desc.kernels)) for bid, desc, _launches in blocks), *rest)
