"""The public facade: every exported name imports, nothing private leaks, the planner stays pure."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import tomllib

import pytest

import rxcuda

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_all_names_are_importable():
    for name in rxcuda.__all__:
        assert getattr(rxcuda, name) is not None, name


def test_all_has_no_private_names_or_duplicates():
    assert not [n for n in rxcuda.__all__ if n.startswith("_")]
    assert len(set(rxcuda.__all__)) == len(rxcuda.__all__)


def test_star_import_gives_exactly_all():
    ns: dict = {}
    exec("from rxcuda import *", ns)
    assert set(ns) - {"__builtins__"} == set(rxcuda.__all__)


def test_public_objects_live_in_private_modules():
    # the facade re-exports; implementations sit behind it in _modules
    for name in rxcuda.__all__:
        obj = getattr(rxcuda, name)
        module = getattr(obj, "__module__", "")
        assert module.startswith("rxcuda."), (name, module)
        assert any(part.startswith("_") for part in module.split(".")[1:]), (name, module)


def test_public_names_have_docstrings():
    undocumented = [n for n in rxcuda.__all__ if not inspect.getdoc(getattr(rxcuda, n))]
    assert undocumented == []


def test_public_modules_of_the_facade_are_not_exported():
    assert "engine" not in rxcuda.__all__ and "streams" not in rxcuda.__all__


def test_errors_refine_builtins():
    assert issubclass(rxcuda.ValidationError, ValueError)
    assert issubclass(rxcuda.KernelFileError, ValueError)
    assert issubclass(rxcuda.CudaError, RuntimeError) and issubclass(rxcuda.NoDeviceError, RuntimeError)
    for name in (
        "ValidationError",
        "KernelFileError",
        "CudaError",
        "NoDeviceError",
        "CompileError",
        "EngineClosedError",
    ):
        assert issubclass(getattr(rxcuda, name), rxcuda.RxcudaError)


def test_version_matches_pyproject():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert rxcuda.__version__ == meta["project"]["version"]


def test_console_script_points_at_the_cli():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    module, func = meta["project"]["scripts"]["rxcuda"].split(":")
    assert callable(getattr(importlib.import_module(module), func))


@pytest.mark.parametrize("package", ["rxcuda.sources", "rxcuda.streams", "rxcuda.distributed"])
def test_subpackage_exports_resolve(package):
    mod = importlib.import_module(package)
    for name in getattr(mod, "__all__", ()):
        assert hasattr(mod, name), f"{package}.{name}"


# -- rxcuda.lowlevel: the pipeline as public data ------------------------------------------------------------
def test_lowlevel_names_import_and_have_docstrings():
    import rxcuda.lowlevel as low

    assert len(set(low.__all__)) == len(low.__all__) and not [n for n in low.__all__ if n.startswith("_")]
    undocumented = [n for n in low.__all__ if n != "NodePlan" and not inspect.getdoc(getattr(low, n))]
    assert undocumented == []
    ns: dict = {}
    exec("from rxcuda.lowlevel import *", ns)
    assert set(ns) - {"__builtins__"} == set(low.__all__)


def test_lowlevel_holds_what_plan_takes_and_returns():
    import rxcuda.lowlevel as low

    assert low.plan is rxcuda.plan and low.GraphPlan is rxcuda.GraphPlan
    for name in ("PipelineDescription", "BlockEntry", "Connection", "PortRef", "ExternalBinding", "BlockDescription",
                 "PortSpec", "ScalarSpec", "KernelSpec", "Pin", "KernelNodePlan", "CallNodePlan", "MemsetNodePlan",
                 "BufferPlan", "BufferArg", "ScalarArg", "validate", "order_blocks"):
        assert name in low.__all__, name


@pytest.mark.parametrize("module", ["rxcuda.lowlevel", "rxcuda.plan._index"])
def test_docstring_examples_run_without_a_gpu(module):
    import doctest

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_tests_of_the_planner_use_public_names():
    private = ("rxcuda.model._describe", "rxcuda.model._graphplan", "rxcuda.plan._plan import (")
    for name in ("_pipeline.py", "test_plan.py", "test_describe.py", "test_index.py"):
        text = (ROOT / "tests" / "unit" / name).read_text()
        assert not [p for p in private if p in text], name
