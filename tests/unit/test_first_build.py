"""A first build that fails: there is no last good graph, and the frame, the diagnostic, the message of ``read()``
and stderr say so (docs/errors.md). A failure while a good graph runs keeps saying that it keeps running."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

from rxcuda import Block

N = 16


def _open_input(engine):
    add = engine.add(Block.from_kernel("vector_add", size=N))
    engine.write(add["a"], np.ones(N, np.float32))  # add.b is neither written nor connected
    return add


def test_a_failed_first_build_is_an_error_frame_that_says_nothing_runs(engine):
    add = _open_input(engine)
    with pytest.warns(RuntimeWarning, match="build failed, no graph runs until it is fixed: required input "
                                            "vector_add.b is neither connected nor bound"):
        frame = engine.tick()
    assert frame.state == "error" and not frame.launched and add.state == "error"
    (d,) = [d for d in engine.diagnostic_log if d.severity == "error"]
    assert d.message.startswith("build failed, no graph runs until it is fixed: ")
    assert "last good graph" not in d.message
    with pytest.raises(RuntimeError, match="no working graph yet: build failed, no graph runs") as err:
        engine.read(add["out"])
    assert "last good graph" not in str(err.value)


def test_the_warning_is_given_once_and_the_frames_recover_when_it_is_fixed(engine):
    add = _open_input(engine)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # even so, the engine warns once for one failure
        for _ in range(3):
            assert engine.tick().state == "error"
        with pytest.raises(RuntimeError):
            engine.read(add["out"])
    assert len([w for w in seen if "no graph runs" in str(w.message)]) == 1
    engine.write(add["b"], np.ones(N, np.float32))
    frame = engine.tick()
    assert frame.state == "ok" and frame.launched and add.state == "ok"


def test_a_failed_rebuild_keeps_the_last_good_graph_and_does_not_warn(engine):
    mul = engine.add(Block.from_kernel("scalar_mul", size=N))
    engine.write(mul["x"], np.ones(N, np.float32))
    assert engine.tick().state == "ok"
    broken = engine.add(Block.from_kernel("vector_add", size=N, name="broken"))
    engine.connect(mul["out"], broken["a"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning here would raise
        frame = engine.tick()
    assert frame.state == "error" and frame.launched
    assert engine.diagnostic_log[-1].message.startswith("rebuild failed, the last good graph keeps running: ")


def test_with_logging_unconfigured_the_failure_is_on_stderr_once(tmp_path):
    script = tmp_path / "first.py"
    script.write_text(
        "import numpy as np, rxcuda\n"
        "from rxcuda.cuda import NullDriver\n"
        "engine = rxcuda.Engine(driver=NullDriver())\n"
        "add = engine.add(rxcuda.Block.from_kernel('vector_add', size=16))\n"
        "engine.write(add['a'], np.ones(16, np.float32))\n"
        "for _ in range(5):\n"
        "    engine.tick()\n"
        "try:\n"
        "    engine.read(add['out'])\n"
        "except RuntimeError:\n"
        "    pass\n"
        "engine.close()\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("no graph runs until it is fixed") == 1, proc.stderr
    assert f"{script}:7: RuntimeWarning: rxcuda: build failed" in proc.stderr  # it points at the user's tick()
