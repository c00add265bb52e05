"""What rxcuda.tensor promises its users beyond the numbers (issue 18): its errors are RxcudaErrors, the kernel
compile count is public in ``stats()``, a tensor made from data on another device can be written, and the CPU
backend gives IEEE values without NumPy's floating-point warnings. No GPU needed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import rxcuda
import rxcuda.tensor as rt
from rxcuda.tensor import _cache, _cuda, _factory, _ir
from rxcuda.tensor._passes import plan


# -- errors ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("error, builtin", [(rt.DeviceError, ValueError), (rt.GradientError, ValueError),
                                            (rt.CudaUnavailableError, RuntimeError), (rt.ShapeError, ValueError)])
def test_tensor_errors_are_rxcuda_errors_and_their_builtin(error, builtin):
    assert issubclass(error, rxcuda.RxcudaError) and issubclass(error, builtin)


def test_each_tensor_error_is_caught_as_an_rxcuda_error():
    with pytest.raises(rxcuda.RxcudaError, match=r"unknown device 'tpu': use 'cpu' or 'cuda'"):
        rt.zeros(3, device="tpu")
    with pytest.raises(rxcuda.RxcudaError, match="operands on different devices"):
        rt.tensor(np.ones(2)) + rt.tensor(np.ones(2)).to("cuda")
    with pytest.raises(rxcuda.RxcudaError, match="do not broadcast"):
        rt.tensor(np.ones(2)) + rt.tensor(np.ones(3))
    x = rt.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(rxcuda.RxcudaError, match="scalar"):
        (x * 2).backward()


# -- the compile count -------------------------------------------------------------------------------------------
def _ir_of(y):
    p = plan([y.node])
    (g,) = [g for g in p.groups if g.kind != "view"]
    return _ir.group_ir(g, p, [np.empty(i.shape, i.dtype) for i in g.inputs])


def test_a_factory_counts_its_compiles_into_the_stats_it_is_given():
    stats = rt.Stats()
    factory = _factory.KernelFactory(stats=stats)
    ir = _ir_of(rt.exp(rt.tensor(np.ones((3, 5), np.float32)) * 2.0))
    kernel = factory.get(ir)
    assert factory.get(ir) is kernel and (stats.compiles, factory.misses, factory.hits) == (1, 1, 1)
    factory.get(_ir_of(rt.tensor(np.ones(7, np.float32)) + 1.0))
    assert stats.compiles == 2 and stats.upgrades == 0


def test_the_backend_factory_counts_into_rt_stats_and_reset_zeroes_it():
    assert _cuda.FACTORY.stats is _cache.STATS
    rt.reset_stats()
    ir = _ir_of(rt.tanh(rt.tensor(np.ones((2, 9), np.float32))) - 0.125 * 3)
    before = _cuda.FACTORY.misses
    _cuda.FACTORY.get(ir)
    made = _cuda.FACTORY.misses - before  # 0 if an earlier test made this very kernel
    assert rt.stats().compiles == made
    _cuda.FACTORY.get(ir)
    assert rt.stats().compiles == made  # a repeat is a lookup
    snapshot = rt.stats()
    snapshot.compiles += 100  # a copy: the process's counters do not move
    assert rt.stats().compiles == made
    rt.reset_stats()
    assert rt.stats() == rt.Stats()


def test_an_upgrade_swapped_in_is_counted():
    stats = rt.Stats()
    factory = _factory.KernelFactory(upgrade=True, stats=stats)
    kernel = factory.get(_ir_of(rt.exp(rt.tensor(np.ones((4, 33), np.float32)) * 1.25)))
    kernel.function = "ptx function"
    load = lambda code: ("module", "tuned function")  # noqa: E731
    kernel.current(load)
    kernel.current(load)  # the second launch starts the NVRTC build
    assert factory.wait(timeout=120) == 0
    assert kernel.current(load) == "tuned function" and (stats.compiles, stats.upgrades) == (1, 1)


# -- writes ------------------------------------------------------------------------------------------------------
def test_a_tensor_made_from_data_on_another_device_writes_its_data():
    a = np.arange(6.0)
    t = rt.tensor(a, device="cuda")
    assert t.device == "cuda" and t.node.op == "copy" and t.version == 0
    t[1:3] = 7.0
    t[0] = np.float64(-1.0)
    assert t.version == 2
    data = t.node.inputs[0].attrs[0].array  # the host copy tensor() made; the next evaluation moves it again
    assert data.tolist() == [-1.0, 7.0, 7.0, 3.0, 4.0, 5.0] and a.tolist() == [0, 1, 2, 3, 4, 5]
    c = rt.tensor(a, device="cpu")
    c[0] = 9.0
    assert c.node.op == "const" and c.numpy()[0] == 9.0 and c.version == 1


def test_a_moved_tensor_is_still_a_lazy_copy():
    x = rt.tensor(np.ones(3))
    with pytest.raises(TypeError, match=r"only a tensor made from data can be written \(this one is a lazy copy\)"):
        x.to("cuda")[0] = 2.0
    with pytest.raises(TypeError, match=r"this one is a lazy mul"):
        (x * 2)[0] = 1.0
    with pytest.raises(TypeError, match=r"mark_unchanged\(\) is for tensors holding an outside array"):
        rt.tensor(np.ones(3), device="cuda").mark_unchanged()


# -- IEEE values, no warnings ------------------------------------------------------------------------------------
def test_the_cpu_backend_gives_ieee_values_without_warnings():
    x = rt.tensor(np.array([0.0, -1.0, 1.0, np.inf], np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = rt.log(x).numpy()
        quotient = (x / 0.0).numpy()
    np.testing.assert_array_equal(out, np.array([-np.inf, np.nan, 0.0, np.inf], np.float32))
    np.testing.assert_array_equal(quotient, np.array([np.nan, -np.inf, np.inf, np.inf], np.float32))
