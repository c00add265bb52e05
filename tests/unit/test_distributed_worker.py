"""A worker run in-process (no Ray) on the null driver: the fragment it builds, one step's parameters, writes
and links, the two ends of a host link (the bytes that arrive) and of a CUDA IPC link (the driver calls each end
makes), and a clean close."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import rxcuda
from rxcuda.cuda import NullDriver
from rxcuda.distributed import Worker, split
from rxcuda.distributed import _worker as worker_module
from rxcuda.distributed._links import IpcToken
from rxcuda.distributed._placement import check_workers
from rxcuda.distributed._worker import FragmentHost
from rxcuda.lowlevel import PortRef

PTX = "scalar_mul"
N = 256


class RecordingDriver(NullDriver):
    """The null driver, keeping the bytes of every host-to-device copy (what reached the device)."""

    def __init__(self):
        super().__init__()
        self.uploads: list[bytes] = []

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        self.uploads.append(ctypes.string_at(int(src), int(nbytes)))
        return super().cuMemcpyHtoDAsync(dst, src, nbytes, stream)


@pytest.fixture
def drivers(monkeypatch):
    made: list[RecordingDriver] = []

    def make():
        made.append(RecordingDriver())
        return made[-1]

    monkeypatch.setattr(worker_module, "_null_driver", make)
    return made


def _pipeline(gpus: bool):
    """first (worker a) -> second (worker b), as a model engine describes it, cut in two."""
    model = rxcuda.Engine(driver=NullDriver())
    first = model.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"))
    second = model.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"))
    model.connect(first["out"], second["x"])
    model.write(first["x"], np.zeros(N, np.float32))
    second.params["scale"].value = 5.0
    spec = Worker(num_gpus=0.5) if gpus else Worker(null=True)
    s = split(model.describe(), {first.id: "a", second.id: "b"}, check_workers({"a": spec, "b": spec}),
              nodes={"a": "n1", "b": "n1"})
    model.close()
    return s, first, second


def test_a_worker_builds_its_fragment_with_the_values_and_the_last_writes(drivers):
    s, first, _second = _pipeline(gpus=False)
    x = np.random.default_rng(1).random(N, dtype=np.float32)
    host = FragmentHost("a", null=True)
    info = host.build(s.fragments["a"], {PortRef(first.id, "x"): x})
    assert info["blocks"] == 1 and info["pid"] > 0
    assert [b.name for b in host.engine.blocks] == ["first"]
    assert x.tobytes() in drivers[-1].uploads  # the written input, replayed into the new engine
    host.close()
    assert host.engine is None


def test_a_step_applies_parameters_as_a_hot_update_and_writes_before_its_tick(drivers):
    s, first, _second = _pipeline(gpus=False)
    host = FragmentHost("a", null=True)
    host.build(s.fragments["a"], {})
    host.step(1, {}, {}, {})
    y = np.random.default_rng(2).random(N, dtype=np.float32)
    out, report = host.step(2, {first.id: {"scale": 7.5}}, {PortRef(first.id, "x"): y}, {PortRef(first.id, "out"): 1})
    assert report.frame.tiers == (rxcuda.Tier.PARAMETERS,)
    assert host.blocks[first.id].params["scale"].value == 7.5
    assert y.tobytes() in drivers[-1].uploads
    assert set(out) == {PortRef(first.id, "out")} and out[PortRef(first.id, "out")].shape == (N,)
    assert report.observed[PortRef(first.id, "out")].dtype == np.float32
    host.close()


def test_a_refused_parameter_is_a_diagnostic_and_the_frame_goes_on(drivers):
    s, first, _second = _pipeline(gpus=False)
    host = FragmentHost("a", null=True)
    host.build(s.fragments["a"], {})
    _out, report = host.step(1, {first.id: {"scale": "loud"}}, {}, {})
    assert report.frame is not None
    (d,) = [d for d in report.diagnostics if "parameter refused" in d.message]
    assert d.subject == "first" and "worker 'a'" in d.message and "takes a number" in d.message
    host.close()


def test_a_host_link_carries_the_producers_array_into_the_consumers_input(drivers):
    s, first, second = _pipeline(gpus=False)
    a, b = FragmentHost("a", null=True), FragmentHost("b", null=True)
    a.build(s.fragments["a"], {})
    b.build(s.fragments["b"], {})
    out, _ = a.step(1, {}, {}, {})
    assert isinstance(out[PortRef(first.id, "out")], np.ndarray)
    sent = np.random.default_rng(3).random(N, dtype=np.float32)  # what a GPU would have computed
    _, report = b.step(1, {}, {}, {}, {PortRef(first.id, "out"): sent})
    assert sent.tobytes() in drivers[-1].uploads
    assert b.stats()["received"] == {"first.out -> second.x": 1}
    assert report.frame.launched
    # a producer that skipped the frame (restarting) sends nothing: the input keeps its value, the frame runs
    _, report = b.step(2, {}, {}, {}, None)
    assert report.frame.launched and b.stats()["received"] == {"first.out -> second.x": 1}
    a.close(), b.close()


def test_an_ipc_link_exports_slots_once_and_orders_the_consumers_copy_after_the_producers_event(drivers):
    s, first, second = _pipeline(gpus=True)
    (link,) = s.links
    assert link.transport == "ipc"
    a, b = FragmentHost("a", null=True, depth=3), FragmentHost("b", null=True)
    a.build(s.fragments["a"], {})
    b.build(s.fragments["b"], {})
    api_a, api_b = a.engine.device.api, b.engine.device.api
    assert api_a.count("cuIpcGetMemHandle") == 3 and api_a.count("cuIpcGetEventHandle") == 3
    tokens = []
    for index in (1, 2, 3, 4):
        out, _ = a.step(index, {}, {}, {})
        token = out[PortRef(first.id, "out")]
        assert isinstance(token, IpcToken) and token.slot == index % 3 and token.nbytes == N * 4
        tokens.append(token)
        mark = len(api_b.calls)
        b.step(index, {}, {}, {}, out)
        calls = api_b.since(mark)
        # the wait on the producer's event and the copy come before the frame's launch, on the engine's stream
        assert calls.index("cuStreamWaitEvent") < calls.index("cuMemcpyDtoDAsync") < calls.index("cuGraphLaunch")
    assert api_a.count("cuEventRecord") >= 4
    assert api_b.count("cuIpcOpenMemHandle") == 3 and api_b.count("cuIpcOpenEventHandle") == 3  # once per slot
    assert tokens[0].memory == tokens[3].memory and tokens[0].memory != tokens[1].memory
    assert b.stats()["received"] == {"first.out -> second.x": 4}
    b.close()
    a.close()
    assert api_a.leaks() == {} and api_b.leaks() == {}  # slots, events and mappings all released


def test_a_restarted_producer_is_mapped_again(drivers):
    s, first, _second = _pipeline(gpus=True)
    a, b = FragmentHost("a", null=True), FragmentHost("b", null=True)
    a.build(s.fragments["a"], {})
    b.build(s.fragments["b"], {})
    out, _ = a.step(1, {}, {}, {})
    b.step(1, {}, {}, {}, out)
    a.build(s.fragments["a"], {})  # as after a restart: new slots, new handles
    out, _ = a.step(4, {}, {}, {})  # the same slot index as frame 1
    api_b = b.engine.device.api
    b.step(2, {}, {}, {}, out)
    assert api_b.count("cuIpcOpenMemHandle") == 2 and api_b.count("cuIpcCloseMemHandle") == 1
    b.close(), a.close()


def test_a_worker_without_a_fragment_says_so():
    host = FragmentHost("c", null=True)
    with pytest.raises(RuntimeError, match=r"worker 'c' has no fragment yet; the distributed engine builds it"):
        host.step(1, {}, {}, {})


def test_a_port_of_a_block_the_worker_does_not_hold_is_named(drivers):
    s, first, second = _pipeline(gpus=False)
    host = FragmentHost("a", null=True)
    host.build(s.fragments["a"], {})
    with pytest.raises(KeyError, match=rf"worker 'a' holds no block with id {second.id} \(it holds first\)"):
        host.read(PortRef(second.id, "out"))
    host.close()


def test_a_worker_that_loses_its_gpu_context_ends_its_process_for_ray_to_restart(drivers, monkeypatch, caplog):
    s, first, _second = _pipeline(gpus=False)
    host = FragmentHost("a", null=True)
    host.build(s.fragments["a"], {})
    exits = []

    def fake_exit(status):
        exits.append(status)
        raise SystemExit(status)

    monkeypatch.setattr(worker_module.os, "_exit", fake_exit)
    host.engine.device.api.fail("cuGraphLaunch", "CUDA_ERROR_ILLEGAL_ADDRESS")
    with pytest.raises(SystemExit):
        host.step(1, {}, {}, {})
    assert exits == [worker_module.EXIT_CONTEXT_LOST]
    err = caplog.text
    assert "rxcuda worker 'a'" in err and "lost its GPU context and exits for Ray to restart it" in err
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in err
