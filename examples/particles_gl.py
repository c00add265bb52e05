"""Particles drawn by OpenGL with no copy: the frame's render block writes straight into a GL vertex buffer.

    python -m rxcuda.examples.particles_gl [frames] [--fast]

A fountain of particles on the GPU: each frame a `step` kernel moves every particle (gravity, wind, drag)
from last frame's state (a delayed connection), and respawns the ones that fell through the floor; a `render`
kernel projects them to clip-space vertices. The render block's output port *is* a moderngl vertex buffer
(`engine.gl_buffer(render["verts"], vbo.glo)`): mapped for CUDA before each frame and unmapped after it on
the engine's stream, so GL draws exactly what the frame wrote and nothing passes through the host. The
render loop is the frame clock (60 fps; `--fast`: as fast as it goes). It runs headless through EGL (the GPU
machine has no display), reads the framebuffer back now and then and checks that the lit pixels are the
particles' positions. The gravity and wind parameters are swept while it runs (hot updates, no rebuild).

Where there is no GPU it runs on the CPU device (docs/cpu.md), drawn by whatever EGL gives (Mesa's llvmpipe): the
same kernels and checks, the vertices uploaded into the GL buffer after each frame (one host upload a frame, not
zero-copy), and 180 frames unless told (3 s at 60 fps).
"""

import sys
import time

import numpy as np

import rxcuda as rx

ok, why = rx.probe()
if not ok:  # the same pipeline on the CPU device (docs/cpu.md): Engine() picks it where there is no GPU
    print(f"no CUDA device ({why}): running on the CPU device (one host upload of the vertices a frame)")
try:
    import moderngl
except ImportError:
    sys.exit("rxcuda.examples.particles_gl draws with moderngl: pip install '.[gl]' in rxcuda's checkout")

args = [a for a in sys.argv[1:] if not a.startswith("--")]
FRAMES = int(args[0]) if args else 600 if ok else 180
FAST = "--fast" in sys.argv
N = 1 << 14     # particles
SIZE = 256      # the framebuffer, SIZE x SIZE pixels
DT = 1.0 / 60

SRC = r"""
__device__ __forceinline__ float hash01(unsigned x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return (x >> 8) * (1.0f / 16777216.0f);
}
// last frame's particles -> this frame's; one below the floor starts again at the fountain's mouth
extern "C" __global__ void step(const float4* pos_prev, const float4* vel_prev, float4* pos, float4* vel,
                                float gravity, float wind, float drag, float dt, unsigned frame, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float4 p = pos_prev[i], v = vel_prev[i];
    if (p.w == 0.0f || p.y < -1.0f) {  // dead or never born: spawn, staggered over the first frames
        if (p.w == 0.0f && i % 120 > frame) { pos[i] = p; vel[i] = v; return; }
        float a = hash01(i * 3 + frame * 7919u), b = hash01(i * 5 + frame * 104729u);
        p = make_float4(0.02f * (a - 0.5f), -0.9f, 0.0f, 1.0f);
        v = make_float4(0.6f * (a - 0.5f), 1.6f + 0.6f * b, 0.0f, 0.0f);
    }
    v.x += (wind - drag * v.x) * dt;
    v.y += (-gravity - drag * v.y) * dt;
    p.x += v.x * dt; p.y += v.y * dt;
    pos[i] = p; vel[i] = v;
}
// particles -> clip-space vertices (x, y); the unborn ones far outside the picture
extern "C" __global__ void render(const float4* pos, float* verts, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float4 p = pos[i];
    verts[2 * i] = p.w != 0.0f ? p.x : 4.0f;
    verts[2 * i + 1] = p.w != 0.0f ? p.y : 4.0f;
}
"""
code = {e: rx.compile_cuda(SRC, entry=e) for e in ("step", "render")}


def kernel_block(name, ports, scalars=None, threads=N):
    bb = rx.BlockBuilder(name, size=N)
    k = bb.add_kernel(code[name], threads=threads, block=min(threads, 256))
    for port, (direction, count) in ports.items():
        (bb.input if direction == "in" else bb.output)(port, k[port], count=count)
    for s, value in (scalars or {}).items():
        bb.scalar(s, k[s], default=value)
    return bb.build()


def build(engine):
    step = kernel_block("step", {"pos_prev": ("in", N), "vel_prev": ("in", N), "pos": ("out", N),
                                 "vel": ("out", N)},
                        {"gravity": 2.0, "wind": 0.0, "drag": 0.2, "dt": DT, "frame": 0, "n": N})
    render = kernel_block("render", {"pos": ("in", N), "verts": ("out", 2 * N)}, {"n": N})
    for b in (step, render):
        engine.add(b)
    for state in ("pos", "vel"):
        engine.connect(step[state], step[f"{state}_prev"], delay=1)  # next frame starts from this one
    engine.connect(step["pos"], render["pos"])
    return step, render


def lit_pixels(fbo) -> set:
    img = np.frombuffer(fbo.read(components=1), np.uint8).reshape(SIZE, SIZE)
    return set(zip(*np.nonzero(img), strict=True))


def check_pixels(verts: np.ndarray, lit: set, snap: float = 1 / 16) -> int:
    """Each particle inside the picture lights the pixel under it (GL's origin is bottom-left: row = y), and
    every lit pixel lies under a particle. Returns how many particles were visible. ``snap``: the sub-pixel grid
    GL rounds a vertex to (2**-GL_SUBPIXEL_BITS; at least 4 bits by the spec): a particle closer than that to a
    pixel edge may land on either side of it, so only those farther away are checked."""
    xy = verts.reshape(-1, 2).astype(np.float64)
    w = (xy + 1.0) / 2.0 * SIZE  # window coordinates
    on = ((w >= 0) & (w <= SIZE)).all(axis=1)  # GL draws a point whose centre is inside the picture
    frac = np.abs(w - np.round(w))
    clear = on & (frac > snap).all(axis=1)  # away from a pixel edge, where snapping and GL's tie rule decide
    want = {(int(r), int(c)) for c, r in np.floor(w[clear]).astype(int)}
    assert want <= lit, f"{len(want - lit)} particles drew no pixel"
    near = {(r + dr, c + dc) for c, r in np.floor(w[on]).astype(int) for dr in (-1, 0, 1) for dc in (-1, 0, 1)}
    assert lit <= near, f"{len(lit - near)} lit pixels lie under no particle"
    return int(on.sum())


try:
    ctx = moderngl.create_context(standalone=True, backend="egl")  # headless; a window's context works the same
    snap = 2.0 ** -int(ctx.info.get("GL_SUBPIXEL_BITS", 4))  # the grid GL rounds vertex positions to
except Exception as e:
    sys.exit(f"rxcuda.examples.particles_gl: no OpenGL context through EGL ({e}); see docs/opengl.md")
program = ctx.program(
    vertex_shader="#version 330\nin vec2 p; void main() { gl_Position = vec4(p, 0.0, 1.0); gl_PointSize = 1.0; }",
    fragment_shader="#version 330\nout vec4 colour; void main() { colour = vec4(1.0); }")
vbo = ctx.buffer(reserve=2 * N * 4)
vao = ctx.vertex_array(program, [(vbo, "2f", "p")])
fbo = ctx.simple_framebuffer((SIZE, SIZE))
fbo.use()

with rx.Engine() as engine:
    step, render = build(engine)
    shared = engine.gl_buffer(render["verts"], vbo.glo)  # the port's memory is the vertex buffer
    device = engine.device.name
    period, start, checked = 1.0 / 60, time.perf_counter(), 0
    for f in range(FRAMES):
        step.set(frame=f, gravity=2.0 + np.sin(f / 90.0), wind=0.3 * np.sin(f / 50.0))  # hot updates
        frame = shared.tick()                 # map, launch the frame, unmap: on the engine's stream
        fbo.clear(0.0, 0.0, 0.0, 1.0)
        vao.render(moderngl.POINTS)           # draws what the frame just wrote; GL waits for it on the GPU
        if f % 60 == 59 or f == FRAMES - 1:
            verts = np.frombuffer(vbo.read(), np.float32)   # what GL drew from (read back only to check it)
            visible = check_pixels(verts, lit_pixels(fbo), snap)
            checked += 1
            print(f"frame {f + 1:4d}: {visible:5d} particles drawn, each on its pixel; "
                  f"{frame.host_us:6.1f} us host, tiers {frame.tiers or '-'}")
        if not FAST:  # the render loop is the frame clock
            time.sleep(max(0.0, start + (f + 1) * period - time.perf_counter()))
    assert engine.rebuilds == 1, "parameter sweeps should be hot updates"
    shared.close()
print(f"OK: {FRAMES} frames drawn by OpenGL from the vertex buffer {device} wrote, {checked} framebuffers checked")
