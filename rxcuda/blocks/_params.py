"""A block's parameters: typed scalars whose every setter checks the value (type, range, and the buffers a count
parameter counts) before it is stored and folded into the engine's pending plan."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cuda import _native
from ..model import _dtypes
from ._bounds import bounded

_FLOAT_MAX = {"f16": 65504.0, "f32": float(np.finfo(np.float32).max), "f64": sys.float_info.max,
              "bf16": 3.3895313892515355e38}


def _value_check(param: Parameter, dtype: str):
    """The function that checks and converts a value for a parameter of ``dtype``, built once per parameter
    so the setter (the hottest call a user makes) pays one call and, for the usual Python number, two
    comparisons. The rule, for every type:

    - integer types take Python and NumPy integers within their range (not bool, float or str);
    - float types take Python and NumPy ints and floats that are finite and within their range
      (f16 ±65504, f32 ±3.4028235e38, f64 finite; not bool or str).

    Anything else raises TypeError (the wrong kind of value) or ValueError (out of range), naming the
    parameter, its type and the value.
    """
    def where() -> str:  # read when raising: an engine may rename the block after the check was made
        return f"{param._block.name}.{param.name}"

    kind = "f" if dtype == "bf16" else _dtypes.to_numpy(dtype).kind
    if kind == "f":
        hi = _FLOAT_MAX[dtype]
        lo = -hi

        def check_float(v):
            if type(v) is float and lo <= v <= hi:  # NaN and inf fail the comparison
                return v
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
                try:
                    f = float(v)
                except OverflowError:  # an int beyond any float
                    f = math.inf
                if lo <= f <= hi:
                    return f
                raise ValueError(f"{where()} ({dtype}) takes a finite number within [{lo:.8g}, {hi:.8g}] "
                                 f"(got {v!r})")
            raise TypeError(f"{where()} ({dtype}) takes a number: a Python or NumPy int or float "
                            f"(got {v!r}, a {type(v).__name__})")

        return check_float
    if kind not in "iu":
        if _dtypes.vector_layout(dtype) or _dtypes.struct_type(dtype):  # a float4 or a struct passed by value
            raise TypeError(f"{where()}: a {_dtypes.describe(dtype)} passed by value is not a block parameter; pass "
                            "its components as separate scalar parameters, or the value through a pointer port")
        raise TypeError(f"{where()}: a parameter of type {dtype} is not supported; use an integer or float type")
    _, ilo, ihi = _fast_test_of(dtype, None, None)  # the type's range (np.iinfo, memoized: ~1 us a block)

    def check_int(v):
        if type(v) is int and ilo <= v <= ihi:
            return v
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            i = int(v)
            if ilo <= i <= ihi:
                return i
            raise ValueError(f"{where()} ({dtype}) must be within [{ilo}, {ihi}] (got {i})")
        raise TypeError(f"{where()} ({dtype}) takes an integer: a Python or NumPy int "
                        f"(got {v!r}, a {type(v).__name__})")

    return check_int


def _fast_test(dtype: str, lo, hi) -> tuple:
    """(type, low, high): the values of that exact Python type within [low, high] pass the check of a parameter
    of ``dtype`` declared with range [lo, hi] (None: unbounded) unchanged -- a float for a float type, an int for
    an integer type (bool is neither). (None, 0, 0) where there is no such shortcut."""
    t: type
    tlo: float
    thi: float
    if dtype in _FLOAT_MAX:
        t, tlo, thi = float, -_FLOAT_MAX[dtype], _FLOAT_MAX[dtype]
    else:
        try:
            np_type = _dtypes.to_numpy(dtype)
        except Exception:  # (not a scalar type: the full check says why)
            return None, 0, 0
        if np_type.kind not in "iu":
            return None, 0, 0
        info = np.iinfo(np_type)
        t, tlo, thi = int, int(info.min), int(info.max)
    if lo is not None:
        tlo = max(tlo, lo)
    if hi is not None:
        thi = min(thi, hi)
    return t, tlo, thi


_fast_test_memo = functools.lru_cache(maxsize=1024)(_fast_test)  # np.iinfo costs ~1 us; blocks share few ranges


def _fast_test_of(dtype: str, lo, hi) -> tuple:
    try:
        return _fast_test_memo(dtype, lo, hi)
    except TypeError:  # a range bound that does not hash
        return _fast_test(dtype, lo, hi)


def _in_range(param: Parameter, check, lo, hi):
    """``check`` followed by the parameter's declared range ``[lo, hi]`` (either may be None)."""
    def check_range(v):
        v = check(v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ValueError(f"{param._block.name}.{param.name} ({param.dtype}) must be within [{lo}, {hi}], its "
                             f"declared range (got {v!r})")
        return v

    return check_range


class _Fields:
    """A parameter's fields and its ``value`` setter in Python: the base of :class:`Parameter` where the compiled
    path (rxcuda.cuda._native) is not available; its ``ParamBase`` is the same in C, ~0.3 us less per change."""

    # the one list of a parameter's fields: the compiled ParamBase is made with these names (param_base, in this
    # order), as is the setter's contract below (_SETTER: the property, the block's sink and id, the sink's fold)
    __slots__ = ("name", "dtype", "_value", "_block", "_check", "_min", "_max", "_step", "_plain", "_lo", "_hi")
    name: str
    dtype: str
    _value: Any
    _block: Any
    _check: Any
    _min: Any
    _max: Any
    _step: Any
    _plain: type | None
    _lo: Any
    _hi: Any

    @property
    def value(self):
        """The parameter's value. Setting it checks the value (its type, range and, for a count, the buffers it
        counts) and folds it into the engine's pending plan: the next frame runs with it."""
        return self._value

    @value.setter
    def value(self, v) -> None:
        # the hottest call a user makes: the full check only for what the fast test cannot pass as it is
        if type(v) is not self._plain or not self._lo <= v <= self._hi:
            v = self._check(v)
        self._value = v
        block = self._block
        sink = block._sink
        if sink is not None:
            sink.set_value((block.id, self.name), v)  # (the id, not kept here: engine.replace hands it over)


def _fields() -> type:
    """Parameter's base: the compiled ``ParamBase`` where it builds, else :class:`_Fields`."""
    native = _native.hotpath()
    if native is None:
        return _Fields
    native.set_float64(np.float64)  # (a NumPy float for a float parameter: kept as float(v) without a _check call)
    return native.param_base(_Fields.__slots__, _SETTER)


# what the setter names besides the fields (_Fields.value: the property, block._sink, block.id, sink.set_value), handed
# to the compiled ParamBase with the fields
_SETTER = ("value", "_sink", "id", "set_value")


if TYPE_CHECKING:
    _Base = _Fields
else:
    _Base = _fields()


class Parameter(_Base):
    """A typed scalar of a block. Setting ``value`` schedules a hot update of the next frame.

    A count parameter (see :attr:`counts`) never exceeds the element count of the buffers it counts:

    >>> from rxcuda import Block
    >>> mul = Block.from_kernel("scalar_mul", size=1024)
    >>> mul.set(n=50_000_000)
    Traceback (most recent call last):
    ...
    rxcuda.model._errors.BoundsError: scalar_mul.n = 50000000 is more than port 'x' holds (1024 elements): n \
counts x and out, so the kernel would index past the buffer. Set n <= 1024, or grow the buffer first: \
engine.resize(scalar_mul['x'], shape)

    Integer types take Python and NumPy integers within their range (not bool, float or str); float types
    take Python and NumPy ints and floats that are finite and within their range (not bool or str). A value
    that breaks the rule raises TypeError or ValueError and the parameter keeps its old value. A parameter
    declared with ``min``/``max`` (``Block.from_kernel(..., ranges=...)``, ``BlockBuilder.scalar``, a sidecar)
    refuses values outside them with ValueError; ``step`` only guides controls.

    >>> block = Block.from_kernel("scalar_mul", size=1024)
    >>> block.params["scale"].value = 0.5     # or block.set(scale=0.5)
    >>> block.params["scale"].value = "2.5"
    Traceback (most recent call last):
    ...
    TypeError: scalar_mul.scale (f32) takes a number: a Python or NumPy int or float (got '2.5', a str)
    """

    __slots__ = ()  # (the fields are the base's)

    if TYPE_CHECKING:  # declared for the API reference (Griffe reads it) and the type checker; at run time the
        # base's descriptor (compiled, or _Fields.value) is the one that runs

        @property
        def value(self) -> Any:
            """The parameter's value: what the next frame passes to the kernels. Setting it checks the value (its
            type, range and, for a count, the buffers it counts) and folds it into the engine's pending plan."""

        @value.setter
        def value(self, v: Any) -> None: ...

    def __init__(self, block: Any, name: str, dtype: str, value, min=None, max=None, step=None,
                 counts: tuple[str, ...] = ()):
        self.name = name
        self.dtype = dtype
        self._block = block
        self._min, self._max, self._step = min, max, step  # the declared range (None: unbounded) and control step
        check = _value_check(self, dtype)
        self._check = check if min is None and max is None else _in_range(self, check, min, max)
        # the setter's fast test: a value of exactly this Python type within [_lo, _hi] (the type's range and the
        # declared one) is what the full check would return unchanged; anything else takes the full check, which
        # converts it or raises. A count parameter always takes the full check (its bound moves with resizes).
        self._plain, self._lo, self._hi = _fast_test_of(dtype, min, max)
        if counts:  # a count parameter: never past the buffers it counts (see rxcuda.engine._bounds)
            self._check = bounded(self, self._check, counts)
            self._plain = None
        self._value = self._check(value)

    # The range is part of the declaration (it is checked by every setter, shown by the live page's controls and
    # kept by describe()), so it is read-only here: declare another range to change it.
    @property
    def min(self):
        """The smallest value the parameter takes (None: unbounded). Read-only: declare the range with the
        block (``Block.from_kernel(..., ranges=...)``, ``BlockBuilder.scalar``, a sidecar)."""
        return self._min

    @property
    def max(self):
        """The largest value the parameter takes (None: unbounded). Read-only, like :attr:`min`."""
        return self._max

    @property
    def step(self):
        """The step a control offers (None: any); it guides controls only. Read-only, like :attr:`min`."""
        return self._step

    @property
    def counts(self) -> tuple[str, ...]:
        """The ports (and internal buffers) this count parameter counts; () for none. A value above the
        smallest one's element count, or below 0, raises BoundsError (a ValueError) and changes nothing.

        >>> from rxcuda import Block
        >>> Block.from_kernel("kernels/scalar_mul.ptx", size=1024).params["n"].counts
        ('x', 'out')
        """
        return next((s.counts for s in self._block.description.scalars if s.name == self.name), ())

    @property
    def follows(self) -> tuple[str, int | None] | None:
        """``(port, axis)`` when this parameter follows a port's shape (its element count where ``axis`` is None,
        else that axis's length), else None. Such a parameter reads the value the running graph passes: after a
        build where the port runs at another shape than declared (``Block.from_kernel(..., size=512)`` fed by a
        1024-element output), ``value`` is 1024; back at the declared shape, its own value again. A value you set
        is passed until the next build re-derives it.

        >>> from rxcuda import Block
        >>> Block.from_kernel("scalar_mul", size=1024).params["n"].follows
        ('x', None)
        """
        return next((s.size_of for s in self._block.description.scalars if s.name == self.name), None)

    @property
    def limit(self) -> int | None:
        """The largest value this count parameter takes now: the smallest element count, after any resize, of
        the buffers it counts (a slider's end); None when it counts nothing."""
        from ._bounds import capacities

        return min(capacities(self._block, self.counts).values(), default=None) if self.counts else None

    def bind(self, source):
        """Take values from an Observable, on whatever thread it emits; returns a disposable.

        Values are coalesced: the latest before a frame wins. A bad value is reported as a diagnostic
        (when the block is in an engine) and the binding stays alive; disposing ends it.

        >>> from rxcuda import Block
        >>> from reactivex.subject import Subject
        >>> knob = Subject()
        >>> block = Block.from_kernel("scalar_mul", size=1024)
        >>> sub = block.params["scale"].bind(knob)
        >>> knob.on_next(64); block.params["scale"].value
        64.0
        >>> sub.dispose()
        """
        from ..streams._bind import bind_parameter

        def setter(v):
            self.value = v

        d = bind_parameter(source, setter, lambda e: self._block._binding_error(self.name, e))
        self._block._subscriptions.add(d)
        return d

    def __repr__(self) -> str:
        return f"<parameter {self._block.name}.{self.name}: {self.dtype} = {self._value!r}>"


class Parameters(Mapping[str, Parameter]):
    """Read-only mapping name -> Parameter."""

    def __init__(self, params: dict[str, Parameter]):
        self._p = params

    def __getitem__(self, name: str) -> Parameter:
        try:
            return self._p[name]
        except KeyError:
            raise KeyError(f"no parameter '{name}' (parameters: {', '.join(self._p) or 'none'})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._p)

    def __len__(self) -> int:
        return len(self._p)
