"""Where an IsolatedEngine frame's time goes on this machine (100 small kernels, nothing faulting): this process's
work before the request, the wait for the answer (of which the GPU process's own frame, its ``host_us``), and this
process's work after it; beside the in-process ``tick()``.

    python bench/isolated_split.py            # RXCUDA_CLOCK_SPIN_US=300 to force the spinning clock on a small host

Median microseconds of 3000 frames each. The clock's mailbox (an idle engine's frame with no system call) is used
where the clock's ends spin (hosts of 8 cores or more) on x86-64; ``mailed`` says how many frames took it.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import rxcuda
from rxcuda import IsolatedEngine
from rxcuda.distributed import _clock

N = 1 << 10
FRAMES = 3000


def chain(e):
    bs = [e.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name=f"m{i}", scale=1.0)) for i in range(100)]
    for a, b in zip(bs, bs[1:], strict=False):
        e.connect(a["out"], b["x"])
    e.write(bs[0]["x"], np.ones(N, np.float32))
    return bs


def us(xs) -> float:
    return round(statistics.median(xs) * 1e6, 2)


def main() -> None:
    e = rxcuda.Engine()
    chain(e)
    e.tick()
    ts = []
    for _ in range(FRAMES):
        t = time.perf_counter()
        f = e.tick()
        ts.append(time.perf_counter() - t)
    print(f"in-process tick {us(ts)} us (its host_us {f.host_us:.1f})")
    iso = IsolatedEngine(standby=False)
    chain(iso)
    iso.tick()
    marks: dict[str, float] = {}
    wrapped = {}
    for name in ("answer", "answer_mail"):
        orig = getattr(_clock, name)

        def timed(*a, _orig=orig, **k):
            marks["s1"] = marks.get("s0", 0.0)
            r = _orig(*a, **k)
            marks["w"] = time.perf_counter()
            return r

        wrapped[name] = orig
        setattr(_clock, name, timed)
    step, mail = _clock.Clock.step, _clock.Clock.mail

    def stepped(self, *a, _orig=step):
        marks["s0"] = time.perf_counter()
        _orig(self, *a)

    def mailed(self, *a, _orig=mail):
        marks["s0"] = time.perf_counter()
        _orig(self, *a)

    _clock.Clock.step, _clock.Clock.mail = stepped, mailed
    pre, wait, post, total, child = [], [], [], [], []
    try:
        for _ in range(FRAMES):
            t0 = time.perf_counter()
            f = iso.tick()
            t1 = time.perf_counter()
            pre.append(marks["s0"] - t0)
            wait.append(marks["w"] - marks["s0"])
            post.append(t1 - marks["w"])
            total.append(t1 - t0)
            child.append(f.host_us * 1e-6)
        print(f"isolated: before {us(pre)}, request to answer {us(wait)} (the GPU process's frame {us(child)}), "
              f"after {us(post)}, total {us(total)} us; mailed {iso._clocks['gpu'].mailed} of {FRAMES + 1} frames")
    finally:
        _clock.Clock.step, _clock.Clock.mail = step, mail
        for name, orig in wrapped.items():
            setattr(_clock, name, orig)
        iso.close()
        e.close()


if __name__ == "__main__":
    main()
