"""Structural changes prepared off the frame thread, on a real GPU: a pipeline edited from another thread
while ``engine.run`` drives the frames. Every frame's observed result is checked against NumPy on fresh
random inputs: it is the old pipeline's or the new one's, never anything else, and from the frame that swaps
a new graph in, the new one's.
"""

import threading
import time

import numpy as np

from rxcuda import Block

RATE = 120.0  # frames per second while editing
TIMEOUT = 30.0


def rand(rng, n):
    return rng.standard_normal(n).astype(np.float32) + 0.5


class Record:
    """Every observed value and every Frame, in the order the engine thread delivers them (an observed
    port's value comes before its frame's Frame)."""

    def __init__(self, engine, port):
        self.items: list = []
        self.subs = [engine.observe(port).subscribe(lambda v: self.items.append(("value", v.copy()))),
                     engine.frames.subscribe(lambda f: self.items.append(("frame", f)))]

    def frames(self) -> list[tuple]:
        """(frame, the value observed in it) for every frame that launched."""
        out, value = [], None
        for kind, x in list(self.items):
            if kind == "value":
                value = x
            elif x.launched:
                assert value is not None, f"frame {x.index} launched but its output was not observed"
                out.append((x, value))
                value = None
        return out

    def dispose(self) -> None:
        for s in self.subs:
            s.dispose()


def settle(engine) -> None:
    """Wait until no structural change is pending or being prepared (the frames go on meanwhile)."""
    deadline = time.monotonic() + TIMEOUT
    while engine._rt.preparing or engine._rt.pending.structure_pending:
        assert time.monotonic() < deadline, "a structural change was never swapped in"
        time.sleep(0.01)
    time.sleep(5 / RATE)  # a few frames of the settled pipeline


def test_replacing_a_block_while_running_gives_the_old_or_the_new_result_in_every_frame(engine, rng, kernels):
    n = 4099
    op = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n, name="op"))
    scale = float(np.float32(rng.uniform(0.5, 2.0)))
    tail = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=scale, name="tail"))
    engine.connect(op["out"], tail["x"])
    a, b = rand(rng, n), rand(rng, n)
    engine.write(op["a"], a)
    engine.write(op["b"], b)
    # a few blocks beside it, so that a rebuild takes a while
    side = [engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, name=f"s{i}")) for i in range(50)]
    engine.connect(tail["out"], side[0]["x"])
    for s, t in zip(side, side[1:], strict=False):
        engine.connect(s["out"], t["x"])
    expected = {"add": (a + b) * np.float32(scale), "sub": (a - b) * np.float32(scale)}
    engine.keep(tail["out"])  # memory of its own from the first build: observed in every frame
    engine.tick()
    record = Record(engine, tail["out"])
    running = engine.run(RATE)
    kinds = ["sub", "add", "sub", "add", "sub"]
    try:
        def edit() -> None:
            nonlocal op
            for kind in kinds:
                time.sleep(0.15)
                new = Block.from_kernel(kernels / f"vector_{kind}.ptx", size=n)
                engine.replace(op, new)
                op = new

        editor = threading.Thread(target=edit)
        editor.start()
        editor.join(TIMEOUT)
        settle(engine)
    finally:
        running.dispose()
        record.dispose()
    frames = record.frames()
    assert len(frames) > 20
    swaps = 0
    last = None
    for frame, value in frames:
        matches = [k for k, want in expected.items() if np.allclose(value, want, rtol=1e-5, atol=1e-6)]
        assert matches, f"frame {frame.index}: the output is neither the old pipeline's nor the new one's"
        if "structure" in frame.tiers:
            swaps += 1
        elif last is not None:  # no swap in this frame: the same pipeline as the frame before
            assert matches == last, f"frame {frame.index} changed its result without a swap"
        last = matches
    assert swaps >= 1 and last == [kinds[-1]]  # the last edit's pipeline runs at the end
    np.testing.assert_allclose(engine.read(tail["out"]), expected[kinds[-1]], rtol=1e-5, atol=1e-6)
    assert engine.rebuilds >= 2 and not [d for d in engine.diagnostic_log if d.severity == "error"]


def test_a_delayed_connections_state_goes_on_exactly_through_every_swap(engine, rng, kernels):
    n = 2053
    acc = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n, name="acc"))
    initial = rng.integers(-50, 50, n).astype(np.float32)
    step = rng.integers(1, 5, n).astype(np.float32)  # whole numbers: every sum is exact in float32
    engine.connect(acc["out"], acc["a"], delay=1, initial=initial)
    engine.write(acc["b"], step)
    engine.keep(acc["out"])
    engine.tick()
    record = Record(engine, acc["out"])
    running = engine.run(RATE)
    try:
        def edit() -> None:  # a consumer of acc.out added and removed: the graph around the state changes
            extra = None
            for _ in range(8):
                time.sleep(0.1)
                if extra is None:
                    extra = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0))
                    engine.connect(acc["out"], extra["x"])
                else:
                    engine.remove(extra)
                    extra = None

        editor = threading.Thread(target=edit)
        editor.start()
        editor.join(TIMEOUT)
        settle(engine)
    finally:
        running.dispose()
        record.dispose()
    frames = record.frames()
    assert len(frames) > 20 and any("structure" in f.tiers for f, _ in frames)
    for (f0, v0), (f1, v1) in zip(frames, frames[1:], strict=False):
        assert f1.index == f0.index + 1
        np.testing.assert_array_equal(v1, v0 + step, err_msg=f"frame {f1.index} ({f1.tiers}) lost the state")
    first, value = frames[0]
    np.testing.assert_array_equal(value, initial + step * np.float32(first.index))  # frame 1 read initial


def test_a_parameter_set_while_a_graph_is_prepared_reaches_it(engine, rng, kernels):
    n = 3001
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=1.0, name="mul"))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    engine.keep(mul["out"])  # read after the swap: its value must not share memory with later buffers
    side = [engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, name=f"s{i}")) for i in range(200)]
    engine.connect(mul["out"], side[0]["x"])
    for s, t in zip(side, side[1:], strict=False):
        engine.connect(s["out"], t["x"])
    engine.tick()
    running = engine.run(RATE)
    try:
        extra = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n))
        engine.connect(side[-1]["out"], extra["x"])
        deadline = time.monotonic() + TIMEOUT
        while not engine._rt.preparing and engine._rt.pending.structure_pending:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        scale = float(np.float32(rng.uniform(2.0, 3.0)))
        mul.set(scale=scale)  # most likely while the new graph is prepared
        settle(engine)
        np.testing.assert_allclose(engine.read(mul["out"]), x * np.float32(scale), rtol=1e-6)
        assert engine.read(extra["out"]).shape == (n,)
    finally:
        running.dispose()
