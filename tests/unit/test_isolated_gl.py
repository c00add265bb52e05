"""OpenGL drawing from an isolated engine (``IsolatedEngine.gl_buffer``, rxcuda/distributed/_isogl.py): the GL buffer
is registered in this process and each frame's bytes come from the GPU process through shared memory; a fault in
the GPU process costs the frames it ended, GL keeps the last good frame, and the next good frames draw again. On
the CPU device drawn for real through EGL (Mesa's llvmpipe), pixel by pixel against NumPy; the GPU path's CUDA IPC
bookkeeping (slots mapped once per board, mapped again for a replaced process's board) on the null driver. The
same on a GPU, with a kernel that really faults: tests/gpu/test_gl_gpu.py."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from _gldraw import draw, egl_context, pixel_centres, points
from test_isolated import _until_ok

import rxcuda
from rxcuda.cuda import NullDriver, _ipc
from rxcuda.distributed import IsolatedEngine, _board, _isogl, _procs
from rxcuda.engine._engine import Engine, Frame

BAD = ('extern "C" __global__ void bad(const float* x, float* out, int n) '
       "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i + 100000000] = x[i]; }")
M = 300  # points drawn


def _moderngl():
    return pytest.importorskip("moderngl", reason="the gl extra's moderngl is not installed: pip install '.[gl]'")


@pytest.fixture
def ctx():
    ctx = egl_context(_moderngl())
    yield ctx
    ctx.release()


def _frame(iso, shared, mul, ctx, vao, vbo, rng, scale):
    """One good frame through the GL buffer on fresh random pixels: the buffer holds exactly the frame's points
    and GL lights exactly their pixels. Returns what was drawn (pixels, points)."""
    want, xy = pixel_centres(rng, M)
    iso.write(mul["x"], (xy / np.float32(scale)).reshape(-1))  # dividing and multiplying by a power of 2: exact
    mul.params["scale"].value = scale
    f = shared.tick()
    assert f.state == "ok", (f, iso.faults[-1:])
    np.testing.assert_array_equal(np.frombuffer(vbo.read(), np.float32).reshape(M, 2), xy)
    assert draw(ctx, vao) == want
    return want, xy


def test_on_the_cpu_device_gl_draws_each_frame_and_again_after_the_gpu_process_faulted(ctx):
    rng = np.random.default_rng()
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=2 * M, scale=2.0, name="mul"))
        iso.write(mul["x"], np.zeros(2 * M, np.float32))
        assert iso.tick().state == "ok"
        vbo = ctx.buffer(reserve=2 * M * 4)
        vao = points(ctx, vbo)
        shared = iso.gl_buffer(mul["out"], vbo.glo)
        for scale in (2.0, 0.5, -4.0):
            _frame(iso, shared, mul, ctx, vao, vbo, rng, scale)
        last_want, last_xy = _frame(iso, shared, mul, ctx, vao, vbo, rng, 2.0)
        assert shared.copied == 4 and shared.missed == 0
        # a kernel beside it writes past its buffer: the GPU process ends, GL keeps the last good frame
        oops = iso.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(BAD, target="ptx"), size=2 * M))
        iso.write(oops["x"], np.ones(2 * M, np.float32))
        first = iso.pid
        f = shared.tick()
        assert f.state == "error" and iso.faults[-1].kind == "fault"
        assert "illegal address in kernel 'bad'" in iso.faults[-1].message
        assert shared.missed == 1 and shared.copied == 4
        np.testing.assert_array_equal(np.frombuffer(vbo.read(), np.float32).reshape(M, 2), last_xy)
        assert draw(ctx, vao) == last_want
        iso.remove(oops)
        seen = _until_ok(shared)
        assert iso.pid != first and shared.missed == len(seen)  # the frames while it was replaced: not copied
        # the new GPU process exports the port on a new board: every next frame is drawn exactly
        for scale in (1.0, -0.25, 8.0):
            _frame(iso, shared, mul, ctx, vao, vbo, rng, scale)
        shared.close()
        assert iso.tick().state == "ok"  # the export leaves the GPU process's fragment
        assert iso._gl_side is not None and iso._gl_side.device.api.leaks().get("graphics", 0) == 0


def test_on_the_cpu_device_new_code_tried_in_the_standby_leaves_the_drawing_to_the_serving_process(ctx):
    """A trial run builds the pipeline in the standby process: without the GL buffer's export, so the board the
    drawing copies from stays the serving process's."""
    bad_mul = ('extern "C" __global__ void scalar_mul(const float* x, float* out, float scale, int n) '
               "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i + 100000000] = x[i] * scale; }")
    rng = np.random.default_rng()
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=2 * M, scale=2.0, name="mul"))
        vbo = ctx.buffer(reserve=2 * M * 4)
        vao = points(ctx, vbo)
        shared = iso.gl_buffer(mul["out"], vbo.glo)
        _frame(iso, shared, mul, ctx, vao, vbo, rng, 2.0)
        actor = _procs.actor_of(iso.actor("gpu"))
        end = time.monotonic() + 60
        while (actor.standby is None or not actor.standby.ready.is_set()) and time.monotonic() < end:
            time.sleep(0.02)
        serving = iso.pid
        mul.set_code("scalar_mul", rxcuda.compile_cuda(bad_mul, target="ptx"))
        _frame(iso, shared, mul, ctx, vao, vbo, rng, 0.5)  # the good code's frame, drawn
        assert iso.faults[-1].kind == "trial" and iso.pid == serving
        for scale in (4.0, -1.0):
            _frame(iso, shared, mul, ctx, vao, vbo, rng, scale)
        assert shared.missed == 0


def test_on_two_cpu_positions_a_port_on_position_1_is_drawn_every_frame(ctx):
    """With devices=[...], the pipeline is split by position before it is shipped: the GL buffer's port (on position
    1 here) must still be exported by the GPU process (a second split that dropped the exports once went unseen)."""
    rng = np.random.default_rng()
    with IsolatedEngine(devices=["cpu", "cpu"], deadline=30.0, standby=False) as iso:
        first = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=2 * M, scale=1.0, name="first"))
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=2 * M, scale=2.0, name="mul"), device=1)
        iso.connect(first["out"], mul["x"])
        vbo = ctx.buffer(reserve=2 * M * 4)
        vao = points(ctx, vbo)
        shared = iso.gl_buffer(mul["out"], vbo.glo)
        for scale in (2.0, -0.5, 4.0):
            want, xy = pixel_centres(rng, M)
            iso.write(first["x"], (xy / np.float32(scale)).reshape(-1))
            mul.params["scale"].value = scale
            assert shared.tick().state == "ok", iso.faults[-1:]
            np.testing.assert_array_equal(np.frombuffer(vbo.read(), np.float32).reshape(M, 2), xy)
            assert draw(ctx, vao) == want
        assert shared.copied == 3 and shared.missed == 0
        shared.close()


def test_what_it_refuses_it_names_with_the_fix():
    with IsolatedEngine(null=True, deadline=5.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=64, name="mul"))
        with pytest.raises(TypeError, match=r"the GL object's name, a positive int .* \(got True\)"):
            iso.gl_buffer(mul["out"], True)
        assert iso._gl_side is None  # refused before a CUDA context was made here for it
        iso._gl_side = _isogl.GLSide(0, cpu=False, null=True)  # (the null driver's GL objects are the test's)
        iso._gl_side.api.gl_objects[7] = 64 * 4
        with pytest.raises(NotImplementedError, match=r"shares GL buffers, not textures: draw mul.out through a GL "
                                                      r"buffer \(iso.gl_buffer"):
            iso.gl_texture(mul["out"], 7)
        with pytest.raises(TypeError, match=r"the GL object's name, a positive int .* \(got -1\)"):
            iso.gl_buffer(mul["out"], -1)
        other = rxcuda.Block.from_kernel("scalar_mul", size=64, name="elsewhere")
        with pytest.raises(rxcuda.ValidationError, match=r"elsewhere is not in this distributed engine"):
            iso.gl_buffer(other["out"], 7)
        with pytest.raises(rxcuda.CudaError, match=r"cuGraphicsGLRegisterBuffer.*INVALID_VALUE"):
            iso.gl_buffer(mul["out"], 8)  # names no GL buffer
        iso._gl_side.api.gl_objects[9] = 16
        small = iso.gl_buffer(mul["out"], 9)
        iso.write(mul["x"], np.ones(64, np.float32))
        with pytest.raises(ValueError, match=r"GL buffer 9 holds 16 bytes, but mul.out \(64 f32\) needs 256; make it "
                                             r"larger \(moderngl: ctx.buffer\(reserve=256\)\)"):
            small.tick()
        small.close()
        running = iso.run(1000.0)
        with pytest.raises(RuntimeError, match=r"dispose run\(\) and tick from the render loop"):
            iso.gl_buffer(mul["out"], 7)
        running.dispose()
        shared = iso.gl_buffer(mul["out"], 7)
        assert shared.tick().state == "ok" and shared.copied == 1
        iso._gl_side.api.gl_objects[10] = 64 * 4
        inputs = iso.gl_buffer(mul["x"], 10)  # any typed port: an input too (nothing is bound to the buffer)
        with shared, inputs:  # several buffers around one frame
            assert iso.tick().state == "ok"
        assert shared.copied == 2 and inputs.copied == 1
        iso.tick()  # a frame not ticked through them: not copied
        assert shared.copied == 2 and shared.missed == 0
        keep = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=64, name="keep"))
        iso.remove(mul)  # the shared port's block: exported no more, its frames are not waited for
        t0 = time.monotonic()
        shared.tick()
        assert shared.missed == 1 and time.monotonic() - t0 < iso.deadline
        shared.close()
        inputs.close()
        shared = iso.gl_buffer(keep["out"], 7)
    with pytest.raises(rxcuda.EngineClosedError):
        shared.tick()


class _Producer:
    """What a GPU process's export does on a GPU, on a null driver of its own: ``depth`` exported slots with
    an interprocess event each, their handles on a board; each frame publishes the frame's slot."""

    def __init__(self, path: str, depth: int, nbytes: int, since: int):
        self.api = NullDriver()
        self.slots = [_ipc.export_memory(self.api, nbytes) for _ in range(depth)]
        self.events = [_ipc.export_event(self.api) for _ in range(depth)]
        handles = [(m.handle, e.handle) for m, e in zip(self.slots, self.events, strict=True)]
        self.board = _board.LinkBoard.create(path, depth=depth, nbytes=nbytes, data=False, since=since, handles=handles)

    def close(self) -> None:
        self.board.close(unlink=True)
        for m in self.slots:
            m.close()
        for e in self.events:
            e.close()


class _Engine:
    """What an IsolatedGLBuffer asks of its engine, with frames that publish on a :class:`_Producer`'s board."""

    def __init__(self, block):
        self._model = Engine(driver=NullDriver())
        self._model.add(block)
        self._session = uuid.uuid4().hex[:12]
        self.closed, self._loop, self.deadline = False, None, 1.0
        self._faulted: set[int] = set()
        self._down: dict = {}
        self._held, self._dirty, self._index = False, False, 0
        self._placement = {block.id: "gpu"}
        self.producer: _Producer | None = None

    def placement(self, block) -> str:
        return "gpu"

    def tick(self) -> Frame:
        self._index += 1
        assert self.producer is not None
        self.producer.board.publish(self._index)
        return Frame(self._index, 0.0, (), "ok", True)


def test_on_a_gpu_each_frame_is_one_copy_from_the_exported_slot_mapped_once_per_board():
    """The GPU path's bookkeeping, on the null driver: each slot of the GPU process's board is mapped here once
    (cuIpcOpenMemHandle, its event opened), every frame is one wait on the slot's event and one device-to-device
    copy into the mapped GL buffer, and a replaced process's board is mapped anew with the old slots closed."""
    mul = rxcuda.Block.from_kernel("scalar_mul", size=64, name="mul")
    engine = _Engine(mul)
    side = _isogl.GLSide(0, cpu=False, null=True)
    side.slots_on_device = True  # as on a GPU
    side.api.gl_objects[5] = 256
    shared = _isogl.IsolatedGLBuffer(engine, side, mul["out"], 5)
    assert shared.transport == "ipc" and shared.nbytes == 256
    path = _board.board_path(engine._session, mul.id, "out")
    engine.producer = _Producer(path, depth=3, nbytes=256, since=1)
    api = side.api
    api.record = True
    for _ in range(5):
        shared.tick()
    calls = [c[0] for c in api.calls]
    assert calls.count("cuIpcOpenMemHandle") == 3 and calls.count("cuIpcOpenEventHandle") == 3
    assert calls.count("cuStreamWaitEvent") == 5 and calls.count("cuMemcpyDtoDAsync") == 5
    assert calls.count("cuGraphicsMapResources") == 5 and calls.count("cuGraphicsUnmapResources") == 5
    copy = next(c for c in api.calls if c[0] == "cuMemcpyDtoDAsync")
    assert copy[1][2] == 256
    # the GPU process is replaced: its successor's board retires the old one, and serves from the next frame on
    old = engine.producer
    engine.producer = _Producer(path, depth=3, nbytes=256, since=engine._index + 1)
    api.calls.clear()
    for _ in range(4):
        shared.tick()
    calls = [c[0] for c in api.calls]
    assert calls.count("cuIpcCloseMemHandle") == 3 and calls.count("cuIpcOpenMemHandle") == 3
    assert calls.count("cuMemcpyDtoDAsync") == 4 and shared.copied == 9 and shared.missed == 0
    old.board.close()
    for m in old.slots:
        m.close()
    for e in old.events:
        e.close()
    engine._faulted.add(engine._index + 1)  # a frame a fault ended: not copied, nothing waited for
    engine.producer.board.skip(engine._index + 1)
    api.calls.clear()
    shared.tick()
    assert shared.missed == 1 and not [c for c in api.calls if c[0] == "cuMemcpyDtoDAsync"]
    shared.close()
    side.close()
    engine.producer.close()
    assert api.leaks() == {}
    engine._model.close()
