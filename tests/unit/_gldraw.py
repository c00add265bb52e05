"""What the GL tests draw with (tests/unit/test_gl_cpu.py, tests/gpu/test_gl_gpu.py): a headless EGL context, points
drawn from a vertex buffer into a SIZE x SIZE framebuffer and read back as the set of lit pixels, and random pixels
with the clip-space points at their centres."""

from __future__ import annotations

import numpy as np
import pytest

SIZE = 64


def egl_context(moderngl):
    """A standalone context through EGL; the calling test skips, saying why, where none can be made."""
    try:
        return moderngl.create_context(standalone=True, backend="egl")
    except Exception as e:  # no libEGL, or no EGL vendor library (Debian: libegl1 and libegl-mesa0)
        pytest.skip(f"no OpenGL context through EGL: {e}")


def points(ctx, vbo):
    program = ctx.program(
        vertex_shader="#version 330\nin vec2 p; void main() { gl_Position = vec4(p, 0.0, 1.0); gl_PointSize = 1.0; }",
        fragment_shader="#version 330\nout vec4 c; void main() { c = vec4(1.0); }")
    return ctx.vertex_array(program, [(vbo, "2f", "p")])


def draw(ctx, vao) -> set:
    import moderngl

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
