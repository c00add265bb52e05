"""The private MPS daemon of ``Engine(share_gpu="mps")`` (``_mps``), with a stand-in ``nvidia-cuda-mps-control`` on
PATH that records how it was called and makes or removes its control pipe as the real one does: our process
handling (started with a folder of its own before the workers, the workers started with its two variables, told
``quit`` at close and its folder removed), a missing or failing daemon named in a warning, and what is left alone."""

from __future__ import annotations

import json
import os
import stat
import sys

import numpy as np
import pytest

import rxcuda
from rxcuda.distributed import Worker, _mps

FAKE = r'''#!{python}
import json, os, sys
pipe, log = os.environ["CUDA_MPS_PIPE_DIRECTORY"], os.environ["CUDA_MPS_LOG_DIRECTORY"]
stdin = "" if "-d" in sys.argv else sys.stdin.read()
with open(os.environ["FAKE_MPS_RECORD"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "stdin": stdin, "pipe": pipe, "log": log}}) + "\n")
if "-d" in sys.argv:
    if os.environ.get("FAKE_MPS_FAIL"):
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    open(os.path.join(pipe, "control"), "w").close()
elif stdin.strip() == "quit":
    os.remove(os.path.join(pipe, "control"))
'''
GPU = {"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The stand-in daemon first on PATH; returns a function giving the calls it recorded."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / _mps.BINARY
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")  # found first
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    return lambda: [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_the_daemon_starts_with_a_folder_of_its_own_and_quits_then_the_folder_goes(fake):
    daemon = _mps.start_for("mps", GPU)
    assert daemon is not None
    pipe, log = daemon.env["CUDA_MPS_PIPE_DIRECTORY"], daemon.env["CUDA_MPS_LOG_DIRECTORY"]
    assert os.path.dirname(pipe) == os.path.dirname(log) == daemon.root and os.path.isdir(log)
    assert os.path.basename(daemon.root).startswith("rxcuda-mps-")
    (started,) = fake()
    assert started == {"argv": ["-d"], "stdin": "", "pipe": pipe, "log": log}
    daemon.stop()
    assert fake()[1] == {"argv": [], "stdin": "quit\n", "pipe": pipe, "log": log}
    assert not os.path.exists(daemon.root)
    daemon.stop()  # twice: nothing more is sent
    assert len(fake()) == 2


def test_a_missing_or_failing_daemon_is_a_warning_and_the_workers_run_without_mps(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.warns(RuntimeWarning, match=r"the private MPS daemon did not start \(.*-d exited with status 1: An "
                                            r"instance of this daemon is already running\); the workers run without"):
        assert _mps.start_for("mps", GPU) is None
    (call,) = fake()
    assert not os.path.exists(os.path.dirname(call["pipe"]))  # its folder removed
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-cuda-mps-control anywhere
    with pytest.warns(RuntimeWarning, match=r"share_gpu='mps': nvidia-cuda-mps-control is not on PATH .* the "
                                            r"workers run without MPS"):
        assert _mps.start_for("mps", GPU) is None


def test_nothing_starts_when_off_for_null_workers_or_under_the_users_own_mps(fake, monkeypatch):
    assert _mps.start_for("off", GPU) is None
    assert _mps.start_for("mps", {"a": Worker(null=True), "b": Worker(null=True)}) is None
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/users-mps")
    assert _mps.start_for("mps", GPU) is None
    assert fake() == []
    with pytest.raises(ValueError, match=r"'share_gpu' must be one of off, mps \(got 'yes'\)"):
        _mps.start_for("yes", GPU)


def test_an_engine_starts_its_daemon_before_its_workers_which_run_as_its_clients_and_stops_it_at_close(fake,
                                                                                                     monkeypatch):
    from rxcuda.distributed import Engine

    monkeypatch.setenv("RXCUDA_DEVICE", "cpu")  # the workers' engines on the CPU device: no GPU here
    dist = Engine({"a": Worker(num_gpus=0.5)}, backend="process", share_gpu="mps")
    try:
        (started,) = fake()
        assert dist.where("a")["mps_pipe"] == started["pipe"]  # set in the worker before its first CUDA call
        k = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=64, name="k", scale=3.0), on="a")
        dist.write(k["x"], np.arange(64, dtype=np.float32))
        assert dist.tick().complete  # its engine made under those variables (the CPU device here)
        np.testing.assert_array_equal(dist.read(k["out"]), np.arange(64, dtype=np.float32) * 3)
    finally:
        dist.close()
    assert [c["stdin"] for c in fake()] == ["", "quit\n"]  # quit once its clients were gone
    assert not os.path.exists(os.path.dirname(started["pipe"]))
