"""Structural changes prepared off the frame thread (rxcuda.engine._prepare), on the null driver.

Under ``engine.run`` a structural change is planned, built and instantiated on the preparation worker while
the last good graph keeps launching; the first frame after the worker is done swaps it in. These tests hold
the worker at a gate (``Gate``) so that "a preparation in flight" is a state they can act in, and drive the
frames one by one with an Observable clock.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from reactivex.subject import Subject

from rxcuda import Block
from rxcuda.lowlevel import PortRef

N = 1024
K = "kernels"
TIMEOUT = 10.0


def mul(name: str, scale: float = 1.0) -> Block:
    return Block.from_kernel(f"{K}/scalar_mul.ptx", size=N, scale=scale, name=name)


class Gate:
    """Holds the preparation worker inside ``Builder.prepare`` until ``open()``: records the thread it ran on
    and the descriptions it was given (one per preparation)."""

    def __init__(self, engine, monkeypatch, fail: Exception | None = None):
        self.builder = engine._builder
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.threads: list[str] = []
        self.descs: list = []
        self.fail = fail
        real = self.builder.prepare

        def prepare(desc, background):
            if not background:
                return real(desc, background)
            self.threads.append(threading.current_thread().name)
            self.descs.append(desc)
            self.entered.set()
            assert self.opened.wait(TIMEOUT), "the test never opened the gate"
            if self.fail is not None:
                raise self.fail
            return real(desc, background)

        monkeypatch.setattr(self.builder, "prepare", prepare)

    def open(self) -> None:
        self.opened.set()

    def wait_done(self) -> None:
        """Open the gate and wait until the worker finished the preparation in flight."""
        self.open()
        job = self.builder.prep.job
        assert job is not None, "no preparation is in flight"
        job.exception(TIMEOUT)  # waits for it, built or failed


class Frames:
    """``engine.run`` on an Observable clock: ``next()`` produces one frame and returns it."""

    def __init__(self, engine):
        self.engine = engine
        self.clock: Subject = Subject()
        self.seen: list = []
        self.sub = engine.frames.subscribe(self.seen.append)
        self.running = engine.run(self.clock)

    def next(self):
        n = len(self.seen)
        self.clock.on_next(0)
        deadline = time.monotonic() + TIMEOUT
        while len(self.seen) <= n:
            assert time.monotonic() < deadline, "no frame came"
            time.sleep(0.001)
        return self.seen[n]

    def stop(self) -> None:
        self.running.dispose()
        self.sub.dispose()


@pytest.fixture
def chain(engine):
    blocks = [mul(f"m{i}", 2.0) for i in range(3)]
    for b in blocks:
        engine.add(b)
    for a, b in zip(blocks, blocks[1:], strict=False):
        engine.connect(a["out"], b["x"])
    engine.write(blocks[0]["x"], np.ones(N, np.float32))
    assert engine.tick().tiers == ("structure",)
    return blocks


@pytest.fixture
def frames(engine, chain):
    f = Frames(engine)
    yield f
    f.stop()


def kernel_arg(engine, block, name: str):
    """The value a kernel node of the running graph holds for a block's parameter (its argument storage)."""
    g = engine._rt.graph
    (nid, arg), *_ = g.plan.slots[(block.id, name)]
    view, idx = g.nodes[nid].slots[arg]
    return view[idx]


def test_a_structural_change_under_run_is_built_on_the_worker_while_the_old_graph_launches(
        engine, api, chain, frames, monkeypatch):
    gate = Gate(engine, monkeypatch)
    old = engine._rt.graph
    extra = engine.add(mul("extra"))
    engine.connect(chain[-1]["out"], extra["x"])
    launches = api.count("cuGraphLaunch")
    for _ in range(3):  # the worker is held: the frames go on with the last good graph
        frame = frames.next()
        assert frame.launched and "structure" not in frame.tiers
    assert gate.entered.is_set() and gate.threads == ["rxcuda-prepare"]
    assert engine._rt.graph is old and engine._rt.preparing
    assert api.count("cuGraphLaunch") == launches + 3
    gate.wait_done()
    frame = frames.next()  # the swap, then the new graph's first launch
    assert frame.tiers == ("structure",) and frame.launched
    new = engine._rt.graph
    assert new is not old and (extra.id, "extra") not in old.plan.kernel_nodes
    assert any(n.block == extra.id for n in new.plan.nodes)
    assert not engine._rt.preparing and engine._builder.prep.swaps == 1
    uploads = [a for n, a in api.calls if n == "cuGraphUpload"]  # uploaded by the worker, before its first launch
    assert uploads == [(int(new.exec), engine._rt.stream_h)]
    assert engine._builder.prep.last_swap_us is not None and engine.rebuilds == 2
    deadline = time.monotonic() + TIMEOUT  # the old graph is freed on the worker once the GPU is done with it
    while old.exec is not None:
        assert time.monotonic() < deadline, "the old graph was never freed"
        time.sleep(0.001)


def test_parameters_changed_mid_preparation_reach_the_new_graph_before_its_first_launch(
        engine, chain, frames, monkeypatch):
    gate = Gate(engine, monkeypatch)
    extra = engine.add(mul("extra"))
    engine.connect(chain[-1]["out"], extra["x"])
    frames.next()
    assert gate.entered.wait(TIMEOUT)  # the worker took its description: later values are not in it
    chain[1].set(scale=7.0)
    frames.next()
    assert kernel_arg(engine, chain[1], "scale") == np.float32(7.0)  # the running graph got it at once
    gate.wait_done()
    assert gate.descs[0].block(chain[1].id).value("scale") == 2.0
    frames.next()
    g = engine._rt.graph
    assert any(n.block == extra.id for n in g.plan.nodes)
    assert kernel_arg(engine, chain[1], "scale") == np.float32(7.0)  # replayed before the first launch


def test_a_failure_on_the_worker_keeps_the_last_good_graph(engine, api, chain, frames, monkeypatch):
    gate = Gate(engine, monkeypatch, fail=RuntimeError("the worker broke"))
    old = engine._rt.graph
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    extra = engine.add(mul("extra"))
    engine.connect(chain[-1]["out"], extra["x"])
    frames.next()
    gate.wait_done()
    frame = frames.next()  # reported at the swap; the last good graph launches
    assert frame.launched and "structure" not in frame.tiers
    assert engine._rt.graph is old and not engine._rt.preparing
    assert any(d.severity == "error" and "the worker broke" in d.message for d in seen)
    gate.fail = None  # the next structural change builds again
    gate.opened.set()
    engine.remove(extra)
    frames.next()
    engine._builder.prep.job.result(TIMEOUT)
    assert frames.next().tiers == ("structure",) and engine._rt.graph is not old


def test_an_instantiation_that_fails_on_the_worker_keeps_the_last_good_graph(engine, api, chain, frames,
                                                                             monkeypatch):
    gate = Gate(engine, monkeypatch)
    old = engine._rt.graph
    engine.connect(chain[-1]["out"], engine.add(mul("extra"))["x"])
    frames.next()
    api.fail("cuGraphInstantiate", "CUDA_ERROR_OUT_OF_MEMORY")
    gate.wait_done()
    assert frames.next().launched and engine._rt.graph is old
    assert "exec" not in api.leaks() or len(api.live["exec"]) == 1  # only the running graph's


def test_a_change_arriving_during_a_preparation_folds_into_the_next_one(engine, chain, frames, monkeypatch):
    gate = Gate(engine, monkeypatch)
    a = engine.add(mul("a"))
    engine.connect(chain[-1]["out"], a["x"])
    frames.next()
    assert gate.entered.wait(TIMEOUT)
    b = engine.add(mul("b"))  # arrives while the first preparation runs
    engine.connect(a["out"], b["x"])
    c = engine.add(mul("c"))
    engine.connect(b["out"], c["x"])
    frames.next()
    frames.next()
    assert len(gate.descs) == 1 and engine._builder.prep.again
    gate.wait_done()
    gate.entered.clear()
    assert frames.next().tiers == ("structure",)  # the first swapped in: a, without b and c
    blocks = {n.block for n in engine._rt.graph.plan.nodes}
    assert a.id in blocks and b.id not in blocks
    assert engine._rt.preparing  # ... and the next one started at that swap, with b and c at once
    engine._builder.prep.job.result(TIMEOUT)
    assert frames.next().tiers == ("structure",)
    assert {b.id, c.id} <= {n.block for n in engine._rt.graph.plan.nodes}
    assert len(gate.descs) == 2 and not engine._rt.preparing


def test_delay_state_append_counters_and_written_inputs_carry_over(engine, api, monkeypatch):
    acc = engine.add(Block.from_kernel(f"{K}/vector_add.ptx", size=N, name="acc"))
    engine.connect(acc["out"], acc["a"], delay=1, initial=1.0)
    engine.write(acc["b"], np.ones(N, np.float32))
    hits = engine.add(Block.from_kernel(f"{K}/append_above.ptx", size=N, name="hits"))
    engine.connect(acc["out"], hits["values"])
    engine.tick()
    old = engine._rt.graph
    prev = old.plan.delays[next(iter(old.plan.delays))]
    counter = old.plan.counters[next(iter(old.plan.counters))]
    frames = Frames(engine)
    try:
        gate = Gate(engine, monkeypatch)
        engine.connect(hits["out"], engine.add(mul("tail"))["x"])
        frames.next()
        assert gate.entered.wait(TIMEOUT)
        data = np.full(N, 3.0, np.float32)
        engine.write(acc["b"], data)  # during the preparation: the running graph and the new one get it
        gate.wait_done()
        mark = len(api.calls)
        frames.next()
        new = engine._rt.graph
        assert new is not old
        new_prev = new.plan.delays[next(iter(new.plan.delays))]
        new_counter = new.plan.counters[next(iter(new.plan.counters))]
        # the same memory: the previous frame's values and the counter go on where the old graph left them
        assert new.pointers[new_prev] == old.pointers[prev]
        assert new.pointers[new_counter] == old.pointers[counter]
        swap = api.calls[mark:]
        touched = {a[0] for n, a in swap if n in ("cuMemsetD8Async", "cuMemsetD32Async", "cuMemcpyHtoDAsync")}
        assert old.pointers[prev] not in touched  # not given its frame-0 value again
        b_ptr = new.pointers[new.plan.port_buffers[PortRef(acc.id, "b")]]
        assert b_ptr in {a[0] for n, a in swap if n == "cuMemcpyHtoDAsync"}  # the write reached the new graph
    finally:
        frames.stop()


def test_tick_called_directly_applies_the_change_in_that_tick(engine, chain, monkeypatch):
    frames = Frames(engine)
    gate = Gate(engine, monkeypatch)
    a = engine.add(mul("a"))
    engine.connect(chain[-1]["out"], a["x"])
    frames.next()
    assert gate.entered.wait(TIMEOUT) and engine._rt.preparing
    frames.stop()  # the preparation is still in flight
    b = engine.add(mul("b"))
    engine.connect(a["out"], b["x"])
    threading.Timer(0.05, gate.open).start()
    frame = engine.tick()  # waits for the preparation, swaps it in, and builds b too, in this tick
    assert "structure" in frame.tiers and frame.launched
    assert {a.id, b.id} <= {n.block for n in engine._rt.graph.plan.nodes}
    assert not engine._rt.preparing and not engine._builder.prep.again


def test_without_run_a_structural_change_is_built_in_the_tick(engine, chain):
    a = engine.add(mul("a"))
    engine.connect(chain[-1]["out"], a["x"])
    assert engine.tick().tiers == ("structure",) and not engine._rt.preparing
    assert engine._builder.prep.job is None and engine._builder.prep.worker._thread is None


def test_close_during_a_preparation_throws_the_new_graph_away(api, monkeypatch):
    import rxcuda

    engine = rxcuda.Engine(driver=api)
    blocks = [mul("m0"), mul("m1")]
    for b in blocks:
        engine.add(b)
    engine.connect(blocks[0]["out"], blocks[1]["x"])
    engine.write(blocks[0]["x"], np.ones(N, np.float32))
    engine.tick()
    frames = Frames(engine)
    gate = Gate(engine, monkeypatch)
    engine.connect(blocks[1]["out"], engine.add(mul("extra"))["x"])
    frames.next()
    assert gate.entered.wait(TIMEOUT)
    threading.Timer(0.05, gate.open).start()
    frames.sub.dispose()
    engine.close()  # waits for the worker, frees what it built, ends the worker
    assert engine.closed and not engine._rt.preparing
    assert api.count("cuGraphInstantiate") == 2  # the new graph was made ...
    assert api.leaks() == {}  # ... and freed with everything else
    assert engine._builder.prep.worker._thread is None


def test_reads_wait_for_a_preparation_and_see_the_new_graph(engine, chain, frames, monkeypatch):
    gate = Gate(engine, monkeypatch)
    a = engine.add(mul("a"))
    engine.connect(chain[-1]["out"], a["x"])
    frames.next()
    assert gate.entered.wait(TIMEOUT)
    threading.Timer(0.05, gate.open).start()
    out = engine.read(a["out"])  # a port only the graph being prepared has: the read waits for it
    assert out.shape == (N,) and not engine._rt.preparing
    assert a.id in {n.block for n in engine._rt.graph.plan.nodes}


def test_a_port_of_the_running_graph_is_read_there_without_waiting(engine, chain, frames, monkeypatch):
    gate = Gate(engine, monkeypatch)
    engine.connect(chain[-1]["out"], engine.add(mul("a"))["x"])
    frames.next()
    assert gate.entered.wait(TIMEOUT)
    old = engine._rt.graph
    out = engine.read(chain[-1]["out"])  # the gate is closed: this returns with the last frame's value
    assert out.shape == (N,) and engine._rt.preparing and engine._rt.graph is old
    gate.open()


def test_a_resize_that_fits_is_recognized_on_the_worker_and_taken_in_place_at_the_swap(engine, api, chain, frames):
    old = engine._rt.graph
    instantiated = api.count("cuGraphInstantiate")
    engine.resize(chain[0]["x"], (N // 2,))
    deadline = time.monotonic() + TIMEOUT
    tiers: tuple = ()
    while "parameters" not in tiers:  # the worker only plans it; the swap updates the running graph's nodes
        assert time.monotonic() < deadline, "the resize never reached the graph"
        tiers = frames.next().tiers
    assert engine._rt.graph is old and api.count("cuGraphInstantiate") == instantiated
    assert engine.shape(chain[-1]["out"]) == (N // 2,) and engine._builder.resized_in_place == 1


def test_updates_report_the_swap_once_with_the_blocks_it_was_asked_for(engine, chain, frames, monkeypatch):
    gate = Gate(engine, monkeypatch)
    seen: list = []
    sub = engine.updates.subscribe(seen.append)
    a = engine.add(mul("a"))
    engine.connect(chain[-1]["out"], a["x"])
    frames.next()
    assert seen == []  # handed to the worker: nothing applied yet
    chain[0].set(scale=5.0)
    frames.next()
    assert [u.tiers for u in seen] == [("parameters",)]  # the running graph got the value
    gate.wait_done()
    frames.next()
    sub.dispose()
    assert seen[-1].tiers == ("structure",) and "a" in seen[-1].blocks and seen[-1].seconds > 0
