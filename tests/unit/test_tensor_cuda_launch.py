"""The CUDA backend's launch path without a GPU: ``Backend.prepare`` loads a group's kernel through
``rxcuda.cuda._kernels`` and launches it with ``launch_shape``'s grid and block, on the backend's stream, with
one argument per IR input (a pointer, or a fill's value as its dtype, a bool as one byte) and one pointer per
output. CuPy is a stand-in that hands out addresses; the driver is the null driver, reading what it is handed."""

from __future__ import annotations

import ctypes
import itertools
import struct
from types import SimpleNamespace

import numpy as np
import pytest
from _blocks import BlockReading

import rxcuda.tensor as rt
from rxcuda.cuda import NullDriver, _kernels
from rxcuda.model._errors import CudaError
from rxcuda.tensor import _cuda, _factory, _ir
from rxcuda.tensor._passes import plan
from rxcuda.tensor._tuning import launch_shape

CODES = {"b1": "B", "f4": "f", "f8": "d", "i4": "i", "i8": "q"}  # a fill's struct code (a bool is one byte)


class FakeArray:
    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.strides = tuple(int(s) for s in np.empty(self.shape, self.dtype).strides)
        self.data = SimpleNamespace(ptr=ptr)


class FakeStream:
    ptr = 0xABC0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeCupy:
    """What the backend's launch path uses of CuPy: a stream and ``empty``."""

    def __init__(self):
        self.freed: list[int] = []
        self.cuda = SimpleNamespace(Stream=FakeStream, runtime=SimpleNamespace(free=self.freed.append))
        self._ptrs = itertools.count(0x7F00_0000_0000, 0x10000)

    def empty(self, shape, dtype):
        return FakeArray(shape, dtype, next(self._ptrs))


class Reading(NullDriver):
    """Reads each launch's arguments through ``kernelParams`` with the struct codes of ``layout``."""

    def __init__(self):
        super().__init__()
        self.layout = ""
        self.seen: list[tuple] = []

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_void_p * len(self.layout)).from_address(params)
        values = tuple(struct.unpack("<" + c, ctypes.string_at(p, struct.calcsize("<" + c)))[0]
                       for c, p in zip(self.layout, pointers, strict=True))
        self.seen.append(((gx, gy, gz), (bx, by, bz), shared, int(stream), values))
        return super().cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)


@pytest.fixture
def api(monkeypatch):
    reading = Reading()
    monkeypatch.setattr(_kernels, "drv", reading)
    monkeypatch.setattr(_cuda, "FACTORY", _factory.KernelFactory())
    return reading


def _group(*tensors):
    p = plan([t.node for t in tensors])
    (g,) = [g for g in p.groups if g.kind in ("elementwise", "reduce")]
    return g, p


@pytest.mark.parametrize("program", [
    lambda x, w: rt.where(x > w, True, x < -0.5),          # a bool fill (one byte) and a float32 fill
    lambda x, w: rt.softmax(x * 1.5 + w, axis=-1),          # a reduce group
    lambda x, w: (x.astype(np.int64) * 3 - 2).sum(axis=0),  # int64 fills
])
def test_a_launch_hands_the_driver_each_argument_as_the_kernel_takes_it(api, program):
    x = rt.asarray(np.ones((6, 40), np.float32))
    w = rt.asarray(np.ones(40, np.float32))
    g, p = _group(program(x, w))
    be = _cuda.Backend(FakeCupy())
    inputs, want, layout = [], [], ""
    for k, n in enumerate(g.inputs):
        if n.op == "full":
            inputs.append(be.leaf_value(n))
            value = n.attrs[0]
            want.append(int(bool(value)) if n.dtype == np.bool_ else n.dtype.type(value).item())
            layout += CODES[n.dtype.str[1:]]
        else:
            inputs.append(FakeArray(n.shape, n.dtype, 0x5000_0000 + 0x1000 * k))
            want.append(0x5000_0000 + 0x1000 * k)
            layout += "Q"
    api.layout = layout + "Q" * len(g.outputs)
    ir = _ir.group_ir(g, p, inputs)
    assert ir is not None
    launch = be.prepare(ir, g)
    outs = launch(inputs)
    outs2 = launch(inputs)  # a second launch: the same launcher, new outputs
    (first, second) = api.seen
    blocks, threads = launch_shape(ir)
    assert first[:4] == ((blocks, 1, 1), (threads, 1, 1), 0, FakeStream.ptr)
    assert first[4] == (*want, *(o.data.ptr for o in outs))
    assert second[4] == (*want, *(o.data.ptr for o in outs2))
    assert [(o.shape, o.dtype) for o in outs] == [(n.shape, n.dtype) for n in g.outputs]
    kernel = _cuda.FACTORY.get(ir)
    assert isinstance(kernel.module, _kernels.KernelModule) and kernel.function.entry == _ir.ENTRY
    assert api.count("cuModuleLoadDataEx") == 1  # PTX, JIT level 0
    assert be.cp.freed == [0]  # cudaFree(0) first: the load goes into CuPy's context


def test_a_ptx_the_driver_refuses_names_the_kernel_source_and_the_fix(api):
    x = rt.asarray(np.ones((3, 4), np.float32))
    g, p = _group(rt.exp(x) + 1.0)
    be = _cuda.Backend(FakeCupy())
    ir = _ir.group_ir(g, p, [FakeArray(n.shape, n.dtype, 0x1000) if n.op != "full" else be.leaf_value(n)
                             for n in g.inputs])
    api.fail("cuModuleLoadDataEx", "CUDA_ERROR_INVALID_PTX")
    with pytest.raises(CudaError, match=r"GroupKernel\.source.*KernelFactory\(ptx=False\)"):
        be.prepare(ir, g)


def test_an_interpreted_group_launches_the_interpreter_with_its_program(monkeypatch):
    from rxcuda.tensor import _interp

    api = BlockReading(_interp._SIZE)
    monkeypatch.setattr(_kernels, "drv", api)
    factory = _factory.KernelFactory(interpret=True)
    assert factory.interpreter(wait=True) is not None
    monkeypatch.setattr(_cuda, "FACTORY", factory)
    x = rt.asarray(np.ones((6, 40), np.float32))
    g, p = _group(rt.exp(x * 1.5) / 3.0)
    cupy = FakeCupy()
    cupy.cuda.Device = lambda: SimpleNamespace(attributes={"MultiProcessorCount": 2})
    be = _cuda.Backend(cupy)
    inputs = [FakeArray(n.shape, n.dtype, 0x5000_0000) if n.op != "full" else be.leaf_value(n) for n in g.inputs]
    ir = _ir.group_ir(g, p, inputs)
    launch = be.prepare(ir, g)
    outs, outs2 = launch(inputs), launch(inputs)
    kernel = factory.get(ir)
    assert factory.interp_misses == 1 and kernel.interp is not None and kernel.function.entry == "rx_interp_f4"
    assert api.count("cuModuleLoadData") == 1 and api.count("cuModuleLoadDataEx") == 0  # the cubin, no JIT
    g2, p2 = _group(rt.sqrt(x) - 2.5)
    inputs2 = [FakeArray(n.shape, n.dtype, 0x6000_0000) if n.op != "full" else be.leaf_value(n) for n in g2.inputs]
    be.prepare(_ir.group_ir(g2, p2, inputs2), g2)(inputs2)
    assert factory.interp_misses == 2 and api.count("cuModuleLoadData") == 1  # the interpreter is loaded once
    (grid, block, stream, first), (_, _, _, second) = api.seen[:2]
    assert grid == (1, 1, 1) and block == (256, 1, 1) and stream == FakeStream.ptr  # ceil(240 / 256), <= 8 per SM
    fmt = "<" + "".join("Q" if n.op != "full" else "d" for n in g.inputs) + "Q"
    want = [0x5000_0000 if n.op != "full" else float(n.attrs[0]) for n in g.inputs]
    assert struct.unpack_from(fmt, first) == (*want, outs[0].data.ptr)
    assert struct.unpack_from(fmt, second) == (*want, outs2[0].data.ptr)
    assert first[_interp._STATIC_AT:] == kernel.interp.static()
