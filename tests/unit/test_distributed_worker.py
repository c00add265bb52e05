"""A worker run in-process (no Ray) on the null driver: the fragment it builds, one step's parameters, writes
and links, the two ends of a host link (the bytes that arrive) and of a CUDA IPC link (the driver calls each end
makes), and a clean close."""

from __future__ import annotations

import ctypes
import threading
import uuid

import numpy as np
import pytest

import rxcuda
from rxcuda.cuda import NullDriver
from rxcuda.distributed import Worker, split
from rxcuda.distributed import _worker as worker_module
from rxcuda.distributed._placement import check_workers
from rxcuda.distributed._worker import FragmentHost
from rxcuda.lowlevel import PortRef

PTX = "scalar_mul"
N = 256


class RecordingDriver(NullDriver):
    """The null driver, keeping the bytes of every host-to-device copy (what reached the device); a read of
    ``len(device_bytes)`` bytes back from the device gives ``device_bytes`` (what a GPU would have computed)."""

    def __init__(self):
        super().__init__()
        self.uploads: list[bytes] = []
        self.device_bytes: bytes | None = None

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        self.uploads.append(ctypes.string_at(int(src), int(nbytes)))
        return super().cuMemcpyHtoDAsync(dst, src, nbytes, stream)

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        result = super().cuMemcpyDtoHAsync(dst, src, nbytes, stream)
        if self.device_bytes is not None and int(nbytes) == len(self.device_bytes):
            ctypes.memmove(int(dst), self.device_bytes, int(nbytes))
        return result


@pytest.fixture
def drivers(monkeypatch):
    made: list[RecordingDriver] = []

    def make():
        made.append(RecordingDriver())
        return made[-1]

    monkeypatch.setattr(worker_module, "_null_driver", make)
    return made


def _pipeline(gpus: bool, transport: str = "auto", hosts: tuple[str, str] = ("n1", "n1")):
    """first (worker a) -> second (worker b) on Ray nodes ``hosts``, as a model engine describes it, cut in two."""
    model = rxcuda.Engine(driver=NullDriver())
    first = model.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"))
    second = model.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"))
    model.connect(first["out"], second["x"])
    model.write(first["x"], np.zeros(N, np.float32))
    second.params["scale"].value = 5.0
    spec = Worker(num_gpus=0.5) if gpus else Worker(null=True)
    s = split(model.describe(), {first.id: "a", second.id: "b"}, check_workers({"a": spec, "b": spec}),
              nodes=dict(zip("ab", hosts, strict=True)),
              transports={(PortRef(first.id, "out"), PortRef(second.id, "x")): transport})
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
    s, first, _second = _pipeline(gpus=False, hosts=("n1", "n2"))  # a link through the object store: out carries it
    host = FragmentHost("a", null=True)
    host.build(s.fragments["a"], {})
    host.step(1, {}, {}, {})
    y = np.random.default_rng(2).random(N, dtype=np.float32)
    out, report = host.step(2, {first.id: {"scale": 7.5}}, {PortRef(first.id, "x"): y}, {PortRef(first.id, "out"): 1})
    assert report.frame.tiers == (rxcuda.Tier.PARAMETERS,)
    assert host.blocks[first.id].params["scale"].value == 7.5
    assert y.tobytes() in drivers[-1].uploads
    assert set(out) == {PortRef(first.id, "out")} and out[PortRef(first.id, "out")].nbytes == N * 4
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


def test_a_host_link_across_hosts_hands_ray_a_pinned_slot_and_copies_it_into_the_consumers_input(drivers):
    s, first, second = _pipeline(gpus=False, hosts=("n1", "n2"))
    (link,) = s.links
    assert (link.transport, link.via) == ("host", "store") and "object store" in link.why
    a, b = FragmentHost("a", null=True, depth=3), FragmentHost("b", null=True, depth=3)
    a.build(s.fragments["a"], {})
    b.build(s.fragments["b"], {})
    api_a = a.engine.device.api
    assert api_a.count("cuMemHostAlloc") >= 3  # the ring: pinned once, at build
    rng = np.random.default_rng(3)
    for index in (1, 2, 3, 4):
        x = rng.standard_normal(N).astype(np.float32)  # what the producer's GPU computed this frame
        api_a.device_bytes = x.tobytes()
        mark = len(api_a.calls)
        out, _ = a.step(index, {}, {}, {})
        sent = out[PortRef(first.id, "out")]
        # the frame's bytes in pinned memory (no readback through engine.read, no pickling): what Ray stores
        assert sent.dtype == np.uint8 and sent.tobytes() == x.tobytes()
        assert api_a.since(mark).count("cuMemcpyDtoHAsync") == 1 and "cuEventSynchronize" in api_a.since(mark)
        mark_b = len(drivers[-1].calls)
        _, report = b.step(index, {}, {}, {}, {PortRef(first.id, "out"): sent.copy()})
        calls = drivers[-1].since(mark_b)
        assert calls.index("cuMemcpyHtoDAsync") < calls.index("cuGraphLaunch")  # in before the frame's launch
        assert drivers[-1].uploads[-1] == x.tobytes() and report.frame.launched
    assert b.stats()["received"] == {"first.out -> second.x": 4}
    # a producer that skipped the frame (restarting) sends nothing: the input keeps its value, the frame runs
    _, report = b.step(5, {}, {}, {}, None)
    assert report.frame.launched and b.stats()["received"] == {"first.out -> second.x": 4}
    b.close(), a.close()
    assert api_a.leaks() == {} and drivers[-1].leaks() == {}


def test_a_host_link_on_one_host_copies_through_its_pinned_board_in_order_and_exact(drivers):
    s, first, second = _pipeline(gpus=True, transport="host")  # GPU workers of one host, host asked for
    (link,) = s.links
    assert (link.transport, link.via) == ("host", "board") and "shared-memory board" in link.why
    a, b = _hosts(s, device_slots=True)
    api_a, api_b = a.engine.device.api, b.engine.device.api
    assert api_a.count("cuMemHostRegister") == 1 and api_a.count("cuIpcGetMemHandle") == 0  # the board, pinned
    rng = np.random.default_rng(11)
    for index in range(1, 9):
        x = rng.standard_normal(N).astype(np.float32)
        api_a.device_bytes = x.tobytes()
        if index % 2:  # the consumer asks first and waits on the board; or the producer is a frame ahead
            join = _step_in_thread(b, index)
            out, _ = a.step(index, {}, {}, {})
            join()
        else:
            out, _ = a.step(index, {}, {}, {})
            b.step(index, {}, {}, {})
        assert out == {}  # nothing through Ray
        assert api_b.uploads[-1] == x.tobytes()  # the bytes exact, the frames in order
    assert api_b.count("cuMemHostRegister") == 1  # the consumer pinned its mapping once
    assert a.stats()["pinned"] == [True] and b.stats()["pinned"] == [True]
    assert b.stats()["received"] == {"first.out -> second.x": 8} and b.stats()["waited"] >= 1
    b.close(), a.close()
    assert api_a.leaks() == {} and api_b.leaks() == {}  # unpinned, events released


def test_a_board_the_driver_refuses_to_pin_still_carries_every_frame_exactly(drivers):
    s, first, second = _pipeline(gpus=False, transport="host")
    a, b = _hosts(s, device_slots=False)
    api_a, api_b = a.engine.device.api, b.engine.device.api
    api_b.fail("cuMemHostRegister", "CUDA_ERROR_NOT_SUPPORTED")  # the consumer's pinning of the board refused
    rng = np.random.default_rng(12)
    for index in (1, 2, 3):
        x = rng.standard_normal(N).astype(np.float32)
        api_a.device_bytes = x.tobytes()
        a.step(index, {}, {}, {})
        b.step(index, {}, {}, {})
        assert api_b.uploads[-1] == x.tobytes()  # copied from pageable memory: staged by the driver, still exact
    assert b.stats()["pinned"] == [False] and a.stats()["pinned"] == [True]
    b.close(), a.close()
    assert api_b.count("cuMemHostUnregister") == 0 and api_a.leaks() == {} and api_b.leaks() == {}


def test_a_host_board_slot_written_again_before_its_copy_finished_is_an_error_never_a_stale_frame(drivers):
    s, first, second = _pipeline(gpus=False, transport="host")
    a, b = _hosts(s, device_slots=False, depth=2)
    a.step(1, {}, {}, {})
    tick = b.engine.tick

    def racing_tick(*args, **kw):  # while the consumer's frame (and its copy out of slot 1) runs, the producer
        a.step(2, {}, {}, {})      # runs two frames ahead: more than the link's slots (the driver's bound prevents
        a.step(3, {}, {}, {})      # it), so frame 3 lands in slot 1
        return tick(*args, **kw)

    b.engine.tick = racing_tick
    with pytest.raises(RuntimeError, match=r"slot 1 was written again \(frame 3\) while frame 1 was copied"):
        b.step(1, {}, {}, {})
    b.close(), a.close()


def _hosts(s, *, device_slots: bool, depth: int = 3):
    """Producer a and consumer b of one link, built in this process, sharing a fresh board name."""
    session = uuid.uuid4().hex[:12]
    a = FragmentHost("a", null=True, depth=depth, session=session, device_slots=device_slots)
    b = FragmentHost("b", null=True, depth=depth, session=session, device_slots=device_slots)
    a.build(s.fragments["a"], {})
    b.build(s.fragments["b"], {})
    return a, b


def _step_in_thread(host, index):
    """Start ``host``'s step of frame ``index`` on a thread (it waits on the link's board); returns a join()."""
    got: dict = {}

    def run():
        try:
            got["result"] = host.step(index, {}, {}, {})
        except BaseException as e:  # handed to the test
            got["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join():
        t.join(30)
        assert not t.is_alive(), "the consumer's step never returned"
        if "error" in got:
            raise got["error"]
        return got["result"]

    return join


def test_an_ipc_link_exports_slots_once_and_orders_the_consumers_copy_after_the_producers_event(drivers):
    s, first, second = _pipeline(gpus=True)
    (link,) = s.links
    assert link.transport == "ipc"
    a, b = _hosts(s, device_slots=True)
    api_a, api_b = a.engine.device.api, b.engine.device.api
    assert api_a.count("cuIpcGetMemHandle") == 3 and api_a.count("cuIpcGetEventHandle") == 3
    for index in (1, 2, 3, 4):
        out, _ = a.step(index, {}, {}, {})
        assert out == {}  # nothing travels through Ray: the frame is published on the link's board
        mark = len(api_b.calls)
        b.step(index, {}, {}, {})
        calls = api_b.since(mark)
        # the wait on the producer's event and the copy come before the frame's launch, on the engine's stream
        assert calls.index("cuStreamWaitEvent") < calls.index("cuMemcpyDtoDAsync") < calls.index("cuGraphLaunch")
    assert api_a.count("cuEventRecord") >= 4
    assert api_b.count("cuIpcOpenMemHandle") == 3 and api_b.count("cuIpcOpenEventHandle") == 3  # once per slot
    # the slot of frame 4 is frame 1's: the same mapped memory and the same event, waited on again
    waits = [args for name, args in api_b.calls if name == "cuStreamWaitEvent"]
    assert waits[0][1] == waits[3][1] and waits[0][1] != waits[1][1]
    assert b.stats()["received"] == {"first.out -> second.x": 4} and b.stats()["skipped"] == {}
    b.close()
    a.close()
    assert api_a.leaks() == {} and api_b.leaks() == {}  # slots, events and mappings all released


def test_ipc_link_ends_read_their_ports_pointer_once_per_graph_and_again_after_a_rebuild_moves_it(drivers, monkeypatch):
    from rxcuda.distributed import _links

    device_pointer = _links.device_pointer
    looks: list[str] = []
    monkeypatch.setattr(_links, "device_pointer", lambda e, p: (looks.append(p.block.name), device_pointer(e, p))[1])
    s, first, second = _pipeline(gpus=True)
    a, b = _hosts(s, device_slots=True)
    api_a, api_b = a.engine.device.api, b.engine.device.api
    src_port, dst_port = a.port(PortRef(first.id, "out")), b.port(PortRef(second.id, "x"))

    def copies(api, mark):  # (dst, src, nbytes) of each device-to-device copy since ``mark``
        return [tuple(int(v) for v in args[:3]) for name, args in api.calls[mark:] if name == "cuMemcpyDtoDAsync"]

    for index in (1, 2, 3):
        a.step(index, {}, {}, {})
        b.step(index, {second.id: {"scale": 2.0 + index}}, {}, {})  # a parameter moves no buffer
    assert looks == ["first", "second"]  # each end read its pointer once in three frames
    looks.clear()
    old_src, old_dst = device_pointer(a.engine, src_port)[0], device_pointer(b.engine, dst_port)[0]
    mark_a, mark_b = len(api_a.calls), len(api_b.calls)
    a.step(4, {}, {}, {})
    b.step(4, {}, {}, {})
    assert looks == []  # the graphs stayed: the pointers read before
    assert copies(api_a, mark_a)[0][1] == old_src and copies(api_b, mark_b)[0][0] == old_dst
    # a structure change on each side: a larger input moves the buffers (a new pool size class), a rebuild
    rebuilds = a.engine.rebuilds, b.engine.rebuilds
    a.engine.resize(a.port(PortRef(first.id, "x")), (8 * N,))
    b.engine.resize(dst_port, (8 * N,))
    mark_a, mark_b = len(api_a.calls), len(api_b.calls)
    a.step(5, {}, {}, {})
    b.step(5, {}, {}, {})
    assert (a.engine.rebuilds, b.engine.rebuilds) > rebuilds
    assert looks.count("first") >= 1 and looks.count("second") >= 1  # read again after the rebuild
    new_src, new_dst = device_pointer(a.engine, src_port)[0], device_pointer(b.engine, dst_port)[0]
    assert new_src != old_src and new_dst != old_dst  # the buffers moved
    (copy_a,), (copy_b,) = copies(api_a, mark_a), copies(api_b, mark_b)
    assert copy_a[1] == new_src and copy_a[2] == N * 4  # the slot holds the link's bytes, no more
    assert copy_b[0] == new_dst  # the consumer's copy lands in the moved input, not the old one
    assert b.stats()["received"] == {"first.out -> second.x": 5}
    b.close(), a.close()
    assert api_a.leaks() == {} and api_b.leaks() == {}


def test_a_consumer_stepped_before_its_producer_waits_for_the_producers_event_record(drivers):
    s, first, second = _pipeline(gpus=True)
    a, b = _hosts(s, device_slots=True)
    api_a, api_b = a.engine.device.api, b.engine.device.api
    order: list[str] = []
    for api, who in ((api_a, "producer"), (api_b, "consumer")):
        real_record, real_wait = api.cuEventRecord, api.cuStreamWaitEvent
        api.cuEventRecord = lambda ev, st, r=real_record, w=who: (order.append(f"{w} record"), r(ev, st))[1]
        api.cuStreamWaitEvent = lambda st, ev, f, r=real_wait, w=who: (order.append(f"{w} wait"), r(st, ev, f))[1]
    for index in (1, 2, 3):
        order.clear()
        join = _step_in_thread(b, index)  # as the driver submits it: alongside the producer's, not after
        a.step(index, {}, {}, {})
        _, report = join()
        assert report.frame.launched
        assert order.index("producer record") < order.index("consumer wait"), order
    assert b.stats()["received"] == {"first.out -> second.x": 3}
    b.close(), a.close()


def test_an_ipc_link_on_the_null_driver_carries_each_frames_bytes_in_shared_memory(drivers):
    s, first, second = _pipeline(gpus=False, transport="ipc")
    a, b = _hosts(s, device_slots=False)
    api_a = a.engine.device.api
    rng = np.random.default_rng(7)
    frames = {}
    for index in range(1, 9):
        x = rng.standard_normal(N).astype(np.float32)  # what the producer's GPU would have computed this frame
        frames[index] = x
        api_a.device_bytes = x.tobytes()
        if index % 2:  # the consumer asks first and waits; or the producer is a frame ahead
            join = _step_in_thread(b, index)
            a.step(index, {}, {}, {})
            join()
        else:
            a.step(index, {}, {}, {})
            b.step(index, {}, {}, {})
        np.testing.assert_array_equal(np.frombuffer(drivers[-1].uploads[-1], np.float32), x)
    assert b.stats()["received"] == {"first.out -> second.x": 8}
    assert b.stats()["waited"] >= 1  # the consumer's step ran before its producer's at least once
    b.close(), a.close()


def test_a_producer_a_frame_ahead_never_overwrites_the_slot_its_consumer_reads(drivers):
    s, first, second = _pipeline(gpus=False, transport="ipc")
    a, b = _hosts(s, device_slots=False, depth=3)
    api_a = a.engine.device.api
    rng = np.random.default_rng(8)
    xs = {}
    for index in (1, 2, 3):  # the driver's bound: at most depth - 1 frames ahead of the consumer... and one more
        xs[index] = rng.standard_normal(N).astype(np.float32)
        api_a.device_bytes = xs[index].tobytes()
        a.step(index, {}, {}, {})
    for index in (1, 2, 3):
        b.step(index, {}, {}, {})
        np.testing.assert_array_equal(np.frombuffer(drivers[-1].uploads[-1], np.float32), xs[index])
    b.close(), a.close()


def test_a_failed_producer_step_lets_its_consumer_go_on_with_its_last_input(drivers):
    s, first, second = _pipeline(gpus=False, transport="ipc")
    a, b = _hosts(s, device_slots=False)
    a.step(1, {}, {}, {})
    b.step(1, {}, {}, {})
    join = _step_in_thread(b, 2)
    with pytest.raises(KeyError, match="worker 'a' holds no block"):  # a step that fails before its tick
        a.step(2, {}, {PortRef(second.id, "x"): np.ones(N, np.float32)}, {})
    _, report = join()  # not held until the timeout: the board says frame 2 will not come
    assert report.frame.launched
    stats = b.stats()
    assert stats["received"] == {"first.out -> second.x": 1} and stats["skipped"] == {"first.out -> second.x": 1}
    b.close(), a.close()


def test_a_consumer_whose_producer_publishes_nothing_skips_the_frame_with_a_warning(drivers):
    s, first, second = _pipeline(gpus=False, transport="ipc")
    a, b = _hosts(s, device_slots=False)
    b.link_timeout = 0.05
    _, report = b.step(1, {}, {}, {})
    assert report.frame.launched
    (d,) = report.diagnostics
    assert d.severity == "warning" and d.subject == "first.out -> second.x"
    assert "worker 'b': the producer of first.out -> second.x published no frame 1 within 0.05 s" in d.message
    assert b.stats()["skipped"] == {"first.out -> second.x": 1}
    b.close(), a.close()


def test_a_restarted_producer_is_mapped_again_and_its_predecessors_frames_are_skipped(drivers):
    s, first, _second = _pipeline(gpus=True)
    a, b = _hosts(s, device_slots=True)
    a.step(1, {}, {}, {})
    b.step(1, {}, {}, {})
    a.close()  # as a restart: the producer's board is retired, a new one (new slots, new handles) serves frame 4 on
    a.build(s.fragments["a"], {}, since=4)
    api_b = b.engine.device.api
    _, report = b.step(3, {}, {}, {})  # a frame of the old producer, still in flight: skipped, not waited for
    assert report.frame.launched and b.stats()["skipped"] == {"first.out -> second.x": 1}
    a.step(4, {}, {}, {})  # the same slot index as frame 1
    b.step(4, {}, {}, {})
    assert api_b.count("cuIpcOpenMemHandle") == 2 and api_b.count("cuIpcCloseMemHandle") == 1
    assert b.stats()["received"] == {"first.out -> second.x": 2}
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


@pytest.mark.parametrize("cpu", [False, True], ids=["null driver", "cpu device"])
def test_a_prewarmed_standby_has_done_what_a_links_first_frame_does(cpu):
    """A standby's prewarm runs a frame and looks a port's buffer up as a link's end does, so that the first
    frame of the worker it takes over imports nothing (CuPy's import took ~150 ms of it); in a fresh process."""
    import subprocess
    import sys

    code = ("import sys; from rxcuda.distributed._worker import FragmentHost; "
            f"host = FragmentHost('standby', null=True, cpu={cpu}); before = 'cupy' in sys.modules; "
            "host.prewarm(); print(before, 'cupy' in sys.modules, host._warm is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "True", "True"], out.stdout + out.stderr


def test_where_in_a_process_without_ray_does_not_import_it():
    """A child process of the driver's (_procs, the isolated engine's GPU process) has no Ray loaded: where() asks
    Ray only where it is, since importing it took ~600 ms of a replaced GPU process's build (H100, Ray 2.60)."""
    import subprocess
    import sys

    code = ("import sys; from rxcuda.distributed._worker import FragmentHost; h = FragmentHost('w', True); "
            "w = h.where(); print('ray' in sys.modules, w['gpus'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "[]"], out.stdout + out.stderr
