"""The calling thread's context (rxcuda.cuda._context), against a fake driver: library setup never makes or
switches a context, it only checks that the right one is current."""

import types

import pytest

from rxcuda.cuda import _context
from rxcuda.model._errors import CudaError


def fake_driver(ctx: int, device: int = 0, cc=(9, 0)):
    attrs = types.SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
                                  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor")
    return types.SimpleNamespace(
        cuCtxGetCurrent=lambda: (0, ctx),
        cuCtxGetDevice=lambda: (0, device),
        cuDeviceGet=lambda ordinal: (0, 100 + ordinal),
        cuDeviceGetAttribute=lambda attr, dev: (0, cc[0] if attr == "major" else cc[1]),
        CUdevice_attribute=attrs,
    )


def test_the_current_device_or_none(monkeypatch):
    monkeypatch.setattr(_context, "require_driver", lambda: fake_driver(ctx=0x55, device=1))
    assert _context.current_device() == 1
    _context.require_current(1, "setup")
    monkeypatch.setattr(_context, "require_driver", lambda: fake_driver(ctx=0))
    assert _context.current_device() is None


def test_setup_without_the_right_context_says_what_to_do(monkeypatch):
    monkeypatch.setattr(_context, "require_driver", lambda: fake_driver(ctx=0))
    with pytest.raises(CudaError, match=r"library call setup failed.*no CUDA context is current.*rxcuda.Engine"):
        _context.require_current(0, "library call setup")
    monkeypatch.setattr(_context, "require_driver", lambda: fake_driver(ctx=0x55, device=1))
    with pytest.raises(CudaError, match=r"current context is on device 1, but the call is set up for device 0"):
        _context.require_current(0, "library call setup")


def test_device_arch(monkeypatch):
    monkeypatch.setattr(_context, "require_driver", lambda: fake_driver(ctx=0, cc=(12, 0)))
    assert _context.device_arch(0) == "sm_120"
