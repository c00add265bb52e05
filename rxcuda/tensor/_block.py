"""A tensor program as a block of a live pipeline: ``rxcuda.tensor.block(fn, **inputs)``.

``fn`` is called once with lazy tensors standing for the inputs; what it returns are the outputs. The traced
program is planned with the usual passes, and the plan becomes a :class:`~rxcuda.Block` like any other:

- every keyword argument that is an input spec (``rt.input((1024,), "f32")``, or any array: its shape and
  dtype are taken, not its data) is an **input port** of that name, of that shape and type;
- every keyword argument that is a Python or NumPy number is a **scalar parameter** of that name (a Python
  float is f32, a Python int i32, a NumPy scalar keeps its type): it is a kernel argument, so setting
  ``block.params[name].value`` is a hot update (no rebuild). Parameters never merge with equal literals;
- each fused group of the plan (elementwise, reduce) is **one kernel** (``k0``, ``k1``... in run order),
  the CUDA C++ of ``_codegen.generate`` compiled through NVRTC, launched with ``_tuning.launch_shape``.
  Other scalar fills of the program (literals such as the ``2`` of ``x * 2``) are baked into the source, so
  editing a literal changes only the code;
- each ``matmul`` is **one cuBLAS GEMM call** (``gemm0``, ``gemm1``... in run order: an
  ``rxcuda.libraries.gemm`` step, captured as a child-graph node between the kernels): 2-D operands, or a 1-D
  one as a matrix of one row (first) or one column (second); f32, f64 or f16, both of one type; each operand
  an input port, a computed buffer, or the transpose of either (``x.T @ w`` sets cuBLAS's transpose flag: no
  copy). Its ``alpha`` is the scalar parameter ``gemm0_alpha`` (1.0; a device scalar, so setting it scales
  that product as a hot update);
- values passed from one kernel or call to another are the block's **internal buffers**; views between
  kernels (transpose, reshape, ``None`` axes, broadcasting) are strides the reading kernel uses, no copy;
- the returned tensor is the output port ``out``; a tuple/list gives ``out0``, ``out1``...; a dict names
  them. A bool output is a ``u8`` port of one byte per element (so a block can compute a region's flag).

Not yet in blocks (each raises ValueError saying so): a batched (more than 2-D) matmul, a matmul of a view
cuBLAS cannot read as a matrix or its transpose (a column slice, a step, a broadcast: make it a buffer with
``x[:, :k] + 0``), matmul operands of two types, device copies, arrays captured from outside ``fn`` (pass
them as inputs), slices that start past element 0, an output that is a view or is also read by a later kernel
of the block (return ``y + 0``), and a group the generator cannot express.

:meth:`TensorBlock.retrace` (or :func:`update`) traces a new program for the same inputs: when the kernels,
their parameter layouts, the GEMM calls (shapes, types, transposes), the ports, parameters and internal
buffers are all unchanged, each kernel whose source changed is swapped through ``Block.set_code`` (Code
tier, no rebuild: an edited literal next to a GEMM, say); otherwise the block takes the new description in
place (the engine rebuilds: Structure tier; in an engine through ``engine.replace``, so the ports in use must
still fit, and parameter bindings end). ``block.last_change`` says what changed. Parameter values carry over
by name.

A tensor block sits in a region (``rxcuda.If(flag, [blk])``) or a composite (``Composite.add(blk)``) like
any block: its kernels and GEMMs become nodes of the frame graph there.

>>> import rxcuda.tensor as rt
>>> blk = rt.block(lambda x, scale: rt.exp(x * scale) + 1, x=rt.input((1024,), "f32"), scale=0.5)
>>> [p.name for p in blk.inputs], [p.name for p in blk.outputs], blk.params["scale"].value
(['x'], ['out'], 0.5)
>>> layer = rt.block(lambda x, w, b: rt.maximum(x @ w + b, 0), x=rt.input((32, 64)), w=rt.input((64, 16)),
...                  b=rt.input(16))
>>> [k.name for k in layer.description.kernels], layer.params["gemm0_alpha"].value
(['gemm0', 'k0'], 1.0)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from ..blocks._blocks import Block, Parameter, Parameters
from ..model import _dtypes
from ..model._describe import BlockDescription, CallSpec, KernelSpec
from ..model._events import Tier
from ..model._shapes import fmt
from ._codegen import generate
from ._graph import Buffer, Node, topo
from ._ir import ENTRY, ctype, group_ir
from ._passes import Passes, plan
from ._tuning import launch_shape

DEVICE = "cuda"
__all__ = ["InputSpec", "TensorBlock", "block", "input", "update"]


@attrs.frozen
class InputSpec:
    """An input port of a tensor block: its shape and NumPy dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __repr__(self) -> str:
        return f"input({self.shape}, {_dtypes.dtype_name(self.dtype)!r})"


def input(shape, dtype="f32") -> InputSpec:  # noqa: A001 - rt.input reads like the port it declares
    """The spec of an input port: ``rt.input((480, 640), "f32")`` (a dtype name, NumPy dtype or type)."""
    if isinstance(shape, int | np.integer):
        shape = (int(shape),)
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"an input's shape is a tuple of ints (got {shape!r})") from None
    if any(d <= 0 for d in shape):
        raise ValueError(f"an input port needs a shape of positive lengths (got {shape})")
    return InputSpec(shape, _dtypes.to_numpy(dtype) if isinstance(dtype, str) else np.dtype(dtype))


def _spec(name: str, value) -> InputSpec | Node:
    """An input spec, or the ``full`` leaf of a scalar parameter, for the keyword argument ``name``."""
    if isinstance(value, InputSpec):
        return value
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"tensor block argument '{name}': a bool is not a parameter type; pass an int or float "
                        "(or an input spec)")
    if isinstance(value, int | float | np.integer | np.floating):
        dtype = np.dtype(np.float32 if isinstance(value, float) else np.int32 if isinstance(value, int)
                         else value.dtype)
        return Node("full", (), (dtype.type(value), name), (), dtype, DEVICE)  # named: never merged with a literal
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None and not isinstance(value, str | bytes):
        return input(shape, np.dtype(str(dtype)) if not isinstance(dtype, np.dtype) else dtype)
    raise TypeError(f"tensor block argument '{name}' is a {type(value).__name__}: pass an input spec "
                    "(rxcuda.tensor.input(shape, dtype)), an array whose shape and dtype the port takes, or a "
                    "Python/NumPy number (a scalar parameter)")


# -- where a value lives in the block ----------------------------------------------------------------------
@attrs.frozen
class _Ref:
    """A value as a kernel reads it: a buffer (an input port's name, or the node that writes an internal or
    output buffer), and its shape, strides (bytes) and dtype in that buffer."""

    base: Any
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype


def _contiguous(base, shape: tuple, dtype: np.dtype) -> _Ref:
    strides, acc = [], dtype.itemsize
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return _Ref(base, tuple(shape), tuple(reversed(strides)), dtype)


def _view(n: Node, src: _Ref) -> _Ref:
    """``n`` (a view op) of ``src``, as strides over the same buffer; ValueError where it needs an offset or
    a copy."""
    if n.op == "reshape":
        if src.strides != _contiguous(None, src.shape, src.dtype).strides:
            raise ValueError(f"a reshape {src.shape} -> {n.shape} of a non-contiguous view is not yet in tensor "
                             "blocks")
        return _contiguous(src.base, n.shape, n.dtype)
    if n.op == "transpose":
        (axes,) = n.attrs
        return _Ref(src.base, n.shape, tuple(src.strides[a] for a in axes), n.dtype)
    if n.op == "broadcast_to":
        off = len(n.shape) - len(src.shape)
        strides = [0] * off + [0 if d == 1 and t != 1 else s
                               for d, t, s in zip(src.shape, n.shape[off:], src.strides, strict=True)]
        return _Ref(src.base, n.shape, tuple(strides), n.dtype)
    if n.op == "getitem":
        (index,) = n.attrs
        strides, axis = [], 0
        for item in index:
            if item[0] == "new":
                strides.append(0)
                continue
            if item[0] == "int" and item[1] != 0 or item[0] == "slice" and item[1] != 0:
                raise ValueError("a slice or index that starts past element 0 is not yet in tensor blocks (a block's "
                                 "kernels read their buffers from the start); slice inside the program after a "
                                 "computation, or pass the slice as an input")
            if item[0] == "slice":
                strides.append(src.strides[axis] * item[3])
            axis += 1
        strides.extend(src.strides[axis:])
        return _Ref(src.base, n.shape, tuple(strides), n.dtype)
    raise ValueError(f"a {n.op} group is not yet in tensor blocks")


GEMM_DTYPES = ("f32", "f64", "f16")
"""Operand types of a matmul in a tensor block (those of ``rxcuda.libraries.gemm`` that tensors have: bf16 has no
NumPy type)."""


def _transposed(ref: _Ref) -> bool | None:
    """How cuBLAS reads the matmul operand ``ref``: False where it is a C-order matrix (or vector), True where
    it is the transpose of one (``x.T``: cuBLAS's op flag, no copy), None where it is neither (a column slice,
    a step, a broadcast: a buffer cuBLAS cannot read as rows)."""
    it = ref.dtype.itemsize
    if len(ref.shape) == 1:
        return False if ref.shape[0] == 1 or ref.strides[0] == it else None
    (r, c), (s0, s1) = ref.shape, ref.strides
    if (c == 1 or s1 == it) and (r == 1 or s0 == c * it):
        return False
    if (r == 1 or s0 == it) and (c == 1 or s1 == r * it):
        return True
    return None


def _gemm(n: Node, ins: tuple[Node, ...], refs: list[_Ref | None], name: str):
    """The cuBLAS GEMM call for the matmul ``n`` of ``ins`` (read as ``refs``: None for a fill): ``a @ b`` of
    matrices or vectors (a vector is a matrix with one row, or one column), each operand in C order or
    transposed (``x.T @ w``: ``trans_a``), the result a C-order buffer ``c``; ValueError naming the matmul and
    the workaround for what cuBLAS cannot take as it is."""
    from ..libraries import gemm

    a, b = ins
    what = f"matmul {fmt(a.shape)} @ {fmt(b.shape)} in a tensor block"
    if len(a.shape) > 2 or len(b.shape) > 2:
        raise ValueError(f"{what}: a batched (more than 2-D) matmul is not yet in tensor blocks; fold the batch "
                         "axes into the rows where the second operand is one matrix ((x.reshape(-1, k) @ w)"
                         ".reshape(...)), or put an rxcuda.libraries.gemm(m, n, k, batch=...) block beside this one")
    names = [_dtypes.dtype_name(i.dtype) if i.dtype.kind == "f" else str(i.dtype) for i in ins]
    if names[0] != names[1] or names[0] not in GEMM_DTYPES:
        raise ValueError(f"{what}: the operands are {names[0]} and {names[1]}; cuBLAS GEMM takes two operands of "
                         f"one type, {', '.join(GEMM_DTYPES)}: cast in the program (x.astype('f32') @ w)")
    trans = []
    for which, ref in zip(("first", "second"), refs, strict=True):
        if ref is None:
            raise ValueError(f"{what}: the {which} operand is a fill (rt.full, ones, zeros or a parameter), which "
                             "has no buffer in a block; pass the matrix as an input of the block")
        t = _transposed(ref)
        if t is None:
            strides = tuple(s // ref.dtype.itemsize for s in ref.strides)
            raise ValueError(f"{what}: the {which} operand {fmt(ref.shape)} is a view with element strides "
                             f"{strides} (a column slice, a step or a broadcast), which cuBLAS cannot read as "
                             "a matrix in C order or its transpose; make it a buffer of its own in the program "
                             "(x[:, :k] + 0), or pass it as an input")
        trans.append(t)
    m = a.shape[0] if len(a.shape) == 2 else 1
    k = a.shape[-1]
    cols = b.shape[1] if len(b.shape) == 2 else 1
    return gemm(m, cols, k, dtype=names[0], trans_a=trans[0], trans_b=trans[1], name=name)


def _bake(source: str, literals: Mapping[int, tuple[Any, np.dtype]]) -> str:
    """``source`` with the scalar arguments ``s<k>`` of ``literals`` turned into constants of the body."""
    if not literals:
        return source
    at = source.index(f" {ENTRY}(")
    head, sep, body = source[at:].partition(")\n{\n")
    consts = []
    for k, (value, dtype) in literals.items():
        t = ctype(dtype)
        head, count = re.subn(rf"(\(|, )(?:unsigned char|{re.escape(t)}) s{k}(?=,|$)",
                             lambda m: "(" if m.group(1) == "(" else "", head)
        assert count == 1, f"scalar s{k} not found in the kernel signature"
        lit = repr(float(value)) if dtype.kind == "f" else str(int(value))
        if dtype.kind == "f" and not np.isfinite(value):
            lit = {np.inf: "__int_as_float(0x7f800000)", -np.inf: "-__int_as_float(0x7f800000)"}.get(
                float(value), "__int_as_float(0x7fffffff)")
        consts.append(f"    const {'unsigned char' if t == 'bool' else t} s{k} = ({t})({lit});")
    head = head.replace("(, ", "(")
    return source[:at] + head + sep + "\n".join(consts) + "\n" + body


@attrs.frozen
class _Traced:
    description: BlockDescription
    groups: int
    calls: int
    specs: dict[str, Any]


def _outputs(result) -> dict[str, Node]:
    from ._tensor import Tensor

    if isinstance(result, Tensor):
        items = {"out": result}
    elif isinstance(result, tuple | list):
        items = {f"out{i}": t for i, t in enumerate(result)}
    elif isinstance(result, dict):
        items = dict(result)
    else:
        raise TypeError(f"a tensor block's program returns a Tensor, a tuple/list or a dict of them (got a "
                        f"{type(result).__name__})")
    if not items:
        raise TypeError("a tensor block's program returned no outputs")
    for k, t in items.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"a tensor block's output '{k}' is a {type(t).__name__}, not a Tensor")
        if not isinstance(k, str) or not k:
            raise TypeError(f"output names are non-empty str (got {k!r})")
    return {k: t.node for k, t in items.items()}


def _trace(fn: Callable, name: str, args: Mapping[str, Any]) -> _Traced:
    from ..blocks._blocks import BlockBuilder
    from ..sources._nvrtc import compile_cuda
    from ._tensor import Tensor

    if not callable(fn):
        raise TypeError(f"rxcuda.tensor.block takes a function (got {type(fn).__name__})")
    leaves: dict[str, Node] = {}
    params: dict[Node, str] = {}
    inputs: dict[Node, str] = {}
    specs: dict[str, Any] = {}
    for key, value in args.items():
        spec = _spec(key, value)
        if isinstance(spec, Node):
            leaves[key], params[spec] = spec, key
            specs[key] = value
        else:
            leaf = Node("const", (), (Buffer(None, owned=True),), spec.shape, spec.dtype, DEVICE)
            leaves[key], inputs[leaf] = leaf, key
            specs[key] = spec
    outs = _outputs(fn(**{k: Tensor(n) for k, n in leaves.items()}))
    program = topo(list(outs.values()))
    for n in program:
        if n.op == "const" and n not in inputs:
            raise ValueError(f"the program reads an array {n.shape} from outside its arguments; pass it as an input "
                             "(a keyword argument) of the tensor block")
        if n.op == "copy":
            raise ValueError("a device copy (.to) has no place in a tensor block: it runs on the GPU")
    p = plan(list(outs.values()), passes=Passes())  # keys: a parameter's fill carries its name (_spec)
    out_nodes = [p.input_map.get(n, n) for n in outs.values()]
    if len(set(out_nodes)) != len(out_nodes):
        raise ValueError("two outputs of the tensor block are the same value; return it once")
    out_name = dict(zip(out_nodes, outs, strict=True))

    b = BlockBuilder(name)
    refs: dict[Node, _Ref] = {leaf: _contiguous(key, leaf.shape, leaf.dtype) for leaf, key in inputs.items()}
    producer: dict[Node, tuple] = {}  # computed node -> (kernel handle, out pin name)
    readers: dict[Node, list] = {}  # computed node -> pins reading its buffer
    port_pins: dict[str, list] = {}
    param_pins: dict[str, list] = {}
    alphas: dict[str, Any] = {}  # each GEMM's alpha: a device scalar the engine reads from a block parameter
    kernels = calls = 0

    def read(i: Node, pin) -> None:  # ``pin`` reads the buffer holding ``i``: a port's, or an internal one
        base = refs[i].base
        if isinstance(base, str):
            port_pins.setdefault(base, []).append(pin)
        else:
            readers.setdefault(base, []).append(pin)

    for g in p.groups:
        if g.kind == "view":
            for n in g.nodes:
                src = p.inputs_of(n)[0]
                if src not in refs:
                    raise ValueError(f"a {n.op} of a fill {fmt(src.shape)} (rt.full, ones, zeros) is not yet in "
                                     "tensor blocks: it has no buffer; pass the array as an input of the block")
                refs[n] = _view(n, refs[src])
            continue
        if g.kind == "matmul":
            (n,) = g.nodes
            ins = p.inputs_of(n)
            call = b.add_call(_gemm(n, ins, [refs.get(i) for i in ins], f"gemm{calls}"))
            calls += 1
            for i, pin in zip(ins, ("a", "b"), strict=True):
                read(i, call[pin])
            producer[n] = (call, "c")
            refs[n] = _contiguous(n, n.shape, n.dtype)
            alphas[f"{call.name}_alpha"] = call["alpha"]
            continue
        if g.kind not in ("elementwise", "reduce"):
            raise ValueError(f"a {g.kind} group is not yet in tensor blocks")
        values = [None if i.op == "full" else refs[i] for i in g.inputs]
        ir = group_ir(g, p, values)
        if ir is None:
            raise ValueError(f"group {g.index} ({', '.join(n.op for n in g.nodes)}) is beyond the CUDA generator; "
                             "tensor blocks need every group as one generated kernel")
        literals = {k: (i.attrs[0], i.dtype) for k, i in enumerate(g.inputs) if i.op == "full" and i not in params}
        source = _bake(generate(ir), literals)
        code = compile_cuda(source, entry=ENTRY, name=f"{name}_k{kernels}.cu")
        blocks, threads = launch_shape(ir)
        if blocks == 0:
            raise ValueError(f"group {g.index} of the tensor block has nothing to compute (an empty shape)")
        k = b.add_kernel(code, name=f"k{kernels}", grid=blocks, block=threads)
        kernels += 1
        for j, i in enumerate(g.inputs):
            if i.op == "full":
                if i in params:
                    param_pins.setdefault(params[i], []).append(k[f"s{j}"])
                continue
            read(i, k[f"in{j}"])
        for j, o in enumerate(g.outputs):
            producer[o] = (k, f"out{j}")
            refs[o] = _contiguous(o, o.shape, o.dtype)
    for key in (k for k in specs if isinstance(specs[k], InputSpec)):
        if key not in port_pins:
            raise ValueError(f"input '{key}' is not used by a kernel of the tensor block (an unused input, or one "
                             "only returned or viewed); use it in the program or leave it out")
        spec = specs[key]
        b.input(key, port_pins[key], shape=spec.shape)
    for leaf, key in params.items():
        if key not in param_pins:
            raise ValueError(f"parameter '{key}' is not used by a kernel of the tensor block")
        b.scalar(key, param_pins[key], default=leaf.attrs[0].item())
    for key, pin in alphas.items():
        if key in specs or key in outs:
            raise ValueError(f"'{key}' names the alpha parameter of the block's GEMM {key[:-6]}; give the "
                             f"{'argument' if key in specs else 'output'} another name")
        b.scalar(key, pin, default=1.0)
    for n, key in out_name.items():
        if n not in producer:
            what = "an input or parameter" if n.op in ("const", "full") else f"a {n.op} view"
            raise ValueError(f"output '{key}' is {what}, not a value a kernel computes: not yet in tensor blocks; "
                             f"return a computed value ({key} + 0)")
        if n in readers:
            raise ValueError(f"output '{key}' is also read by a later kernel or GEMM of the block: not yet in tensor "
                             f"blocks; return a copy of it ({key} + 0)")
        k, pin = producer[n]
        # a bool is one byte the generated kernel writes through an untyped pointer: a u8 port (a region's flag)
        b.output(key, k[pin], dtype="u8" if n.dtype == np.bool_ else None,
                 **({"shape": n.shape} if n.shape else {"count": 1}))
    for n, (k, pin) in producer.items():
        if n not in out_name and n in readers:
            b.connect(k[pin], readers[n], count=max(1, int(np.prod(n.shape, dtype=np.int64))),
                      name=f"{k.name}.{pin}")
    block = b.build()
    return _Traced(block.description, kernels, calls, specs)


class TensorBlock(Block):
    """A block traced from a tensor program (see :func:`block`). ``kernels`` counts its generated kernels (one
    per fused group), ``calls`` its library calls (one GEMM per matmul); :meth:`retrace` gives it a new
    program."""

    def __init__(self, traced: _Traced, fn: Callable):
        super().__init__(traced.description)
        self.fn = fn
        self.kernels = traced.groups
        self.calls = traced.calls
        self._specs = traced.specs
        self.last_change = ""

    def retrace(self, fn: Callable) -> Tier | None:
        """Trace ``fn`` for the same inputs and parameters. Unchanged kernel layouts, GEMM calls, ports,
        parameters and internal buffers: the kernels whose code changed are swapped in (Code tier; ``"nothing"`` if none
        did: None). Otherwise the block takes the new description in place and the engine rebuilds it (Structure
        tier); ``last_change`` says what changed."""
        traced = _trace(fn, self.name, self._specs)
        new, old = traced.description, self.description
        why = _difference(old, new)
        self.fn, self.kernels, self.calls = fn, traced.groups, traced.calls
        if not why:
            swapped = [k.name for k, n in zip(old.kernels, new.kernels, strict=True)
                       if isinstance(k, KernelSpec) and isinstance(n, KernelSpec) and k.code.key != n.code.key]
            for kname in swapped:
                self.set_code(kname, new.kernel(kname).code)
            self.last_change = f"code of {', '.join(swapped)}" if swapped else "nothing"
            return Tier.CODE if swapped else None
        self.last_change = why
        self._restructure(new)
        return Tier.STRUCTURE

    def _restructure(self, desc: BlockDescription) -> None:
        engine = self._engine
        if engine is None:
            self._take(desc)
            return
        # the engine's hot-swap, twice: a stand-in with the old description takes this block's place (equal
        # descriptions: nothing rebuilt), then this block, now with the new one, takes it back (a rebuild)
        stand_in = Block(self.description)
        engine.replace(self, stand_in)
        self._take(desc)
        engine.replace(stand_in, self)

    def _take(self, desc: BlockDescription) -> None:
        values = {n: (p.dtype, p._value) for n, p in self.params.items()}
        self._desc = desc
        self._launches = {}
        fresh = {s.name: Parameter(self, s.name, s.dtype, s.default, s.min, s.max, s.step) for s in desc.scalars}
        for n, prm in fresh.items():
            if n in values and values[n][0] == prm.dtype:
                prm._value = values[n][1]
        self.params = Parameters(fresh)


def _difference(old: BlockDescription, new: BlockDescription) -> str:
    """What keeps ``new`` from being a Code-tier swap of ``old`` ("" when nothing does)."""
    ok, nk = [k.name for k in old.kernels], [k.name for k in new.kernels]
    if ok != nk:
        return f"kernels {', '.join(ok)} -> {', '.join(nk)}"
    for a, c in zip(old.kernels, new.kernels, strict=True):
        if isinstance(a, CallSpec) and isinstance(c, CallSpec):  # a library call (a GEMM): the same call or not
            if (a.key, a.params, a.device_scalars) != (c.key, c.params, c.device_scalars):
                return f"call {a.name}: {getattr(c, 'summary', '') or 'another call'}"
            continue
        if not (isinstance(a, KernelSpec) and isinstance(c, KernelSpec)):
            return f"{a.name}: a kernel and a library call"
        if not a.code.signature.same_layout(c.code.signature):
            return f"parameter layout of kernel {a.name}"
        if a.launch != c.launch:
            return f"launch of kernel {a.name}"
    if old.ports != new.ports:
        return "ports"
    if old.internals != new.internals:
        return "internal buffers"
    if [(s.name, s.dtype, s.pins) for s in old.scalars] != [(s.name, s.dtype, s.pins) for s in new.scalars]:
        return "parameters"
    return ""


def block(fn: Callable, *, name: str | None = None, **inputs) -> TensorBlock:
    """Trace ``fn`` into a block (see the module docstring): keyword arguments are input specs
    (``rt.input(shape, dtype)`` or an array) or numbers (scalar parameters); ``name`` defaults to the
    function's name."""
    if not callable(fn):
        raise TypeError(f"rxcuda.tensor.block takes a function (got {type(fn).__name__})")
    bname = name or getattr(fn, "__name__", "") or "tensor"
    if bname == "<lambda>":
        bname = "tensor"
    return TensorBlock(_trace(fn, bname, inputs), fn)


def update(blk: TensorBlock, fn: Callable) -> Tier | None:
    """``blk.retrace(fn)``."""
    if not isinstance(blk, TensorBlock):
        raise TypeError(f"rxcuda.tensor.update takes a block made by rxcuda.tensor.block (got {blk!r})")
    return blk.retrace(fn)
