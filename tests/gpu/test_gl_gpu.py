"""OpenGL draws what the frame wrote, with no copy: a port bound to a moderngl vertex buffer, drawn as points into
a framebuffer read back and checked pixel by pixel; a 2-D port copied into a texture on the GPU; the particles
example. Headless through EGL (the GPU machine brings the GL loaders and moderngl, see docs/opengl.md)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import gpu_subprocess_env

import rxcuda

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit"))
from _gldraw import draw, egl_context, pixel_centres, points  # noqa: E402

moderngl = pytest.importorskip("moderngl", reason="the gl extra's moderngl is not installed")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def ctx():
    ctx = egl_context(moderngl)
    yield ctx
    ctx.release()


def test_a_gl_buffer_is_drawn_from_the_ports_memory_every_frame(engine, ctx, rng, kernels):
    m = 300
    mul = engine.add(rxcuda.Block.from_kernel(f"{kernels}/scalar_mul.ptx", size=2 * m, scale=2.0))
    vbo = ctx.buffer(reserve=2 * m * 4)
    vao = points(ctx, vbo)
    shared = engine.gl_buffer(mul["out"], vbo.glo)
    for frame_no in range(3):
        want, xy = pixel_centres(rng, m)
        engine.write(mul["x"], (xy / np.float32(2)).reshape(-1))  # halving and doubling are exact
        frame = shared.tick()
        assert frame.state == "ok" and (frame_no == 0 or frame.tiers == ())  # bound once, then nothing to do
        np.testing.assert_array_equal(np.frombuffer(vbo.read(), np.float32).reshape(m, 2), xy)
        assert draw(ctx, vao) == want
    assert engine.rebuilds == 1
    shared.close()


def test_a_gl_texture_gets_the_2d_port_after_each_frame(engine, ctx, rng, kernels):
    h, w = 24, 40
    mul = engine.add(rxcuda.Block.from_kernel(f"{kernels}/scalar_mul.ptx", size=h * w, scale=1.5))
    engine.resize(mul["x"], (h, w))
    x = rng.normal(size=(h, w)).astype(np.float32)
    engine.write(mul["x"], x)
    engine.tick()
    tex = ctx.texture((w, h), 1, dtype="f4")
    shared = engine.gl_texture(mul["out"], tex.glo)
    for scale in (1.5, -0.25):
        mul.set(scale=scale)
        x = rng.normal(size=(h, w)).astype(np.float32)
        engine.write(mul["x"], x)
        shared.tick()
        got = np.frombuffer(tex.read(), np.float32).reshape(h, w)
        np.testing.assert_array_equal(got, x * np.float32(scale))
    wrong = ctx.texture((w, h + 1), 1, dtype="f4")
    with pytest.raises(ValueError, match=r"GL texture .* is 40x25 .* but .*out is 24 rows of 40"):
        engine.gl_texture(mul["out"], wrong.glo).tick()
    shared.close()


def test_the_particles_gl_example_draws_every_particle_on_its_pixel(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "particles_gl.py"), "150", "--fast"],
                          capture_output=True, text=True, cwd=tmp_path, env=gpu_subprocess_env(), timeout=300)
    if "no OpenGL context through EGL" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 150 frames drawn by OpenGL" in proc.stdout and "each on its pixel" in proc.stdout
