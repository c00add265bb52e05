"""Which cuRAND host-API sequences can be captured into a CUDA graph? A probe of cuRAND, not of rxcuda.

For each generator type, call sequence and capture mode: make a generator, prime it with one eager generate
(the first generate allocates, which no capture allows), then capture the sequence on a non-blocking stream,
launch the graph, and compare its numbers with the same sequence issued eagerly. Prints one row per
combination; ``rxcuda.libraries.random_*(backend="curand")`` is built on what this shows (position the
generator outside the capture, capture only the generate).

    python bench/curand_capture_probe.py              # the full matrix: 3 generators x 3 sequences x 2 modes
    python bench/curand_capture_probe.py --json probe.json
"""

from __future__ import annotations

import argparse
import json
import sys

RNG_TYPES = ("PSEUDO_PHILOX4_32_10", "PSEUDO_XORWOW", "PSEUDO_MRG32K3A")
SEQUENCES = ("generate", "offset+generate", "seed+offset+generate")
MODES = ("THREAD_LOCAL", "RELAXED")
N = 4096


def probe(rng_type: str, sequence: str, mode: str, stream) -> str:
    """The outcome of capturing ``sequence`` after priming: 'captured, matches eager: ...' or 'error ...'."""
    import cupy as cp
    import numpy as np
    from cuda.bindings import runtime
    from nvmath.bindings import curand

    from rxcuda.cuda._driver import check, drv

    gen = curand.create_generator(int(curand.RngType[rng_type]))
    out, ref = cp.zeros(N, np.float32), cp.zeros(N, np.float32)
    graph = exe = None
    error = None
    try:
        curand.set_stream(gen, stream)
        curand.set_pseudo_random_generator_seed(gen, 1)
        curand.generate_uniform(gen, ref.data.ptr, N)  # priming: the first generate allocates
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
        cmode = getattr(drv.CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{mode}")
        check(drv.cuStreamBeginCapture(stream, cmode), "cuStreamBeginCapture")
        try:
            if "seed" in sequence:
                curand.set_pseudo_random_generator_seed(gen, 2)
            if "offset" in sequence:
                curand.set_generator_offset(gen, 0)
            curand.generate_uniform(gen, out.data.ptr, N)
        except Exception as e:  # what cuRAND says under capture is the result
            error = e
        err, graph = drv.cuStreamEndCapture(stream)
        if error is None and err:
            error = RuntimeError(f"cuStreamEndCapture: {err!r}")
        if error is not None:
            return f"error {type(error).__name__}: {error}"
        exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        check(drv.cuGraphLaunch(exe, stream), "cuGraphLaunch")
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
        # the same sequence, eagerly
        curand.set_pseudo_random_generator_seed(gen, 2 if "seed" in sequence else 1)
        curand.set_generator_offset(gen, 0 if ("offset" in sequence or "seed" in sequence) else N)
        curand.generate_uniform(gen, ref.data.ptr, N)
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return f"captured, matches eager: {bool(cp.array_equal(out, ref))}"
    finally:
        runtime.cudaGetLastError()  # cuRAND's failures leave the runtime's last error set
        if exe is not None:
            drv.cuGraphExecDestroy(exe)
        if graph is not None:
            drv.cuGraphDestroy(graph)
        curand.destroy_generator(gen)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)

    from rxcuda.cuda._device import Device
    from rxcuda.model._errors import NoDeviceError

    try:
        device = Device(args.device)  # the primary context, current on this thread (as the engine's)
    except NoDeviceError as e:
        print(f"curand_capture_probe: {e}", file=sys.stderr)
        return 2
    from nvmath.bindings import curand

    stream = device.create_stream()
    rows = []
    try:
        for rng_type in RNG_TYPES:
            for sequence in SEQUENCES:
                for mode in MODES:
                    rows.append({"generator": rng_type, "sequence": sequence, "mode": mode,
                                 "outcome": probe(rng_type, sequence, mode, int(stream))})
    finally:
        from rxcuda.cuda._driver import drv

        drv.cuStreamDestroy(stream)
    head = f"{'generator':<22} {'sequence under capture':<24} {'mode':<13} outcome"
    print(f"device: {device.name}; cuRAND {curand.get_version()}; {N} uniforms, primed by one eager generate")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['generator']:<22} {r['sequence']:<24} {r['mode']:<13} {r['outcome']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.name, "curand": curand.get_version(), "rows": rows}, f, indent=1)
    device.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
