"""NVTX ranges (rxcuda.cuda._nvtx): nothing at all unless ``nvtx`` imports and a tool collects; then ranges
around tick, apply per tier, rebuild, capture, compile and reload. A fake ``nvtx`` module records the calls."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import rxcuda
from rxcuda.cuda import NullDriver, _nvtx

N = 64


class FakeNvtx(types.ModuleType):
    """Records push_range / pop_range as the real package's module-level functions take them."""

    def __init__(self, enabled: bool = True):
        super().__init__("nvtx")
        self.calls: list[tuple[str, str | None]] = []
        self._enabled = enabled

    def enabled(self) -> bool:
        return self._enabled

    def push_range(self, message=None, color="blue", domain=None, category=None, payload=None):
        assert domain == "rxcuda"
        self.calls.append(("push", message))

    def pop_range(self, domain=None):
        assert domain == "rxcuda"
        self.calls.append(("pop", None))

    def pushed(self) -> list[str]:
        return [m for kind, m in self.calls if kind == "push"]


@pytest.fixture
def fake(monkeypatch):
    """A fake nvtx importable; ENABLED decided again after the environment changes, and restored after."""
    module = FakeNvtx()
    monkeypatch.setitem(sys.modules, "nvtx", module)
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    monkeypatch.delenv("RXCUDA_NVTX", raising=False)
    yield module
    monkeypatch.undo()
    _nvtx.detect()


def collecting(monkeypatch) -> None:
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so")
    assert _nvtx.detect()


def chain(engine):
    add = engine.add(rxcuda.Block.from_kernel("kernels/vector_add.ptx", size=N))
    mul = engine.add(rxcuda.Block.from_kernel("kernels/scalar_mul.ptx", size=N))
    engine.connect(add["out"], mul["x"])
    engine.write(add["a"], np.ones(N, np.float32))
    engine.write(add["b"], np.ones(N, np.float32))
    return add, mul


def balanced(calls) -> bool:
    depth = 0
    for kind, _ in calls:
        depth += 1 if kind == "push" else -1
        if depth < 0:
            return False
    return depth == 0


def test_not_collecting_makes_no_nvtx_calls_and_leaves_the_tick_alone(fake):
    assert not _nvtx.detect()  # nvtx imports, but no tool collects
    with rxcuda.Engine(driver=NullDriver()) as engine:
        _add, mul = chain(engine)
        engine.tick()
        mul.params["scale"].value = 2.0
        engine.tick()
        assert "tick" not in vars(engine._runner) and "apply_pending" not in vars(engine._updater)
        assert "build" not in vars(engine._builder)
    assert fake.calls == []
    assert _nvtx.range("compile x") is _nvtx.range("compile y")  # one shared no-op


def test_collecting_puts_ranges_around_tick_apply_rebuild(fake, monkeypatch):
    collecting(monkeypatch)
    with rxcuda.Engine(driver=NullDriver()) as engine:
        add, mul = chain(engine)
        engine.tick()
        first = list(fake.calls)
        assert fake.pushed() == ["tick", "apply", "apply structure", "rebuild"]
        assert balanced(first)
        fake.calls.clear()
        mul.params["scale"].value = 2.0
        engine.tick()
        assert fake.pushed() == ["tick", "apply"] and balanced(fake.calls)  # one value: the hot path
        fake.calls.clear()
        mul.set(scale=3.0, n=N)
        engine.tick()
        assert fake.pushed() == ["tick", "apply", "apply parameters"] and balanced(fake.calls)
        fake.calls.clear()
        add.set_code(None, rxcuda.load_kernel_file("kernels/vector_sub.ptx"))
        engine.tick()
        assert fake.pushed() == ["tick", "apply", "apply code"] and balanced(fake.calls)
    assert fake.calls[0] == ("push", "tick") and fake.calls[-1] == ("pop", None)


def test_a_ranged_method_that_raises_still_pops(fake, monkeypatch):
    collecting(monkeypatch)

    def tick(sync):
        raise rxcuda.CudaError("cuGraphLaunch", "CUDA_ERROR_LAUNCH_FAILED", "", 719)

    with pytest.raises(rxcuda.CudaError):
        _nvtx.ranged(tick, "tick")(True)
    assert fake.calls == [("push", "tick"), ("pop", None)]


def test_capture_is_a_range(fake, monkeypatch):
    collecting(monkeypatch)

    class Builder:
        def capture(self, node, pointers):
            fake.calls.append(("inside", None))
            return "graph"

    b = Builder()
    assert _nvtx.instrument(b, capture="capture")
    assert b.capture(None, {}) == "graph"
    assert fake.calls == [("push", "capture"), ("inside", None), ("pop", None)]


def test_reload_is_a_range_named_by_block_and_kernel(fake, monkeypatch, tmp_path):
    collecting(monkeypatch)
    from rxcuda.engine._reload import HotReload

    reload = HotReload(lambda: (), lambda *a: None, lambda ev: None)
    block = rxcuda.Block.from_kernel("kernels/vector_add.ptx", size=N)
    reload.reload(block, "vector_add")  # the file is unchanged: nothing to do, but the range was made
    assert fake.calls == [("push", "reload vector_add/vector_add"), ("pop", None)]


def test_compile_is_a_range(fake, monkeypatch, tmp_path):
    collecting(monkeypatch)
    from rxcuda.sources import _nvrtc

    seen = []

    def compile_(*args):
        seen.append(list(fake.calls))
        raise _nvrtc._CompileFailed("k.cu(1): error: stop here")  # what NVRTC says of a bad source

    monkeypatch.setattr(_nvrtc, "_compile", compile_)
    with pytest.raises(rxcuda.CompileError, match="stop here"):
        _nvrtc.Compiler(cache_dir=False).compile_module('extern "C" __global__ void k() {}', name="k.cu")
    assert seen == [[("push", "compile k.cu")]] and fake.calls == [("push", "compile k.cu"), ("pop", None)]


def test_a_raising_range_body_pops(fake, monkeypatch):
    collecting(monkeypatch)
    with pytest.raises(KeyError), _nvtx.range("rebuild"):
        raise KeyError("x")
    assert fake.calls == [("push", "rebuild"), ("pop", None)]


@pytest.mark.parametrize("env, expected", [
    ({}, False),                                                   # nothing collects
    ({"NVTX_INJECTION64_PATH": "/x.so"}, True),                    # Nsight Systems
    ({"NVTX_INJECTION64_PATH": "/x.so", "RXCUDA_NVTX": "0"}, False),  # asked not to
    ({"RXCUDA_NVTX": "1"}, True),                                  # another collector
    ({"NVTX_INJECTION64_PATH": ""}, False),
])
def test_when_ranges_are_made(fake, env, expected):
    assert _nvtx.detect(env) is expected and _nvtx.ENABLED is expected


def test_nvtx_disabled_by_its_own_switch(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvtx", FakeNvtx(enabled=False))
    try:
        assert not _nvtx.detect({"NVTX_INJECTION64_PATH": "/x.so"})
    finally:
        monkeypatch.undo()
        _nvtx.detect()


def test_without_the_nvtx_package_nothing_is_made(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvtx", None)  # import fails
    try:
        assert not _nvtx.detect({"NVTX_INJECTION64_PATH": "/x.so"})
        assert _nvtx.instrument(object(), x="y") is False
        _nvtx.push("x")
        _nvtx.pop()  # no-ops
    finally:
        monkeypatch.undo()
        _nvtx.detect()
