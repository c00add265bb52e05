"""Fixtures the unit tests share: an engine on the null driver (``engine``) and that driver (``api``).

A test module that needs another driver overrides ``api`` (test_append.py counts calls); one that needs another
engine overrides ``engine``.

Graphs are built without spare nodes here (``CompiledGraph.SPARES = 0``), so that the tests that name the driver
calls a build makes, or compare a template with a fresh build's, see the plan's nodes and nothing else; the tests
marked ``spares`` (tests/unit/test_spares.py) build with the engine's default number of spares, in graphs of any
size (``spares(default_min=True)``: only in graphs of ``SPARES_MIN`` nodes or more, as the engine does).
"""

import pytest

import rxcuda
from rxcuda.cuda import NullDriver, _native
from rxcuda.cuda._graph import CompiledGraph

SPARES = CompiledGraph.SPARES  # the engine's default


def pytest_terminal_summary(terminalreporter):
    """Say which parameter path ran (before pytest's summary line): the tests of the compiled one skip where it was
    not built (rxcuda/cuda/_native.py), so a run without it says so here, with the reason."""
    terminalreporter.write_line(f"rxcuda parameter path: {_native.describe()}")


@pytest.fixture(autouse=True)
def _spares(request, monkeypatch):
    marked = request.node.get_closest_marker("spares")
    monkeypatch.setattr(CompiledGraph, "SPARES", SPARES if marked else 0)
    if marked and not marked.kwargs.get("default_min"):
        monkeypatch.setattr(CompiledGraph, "SPARES_MIN", 1)  # (the tests' chains are short)


@pytest.fixture
def api():
    return NullDriver()


@pytest.fixture
def engine(api):
    e = rxcuda.Engine(driver=api)
    yield e
    e.close()
