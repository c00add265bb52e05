"""A particle system on the GPU: emit (append) -> forces (forces.cu, hot-reloaded) -> integrate, fed back.

    python -m rxcuda.examples.particles [frames]

Every frame an emitter block appends new particles to an append port (its count travels to the next block
as a device value); a spawn block writes them into free slots of the particle state, which it reads from
the previous frame through delayed connections (positions and velocities are float4 ports: one port per
buffer); a `For` region runs forces -> integrate four times per frame (substeps). Gravity comes from one Rx
stream and wind from a noisy sensor smoothed with RxPY operators. Halfway through, forces.cu is rewritten on
disk and hot-reloaded (a Code-tier swap, no rebuild). Every frame's momentum, energy and particle count are
checked against the same steps in NumPy; at the end `engine.run_batch(k)` is checked, bit for bit, against
k ticks of a second engine.
"""

import pathlib
import sys
import tempfile
import threading

import numpy as np
from reactivex import operators as ops
from reactivex.subject import Subject

import rxcuda as rx

ok, why = rx.probe()
if not ok:  # the same pipeline on the CPU device (docs/cpu.md): Engine() picks it where there is no GPU
    print(f"no CUDA device ({why}): running on the CPU device")

FRAMES = int(sys.argv[1]) if len(sys.argv) > 1 else 600
CAP = 1 << 14          # particle slots
RATE = 256             # emitter threads: at most this many new particles per frame
P_EMIT = 0.25          # chance each emitter thread emits in a frame
SUBSTEPS = 4
DT = np.float32(1.0 / 60 / SUBSTEPS)
DRAG = np.float32(0.1)
SEED = 1234

# Kernels use explicitly rounded arithmetic (__fmul_rn, __fadd_rn: no fused multiply-add) so that NumPy's
# float32 reference below computes the same numbers.
COMMON = r"""
__device__ __forceinline__ unsigned mix(unsigned x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16; return x;
}
__device__ __forceinline__ float rnd(unsigned seed, unsigned frame, unsigned k) {
    return (float)(mix(seed * 0x9E3779B9U ^ mix(frame * 0x85EBCA6BU ^ mix(k))) >> 8) * (1.0f / 16777216.0f);
}
"""
EMIT = COMMON + r"""
// One block: thread i emits with probability p; a block-wide prefix sum gives each new particle its place,
// so the order of the appended items is the same every run (one atomicAdd publishes the count).
extern "C" __global__ void emit(/*inout*/ unsigned* clock, float4* born, unsigned* count, float p, unsigned seed,
                                unsigned capacity) {
    __shared__ unsigned offs[1024];
    unsigned i = threadIdx.x, frame = *clock;
    unsigned go = rnd(seed, frame, 3 * i) < p;
    offs[i] = go;
    __syncthreads();
    for (unsigned d = 1; d < blockDim.x; d <<= 1) {
        unsigned v = i >= d ? offs[i - d] : 0;
        __syncthreads();
        offs[i] += v;
        __syncthreads();
    }
    if (go && offs[i] - 1 < capacity) {
        float x = __fsub_rn(rnd(seed, frame, 3 * i + 1), 0.5f), z = __fsub_rn(rnd(seed, frame, 3 * i + 2), 0.5f);
        born[offs[i] - 1] = make_float4(x, __fadd_rn(2.0f, rnd(seed, frame, 7 * i + 5)), z, 1.0f);
    }
    if (i == 0) { atomicAdd(count, offs[blockDim.x - 1]); *clock = frame + 1; }
}
// Last frame's particles, with this frame's newborns written over the slots the ring cursor reaches.
extern "C" __global__ void spawn(const float4* pos_prev, const float4* vel_prev, const float4* born,
                                 const unsigned* nborn, const unsigned* clock, float4* pos, float4* vel,
                                 unsigned rate, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float4 p = pos_prev[i], v = vel_prev[i];
    unsigned base = ((*clock - 1) * rate) % n, j = (i + n - base) % n, k = min(*nborn, rate);
    if (j < k) {
        float4 b = born[j];
        p = make_float4(b.x, 0.0f, b.z, 1.0f);
        v = make_float4(__fmul_rn(2.0f, b.x), b.y, __fmul_rn(2.0f, b.z), 0.0f);
    }
    pos[i] = p; vel[i] = v;
}
extern "C" __global__ void integrate(/*inout*/ float4* pos, /*inout*/ float4* vel, const float4* acc, float dt,
                                     unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || pos[i].w == 0.0f) return;
    float4 p = pos[i], v = vel[i], a = acc[i];
    v.x = __fadd_rn(v.x, __fmul_rn(a.x, dt)); v.y = __fadd_rn(v.y, __fmul_rn(a.y, dt));
    v.z = __fadd_rn(v.z, __fmul_rn(a.z, dt));
    p.x = __fadd_rn(p.x, __fmul_rn(v.x, dt)); p.y = __fadd_rn(p.y, __fmul_rn(v.y, dt));
    p.z = __fadd_rn(p.z, __fmul_rn(v.z, dt));
    if (p.y < 0.0f) { p.w = 0.0f; v = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }  // a particle dies on the floor
    pos[i] = p; vel[i] = v;
}
"""
FORCES = r"""// forces.cu: the force law; edit and save it while the pipeline runs
extern "C" __global__ void forces(const float4* pos, const float4* vel, float4* acc, float gravity, float wind,
                                  float drag, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float4 v = vel[i];
    float alive = pos[i].w;
    acc[i] = make_float4(__fmul_rn(alive, __fsub_rn(wind, __fmul_rn(drag, v.x))),
                         __fmul_rn(alive, __fsub_rn(-gravity, __fmul_rn(drag, v.y))),
                         __fmul_rn(alive, -__fmul_rn(drag, v.z)), 0.0f);
}
"""
# the edit made halfway: a vortex around the y axis replaces the wind's drag on z
FORCES_EDITED = FORCES.replace("__fmul_rn(alive, -__fmul_rn(drag, v.z))",
                               "__fmul_rn(alive, __fsub_rn(__fmul_rn(0.5f, pos[i].x), __fmul_rn(drag, v.z)))")
code = {e: rx.compile_cuda(EMIT, entry=e) for e in ("emit", "spawn", "integrate")}


def kernel_block(name, ports, scalars, threads=CAP, block=256):
    """One kernel; ``ports``: name -> (direction, element count[, counter parameter])."""
    bb = rx.BlockBuilder(name, size=CAP)
    k = bb.add_kernel(code[name], threads=threads, block=block)
    for port, (direction, count, *counter) in ports.items():
        if direction == "in":
            bb.input(port, k[port], count=count)
        else:
            bb.output(port, k[port], count=count, counter=k[counter[0]] if counter else None)
    for s, value in scalars.items():
        bb.scalar(s, k[s], default=value)
    return bb.build()


def build(engine, forces_path):
    """The pipeline in ``engine``; returns its blocks by name."""
    emit = kernel_block("emit", {"clock": ("out", 1), "born": ("out", RATE, "count")},
                        {"p": P_EMIT, "seed": SEED, "capacity": RATE}, threads=RATE, block=RATE)
    spawn = kernel_block("spawn", {"pos_prev": ("in", CAP), "vel_prev": ("in", CAP), "born": ("in", RATE),
                                   "nborn": ("in", 1), "clock": ("in", 1), "pos": ("out", CAP),
                                   "vel": ("out", CAP)}, {"rate": RATE, "n": CAP})
    forces = rx.Block.from_kernel(forces_path, size=CAP, name="forces", gravity=9.81, wind=0.0, drag=0.1)
    integrate = kernel_block("integrate", {"pos": ("in", CAP), "vel": ("in", CAP), "acc": ("in", CAP)},
                             {"dt": float(DT), "n": CAP})
    for b in (emit, spawn):
        engine.add(b)
    engine.add(rx.For(SUBSTEPS, [forces, integrate], name="substeps"))
    engine.connect(emit["clock"], spawn["clock"])
    engine.connect(emit["born"], spawn["born"])
    engine.connect(emit["born"].count, spawn["nborn"])      # the append count, read on the device
    for state in ("pos", "vel"):
        engine.connect(spawn[state], forces[state])
        engine.connect(spawn[state], integrate[state])       # integrate updates the state in place
        engine.connect(spawn[state], spawn[f"{state}_prev"], delay=1)   # next frame starts from this one
    engine.connect(forces["acc"], integrate["acc"])
    return {"emit": emit, "spawn": spawn, "forces": forces, "integrate": integrate}


class Reference:
    """The same steps in NumPy float32."""

    def __init__(self):
        self.pos = np.zeros((CAP, 4), np.float32)
        self.vel = np.zeros((CAP, 4), np.float32)
        self.frame = 0
        self.edited = False

    @staticmethod
    def _mix(x):
        x = x.astype(np.uint32)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
        return x

    def _rnd(self, k):
        m = self._mix
        with np.errstate(over="ignore"):
            h = m(np.uint32(SEED) * np.uint32(0x9E3779B9) ^ m(np.uint32(self.frame) * np.uint32(0x85EBCA6B) ^ m(k)))
        return (h >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)

    def step(self, gravity, wind, drag=DRAG):
        i = np.arange(RATE, dtype=np.uint32)
        with np.errstate(over="ignore"):
            go = self._rnd(3 * i) < np.float32(P_EMIT)
            x, z = self._rnd(3 * i + 1)[go] - np.float32(0.5), self._rnd(3 * i + 2)[go] - np.float32(0.5)
            vy = np.float32(2.0) + self._rnd(7 * i + 5)[go]
        k = int(go.sum())
        slots = (np.arange(k) + self.frame * RATE) % CAP
        self.pos[slots] = np.stack([x, np.zeros(k, np.float32), z, np.ones(k, np.float32)], axis=1)
        self.vel[slots] = np.stack([np.float32(2) * x, vy, np.float32(2) * z, np.zeros(k, np.float32)], axis=1)
        g, w = np.float32(gravity), np.float32(wind)
        for _ in range(SUBSTEPS):
            p, v = self.pos, self.vel
            alive = p[:, 3]
            az = alive * ((np.float32(0.5) * p[:, 0] - drag * v[:, 2]) if self.edited else -(drag * v[:, 2]))
            acc = np.stack([alive * (w - drag * v[:, 0]), alive * (-g - drag * v[:, 1]), az], axis=1)
            live = alive != 0
            v[live, :3] = v[live, :3] + acc[live] * DT
            p[live, :3] = p[live, :3] + v[live, :3] * DT
            dead = live & (p[:, 1] < 0)
            p[dead, 3] = 0
            v[dead] = 0
        self.frame += 1
        return k


def as_rows(a):
    """A float4 port's array as (CAP, 4) float32 rows."""
    return np.ascontiguousarray(a).view(np.float32).reshape(CAP, 4)


def summary(pos, vel):
    alive = pos[:, 3] != 0
    v = vel[alive, :3].astype(np.float64)
    return int(alive.sum()), v.sum(axis=0), 0.5 * float((v * v).sum())


with tempfile.TemporaryDirectory(prefix="rxcuda-particles-") as folder:
    forces_path = pathlib.Path(folder) / "forces.cu"
    forces_path.write_text(FORCES)
    with rx.Engine() as engine:
        blocks = build(engine, forces_path)
        gravity, sensor = Subject(), Subject()
        blocks["forces"].params["gravity"].bind(gravity)
        smoothed = sensor.pipe(ops.scan(lambda avg, x: 0.9 * avg + 0.1 * x, 0.0))   # a noisy sensor, smoothed
        wind_now = []
        smoothed.subscribe(wind_now.append)
        blocks["forces"].params["wind"].bind(smoothed)
        born = []
        engine.observe(blocks["emit"]["born"].count).subscribe(born.append)
        reloaded = threading.Event()
        engine.code_changes.subscribe(lambda ev: reloaded.set())
        watching = engine.watch()
        ref, rng, ref_born = Reference(), np.random.default_rng(7), []
        for f in range(FRAMES):
            if f == FRAMES // 2:  # save a new force law; the watcher recompiles it off the engine thread
                forces_path.write_text(FORCES_EDITED)
                assert reloaded.wait(30), "the edit of forces.cu was not picked up"
                ref.edited = True
            g = 9.81 if f < FRAMES // 3 else 3.7                       # gravity changes once, from a stream
            gravity.on_next(g)
            sensor.on_next(float(np.sin(f / 40.0) + rng.normal(0.0, 0.3)))
            frame = engine.tick()
            assert frame.state == "ok", engine.diagnostic_log
            k = ref.step(g, wind_now[-1])
            ref_born.append(k)
            assert engine.count(blocks["emit"]["born"]) == k, f"frame {f}: NumPy has {k} particles born"
            if f % 50 == 0 or f == FRAMES - 1:
                pos, vel = (as_rows(engine.read(blocks["spawn"][s])) for s in ("pos", "vel"))
                n, momentum, energy = summary(pos, vel)
                rn, rmomentum, renergy = summary(ref.pos, ref.vel)
                assert n == rn, f"frame {f}: {n} particles alive, NumPy has {rn}"
                assert np.allclose(momentum, rmomentum, rtol=1e-5, atol=1e-3), (f, momentum, rmomentum)
                assert np.isclose(energy, renergy, rtol=1e-5), (f, energy, renergy)
                if f % 100 == 0 or f == FRAMES - 1:
                    print(f"frame {f:4d}: {n:5d} alive, momentum ({momentum[0]:+9.3f} {momentum[1]:+9.3f} "
                          f"{momentum[2]:+9.3f}), energy {energy:10.3f}  (NumPy {renergy:10.3f})")
        watching.dispose()
        # the observed counts (read back a frame or so later, no waiting) are NumPy's, frame by frame
        assert len(born) >= FRAMES - 2 and born == ref_born[:len(born)], "the observed append counts differ"
        assert engine.rebuilds == 1, "parameters and the code edit should all have been in-place updates"
        s = engine.stats
        print(f"memory: buffers={s.buffers} allocations={s.allocations} allocated={s.bytes_allocated} "
              f"without_reuse={s.bytes_unshared} saved={s.bytes_saved}")

    # run_batch(k) computes, bit for bit, what k ticks compute
    k = 120
    results = []
    for batched in (False, True):
        with rx.Engine() as engine:
            blocks = build(engine, forces_path)
            engine.tick()
            if batched:
                frame = engine.run_batch(k)
                assert frame.frames == k
            else:
                for _ in range(k):
                    engine.tick()
            results.append([engine.read(blocks["spawn"][s]) for s in ("pos", "vel")])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
    print(f"OK: {FRAMES} frames match NumPy (alive count, momentum, energy); run_batch({k}) equals {k} ticks")
