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

moderngl = pytest.importorskip("moderngl", reason="the gl extra's moderngl is not installed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SIZE = 64


@pytest.fixture
def ctx():
    try:
        ctx = moderngl.create_context(standalone=True, backend="egl")
    except Exception as e:  # no EGL vendor library: nothing to draw with
        pytest.skip(f"no OpenGL context through EGL: {e}")
    yield ctx
    ctx.release()


def points(ctx, vbo):
    program = ctx.program(
        vertex_shader="#version 330\nin vec2 p; void main() { gl_Position = vec4(p, 0.0, 1.0); gl_PointSize = 1.0; }",
        fragment_shader="#version 330\nout vec4 c; void main() { c = vec4(1.0); }")
    return ctx.vertex_array(program, [(vbo, "2f", "p")])


def draw(ctx, vao) -> set:
    fbo = ctx.simple_framebuffer((SIZE, SIZE))
    fbo.use()
    fbo.clear(0.0, 0.0, 0.0, 1.0)
    vao.render(moderngl.POINTS)
    img = np.frombuffer(fbo.read(components=1), np.uint8).reshape(SIZE, SIZE)
    return set(zip(*(a.tolist() for a in np.nonzero(img)), strict=True))


def pixel_centres(rng, m: int):
    """m distinct pixels (row, col) and clip-space points at their centres (GL's rows count from the bottom)."""
    flat = rng.choice(SIZE * SIZE, size=m, replace=False)
    rows, cols = flat // SIZE, flat % SIZE
    xy = np.stack([(cols + 0.5) / SIZE * 2 - 1, (rows + 0.5) / SIZE * 2 - 1], axis=1).astype(np.float32)
    return set(zip(rows.tolist(), cols.tolist(), strict=True)), xy


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
