"""The private MPS daemon of ``Engine(share_gpu=...)`` (``_mps``): the choice ``"auto"`` makes from its inputs
(``choose``, ``_sharing.candidates``, ``_sharing.on_one_gpu``), and, with a stand-in ``nvidia-cuda-mps-control`` on
PATH that records how it was called and makes or removes its control pipe as the real one does, our process handling:
started with a folder of its own before any worker's context, one daemon for the engines of a process (the last
close tells it ``quit`` and its folder goes), a worker a client only behind its engine's open gate, a daemon left by
a killed driver ended by the next one, a missing or failing daemon named in a warning when asked for, and what is
left alone."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

import rxcuda
from rxcuda.distributed import Worker, _mps, _sharing

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
BIN = "/usr/bin/nvidia-cuda-mps-control"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The stand-in daemon first on PATH, temporary folders under ``tmp_path``; returns a function giving the calls
    it recorded."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / _mps.BINARY
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "calls.jsonl"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")  # found first
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    monkeypatch.setattr(_mps.tempfile, "tempdir", str(tmp))  # the daemons' folders (and the sweep) here only
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    yield lambda: [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    assert _mps._daemon is None and _mps._users == 0  # every test leaves no daemon behind


# -- the choice ---------------------------------------------------------------------------------------------
def choose(asked, shared=None, candidates=("a", "b"), user_pipe=None, binary=BIN):
    return _mps.choose(asked, shared, candidates=candidates, user_pipe=user_pipe, binary=binary)


def test_auto_uses_mps_only_where_two_workers_share_a_gpu_of_the_drivers_host():
    c = choose("auto", [("a", "b")])
    assert (c.mode, c.warn) == ("mps", False)
    assert str(c) == ("share_gpu='auto' -> mps: workers 'a', 'b' share a GPU of the driver's host: a private MPS "
                      "daemon serves them, so their frames run at once")
    assert choose("auto", None).mode == "mps"  # not placed yet: two candidates may share
    c = choose("auto", [("a",), ("b",)])  # placed on a GPU each
    assert (c.mode, c.why) == ("off", "no two of this engine's workers were placed on one GPU of the driver's host")
    assert choose("auto", [], candidates=("a", "b")).mode == "off"
    c = choose("auto", None, candidates=("a",))
    assert (c.mode, c.why) == ("off", "fewer than two GPU workers on the driver's host: none shares a GPU")
    c = choose("auto", None, candidates=())  # null driver, CPU device: never
    assert c.mode == "off" and "null driver, CPU device" in c.why


def test_the_users_mps_is_theirs_a_missing_binary_is_off_and_a_warning_only_when_asked_for():
    c = choose("auto", [("a", "b")], user_pipe="/tmp/their-mps")
    assert c.mode == "theirs" and "CUDA_MPS_PIPE_DIRECTORY=/tmp/their-mps" in c.why
    auto, asked = choose("auto", [("a", "b")], binary=None), choose("mps", [("a", "b")], binary=None)
    assert (auto.mode, auto.warn, asked.mode, asked.warn) == ("off", False, "off", True)
    assert "nvidia-cuda-mps-control is not on PATH" in auto.why
    c = choose("mps", [("a",), ("b",)])  # asked for: even where nothing is shared
    assert (c.mode, c.why.split(":")[0]) == ("mps", "asked for")
    assert choose("off", [("a", "b")]).mode == "off"
    with pytest.raises(ValueError, match=r"'share_gpu' must be one of auto, off, mps, turns \(got 'yes'\)"):
        choose("yes")


def test_candidates_are_gpu_workers_that_can_share_and_groups_are_by_node_and_gpu(monkeypatch):
    monkeypatch.setattr(_sharing, "cpu_by_default", lambda: False)
    ws = {"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.25), "c": Worker(num_gpus=1), "d": Worker(null=True)}
    assert _sharing.candidates(ws, "ray") == ("a", "b")  # Ray never gives a whole GPU to two
    assert _sharing.candidates(ws, "process") == ("a", "b", "c")  # child processes all open this host's GPU 0
    monkeypatch.setattr(_sharing, "cpu_by_default", lambda: True)  # RXCUDA_DEVICE=cpu, or no CUDA device
    assert _sharing.candidates(ws, "ray") == ()
    where = {"a": {"node": "n", "gpus": ["0"]}, "b": {"node": "n", "gpus": ["0"]}, "c": {"node": "n", "gpus": ["1"]},
             "d": {"node": "n", "gpus": []}}
    assert _sharing.on_one_gpu(where, ws, "n") == [("a", "b")]
    assert _sharing.on_one_gpu(where, ws, "other") == []  # workers on another host: its pipes cannot reach them
    kids = {"a": {"node": "local:h", "gpus": []}, "c": {"node": "local:h", "gpus": []}}
    assert _sharing.on_one_gpu(kids, ws, "local:h") == [("a", "c")]


# -- the daemon ---------------------------------------------------------------------------------------------
def test_a_share_chosen_before_the_workers_start_runs_the_daemon_in_a_folder_of_its_own_then_quits(fake):
    share = _mps.Share("auto", ("a", "b"), placed_first=False)  # child processes: chosen from the specs
    assert share.mode == "mps"
    pipe, log = share.env["CUDA_MPS_PIPE_DIRECTORY"], share.env["CUDA_MPS_LOG_DIRECTORY"]
    root = os.path.dirname(pipe)
    assert os.path.dirname(log) == root and os.path.basename(root).startswith("rxcuda-mps-")
    assert os.path.exists(share.env[_mps.GATE])  # the gate open: its workers become clients
    with open(os.path.join(root, "owner")) as f:
        assert f.read().split()[0] == str(os.getpid())
    (started,) = fake()
    assert started == {"argv": ["-d"], "stdin": "", "pipe": pipe, "log": log}
    share.close()
    assert fake()[1] == {"argv": [], "stdin": "quit\n", "pipe": pipe, "log": log}
    assert not os.path.exists(root)
    share.close()  # twice: nothing more is sent
    assert len(fake()) == 2


def test_under_ray_the_gate_opens_after_placement_only_where_workers_share(fake, monkeypatch):
    share = _mps.Share("auto", ("a", "b"), placed_first=True)
    env = dict(share.env)
    assert share.mode == "undecided" and fake() == []  # folders made, nothing started yet
    assert _mps.enter(env) is False  # a worker's first context before the choice: no client of anything
    share.decide([])  # placed on a GPU each
    assert share.mode == "off" and fake() == [] and not os.path.exists(os.path.dirname(env[_mps.PIPE]))
    assert _mps.enter(env) is False
    share.close()
    share = _mps.Share("auto", ("a", "b"), placed_first=True)
    env = dict(share.env)
    assert share.decide([("a", "b")]).mode == "mps" and [c["argv"] for c in fake()] == [["-d"]]
    for name in (_mps.PIPE, _mps.LOG):  # what enter sets is undone after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert _mps.enter(env) is True and os.environ[_mps.PIPE] == env[_mps.PIPE]  # what a worker does
    assert _mps.GATE not in os.environ and _mps.enter(env) is True  # a client stays one
    share.close()
    assert [c["stdin"] for c in fake()] == ["", "quit\n"]


def test_engines_of_one_process_share_one_daemon_and_the_last_close_quits_it(fake):
    one = _mps.Share("auto", ("a", "b"), placed_first=False)
    two = _mps.Share("mps", ("c",), placed_first=True)
    assert two.decide(None).mode == "mps"
    assert one.env[_mps.PIPE] == two.env[_mps.PIPE] and one.env[_mps.GATE] != two.env[_mps.GATE]
    assert len(fake()) == 1  # started once
    one.close()
    assert len(fake()) == 1 and os.path.exists(two.env[_mps.GATE])  # still serving the other engine
    assert _mps.enter(one.env) is False  # its gate closed with it: a worker of the closed engine is no client
    two.close()
    assert [c["stdin"] for c in fake()] == ["", "quit\n"]


def test_a_daemon_still_running_at_exit_quits_and_one_a_killed_driver_left_is_ended_by_the_next(fake, tmp_path):
    share = _mps.Share("auto", ("a", "b"), placed_first=False)
    root = os.path.dirname(share.env[_mps.PIPE])
    _mps._at_exit()  # as at interpreter exit, the engine never closed
    assert [c["stdin"] for c in fake()] == ["", "quit\n"] and not os.path.exists(root)
    share._daemon = None  # what it held is gone
    _mps._users = 0
    # a driver killed with its daemon up: its folder names an owner that no longer runs
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = _mps.MpsDaemon(_mps.shutil.which(_mps.BINARY))
    left.start()
    with open(os.path.join(left.root, "owner"), "w") as f:
        f.write(f"{dead.pid} 1")
    live = _mps.MpsDaemon(_mps.shutil.which(_mps.BINARY))  # this process's: left alone
    share = _mps.Share("auto", ("a", "b"), placed_first=False)
    assert not os.path.exists(left.root) and os.path.exists(live.root)
    assert [c["stdin"] for c in fake()][-3:] == ["", "quit\n", ""]  # the left daemon quit, then the new one started
    share.close()
    live.stop()


def test_a_failing_daemon_is_off_with_a_warning_when_asked_for_and_quietly_under_auto(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.warns(RuntimeWarning, match=r"share_gpu='mps': the private MPS daemon did not start \(.*-d exited "
                                            r"with status 1: An instance of this daemon is already running\), so "
                                            r"workers sharing a GPU take turns on it; the workers run without MPS"):
        share = _mps.Share("mps", ("a", "b"), placed_first=False)
    assert share.mode == "off" and share.env  # the variables given are behind a gate never opened
    (call,) = fake()
    assert not os.path.exists(os.path.dirname(call["pipe"]))  # its folder removed
    share.close()
    share = _mps.Share("auto", ("a", "b"), placed_first=False)  # asked for where it pays: no warning, the why kept
    assert share.mode == "off" and "did not start" in share.choice.why
    share.close()
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-cuda-mps-control anywhere
    with pytest.warns(RuntimeWarning, match=r"share_gpu='mps': nvidia-cuda-mps-control is not on PATH .* the "
                                            r"workers run without MPS"):
        assert _mps.Share("mps", ("a", "b"), placed_first=False).mode == "off"


def test_nothing_starts_when_off_for_null_workers_or_under_the_users_own_mps(fake, monkeypatch):
    assert _mps.Share("off", ("a", "b"), placed_first=False).env == {}
    quiet = _mps.Share("auto", (), placed_first=True)
    assert quiet.mode == "off" and quiet.news is None  # null driver or CPU device: no info diagnostic either
    one = _mps.Share("auto", ("a",), placed_first=True)  # one GPU worker (an isolated engine): nothing to say
    assert (one.mode, one.news) == ("off", None)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/users-mps")
    share = _mps.Share("auto", ("a", "b"), placed_first=True)
    assert share.mode == "theirs" and share.env == {}
    assert fake() == []


def test_an_engine_starts_its_daemon_before_its_workers_which_run_as_its_clients_and_stops_it_at_close(fake,
                                                                                                     monkeypatch):
    from rxcuda.distributed import Engine

    monkeypatch.setenv("RXCUDA_DEVICE", "cpu")  # the workers' engines on the CPU device: no GPU here
    monkeypatch.setattr(_sharing, "cpu_by_default", lambda: False)  # the driver judges them GPU workers
    dist = Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}, backend="process", share_gpu="auto")
    try:
        (started,) = fake()
        assert dist.where("a")["mps_pipe"] == started["pipe"]  # set in the worker before its first CUDA call
        assert dist.where("b")["share_gpu"] == "mps"
        assert dist.describe().share_gpu.startswith("share_gpu='auto' -> mps: workers 'a', 'b' share a GPU")
        said = []
        dist.diagnostics.subscribe(said.append)
        k = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=64, name="k", scale=3.0), on="a")
        x = np.random.default_rng(4).standard_normal(64).astype(np.float32)
        dist.write(k["x"], x)
        assert dist.tick().complete  # its engine made under those variables (the CPU device here)
        np.testing.assert_allclose(dist.read(k["out"]), x * 3, rtol=1e-6)
        dist.tick()
        infos = [d.message for d in said if d.worker == "driver" and d.diagnostic.subject == "placement"]
        assert infos == [dist.describe().share_gpu] and said[0].severity == "info"  # said once
    finally:
        dist.close()
    assert [c["stdin"] for c in fake()] == ["", "quit\n"]  # quit once its clients were gone
    assert not os.path.exists(os.path.dirname(started["pipe"]))


def test_cpu_device_workers_never_start_a_daemon(fake, monkeypatch):
    from rxcuda.distributed import Engine

    monkeypatch.setenv("RXCUDA_DEVICE", "cpu")
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}, backend="process", share_gpu="auto") as dist:
        assert dist.where("a")["share_gpu"] == "off" and dist.where("a")["mps_pipe"] is None
        assert "CPU device" in dist.describe().share_gpu
    assert fake() == []


def test_the_default_is_off_so_that_a_gpu_fault_in_one_worker_ends_only_its_own_context(fake):
    import inspect

    from rxcuda.distributed import Engine

    assert inspect.signature(Engine).parameters["share_gpu"].default == "off"
    share = _mps.Share("off", ("a", "b"), placed_first=True)  # two workers that could share: no daemon
    assert share.mode == "off" and share.env == {} and fake() == []
