"""Video frames into a GPU filter: a file decoded by PyAV, played at its own rate, edges found on the GPU.

    python -m rxcuda.examples.video_filter [frames] [--serve]

The example first writes a small video with PyAV (a bright disc moving over a gradient, with noise; lossless
FFV1), then plays it through `rxcuda.streams.media.video_file` -- an Rx Observable of frames, each with its
presentation time -- into a Sobel edge filter on the GPU (one 2-D kernel block; its `gain` swept while it
runs). Each output is checked against the same filter in NumPy. With `--serve` the live view shows the
filter's output as an image preview while the video plays (open the printed address); the notebook
(notebook.ipynb, beside this example) shows it with `rxcuda.view.widgets(engine, previews=[edges["out"]])`.
"""

import pathlib
import queue
import sys
import tempfile

import numpy as np

import rxcuda as rx
from rxcuda.streams import media

ok, why = rx.probe()
if not ok:  # the same pipeline on the CPU device (docs/cpu.md): Engine() picks it where there is no GPU
    print(f"no CUDA device ({why}): running on the CPU device")
try:
    import av
except ImportError:
    sys.exit("rxcuda.examples.video_filter decodes video with PyAV: pip install '.[media]' in rxcuda's checkout")

args = [a for a in sys.argv[1:] if not a.startswith("--")]
FRAMES = int(args[0]) if args else 90
SERVE = "--serve" in sys.argv
H, W, FPS = 120, 160, 30

SRC = r"""
// Sobel edge magnitude of a gray image, times gain; the border rows and columns repeat their neighbours
#define X(row, col) x[(row) * w + (col)]
extern "C" __global__ void edges(const float* x, float* out, float gain, unsigned w, unsigned h) {
    unsigned c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y * blockDim.y + threadIdx.y;
    if (c >= w || r >= h) return;
    unsigned l = c > 0 ? c - 1 : 0, rt = c + 1 < w ? c + 1 : w - 1;  // left and right columns
    unsigned u = r > 0 ? r - 1 : 0, d = r + 1 < h ? r + 1 : h - 1;   // rows above and below
    float gx = (X(u, rt) + 2.0f * X(r, rt) + X(d, rt)) - (X(u, l) + 2.0f * X(r, l) + X(d, l));
    float gy = (X(d, l) + 2.0f * X(d, c) + X(d, rt)) - (X(u, l) + 2.0f * X(u, c) + X(u, rt));
    out[r * w + c] = gain * sqrtf(gx * gx + gy * gy);
}
"""


def numpy_edges(x: np.ndarray, gain: float) -> np.ndarray:
    p = np.pad(x.astype(np.float64), 1, mode="edge")
    gx = (p[:-2, 2:] + 2 * p[1:-1, 2:] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[1:-1, :-2] + p[2:, :-2])
    gy = (p[2:, :-2] + 2 * p[2:, 1:-1] + p[2:, 2:]) - (p[:-2, :-2] + 2 * p[:-2, 1:-1] + p[:-2, 2:])
    return gain * np.sqrt(gx * gx + gy * gy)


def write_video(path, frames: int) -> None:
    """A disc moving over a gradient, with noise: gray, lossless, so decoded frames are what was drawn."""
    rng = np.random.default_rng()
    yy, xx = np.mgrid[0:H, 0:W]
    with av.open(str(path), "w") as out:
        stream = out.add_stream("ffv1", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = W, H, "gray"
        for f in range(frames):
            cx, cy = W * (0.2 + 0.6 * f / max(frames - 1, 1)), H / 2 + 25 * np.sin(f / 8)
            img = 60 + 80 * xx / W + 100 * ((xx - cx) ** 2 + (yy - cy) ** 2 < 18 ** 2) + rng.normal(0, 4, (H, W))
            frame = av.VideoFrame.from_ndarray(np.clip(img, 0, 255).astype(np.uint8), format="gray")
            out.mux(stream.encode(frame))
        out.mux(stream.encode())


with tempfile.TemporaryDirectory(prefix="rxcuda-video-") as folder:
    path = pathlib.Path(folder) / "disc.mkv"
    write_video(path, FRAMES)
    print(f"wrote {path}: {FRAMES} frames of {W}x{H} at {FPS} fps")
    code = rx.compile_cuda(SRC, entry="edges")
    edges = rx.Block.from_kernel(code, shape=(H, W), block_size=(16, 16), name="edges", gain=1.0, w=W, h=H,
                                 ranges={"gain": (0.0, 4.0, 0.05)})
    with rx.Engine() as engine:
        engine.add(edges)
        view = engine.serve() if SERVE else None
        if view is not None:
            print(f"live view at {view.url} (the 'edges.out' preview shows the filter's output)")
        items = queue.Queue()  # the frames as they play, in order ("block": none is dropped)
        sub = media.video_file(path, gray=True, when_behind="block").subscribe(
            items.put, items.put, lambda: items.put(None))
        n, last_t = 0, -1.0
        while (item := items.get(timeout=30)) is not None:
            if isinstance(item, Exception):
                raise item
            gain = 1.0 + 0.5 * np.sin(item.index / 10)
            edges.set(gain=gain)                          # a hot update
            engine.write(edges["x"], item.data)
            frame = engine.tick()
            got = engine.read(edges["out"])
            np.testing.assert_allclose(got, numpy_edges(item.data, np.float32(gain)), rtol=1e-5, atol=1e-5)
            assert item.t > last_t, "presentation times increase"
            last_t, n = item.t, n + 1
            if item.index % 30 == 0:
                print(f"frame {item.index:3d} at t={item.t:5.2f} s: edges up to {got.max():6.3f} "
                      f"(gain {gain:.2f}), {frame.host_us:6.1f} us host, tiers {frame.tiers or '-'}")
        sub.dispose()
        if view is not None:
            view.dispose()
        assert n == FRAMES, f"{n} of {FRAMES} frames came through"
        assert engine.rebuilds == 1, "gain sweeps and new frames are no rebuilds"
print(f"OK: {FRAMES} video frames filtered on the GPU at the file's own rate, each matching NumPy")
