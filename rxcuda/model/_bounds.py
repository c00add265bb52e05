"""Count parameters tied to the buffers they count: what keeps a parameter from making a kernel index past
its buffers.

A kernel such as ``scalar_mul(const float* x, float* out, float scale, int n)`` touches ``x`` and ``out`` only
below ``n``. ``n`` *counts* ``x`` and ``out``: a value above the smaller of their element counts would make
the kernel read or write past a buffer, which ends the process's CUDA context (a sticky illegal address). So a
count parameter is tied to the ports it counts, and every way a value arrives (``Block.set``,
``Parameter.value``, ``Parameter.bind``, the live view, a rebuild from data) refuses a value above the
smallest tied buffer's element count, or below 0, with :class:`~rxcuda.model._errors.BoundsError`.

Where the tie comes from, first match wins:

1. declared on the block: ``BlockBuilder.scalar("n", pins, counts=["a", "out"])`` (port or internal names);
2. declared with the kernel: a sidecar's ``{"name": "n", "type": "i32", "counts": ["x", "out"]}``, or in CUDA
   C++ ``int n RX_COUNTS(x, out)`` (or the comment ``/*counts x, out*/``): names of the kernel's pointer
   parameters, mapped to the block ports or internal buffers that feed them;
3. inferred: an integer scalar named like a count (:data:`COUNT_NAMES`) whose value at declaration equals the
   element count of some of its kernel's buffers counts those buffers; a scalar named ``capacity`` in a kernel
   with an append output counts the append buffer (the kernel keeps ``j < capacity``).

A scalar tied to nothing is the user's to keep in bounds; the engine says so once per kernel when the block is
added (an "info" diagnostic). Everything here is pure data; see the architecture page
(``docs/architecture.md``) for where the checks sit.

>>> tie("n", "i32", 1024, [("k", "x"), ("k", "out")], {}, {("k", "x"): ("x", 1024), ("k", "out"): ("out", 1024)})
('x', 'out')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from . import _dtypes

#: Names an integer scalar has when it is an element count (the inference of rule 3 above).
COUNT_NAMES = frozenset({"n", "count", "size", "num_elements", "num", "length", "len", "elements", "capacity",
                         "num_items", "n_elements", "numel"})


def tie(name: str, dtype: str | None, value, pins: Iterable[tuple[str, str]],
        declared: Mapping[tuple[str, str], tuple[str, ...]], buffers: Mapping[tuple[str, str], tuple[str, int]],
        appends: Iterable[tuple[str, str]] = ()) -> tuple[str, ...]:
    """The ports and internal buffers scalar ``name`` counts, in order, without repeats; () for none.

    ``pins``: (kernel, parameter name) the scalar feeds. ``declared``: (kernel, scalar parameter) -> the
    kernel's pointer parameters it counts (rule 2). ``buffers``: (kernel, pointer parameter) -> (port or
    internal buffer name, element count). ``appends``: (kernel, pointer parameter) of append data pointers.
    """
    pins = list(pins)
    out: dict[str, None] = {}
    said = False
    for kernel, param in pins:
        for ptr in declared.get((kernel, param), ()):
            said = True
            found = buffers.get((kernel, ptr))
            if found is not None:
                out[found[0]] = None
    if said:
        return tuple(out)
    if dtype is None or _dtypes.is_float(dtype) or name.lower() not in COUNT_NAMES:
        return ()
    appended = set(appends)
    for kernel, _param in pins:
        mine = [key for key in appended if key[0] == kernel and key in buffers]
        if name.lower() == "capacity" and mine:  # an append kernel's capacity counts its append buffer
            for key in mine:
                out[buffers[key][0]] = None
            continue
        for (k, _ptr), (buf, count) in buffers.items():
            if k == kernel and count == value and (k, _ptr) not in appended:
                out[buf] = None
    return tuple(out)


def count_problem(block: str, name: str, value, capacities: Mapping[str, int], inputs: Iterable[str] = ()
                  ) -> tuple[str, str, int] | None:
    """Why ``value`` is refused for count parameter ``block.name`` whose tied buffers hold ``capacities``
    (name -> element count): (message, the port it broke, that port's element count); None when it fits.
    ``inputs``: which of those are input ports (the message says to resize one of them to grow the buffer).

    >>> print(count_problem("mul", "n", 50_000_000, {"x": 1024, "out": 1024}, {"x"})[0])
    mul.n = 50000000 is more than port 'x' holds (1024 elements): n counts x and out, so the kernel would index \
past the buffer. Set n <= 1024, or grow the buffer first: engine.resize(mul['x'], shape)
    >>> count_problem("mul", "n", 512, {"x": 1024}) is None
    True
    """
    if not capacities:
        return None
    port, cap = min(capacities.items(), key=lambda kv: kv[1])
    tied = " and ".join(capacities)
    if value < 0:
        return (f"{block}.{name} = {value} is negative: {name} counts {tied}, and an element count is 0 or more. "
                f"Set 0 <= {name} <= {cap}"), port, cap
    if value > cap:
        inputs = set(inputs)
        grow = port if port in inputs else next((p for p in capacities if p in inputs), None)
        how = (f"engine.resize({block}['{grow}'], shape)" if grow is not None
               else "engine.resize(input, shape) on the input it follows (an append buffer's capacity is fixed "
               "where it is declared)")
        return (f"{block}.{name} = {value} is more than port '{port}' holds ({cap} elements): {name} counts "
                f"{tied}, so the kernel would index past the buffer. Set {name} <= {cap}, or grow the buffer "
                f"first: {how}"), port, cap
    return None
