"""``rxcuda.tensor.function``: a Python function over tensors, traced once per input signature and replayed.

Calling the wrapped function looks up its arguments' **signature**: for each tensor its shape, dtype, device,
whether it requires grad and whether it holds data (a lazy tensor is evaluated first); every other argument
(a Python number, a string, None...) by value. A signature seen before replays its trace; a new one **traces**
``fn`` once: ``fn`` runs with stand-in tensors, its operations build the program (nothing is evaluated), the
passes plan and fuse it once, and the plan is kept runnable. These are the guards ``jax.jit`` has: a new shape
(a changing batch size, say) is a new trace, counted in :attr:`Function.stats`.

What a replay costs: on ``cpu`` the kept program runs over the new arrays (no passes, no kernel lookups); on
``cuda`` the whole program (kernels, GEMMs, reductions, the backward pass of ``rt.grad`` and the in-place writes)
was captured into **one CUDA graph** at the first call, and a repeat call is one graph launch
(``rxcuda/tensor/_replay.py``).

Inside ``fn``:

- a value cannot be read on the host: ``bool(t)``, ``float(t)``, ``t.item()``, ``t.numpy()``, ``if t > 0:``
  raise :class:`TraceError` at trace time (the trace would bake one call's value into every replay); choose
  inside the program with ``rt.where(cond, a, b)``;
- ``t[...] = value`` on a tensor made from data (an argument, or one ``fn`` reads from outside such as a weight)
  is an **in-place write**: later reads in ``fn`` see the new value, and every call writes it into the tensor's
  data (the optimizers of ``rxcuda.tensor.SGD`` / ``Adam`` update weights so). Whole writes only (``t[...] =``);
- ``rt.grad(loss, [w, b])`` gives gradients (``loss.backward()`` stores into ``.grad`` across calls, so it is
  refused here: pass the gradients to the optimizer);
- tensors ``fn`` reads from outside are bound by identity: the replay reads their data as it is at each call,
  but rebinding the Python name to another tensor is not seen (trace again with :meth:`Function.clear`).

>>> import numpy as np, rxcuda.tensor as rt
>>> @rt.function
... def scaled_softmax(x, t):
...     return rt.softmax(x / t, axis=-1)
>>> x = rt.tensor(np.arange(6.0).reshape(2, 3))
>>> y = scaled_softmax(x, 2.0)
>>> bool(np.allclose(y.numpy().sum(axis=-1), 1.0))
True
>>> _ = scaled_softmax(x + 1, 2.0)                # the same signature: a replay
>>> _ = scaled_softmax(rt.tensor(np.ones((5, 3))), 2.0)  # a new shape: a new trace
>>> scaled_softmax.stats.traces, scaled_softmax.stats.calls
(2, 3)
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from . import _ops, _run
from ._cache import STATS
from ._errors import CaptureError, TraceError
from ._graph import Node
from ._passes import Passes
from ._program import Program
from ._run import _leaves, _program, _values
from ._tensor import _MOVED, Tensor, _as_tensor, _data

__all__ = ["CaptureError", "Function", "FunctionStats", "TraceError", "function", "jit"]


@attrs.define
class FunctionStats:
    """What a :class:`Function` did: ``calls``; ``traces`` (signatures traced: one per input shape, so a changing
    batch size shows here); ``replays`` (calls that reused a trace); ``graph_launches`` (on ``cuda``: one per
    replay or first run; ``captures`` counts the CUDA graphs made, one per trace and set of bound buffers)."""

    calls: int = 0
    traces: int = 0
    replays: int = 0
    graph_launches: int = 0
    captures: int = 0


class _Tracing:
    """One trace under way: the function's name (for errors) and the writes its body makes."""

    def __init__(self, name: str):
        self.name = name
        self.writes: dict[int, tuple[Tensor, Node]] = {}  # id(tensor) -> (tensor, its data node before the trace)
        self.settled = False

    def refusal(self, what: str) -> TraceError:
        return TraceError(
            f"{what} inside rxcuda.tensor.function '{self.name}' needs the tensor's value on the host, but a "
            "traced function only builds the program (each call replays it without running Python): choose "
            "inside the program with rt.where(cond, a, b), return the value and read it after the call, or call "
            "the undecorated function")


_LOCK = threading.RLock()


def tracing() -> _Tracing | None:
    """The trace under way in this process, or None."""
    return _run.TRACING.stack[-1] if _run.TRACING.stack else None


def write(t: Tensor, index, value) -> bool:
    """``t[index] = value`` inside a trace: record it (and let later reads of ``t`` see ``value``); False when
    no trace is under way (the caller writes now)."""
    tr = tracing()
    if tr is None:
        return False
    parts = index if isinstance(index, tuple) else (index,)
    if not (len(parts) == 1 and (parts[0] is Ellipsis or (type(parts[0]) is slice and parts[0] == slice(None)))):
        raise TraceError(f"t[{index!r}] = ... inside rxcuda.tensor.function '{tr.name}': only whole writes "
                         "(t[...] = value) are replayed; compute the whole new value, e.g. with rt.where(mask, new, t)")
    kept = tr.writes.get(id(t))
    data = kept[1] if kept is not None else _adopt(t, tr)
    if isinstance(value, Tensor):
        v = value
    elif isinstance(value, bool | int | float | np.generic):
        v = Tensor(_ops.full((), value, t.dtype, t.device))
    else:
        v = _as_tensor(value)  # an array: data of the program (on the host: a copy to the device if t is there)
    node = _ops.broadcast_to(_ops.cast(v.node, data.dtype), data.shape)
    if node.device != data.device:
        node = _ops.copy(node, data.device)
    if kept is None:
        tr.writes[id(t)] = (t, data)
    t.node = node  # later reads in the trace see the new value; restored when the trace ends
    return True


def _adopt(t: Tensor, tr: _Tracing) -> Node:
    """The data node a trace writes ``t`` into (see :func:`settle`)."""
    if settle(t):
        tr.settled = True  # the program read t's host data until now: the function is traced again
    node = _data(t.node)
    if node.op != "const":
        raise TraceError(f"a write inside rxcuda.tensor.function '{tr.name}' goes to a lazy {node.op} tensor; "
                         "only a tensor made from data (rt.tensor, rt.asarray, an argument) can be written")
    return node


def settle(t: Tensor) -> bool:
    """Put the data of ``t`` on its device for good if :func:`~._tensor.tensor` keeps it on the host and moves it
    at each evaluation (``rt.tensor(numpy_array, device="cuda")``), so in-place writes (an optimizer's) land
    where the program reads; whether it moved. ``requires_grad`` stays as it was."""
    node = t.node
    if not (node.op == "copy" and node in _MOVED and node.device == "cuda"):
        return False
    wanted = t.requires_grad
    t.node = _ops.const(_run_outside(node).copy(), True, "cuda")
    if wanted:
        t.requires_grad = True
    return True


def _run_outside(node: Node):
    saved = list(_run.TRACING.stack)
    _run.TRACING.stack.clear()
    try:
        return _values([node])[0]
    finally:
        _run.TRACING.stack[:] = saved


# -- arguments: tensors and the rest ---------------------------------------------------------------------
def _flatten(obj, tensors: list) -> Any:
    """``obj``'s structure with every tensor (or array) replaced by its position in ``tensors``."""
    if isinstance(obj, Tensor):
        tensors.append(obj)
        return ("T", len(tensors) - 1)
    if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        from ._tensor import asarray

        tensors.append(asarray(obj))
        return ("T", len(tensors) - 1)
    if isinstance(obj, tuple | list):
        return (type(obj).__name__, tuple(_flatten(o, tensors) for o in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((k, _flatten(v, tensors)) for k, v in obj.items()))
    try:
        hash(obj)
    except TypeError:
        raise TypeError(f"rxcuda.tensor.function takes tensors, arrays, tuples/lists/dicts of them and hashable "
                        f"values (numbers, strings...); got an unhashable {type(obj).__name__}") from None
    return ("S", type(obj), obj)


def _rebuild(tree, tensors: list):
    kind = tree[0]
    if kind == "T":
        return tensors[tree[1]]
    if kind in ("tuple", "list"):
        items = [_rebuild(t, tensors) for t in tree[1]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {k: _rebuild(v, tensors) for k, v in tree[1]}
    return tree[2]


_POSITIONAL: dict[int, tuple] = {}  # the argument structure of a call with n tensors by position


def _guard(t: Tensor) -> tuple:
    return (t.shape, t.dtype, t.device, t.requires_grad)


# -- the wrapper ----------------------------------------------------------------------------------------------
class Function:
    """A Python function over tensors, traced once per signature and replayed (see :func:`function`)."""

    def __init__(self, fn: Callable, *, passes: Passes | None = None, max_traces: int | None = None,
                 graphs: bool = True):
        if not callable(fn):
            raise TypeError(f"rxcuda.tensor.function wraps a callable (got {fn!r})")
        if max_traces is not None and (not isinstance(max_traces, int) or max_traces < 1):
            raise ValueError(f"'max_traces' must be a positive int or None (got {max_traces!r})")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.passes = passes or Passes()
        self.max_traces = max_traces
        self.graphs = graphs
        self.stats = FunctionStats()
        self._traces: dict[tuple, _Trace] = {}

    @property
    def signatures(self) -> list[tuple]:
        """The signatures traced so far: per tensor argument (shape, dtype, device), in argument order."""
        return [tuple(g[:3] for g in guards) for _, guards in self._traces]

    def clear(self) -> None:
        """Forget every trace (the next call traces again, reading the tensors ``fn`` uses from outside anew)."""
        for tr in self._traces.values():
            tr.close()
        self._traces.clear()

    def __call__(self, *args, **kwargs):
        if _run.TRACING.stack:  # called inside another traced function: its operations join that trace
            return self.fn(*args, **kwargs)
        if not kwargs and all(type(a) is Tensor for a in args):  # the common call: tensors only, by position
            tensors = list(args)
            tree = _POSITIONAL.get(len(args))
            if tree is None:
                tree = _POSITIONAL[len(args)] = _flatten((args, {}), [])
        else:
            tensors = []
            tree = _flatten((args, kwargs), tensors)
        key = (tree, tuple(_guard(t) for t in tensors))
        self.stats.calls += 1
        trace = self._traces.get(key)
        if trace is None:
            if self.max_traces is not None and len(self._traces) >= self.max_traces:
                shapes = ", ".join(str(t.shape) for t in tensors)
                raise TraceError(f"rxcuda.tensor.function '{self.name}' was traced {len(self._traces)} times "
                                 f"(max_traces={self.max_traces}) and is called with new shapes ({shapes}); pad the "
                                 "inputs to a few sizes (batch buckets) or raise max_traces")
            trace = self._traces[key] = self._trace(tree, tensors)
            self.stats.traces += 1
        else:
            self.stats.replays += 1
        return trace.run(tensors, self.stats)

    def _trace(self, tree, tensors: list[Tensor]) -> _Trace:
        stand_ins = []
        for t in tensors:
            value = t.node.attrs[0].array if t.node.op == "const" else _values([t.node])[0]
            s = Tensor(_ops.const(value, False, t.device, t.shape, t.dtype))
            if t.requires_grad:
                s.requires_grad = True
            stand_ins.append(s)
        for _ in range(2):  # a second time when a write moved host data to the device (settle)
            args, kwargs = _rebuild(tree, stand_ins)
            tr = _Tracing(self.name)
            with _LOCK:
                _run.TRACING.stack.append(tr)
                try:
                    result = self.fn(*args, **kwargs)
                finally:
                    _run.TRACING.stack.pop()
                    writes = [(t, data, t.node) for t, data in tr.writes.values()]
                    for t, data, _ in writes:
                        t.node = data  # the tensor holds its data again (now on cuda if settle moved it)
            if not tr.settled:
                break
        at = {id(s.node): k for k, s in enumerate(stand_ins)}
        for _, data, _ in writes:
            k = at.get(id(data))
            if k is not None and tensors[k].node.op != "const":
                raise TraceError(f"rxcuda.tensor.function '{self.name}' writes into its argument {k}, which is a "
                                 f"lazy {tensors[k].node.op} tensor; pass a tensor made from data (rt.tensor(...)) "
                                 "to be written in place")
        outs: list[Tensor] = []
        out_tree = _flatten(result, outs)
        trace = _Trace(self, [s.node for s in stand_ins], out_tree, [o.node for o in outs],
                       [(data, new) for _, data, new in writes])
        for s in stand_ins:  # a replay binds each call's arrays: the first call's are not kept alive by the trace
            s.node.attrs[0].array = None
        return trace

    def __get__(self, obj, objtype=None):
        """A function in a class body is a method: the instance is its first argument (a static one, by
        identity, so each instance gets its own traces)."""
        return self if obj is None else functools.partial(self, obj)

    def __repr__(self) -> str:
        return f"<rxcuda.tensor.function {self.name}: {self.stats.traces} traces, {self.stats.calls} calls>"


class _Trace:
    """One traced signature: the planned program, where each of its leaves comes from at a call, the writes
    and the outputs' structure; on cuda, the CUDA graphs it was captured into."""

    def __init__(self, owner: Function, stand_ins: list[Node], out_tree, outs: list[Node],
                 writes: list[tuple[Node, Node]]):
        self.owner = owner
        self.out_tree = out_tree
        self.writes = [data for data, _ in writes]
        nodes = outs + [new for _, new in writes]
        self.nouts = len(outs)
        self.out_nodes = outs
        at = {id(s): k for k, s in enumerate(stand_ins)}
        self.leaves, _ = _leaves(nodes) if nodes else ((), ())
        # a leaf is an argument's data (its position), or data fn read from outside (the node itself)
        self.sources: list[int | Node] = [at.get(id(leaf), leaf) for leaf in self.leaves]
        targets = []
        for data in self.writes:
            k = at.get(id(data))
            targets.append(k if k is not None else data)
        self.targets = targets
        self.device = "cpu"
        if nodes:
            plan, _ = _program(nodes, owner.passes, False)
            self.device = "cuda" if any(n.device == "cuda" for n in plan.nodes) else "cpu"
            if self.device == "cuda" and owner.graphs:
                _refuse_copies(plan, owner.name)
            self.program: Program | None = Program(plan, self.leaves)
        else:
            self.program = None
        self.on_cuda = [leaf.device == "cuda" for leaf in self.leaves]
        self.replay = None
        if self.device == "cuda" and owner.graphs and self.program is not None:
            from ._replay import Replays

            self.replay = Replays(self)

    def arrays(self, tensors: list[Tensor]) -> list:
        """The array each leaf of the program reads at this call."""
        out = []
        for src in self.sources:
            if isinstance(src, int):
                node = tensors[src].node
                out.append(node.attrs[0].array if node.op == "const" else _values([node])[0])
            else:
                out.append(src.attrs[0].array)
        if self.device == "cuda":  # PyTorch and other CUDA arrays as CuPy views (no copy): kernels read .data.ptr
            cp = self.program.cuda.cp
            out = [a if type(a) is cp.ndarray or not self.on_cuda[k] else cp.asarray(a) for k, a in enumerate(out)]
        return out

    def target_buffers(self, tensors: list[Tensor]) -> list:
        """The buffer each in-place write of the trace goes into at this call."""
        out = []
        for tgt in self.targets:
            node = tensors[tgt].node if isinstance(tgt, int) else tgt
            if node.op != "const":
                raise TraceError(f"rxcuda.tensor.function '{self.owner.name}' writes into its argument {tgt}, which "
                                 f"is a lazy {node.op} tensor at this call; pass a tensor made from data")
            out.append(node.attrs[0])
        return out

    def run(self, tensors: list[Tensor], stats: FunctionStats):
        if self.program is None:
            values: list = []
        elif self.replay is not None:
            values = self.replay.run(self.arrays(tensors), self.target_buffers(tensors), stats)
        else:
            values = self.program.run_arrays(self.arrays(tensors), STATS)
            for buf, v in zip(self.target_buffers(tensors), values[self.nouts:], strict=True):
                write_into(buf, v)
        outs = [_wrap(v, n) for v, n in zip(values[:self.nouts], self.out_nodes, strict=True)]
        if self.replay is not None:
            self.replay.hold(outs)
        return _rebuild(self.out_tree, outs)

    def close(self) -> None:
        if self.replay is not None:
            self.replay.close()


def _refuse_copies(plan, name: str) -> None:
    """CaptureError for a program that moves data between host and device: a CUDA graph cannot hold the copy of
    host memory that Python owns (nor wait for the host)."""
    for g in plan.groups:
        if g.kind == "copy":
            n = g.nodes[0]
            src = n.inputs[0]
            raise CaptureError(
                f"rxcuda.tensor.function '{name}' copies a {src.op} {src.shape} from {src.device} to {n.device}, "
                "which a CUDA graph cannot replay: make that data a CUDA tensor outside the function (rt.tensor("
                "cupy_array), or rt.tensor(a, device='cuda') passed in as an argument), read results after the call, "
                "or use rt.function(f, graphs=False)")


def write_into(buf, value) -> None:
    """Write ``value`` (a whole new value of the buffer's shape) into the array of ``buf`` and bump its version."""
    array = buf.array
    if isinstance(array, np.ndarray):
        np.copyto(array, value, casting="unsafe")
    else:
        array[...] = value
    buf.bump()


def _wrap(value, node: Node) -> Tensor:
    """A call's output as a tensor holding ``value`` (no copy). Held as an outside array (never cached as
    unchanged): an output may be a view of an argument's data, which writes to the argument change."""
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        value = value.copy()  # a cached or broadcast value: the caller may write its result
    return Tensor(_ops.const(value, False, node.device, node.shape, node.dtype))


def function(fn: Callable | None = None, *, passes: Passes | None = None, max_traces: int | None = None,
             graphs: bool = True):
    """Wrap ``fn`` (a Python function over tensors) so it is traced once per input signature and replayed:
    on ``cuda`` as one CUDA graph per signature, so a repeat call costs one graph launch.

    Named as users of JAX (``jax.jit``) and PyTorch (``torch.compile``, ``torch.func``) look for it:
    ``rt.function`` and its alias ``rt.jit`` are the same. Use it as a decorator, with or without options.
    ``passes``: the passes that plan the program (all by default). ``max_traces``: refuse more signatures
    than this (a batch size that changes every call would trace every call; pad to a few sizes instead).
    ``graphs=False`` on ``cuda``: replay the program kernel by kernel instead of as a CUDA graph.

    Each traced signature is one entry of ``f.signatures``; ``f.stats`` counts calls, traces, replays and graph
    launches. See the module ``rxcuda.tensor._function`` for what may happen inside ``fn``.

    >>> import rxcuda.tensor as rt
    >>> @rt.jit(max_traces=4)
    ... def add_one(x):
    ...     return x + 1
    >>> add_one(rt.tensor([1.0, 2.0])).numpy()
    array([2., 3.])
    >>> add_one.signatures  # one entry per trace: (shape, dtype, device) of each tensor argument
    [(((2,), dtype('float64'), 'cpu'),)]
    """
    if fn is None:
        return lambda f: Function(f, passes=passes, max_traces=max_traces, graphs=graphs)
    return Function(fn, passes=passes, max_traces=max_traces, graphs=graphs)


jit = function
