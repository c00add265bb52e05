"""Workers that share one GPU: without NVIDIA's Multi-Process Service their contexts take turns on it.

Two processes on one GPU each have their own context; the GPU time-slices between contexts, so each frame of one
worker waits for the other's slice. On an H200 host (bench/distributed.py, 4 MiB ``ipc`` link) two workers took
339-374 us a frame against 57 us for one; under MPS, where the processes' work runs at once, 65-137 us, and a
frame loop of two workers ran at 9976 frames per second instead of 3442. The driver engine says so once per
shared GPU (:func:`shared_without_mps`, a warning in ``diagnostics``), with the fix. The hypothesis behind
``share_gpu="turns"``: the cost is the time-slicing between contexts that have work at the same time, so stepping
the workers of one GPU one after another (:func:`turn_groups`; ``_stepping``) should cost about the sum of their
frames and a context switch, with each worker's faults its own (no MPS); bench/distributed.py measures it.

>>> where = {"a": {"node": "n1", "gpu": "ab12", "mps": False}, "b": {"node": "n1", "gpu": "ab12", "mps": False},
...          "c": {"node": "n1", "gpu": "cd34", "mps": False}}
>>> shared_without_mps(where)
[('n1', 'ab12', ('a', 'b'))]
"""

from __future__ import annotations

from collections.abc import Mapping

from ..cuda._cpuchoice import cpu_by_default


def shared_without_mps(where: Mapping[str, Mapping]) -> list[tuple[object, str, tuple[str, ...]]]:
    """(node, GPU UUID, workers) for each GPU that two or more workers share while MPS is off for one of them;
    workers whose GPU is unknown (the null driver, or not built yet) are left out."""
    groups: dict[tuple, list[str]] = {}
    for w, at in where.items():
        if at.get("gpu"):
            groups.setdefault((at.get("node"), at["gpu"]), []).append(w)
    return [(node, gpu, tuple(sorted(ws))) for (node, gpu), ws in sorted(groups.items(), key=str)
            if len(ws) > 1 and not all(where[w].get("mps") for w in ws)]


def turn_groups(where: Mapping[str, Mapping], workers: Mapping, order) -> tuple[tuple[str, ...], ...]:
    """The workers of ``order`` (a frame's steps, producers first) that ``share_gpu="turns"`` steps one after
    another: for each device two or more of them compute on without MPS, those workers in ``order``'s order. A GPU
    worker's device is its GPU (``gpu``: its UUID, on its ``node``), known once it built; one that MPS serves, or
    whose GPU is not known yet, takes no turns. A worker without a GPU computes on its node's CPU device or null
    driver: those of one kind on one node take turns too (so the mode runs, and is tested, without a GPU).

    >>> from rxcuda.distributed import Worker
    >>> where = {"a": {"node": "n", "gpu": "g1", "mps": False}, "b": {"node": "n", "gpu": "g1", "mps": False},
    ...          "c": {"node": "n", "gpu": "g2", "mps": False}, "d": {"node": "n", "gpu": "g1", "mps": True}}
    >>> turn_groups(where, {w: Worker(num_gpus=0.5) for w in "abcd"}, ["b", "c", "a", "d"])
    (('b', 'a'),)
    """
    groups: dict[tuple, list[str]] = {}
    for w in order:
        at, spec = where.get(w, {}), workers[w]
        if spec.gpuless:
            key: tuple = (at.get("node"), "cpu" if spec.cpu else "null")
        elif at.get("gpu") and not at.get("mps"):
            key = (at.get("node"), at["gpu"])
        else:
            continue
        groups.setdefault(key, []).append(w)
    return tuple(tuple(ws) for ws in groups.values() if len(ws) > 1)


def candidates(workers: Mapping, backend: str) -> tuple[str, ...]:
    """The workers that may share a GPU of the driver's host, judged before they start (``Engine(share_gpu=...)``,
    ``_mps``): none on the CPU device (``RXCUDA_DEVICE=cpu``, or no CUDA device here) or the null driver; child
    processes (``backend="process"``) all open this host's first GPU; Ray gives a whole GPU (``num_gpus >= 1``)
    to one worker only, so there only those asking for a share.

    >>> from rxcuda.distributed import Worker
    >>> candidates({"a": Worker(num_gpus=1, null=True), "b": Worker(num_gpus=0.5), "c": Worker(num_gpus=1)},
    ...            "ray") if not cpu_by_default() else ("b",)
    ('b',)
    """
    gpu = {w: spec for w, spec in workers.items() if not spec.gpuless}
    if not gpu or cpu_by_default():
        return ()
    return tuple(w for w, spec in gpu.items() if backend == "process" or spec.num_gpus < 1)


def on_one_gpu(where: Mapping[str, Mapping], workers: Mapping, node) -> list[tuple[str, ...]]:
    """The groups of two or more GPU workers placed on one GPU of node ``node`` (the driver's), from where their
    actors run (``where``: each worker's ``node`` and the GPU ids Ray gave it, ``gpus``; none for child processes,
    which all open the first GPU).

    >>> from rxcuda.distributed import Worker
    >>> on_one_gpu({"a": {"node": "n", "gpus": ["0"]}, "b": {"node": "n", "gpus": ["0"]},
    ...             "c": {"node": "n", "gpus": ["1"]}, "d": {"node": "m", "gpus": ["0"]}},
    ...            {w: Worker(num_gpus=0.5) for w in "abcd"}, "n")
    [('a', 'b')]
    """
    groups: dict[tuple, list[str]] = {}
    for w, at in where.items():
        if not workers[w].gpuless and at.get("node") == node:
            groups.setdefault(tuple(sorted(at.get("gpus") or ())), []).append(w)
    return [tuple(sorted(ws)) for _, ws in sorted(groups.items()) if len(ws) > 1]


def placed(where: dict[str, dict], warned: set, worker: str, built, choice=None) -> list[tuple[str, str]]:
    """Record in ``where`` the GPU ``worker`` built its fragment on (``built``: its build's answer; a retune's
    is not a dict and changes nothing), and return (severity, message) to say: what ``share_gpu`` came to (``choice``,
    an info, once) and the advice for each GPU newly found shared without MPS (a warning, unless the workers take
    turns on it: ``share_gpu="turns"``; ``warned`` keeps what was said already, so each is said once)."""
    if isinstance(built, dict):
        where[worker] = {**where.get(worker, {}), "gpu": built.get("gpu"), "mps": built.get("mps"),
                         "mps_pipe": built.get("mps_pipe")}
    out = []
    if choice is not None and "choice" not in warned:
        warned.add("choice")
        out.append(("info", str(choice)))
    for node, gpu, ws in shared_without_mps(where):
        if (gpu, ws) not in warned and getattr(choice, "mode", None) != "turns":
            warned.add((gpu, ws))
            out.append(("warning", advice(node, gpu, ws, choice)))
    return out


def advice(node, gpu: str, workers: tuple[str, ...], choice=None) -> str:
    """The warning for workers sharing one GPU without MPS (``choice``: what ``share_gpu`` came to, and why)."""
    chosen = f" ({choice})" if choice is not None else ""
    return (f"workers {', '.join(repr(w) for w in workers)} share one GPU ({gpu[:8]}… on node {node}) without "
            "NVIDIA's Multi-Process Service: their contexts take turns on the GPU, and each frame waits for the "
            f"others' time slices (on an H200, two workers took ~5x one worker's frame time){chosen}. Pass "
            "share_gpu='auto' (a private MPS daemon on the driver's host, where nvidia-cuda-mps-control is on PATH; "
            "a GPU fault in one worker then ends the others on that GPU too), or share_gpu='turns' (the driver steps "
            "them one after another, each fault its own; docs/distributed.md has its cost), or start MPS on the "
            "workers' host before Ray starts its workers "
            "(nvidia-cuda-mps-control -d; see docs/distributed.md, 'Several workers on one GPU'), or give each "
            "worker a GPU of its own")
