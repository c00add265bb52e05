"""What a GL buffer costs a frame on the CPU device (docs/opengl.md, docs/cpu.md): the host upload after the frame.

    python bench/gl_cpu.py [--particles 16384] [--frames 300] [--no-draw]

On the CPU device ``engine.gl_buffer(port, glo)`` gives the port a host copy of the GL buffer and uploads it into
the buffer when the frame is done (``glBufferSubData`` in ``cuGraphicsUnmapResources``). This runs the shape of
``examples/particles_gl.py`` (a kernel writes one (x, y) float32 vertex a particle; GL draws them as points into a
256x256 framebuffer each frame) and prints, per frame, the median and 90th percentile of: mapping (before the
frame), the frame itself (``engine.tick``), unmapping (the upload), and moderngl's own ``vbo.write`` of the same
bytes for comparison. ``--no-draw``: GL draws nothing between frames, so the numbers are the calls' own; with
llvmpipe on a small machine, its drawing of the previous frame runs on the same cores while the next frame's calls
are made, and slows them. Needs moderngl and an EGL context (Mesa's llvmpipe where there is no GPU); runs on the
CPU device whatever the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import moderngl  # noqa: E402

import rxcuda  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--particles", type=int, default=1 << 14)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--no-draw", action="store_true", help="draw nothing between frames")
    args = ap.parse_args()
    n, size = args.particles, 256
    ctx = moderngl.create_context(standalone=True, backend="egl")
    program = ctx.program(
        vertex_shader="#version 330\nin vec2 p; void main() { gl_Position = vec4(p, 0.0, 1.0); gl_PointSize = 1.0; }",
        fragment_shader="#version 330\nout vec4 c; void main() { c = vec4(1.0); }")
    vbo = ctx.buffer(reserve=2 * n * 4)
    vao = ctx.vertex_array(program, [(vbo, "2f", "p")])
    fbo = ctx.simple_framebuffer((size, size))
    fbo.use()
    rng = np.random.default_rng()
    x = rng.uniform(-1, 1, 2 * n).astype(np.float32)
    times: dict[str, list[float]] = {"map (before the frame)": [], "the frame (engine.tick)": [],
                                     "unmap: the upload": [], "moderngl vbo.write, same bytes": []}
    with rxcuda.Engine(device="cpu") as engine:
        mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=2 * n, scale=0.5))
        engine.write(mul["x"], x)
        shared = engine.gl_buffer(mul["out"], vbo.glo)
        shared.tick()  # the first frame binds the port to the buffer's host copy (a rebuild)
        for f in range(args.frames):
            mul.set(scale=0.5 + 0.25 * np.sin(f / 30))
            t0 = time.perf_counter()
            shared.before_frame()
            t1 = time.perf_counter()
            engine.tick()
            t2 = time.perf_counter()
            shared.after_frame()
            t3 = time.perf_counter()
            if not args.no_draw:
                fbo.clear(0.0, 0.0, 0.0, 1.0)
                vao.render(moderngl.POINTS)  # GL draws from the buffer, as the example does
            for key, t in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=False):
                times[key].append(t)
        want = x * np.float32(0.5 + 0.25 * np.sin((args.frames - 1) / 30))
        assert np.array_equal(np.frombuffer(vbo.read(), np.float32), want), "GL's buffer is not what the frame wrote"
        shared.close()
    data = x.tobytes()
    for _ in range(args.frames):
        if not args.no_draw:
            fbo.clear(0.0, 0.0, 0.0, 1.0)
            vao.render(moderngl.POINTS)
        t0 = time.perf_counter()
        vbo.write(data)
        times["moderngl vbo.write, same bytes"].append(time.perf_counter() - t0)
    print(f"{n} particles ({2 * n * 4} bytes of vertices), {args.frames} frames, {ctx.info['GL_RENDERER']}, "
          f"{'nothing drawn' if args.no_draw else 'the points drawn'} between frames:")
    for key, ts in times.items():
        ts = sorted(ts)
        print(f"  {key:32s} median {statistics.median(ts) * 1e6:8.1f} us   p90 {ts[int(0.9 * len(ts))] * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
