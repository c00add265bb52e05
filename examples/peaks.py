"""Peak detection that refines only when there is something to refine: window -> FFT -> magnitude -> If.

    python -m rxcuda.examples.peaks [frames] [--wav [FILE]]

Each frame is 4096 samples of noise, and in some frames a tone. The pipeline windows the frame (Hann),
takes a real FFT (cuFFT, captured into the graph), computes the magnitude spectrum and its energy, and an
`If` region runs the refining block (argmax and parabolic interpolation of the peak) only when the energy
passes a threshold. The GPU decides; the host launches one graph per frame. Peaks arrive as an Observable
(zeros in frames without a tone: the region zeroes its outputs when its body does not run), and each is
checked against the same steps in NumPy.

With `--wav FILE` the frames are a sound file's blocks instead, played at the file's own rate
(`rxcuda.streams.media.audio_file`, an Rx Observable; each block carries its time in the file); with `--wav`
alone the example first writes a test WAV (noise, a tone in every third block) and plays that.
"""

import pathlib
import queue
import sys
import tempfile

import numpy as np

import rxcuda as rx
from rxcuda import libraries as lib

ok, why = rx.probe()
if not ok:
    print(f"no CUDA device ({why}): running on the CPU device")

ARGS = sys.argv[1:]
WAV = None
if "--wav" in ARGS:  # --wav [FILE]
    at = ARGS.index("--wav")
    WAV = ARGS[at + 1] if at + 1 < len(ARGS) and not ARGS[at + 1].isdigit() else ""
    del ARGS[at:at + 1 + (WAV != "")]
FRAMES = int(ARGS[0]) if ARGS else 40
N = 4096
BINS = N // 2 + 1
RATE = 48_000.0
THRESHOLD = 1.5e5  # spectrum energy: noise alone gives ~3e4, a tone of amplitude 0.5 adds ~4e5

SRC = r"""
extern "C" __global__ void hann(const float* x, float* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * (0.5f - 0.5f * cospif(2.0f * i / n));
}
extern "C" __global__ void magnitude(const void* spectrum, float* mag, unsigned bins) {
    const float2* spec = (const float2*)spectrum;  // complex64 values from the FFT
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < bins) mag[i] = sqrtf(spec[i].x * spec[i].x + spec[i].y * spec[i].y);
}
// one block: energy of the spectrum, and the gate's flag
extern "C" __global__ void gate(const float* mag, float* energy, unsigned* loud, float threshold, unsigned bins) {
    __shared__ float part[1024];
    float s = 0.0f;
    for (unsigned i = threadIdx.x; i < bins; i += blockDim.x) s += mag[i] * mag[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) { *energy = part[0]; *loud = part[0] > threshold; }
}
// one block: the largest bin (past DC), refined by a parabola through its neighbours' log magnitudes
extern "C" __global__ void refine(const float* mag, float* peak, float rate, unsigned bins) {
    __shared__ float best[1024];
    __shared__ unsigned where[1024];
    float b = -1.0f; unsigned w = 1;
    for (unsigned i = 1 + threadIdx.x; i + 1 < bins; i += blockDim.x)
        if (mag[i] > b) { b = mag[i]; w = i; }
    best[threadIdx.x] = b; where[threadIdx.x] = w;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float o = best[threadIdx.x + s]; unsigned ow = where[threadIdx.x + s];
            if (o > best[threadIdx.x] || (o == best[threadIdx.x] && ow < where[threadIdx.x])) {
                best[threadIdx.x] = o; where[threadIdx.x] = ow;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        unsigned k = where[0];
        float a = logf(mag[k - 1]), c = logf(mag[k]), d = logf(mag[k + 1]);
        float shift = 0.5f * (a - d) / (a - 2.0f * c + d);
        peak[0] = (k + shift) * rate / (2.0f * (bins - 1));
        peak[1] = mag[k];
    }
}
"""
code = {e: rx.compile_cuda(SRC, entry=e) for e in ("hann", "magnitude", "gate", "refine")}


def one_kernel(name, ports, scalars=None, threads=N, block=256):
    bb = rx.BlockBuilder(name, size=N)
    k = bb.add_kernel(code[name], threads=threads, block=block)
    for port, (direction, count) in ports.items():
        (bb.input if direction == "in" else bb.output)(port, k[port], count=count)
    for s, value in (scalars or {}).items():
        bb.scalar(s, k[s], default=value)
    return bb.build()


window = one_kernel("hann", {"x": ("in", N), "out": ("out", N)}, {"n": N})
fft = rx.Block.from_call(lib.rfft(N), name="fft")
magnitude = one_kernel("magnitude", {"spectrum": ("in", BINS), "mag": ("out", BINS)}, {"bins": BINS},
                       threads=BINS)
gate = one_kernel("gate", {"mag": ("in", BINS), "energy": ("out", 1), "loud": ("out", 1)},
                  {"threshold": THRESHOLD, "bins": BINS}, threads=1024, block=1024)
refine = one_kernel("refine", {"mag": ("in", BINS), "peak": ("out", 2)}, {"rate": RATE, "bins": BINS},
                    threads=1024, block=1024)


def numpy_peak(x: np.ndarray):
    """The same steps in NumPy: (frequency, magnitude), or None below the threshold."""
    i = np.arange(N)
    w = x.astype(np.float64) * (0.5 - 0.5 * np.cos(2 * np.pi * i / N))
    mag = np.abs(np.fft.rfft(w))
    if (mag ** 2).sum() <= THRESHOLD:
        return None
    k = 1 + int(np.argmax(mag[1:-1]))
    a, c, d = np.log(mag[k - 1:k + 2])
    return (k + 0.5 * (a - d) / (a - 2 * c + d)) * RATE / N, mag[k]


rng = np.random.default_rng()


def synthetic():
    """FRAMES blocks of noise, a tone in every third: (samples, tone frequency or None, time)."""
    t = np.arange(N) / RATE
    for f in range(FRAMES):
        x = rng.normal(0.0, 0.1, N)
        freq = rng.uniform(200.0, 20_000.0) if f % 3 == 0 else None
        if freq is not None:
            x = x + rng.uniform(0.5, 1.0) * np.sin(2 * np.pi * freq * t + rng.uniform(0, 2 * np.pi))
        yield x.astype(np.float32), freq, f * N / RATE


def from_wav(path):
    """The file's blocks as they play (an Observable of MediaFrame; read here one by one, in order)."""
    from rxcuda.streams import media

    items = queue.Queue()
    sub = media.audio_file(path, N, mono=True, when_behind="block").subscribe(
        items.put, lambda e: items.put(e), lambda: items.put(None))
    try:
        for _ in range(FRAMES):
            item = items.get(timeout=30)
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item.data, TONES.get(item.index), item.t
    finally:
        sub.dispose()


def write_test_wav(path) -> dict:
    """Noise with a tone in every third block, at RATE: what synthetic() plays, as a WAV file."""
    import soundfile

    blocks = list(synthetic())
    soundfile.write(path, np.concatenate([x for x, _, _ in blocks]), int(RATE), subtype="FLOAT")
    return {i: freq for i, (_, freq, _) in enumerate(blocks) if freq is not None}


TONES: dict = {}  # block -> tone frequency, where the example made the sound
KNOWN = WAV is None or WAV == ""  # which blocks hold a tone is known: the synthetic frames or the test WAV
folder = tempfile.TemporaryDirectory(prefix="rxcuda-peaks-")
if WAV == "":
    WAV = str(pathlib.Path(folder.name) / "tones.wav")
    TONES = write_test_wav(WAV)
    print(f"wrote {WAV}: {FRAMES} blocks of {N} samples at {RATE:.0f} Hz, a tone in every third")
source = from_wav(WAV) if WAV is not None else synthetic()

peaks = []
with rx.Engine() as engine:
    for blk in (window, fft, magnitude, gate):
        engine.add(blk)
    engine.add(rx.If(gate["loud"], [refine], name="when_loud"))
    engine.connect(window["out"], fft["x"])
    engine.connect(fft["y"], magnitude["spectrum"])
    engine.connect(magnitude["mag"], gate["mag"])
    engine.connect(magnitude["mag"], refine["mag"])
    sub = engine.observe(refine["peak"]).subscribe(lambda p: peaks.append(p.copy()))
    tones = detected = frames = 0
    for f, (x, freq, t_source) in enumerate(source):
        frames += 1
        tone = freq is not None
        x = x.astype(np.float32)
        engine.write(window["x"], x)
        engine.tick()
        got, want = engine.read(refine["peak"]), numpy_peak(x)
        if want is None:
            assert not got.any(), f"frame {f}: no tone, but the refine block ran ({got})"
            continue
        tones += tone
        detected += 1
        assert abs(got[0] - want[0]) < 0.05 * RATE / N, f"frame {f}: {got[0]:.2f} Hz, NumPy {want[0]:.2f} Hz"
        assert abs(got[1] - want[1]) <= 1e-3 * want[1]
        if tone:
            assert abs(got[0] - freq) < RATE / N, f"frame {f}: found {got[0]:.1f} Hz, the tone was {freq:.1f} Hz"
        if f < 12:
            print(f"frame {f:3d} (t={t_source:6.3f} s): peak at {got[0]:9.2f} Hz (NumPy {want[0]:9.2f}), "
                  f"magnitude {got[1]:8.2f}")
    sub.dispose()
    assert len(peaks) >= frames - 1, f"observe delivered {len(peaks)} of {frames} frames"
    if KNOWN:
        assert detected == tones == len(range(0, frames, 3)), "every tone, and only the tones, passed the gate"
    s = engine.stats  # memory reuse: intermediates whose lifetimes do not overlap share an allocation
    print(f"memory: buffers={s.buffers} allocations={s.allocations} allocated={s.bytes_allocated} "
          f"without_reuse={s.bytes_unshared} saved={s.bytes_saved}")
    print(f"OK: {frames} frames, {detected} refined on the GPU's decision, each matching NumPy"
          + (f" (from {WAV}, played at its own rate)" if WAV else ""))
