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
from rxcuda.cuda import NullDriver
from rxcuda.cuda._graph import CompiledGraph

SPARES = CompiledGraph.SPARES  # the engine's default


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
