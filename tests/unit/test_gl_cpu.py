"""OpenGL interop on the CPU device, drawn for real: headless through EGL (Mesa's llvmpipe where there is no GPU), a
port shared with a moderngl vertex buffer (``engine.gl_buffer``) is what GL draws after each frame, checked against
NumPy vertex by vertex and pixel by pixel; the GL calls' errors and a missing context are reported naming the fix;
``examples/particles_gl.py`` runs on the CPU device with its framebuffer checks."""

from __future__ import annotations

import ctypes
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
from _gldraw import draw, egl_context, pixel_centres, points

import rxcuda
from rxcuda.cuda import _gl
from rxcuda.cuda._cpu import CpuDriver
from rxcuda.cuda._cpugl import GL, GL_COPY_WRITE_BUFFER

moderngl = pytest.importorskip("moderngl", reason="the gl extra's moderngl is not installed: pip install '.[gl]'")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def ctx():
    ctx = egl_context(moderngl)
    yield ctx
    ctx.release()


@pytest.fixture
def engine():
    with rxcuda.Engine(device="cpu") as e:
        yield e


def test_gl_draws_what_each_frame_of_the_cpu_device_wrote(engine, ctx):
    rng = np.random.default_rng()
    m = 300
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=2 * m, scale=2.0))
    vbo = ctx.buffer(reserve=2 * m * 4)
    vao = points(ctx, vbo)
    shared = engine.gl_buffer(mul["out"], vbo.glo)
    for frame_no in range(4):
        want, xy = pixel_centres(rng, m)
        engine.write(mul["x"], (xy / np.float32(2)).reshape(-1))  # halving and doubling are exact
        frame = shared.tick()
        assert frame.state == "ok" and (frame_no == 0 or frame.tiers == ())  # bound once, then nothing to do
        np.testing.assert_array_equal(np.frombuffer(vbo.read(), np.float32).reshape(m, 2), xy)
        assert draw(ctx, vao) == want
    mul.set(scale=-2.0)  # a parameter change: the frame's new vertices reach GL too
    shared.tick()
    np.testing.assert_array_equal(np.frombuffer(vbo.read(), np.float32).reshape(m, 2), -xy)
    assert engine.rebuilds == 1
    shared.close()
    assert engine.tick().tiers == ("structure",)  # the port has its own buffer again
    assert engine.device.api.leaks().get("graphics", 0) == 0


def test_a_buffer_made_anew_at_another_size_is_mapped_at_its_new_size(engine, ctx):
    n = 64
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=3.0))
    x = np.arange(n, dtype=np.float32)
    engine.write(mul["x"], x)
    vbo = ctx.buffer(reserve=n * 4)
    shared = engine.gl_buffer(mul["out"], vbo.glo)
    shared.tick()
    first = shared.pointer
    vbo.orphan(2 * n * 4)  # glBufferData at twice the size: GL's buffer is made anew
    frame = shared.tick()
    assert shared.pointer != first and engine.rebuilds == 1  # a new host copy; the port rebound to it, no rebuild
    assert frame.state == "ok" and frame.launched
    np.testing.assert_array_equal(np.frombuffer(vbo.read(), np.float32)[:n], x * np.float32(3.0))
    vbo.orphan(n * 2)  # now too small for the port: refused, naming both sizes
    with pytest.raises(ValueError, match=rf"GL buffer {vbo.glo} holds {n * 2} bytes, but .*out .* needs {n * 4}"):
        shared.tick()
    shared.close()


def test_a_buffer_registered_read_write_keeps_what_gl_put_in_it(ctx):
    """Without WRITE_DISCARD (what rxcuda's own GLBuffer asks), mapping reads GL's contents into the host copy."""
    api = CpuDriver()
    vbo = ctx.buffer(np.arange(16, dtype=np.float32).tobytes())
    res = _gl.register_buffer(api, vbo.glo, write_discard=False)
    _gl.map_resources(api, res, 0)
    ptr, size = _gl.mapped_pointer(api, res)
    host = np.frombuffer((ctypes.c_float * 16).from_address(ptr), np.float32)
    assert size == 64 and host.tolist() == list(range(16))
    host[:4] = -1.0  # the device's write
    _gl.unmap_resources(api, res, 0)
    assert np.frombuffer(vbo.read(), np.float32).tolist() == [-1.0] * 4 + list(range(4, 16))
    _gl.unregister(api, res)
    assert api.leaks() == {}


def test_gl_errors_are_reported_naming_the_buffer(engine, ctx):
    api = engine.device.api
    with pytest.raises(rxcuda.CudaError, match=r"cuGraphicsGLRegisterBuffer.*INVALID_VALUE.*4040 names no buffer"):
        _gl.register_buffer(api, 4040)
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=16))
    engine.write(mul["x"], np.ones(16, np.float32))
    vbo = ctx.buffer(reserve=64)
    shared = engine.gl_buffer(mul["out"], vbo.glo)
    shared.tick()
    glo = vbo.glo
    vbo.release()  # glDeleteBuffers: the name no longer names a buffer
    with pytest.raises(rxcuda.CudaError, match=rf"cuGraphicsMapResources.*OpenGL reported GL_INVALID_OPERATION for "
                                               rf"buffer {glo}"):
        shared.tick()


def test_the_gl_state_it_touches_is_restored(engine, ctx):
    """The buffer is bound to GL_COPY_WRITE_BUFFER for the calls; what was bound there before is bound again."""
    gl = GL.load()
    api = gl.current("test")
    other = ctx.buffer(reserve=16)
    gl.fn(api, "glBindBuffer")(GL_COPY_WRITE_BUFFER, other.glo)
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=16))
    engine.write(mul["x"], np.ones(16, np.float32))
    vbo = ctx.buffer(reserve=64)
    shared = engine.gl_buffer(mul["out"], vbo.glo)
    shared.tick()
    bound = ctypes.c_int(0)
    gl.fn(api, "glGetIntegerv")(GL_COPY_WRITE_BUFFER, ctypes.byref(bound))
    assert bound.value == other.glo
    shared.close()


def test_without_a_current_gl_context_it_says_how_to_make_one_current(engine, ctx):
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=16))
    engine.write(mul["x"], np.ones(16, np.float32))
    vbo = ctx.buffer(reserve=64)
    caught: list[BaseException] = []

    def elsewhere():  # a thread with no GL context current
        try:
            engine.gl_buffer(mul["out"], vbo.glo)
        except BaseException as e:  # noqa: BLE001 (handed to the test's thread)
            caught.append(e)

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert len(caught) == 1 and isinstance(caught[0], rxcuda.CudaError)
    assert "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT" in str(caught[0])
    assert "no OpenGL context is current on this thread" in str(caught[0]) and "with ctx:" in str(caught[0])


def test_gl_textures_are_refused_on_the_cpu_device_naming_gl_buffer(engine, ctx):
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=16 * 16))
    engine.resize(mul["x"], (16, 16))
    engine.tick()
    tex = ctx.texture((16, 16), 1, dtype="f4")
    with pytest.raises(rxcuda.CudaError, match=r"NOT_SUPPORTED.*GL textures \(engine.gl_texture\).*engine.gl_buffer"):
        engine.gl_texture(mul["out"], tex.glo)


def test_the_particles_gl_example_runs_on_the_cpu_device_and_its_pixels_check(ctx, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RXCUDA_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "particles_gl.py"), "90", "--fast"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    checked = [line for line in lines if "particles drawn, each on its pixel" in line]
    assert len(checked) == 2 and all(int(line.split(":")[1].split()[0]) > 0 for line in checked)  # frames 60, 90
    assert lines[-1] == ("OK: 90 frames drawn by OpenGL from the vertex buffer CPU (rxcuda) wrote, "
                         "2 framebuffers checked")
