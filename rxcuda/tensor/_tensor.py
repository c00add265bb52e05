"""The lazy ``Tensor`` and the functions that make and combine tensors (``rxcuda.tensor`` re-exports them).

Each operation adds a node (``_ops``); evaluation goes through ``_run`` (plan, run, cache).

>>> import numpy as np
>>> t = tensor(np.arange(3.0))
>>> (t * 2).numpy()
array([0., 2., 4.])
"""

from __future__ import annotations

import weakref

import numpy as np

from . import _autograd, _ops, _vjp
from ._cuda import to_host
from ._explain import explain as _explain_plan
from ._graph import Node
from ._passes import Passes
from ._run import _program, _values

_SCALARS = (bool, int, float, complex, np.generic)


class Tensor:
    """A lazy tensor: a node of a program, evaluated when a result is needed.

    Operators follow NumPy (``+ - * / ** @``, unary ``-``, comparisons, basic slicing ``x[1:, None, ...]``),
    and so do broadcasting and dtype promotion. Python scalars are weak (``float32 + 1.0`` is float32).

    >>> import rxcuda.tensor as rt
    >>> t = rt.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
    >>> (t.T @ t + 1).numpy()
    array([[11., 15.],
           [15., 21.]], dtype=float32)
    """

    __slots__ = ("node", "__weakref__")
    __array_ufunc__ = None  # ndarray + Tensor gives Tensor.__radd__, not an object array

    def __init__(self, node: Node):
        if not isinstance(node, Node):
            raise TypeError(f"Tensor wraps a Node; make one from data with rxcuda.tensor.tensor(...) (got {node!r})")
        self.node = node

    # -- metadata (no evaluation)
    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> np.dtype:
        return self.node.dtype

    @property
    def device(self) -> str:
        return self.node.device

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.node.shape, dtype=np.int64))

    @property
    def version(self) -> int:
        """The version of the data a tensor made from data holds (bumped on every write); 0 otherwise."""
        node = _data(self.node)
        return node.attrs[0].version if node.op == "const" else 0

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Tensor({self.node.op}, shape={self.shape}, dtype={self.dtype}, device={self.device!r})"

    def __bool__(self):
        raise TypeError("the truth value of a lazy tensor is not known until it runs: use bool(t.numpy()), or "
                        "rxcuda.tensor.where(cond, a, b) to choose inside the program")

    __hash__ = object.__hash__  # == builds a node, so hashing stays by identity

    # -- evaluation
    def realize(self, passes: Passes | None = None) -> Tensor:
        """Evaluate now (the result goes into the cache) and return this tensor."""
        realize(self, passes=passes)
        return self

    def numpy(self, passes: Passes | None = None) -> np.ndarray:
        """The value as a NumPy array. Computed results are read-only (the cache shares them; ``.copy()`` to
        write); a tensor from :func:`asarray` gives back the array it holds; a tensor on ``cuda`` is copied to
        the host."""
        return to_host(_values([self.node], passes)[0])

    def __array__(self, dtype=None, copy=None):
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    def cupy(self, passes: Passes | None = None):
        """The value as a CuPy array (the result itself on ``cuda``; a copy to the device on ``cpu``)."""
        value = _values([self.node], passes)[0]
        import cupy

        return cupy.asarray(value) if isinstance(value, np.ndarray) else value

    def explain(self, passes: Passes | None = None) -> str:
        """:func:`explain` of this tensor."""
        return explain(self, passes=passes)

    def to(self, device: str) -> Tensor:
        """This tensor on ``device`` (``"cpu"`` or ``"cuda"``): a copy node, or this tensor if it is there."""
        return Tensor(_ops.copy(self.node, device))

    def astype(self, dtype) -> Tensor:
        return Tensor(_ops.cast(self.node, dtype))

    # -- writes
    def __setitem__(self, index, value) -> None:
        """Write into the data of a tensor made from data (in place), bumping its version so every result
        that depends on it is computed again. A tensor that :func:`tensor` made on another device than its data
        (``tensor(numpy_array, device="cuda")``) writes its data, and the next evaluation moves it again.

        >>> t = tensor([1.0, 2.0, 3.0])
        >>> t[1:] = 0.5
        >>> t.numpy(), t.version
        (array([1. , 0.5, 0.5]), 1)
        """
        node = _data(self.node)
        if node.op != "const":
            raise TypeError(f"only a tensor made from data can be written (this one is a lazy {self.node.op}); "
                            "write into the tensor you made with tensor()/asarray()")
        buf = node.attrs[0]
        if node.device == "cuda":
            import cupy

            if isinstance(value, Tensor):
                value = value.cupy()
            elif isinstance(value, np.ndarray):  # CuPy takes device arrays and scalars only
                value = cupy.asarray(value)
            cupy.asarray(buf.array)[index] = value
        else:
            if isinstance(value, Tensor):
                value = value.numpy()
            elif hasattr(value, "__cuda_array_interface__"):  # a device array written into host data
                import cupy

                value = cupy.asnumpy(value)
            buf.array[index] = value
        buf.bump()

    def mark_unchanged(self, unchanged: bool = True) -> Tensor:
        """Promise that the outside array this tensor holds (from :func:`asarray`, CuPy, PyTorch) does not
        change between evaluations, so results that depend on it are cached. Returns this tensor."""
        if self.node.op != "const" or self.node.attrs[0].owned:
            raise TypeError("mark_unchanged() is for tensors holding an outside array (asarray); a tensor made "
                            "with tensor() is versioned by its writes already")
        self.node.attrs[0].unchanged = bool(unchanged)
        return self

    # -- autograd (rxcuda/tensor/_autograd.py)
    @property
    def requires_grad(self) -> bool:
        """Whether gradients flow to this tensor: set on a float tensor, or computed from one that is."""
        return _autograd.requires_grad(self.node)

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        _autograd.mark_requires_grad(self, flag)

    @property
    def grad(self) -> Tensor | None:
        """The gradient :meth:`backward` accumulated here (a lazy Tensor), or None; assign None to clear."""
        return _autograd.grad_of(self)

    @grad.setter
    def grad(self, value) -> None:
        _autograd.set_grad(self, value)

    def detach(self) -> Tensor:
        """This tensor's value as a new tensor through which no gradient flows (nothing is copied)."""
        return Tensor(_autograd.detach(self.node))

    def backward(self, gradient=None) -> None:
        """Accumulate d(self)/dx into ``x.grad`` for each tensor ``x`` that requires grad; ``self`` is a float
        scalar, or pass ``gradient`` (its shape) for a vector-Jacobian product.

        >>> x = tensor([1.0, 2.0], requires_grad=True)
        >>> (x * x).sum().backward()
        >>> x.grad.numpy()
        array([2., 4.])
        """
        _autograd.backward(self, gradient)

    # -- views
    @property
    def T(self) -> Tensor:
        return Tensor(_ops.transpose(self.node))

    def transpose(self, *axes) -> Tensor:
        if len(axes) == 1 and isinstance(axes[0], tuple | list):
            axes = tuple(axes[0])
        return Tensor(_ops.transpose(self.node, axes or None))

    def reshape(self, *shape) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return Tensor(_ops.reshape(self.node, shape))

    def broadcast_to(self, shape) -> Tensor:
        return Tensor(_ops.broadcast_to(self.node, tuple(shape)))

    def __getitem__(self, index) -> Tensor:
        return Tensor(_ops.getitem(self.node, index))

    # -- reductions
    def sum(self, axis=None, keepdims: bool = False) -> Tensor:
        return Tensor(_ops.reduce("sum", self.node, axis, keepdims))

    def max(self, axis=None, keepdims: bool = False) -> Tensor:
        return Tensor(_ops.reduce("max", self.node, axis, keepdims))

    def min(self, axis=None, keepdims: bool = False) -> Tensor:
        return Tensor(_ops.reduce("min", self.node, axis, keepdims))

    def mean(self, axis=None, keepdims: bool = False) -> Tensor:
        return Tensor(_ops.reduce("mean", self.node, axis, keepdims))

    # -- arithmetic
    def __add__(self, o):
        return _elementwise("add", self, o)

    def __radd__(self, o):
        return _elementwise("add", o, self)

    def __sub__(self, o):
        return _elementwise("sub", self, o)

    def __rsub__(self, o):
        return _elementwise("sub", o, self)

    def __mul__(self, o):
        return _elementwise("mul", self, o)

    def __rmul__(self, o):
        return _elementwise("mul", o, self)

    def __truediv__(self, o):
        return _elementwise("div", self, o)

    def __rtruediv__(self, o):
        return _elementwise("div", o, self)

    def __pow__(self, o):
        return _elementwise("pow", self, o)

    def __rpow__(self, o):
        return _elementwise("pow", o, self)

    def __matmul__(self, o):
        return matmul(self, o)

    def __rmatmul__(self, o):
        return matmul(o, self)

    def __neg__(self):
        return _elementwise("neg", self)

    def __abs__(self):
        return _elementwise("abs", self)

    def __eq__(self, o):  # type: ignore[override]
        return _elementwise("eq", self, o)

    def __ne__(self, o):  # type: ignore[override]
        return _elementwise("ne", self, o)

    def __lt__(self, o):
        return _elementwise("lt", self, o)

    def __le__(self, o):
        return _elementwise("le", self, o)

    def __gt__(self, o):
        return _elementwise("gt", self, o)

    def __ge__(self, o):
        return _elementwise("ge", self, o)


# -- making tensors ----------------------------------------------------------------------------------------
def _outside_device(data) -> str | None:
    """``"cuda"`` for a CUDA array (``__cuda_array_interface__``, or DLPack on a CUDA device), ``"cpu"`` for
    a DLPack array in host memory, None for anything else."""
    if hasattr(data, "__cuda_array_interface__"):
        return "cuda"
    if hasattr(data, "__dlpack_device__") and not isinstance(data, np.ndarray):
        kind = int(data.__dlpack_device__()[0])
        return {1: "cpu", 3: "cpu", 2: "cuda"}.get(kind)  # kDLCPU, kDLCUDAHost, kDLCUDA
    return None


def _cuda_node(data, owned: bool) -> Node:
    if not hasattr(data, "__cuda_array_interface__"):
        try:
            import cupy
        except ImportError:
            raise ImportError("a CUDA DLPack array needs CuPy to be held (pip install cupy-cuda12x)") from None
        data = cupy.from_dlpack(data)
    face = data.__cuda_array_interface__
    dtype = np.dtype(face["typestr"])
    return _ops.const(data, owned, "cuda", tuple(int(d) for d in face["shape"]), dtype)


_MOVED: weakref.WeakSet[Node] = weakref.WeakSet()
"""The copies :func:`tensor` made to put its own data on the device asked for: writing one writes that data."""


def _moved(data: Node, device: str) -> Node:
    """``data`` (a fresh const of :func:`tensor`) on ``device``: itself, or a copy node that writes reach it
    through (:func:`_data`)."""
    node = _ops.copy(data, device)
    if node is not data:
        _MOVED.add(node)
    return node


def _data(node: Node) -> Node:
    """The const node that writes to ``node`` go to: the data of a copy :func:`tensor` made, else ``node``."""
    return node.inputs[0] if node.op == "copy" and node in _MOVED else node


def _shape(shape) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if any(not isinstance(d, int | np.integer) or isinstance(d, bool) or d < 0 for d in shape):
        raise ValueError(f"a shape is a tuple of ints >= 0 such as (480, 640) (got {shape!r})")
    return tuple(int(d) for d in shape)


def tensor(data, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    """A tensor holding a copy of ``data`` (a NumPy array, nested lists, a scalar, a DLPack array such as a
    PyTorch CPU tensor, or a Tensor). Only writes through the tensor (``t[...] = v``) change it, and each bumps
    its version. The copy stays where the data is (a CUDA array such as CuPy's or a PyTorch CUDA tensor is
    copied on the device; anything else on the host) unless ``device`` says otherwise (a copy node moves it).
    ``requires_grad=True`` (float data): ``backward()`` fills ``.grad`` for it (see ``grad``).

    >>> tensor([1, 2, 3]).dtype
    dtype('int64')
    """
    if isinstance(data, Tensor):
        return data.astype(dtype if dtype is not None else data.dtype).to(_ops.check_device(device or data.device))
    where = _outside_device(data)
    device = _ops.check_device(device or ("cuda" if where == "cuda" else "cpu"))
    if where == "cuda":
        import cupy

        held = _cuda_node(data, False).attrs[0].array
        dtype = None if dtype is None else _ops.as_dtype(dtype)
        t = Tensor(_moved(_ops.const(cupy.array(held, dtype=dtype, copy=True), True, "cuda"), device))
        if requires_grad:
            t.requires_grad = True
        return t
    if where == "cpu":
        data = np.from_dlpack(data)
    array = np.array(data, dtype=None if dtype is None else _ops.as_dtype(dtype), copy=True)
    _ops.refuse_kind(array.dtype, "rxcuda.tensor.tensor")
    t = Tensor(_moved(_ops.const(array, True, "cpu"), device))
    if requires_grad:
        t.requires_grad = True
    return t


def asarray(data, device: str | None = None) -> Tensor:
    """A tensor holding ``data`` by reference (NumPy, CuPy, or PyTorch through DLPack): no copy. The array
    counts as changed at every evaluation (rxcuda cannot see writes made outside it) unless you call
    ``t.mark_unchanged()``. ``device``: where the array must be (a copy node is added if it is elsewhere).

    >>> import numpy as np
    >>> a = np.ones(3)
    >>> asarray(a).numpy() is a
    True
    """
    if isinstance(data, Tensor):
        return data if device is None else data.to(device)
    where = _outside_device(data)
    if where == "cuda":
        node = _cuda_node(data, False)
    else:
        if where == "cpu":
            data = np.from_dlpack(data)
        data = np.asarray(data)
        _ops.refuse_kind(data.dtype, "rxcuda.tensor.asarray")
        node = _ops.const(data, False, "cpu")
    t = Tensor(node)
    return t if device is None else t.to(device)


def full(shape, fill_value, dtype=None, device: str = "cpu") -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (a scalar fill node: no memory until it is used).

    >>> full((2, 2), 7).numpy()
    array([[7, 7],
           [7, 7]])
    """
    dtype = np.result_type(fill_value) if dtype is None else _ops.as_dtype(dtype)
    return Tensor(_ops.full(_shape(shape), fill_value, dtype, _ops.check_device(device)))


def zeros(shape, dtype=np.float64, device: str = "cpu") -> Tensor:
    """A tensor of zeros (float64 unless ``dtype`` says otherwise, as in NumPy)."""
    return full(shape, 0, dtype, device)


def ones(shape, dtype=np.float64, device: str = "cpu") -> Tensor:
    """A tensor of ones (float64 unless ``dtype`` says otherwise, as in NumPy)."""
    return full(shape, 1, dtype, device)


def arange(start, stop=None, step=1, dtype=None, device: str = "cpu") -> Tensor:
    """``numpy.arange`` as a tensor. >>> arange(3).numpy() gives array([0, 1, 2])."""
    values = np.arange(start, stop, step, dtype=dtype) if stop is not None else np.arange(start, dtype=dtype)
    return tensor(values, device=device)


# -- operations ---------------------------------------------------------------------------------------------
def _nodes(*xs, scalar_peers: tuple | None = None) -> list[Node]:
    """Operands as nodes: Tensors as they are, Python scalars as weak fills next to the other operands, and
    other array-likes as copies (a snapshot taken now)."""
    tensors = [x for x in xs if isinstance(x, Tensor)]
    device = tensors[0].device if tensors else "cpu"
    arrays = {i: np.array(x) for i, x in enumerate(xs) if not isinstance(x, (Tensor, *_SCALARS))}
    peers = scalar_peers if scalar_peers is not None else range(len(xs))
    dtypes = tuple(xs[i].dtype if isinstance(xs[i], Tensor) else arrays[i].dtype
                   for i in peers if isinstance(xs[i], Tensor) or i in arrays)
    out = []
    for i, x in enumerate(xs):
        if isinstance(x, Tensor):
            out.append(x.node)
        elif i in arrays:
            out.append(_ops.const(arrays[i], True, "cpu") if device == "cpu"
                       else _ops.copy(_ops.const(arrays[i], True, "cpu"), device))
        else:
            if isinstance(x, np.generic):
                out.append(_ops.full((), x, x.dtype, device))
            else:
                out.append(_ops.full((), x, _ops.scalar_dtype(x, dtypes), device))
    return out


_FILLS: dict[tuple, Node] = {}
_FILL_TYPES = (float, int, bool)


def _fill(value, peer: Node) -> Node:
    """The weak-scalar fill for a Python ``value`` next to ``peer`` (one shared node per value, dtype and device:
    fills are immutable leaves, so tracing ``x * 0.5`` again makes no new fill)."""
    key = (type(value), value, float(value).hex() if type(value) is float else 0, peer.dtype, peer.device)
    node = _FILLS.get(key)
    if node is None:
        node = _ops.full((), value, _ops.scalar_dtype(value, (peer.dtype,)), peer.device)
        if len(_FILLS) > 4096:
            _FILLS.clear()
        _FILLS[key] = node
    return node


def _elementwise(op: str, *xs) -> Tensor:
    if len(xs) == 2:  # the hot cases first: tensor with tensor, tensor with a Python number
        a, b = xs
        if type(a) is Tensor:
            if type(b) is Tensor:
                return Tensor(_ops.elementwise(op, a.node, b.node))
            if type(b) in _FILL_TYPES:
                return Tensor(_ops.elementwise(op, a.node, _fill(b, a.node)))
        elif type(b) is Tensor and type(a) in _FILL_TYPES:
            return Tensor(_ops.elementwise(op, _fill(a, b.node), b.node))
    elif len(xs) == 1 and type(xs[0]) is Tensor:
        return Tensor(_ops.elementwise(op, xs[0].node))
    return Tensor(_ops.elementwise(op, *_nodes(*xs)))


def _unary(op: str, doc: str):
    def f(x) -> Tensor:
        return _elementwise(op, x)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = doc
    return f


exp = _unary("exp", "e to the power of each element (``numpy.exp``).")
log = _unary("log", "Natural logarithm of each element (``numpy.log``).")
sqrt = _unary("sqrt", "Square root of each element (``numpy.sqrt``).")
sin = _unary("sin", "Sine of each element (``numpy.sin``).")
cos = _unary("cos", "Cosine of each element (``numpy.cos``).")
tanh = _unary("tanh", "Hyperbolic tangent of each element (``numpy.tanh``).")
abs = _unary("abs", "Absolute value of each element (``numpy.abs``).")


def maximum(a, b) -> Tensor:
    """Elementwise maximum, broadcasting (``numpy.maximum``: NaN wins)."""
    return _elementwise("maximum", a, b)


def minimum(a, b) -> Tensor:
    """Elementwise minimum, broadcasting (``numpy.minimum``: NaN wins)."""
    return _elementwise("minimum", a, b)


def where(cond, a, b) -> Tensor:
    """``a`` where ``cond`` holds, else ``b``, broadcasting all three (``numpy.where``).

    >>> where(arange(4) > 1, 1.0, 0.0).numpy()
    array([0., 0., 1., 1.])
    """
    return Tensor(_ops.elementwise("where", *_nodes(cond, a, b, scalar_peers=(1, 2))))


def matmul(a, b) -> Tensor:
    """Matrix product with NumPy's rules (1-D operands, batch broadcasting); on CUDA ``cupy.matmul``
    (cuBLAS)."""
    na, nb = _nodes(a, b)
    return Tensor(_ops.matmul(na, nb))


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(_nodes(x)[0])


def sum(x, axis=None, keepdims: bool = False) -> Tensor:
    """Sum over ``axis`` (None: all; an int or a tuple), dropping those axes unless ``keepdims``."""
    return _as_tensor(x).sum(axis, keepdims)


def max(x, axis=None, keepdims: bool = False) -> Tensor:
    """Maximum over ``axis`` (see :func:`sum`)."""
    return _as_tensor(x).max(axis, keepdims)


def min(x, axis=None, keepdims: bool = False) -> Tensor:
    """Minimum over ``axis`` (see :func:`sum`)."""
    return _as_tensor(x).min(axis, keepdims)


def mean(x, axis=None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis`` (see :func:`sum`)."""
    return _as_tensor(x).mean(axis, keepdims)


def softmax(x, axis: int = -1) -> Tensor:
    """``exp(x) / sum(exp(x))`` over ``axis``, computed stably (the maximum is subtracted first); over the last
    axis the passes fuse it into one group.

    >>> softmax(tensor([0.0, 0.0])).numpy()
    array([0.5, 0.5])
    """
    x = _as_tensor(x)
    e = exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def logsumexp(x, axis=None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` over ``axis``, computed stably (no overflow for large ``x``; ``-inf`` rows give
    ``-inf``), like ``scipy.special.logsumexp``.

    >>> float(logsumexp(tensor([1000.0, 1000.0])).numpy())
    1000.6931471805599
    """
    x = _as_tensor(x)
    m = x.max(axis, keepdims=True)
    m = where(abs(m) < np.inf, m, 0)  # an infinite maximum would make x - m NaN
    out = log(exp(x - m).sum(axis, keepdims=True)) + m
    return out if keepdims else out.reshape(_ops.reduce("sum", x.node, axis).shape)  # a view: no launch


# -- running --------------------------------------------------------------------------------------------------

def realize(*tensors: Tensor, passes: Passes | None = None, cache: bool = True):
    """Evaluate ``tensors`` together (shared work runs once) and keep their results in the cache. Returns the
    tensor, or a tuple of them. ``passes``: which passes run (all by default); ``cache=False`` neither uses nor
    fills the cache."""
    _values([_as_tensor(t).node for t in tensors], passes, cache)
    return tensors[0] if len(tensors) == 1 else tensors


def explain(*tensors: Tensor, passes: Passes | None = None, outputs=None) -> str:
    """The plan for evaluating ``tensors``, as text: each pass and what it did, every node with its device and
    group, the launches, and every copy between host and device. ``outputs``: the tensors that are requested,
    when only some of ``tensors`` are (the others' own nodes are then dead).

    >>> x = tensor([1.0, 2.0])
    >>> print(explain(exp(x) + 1).split("launches:")[1].split("copies")[0].strip())
    g0 elementwise on cpu (2,): exp add -> %3
    """
    nodes = [_as_tensor(t).node for t in tensors]
    outs = nodes if outputs is None else [_as_tensor(t).node for t in outputs]
    p, _ = _program(outs, passes, True, roots=nodes)
    return _explain_plan(p)


_vjp.use_tensors(Tensor, cos=cos, log=log, sin=sin, where=where)  # the autograd rules build with these
