"""Fixtures the unit tests share: an engine on the null driver (``engine``) and that driver (``api``).

A test module that needs another driver overrides ``api`` (test_append.py counts calls); one that needs another
engine overrides ``engine``.
"""

import pytest

import rxcuda
from rxcuda.cuda import NullDriver


@pytest.fixture
def api():
    return NullDriver()


@pytest.fixture
def engine(api):
    e = rxcuda.Engine(driver=api)
    yield e
    e.close()
