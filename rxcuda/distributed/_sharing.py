"""Workers that share one GPU: without NVIDIA's Multi-Process Service their contexts take turns on it.

Two processes on one GPU each have their own context; the GPU time-slices between contexts, so each frame of one
worker waits for the other's slice. On an H200 host (bench/distributed.py, 4 MiB ``ipc`` link) two workers took
339-374 us a frame against 57 us for one; under MPS, where the processes' work runs at once, 65-137 us, and a
frame loop of two workers ran at 9976 frames per second instead of 3442. The driver engine says so once per
shared GPU (:func:`shared_without_mps`, a warning in ``diagnostics``), with the fix.

>>> where = {"a": {"node": "n1", "gpu": "ab12", "mps": False}, "b": {"node": "n1", "gpu": "ab12", "mps": False},
...          "c": {"node": "n1", "gpu": "cd34", "mps": False}}
>>> shared_without_mps(where)
[('n1', 'ab12', ('a', 'b'))]
"""

from __future__ import annotations

from collections.abc import Mapping


def shared_without_mps(where: Mapping[str, Mapping]) -> list[tuple[object, str, tuple[str, ...]]]:
    """(node, GPU UUID, workers) for each GPU that two or more workers share while MPS is off for one of them;
    workers whose GPU is unknown (the null driver, or not built yet) are left out."""
    groups: dict[tuple, list[str]] = {}
    for w, at in where.items():
        if at.get("gpu"):
            groups.setdefault((at.get("node"), at["gpu"]), []).append(w)
    return [(node, gpu, tuple(sorted(ws))) for (node, gpu), ws in sorted(groups.items(), key=str)
            if len(ws) > 1 and not all(where[w].get("mps") for w in ws)]


def placed(where: dict[str, dict], warned: set, worker: str, built) -> list[str]:
    """Record in ``where`` the GPU ``worker`` built its fragment on (``built``: its build's answer; a retune's
    is not a dict and changes nothing), and return the advice for each GPU newly found shared without MPS
    (``warned`` keeps those already told, so each is said once)."""
    if isinstance(built, dict):
        where[worker] = {**where.get(worker, {}), "gpu": built.get("gpu"), "mps": built.get("mps")}
    out = []
    for node, gpu, ws in shared_without_mps(where):
        if (gpu, ws) not in warned:
            warned.add((gpu, ws))
            out.append(advice(node, gpu, ws))
    return out


def advice(node, gpu: str, workers: tuple[str, ...]) -> str:
    """The warning for workers sharing one GPU without MPS."""
    return (f"workers {', '.join(repr(w) for w in workers)} share one GPU ({gpu[:8]}… on node {node}) without "
            "NVIDIA's Multi-Process Service: their contexts take turns on the GPU, and each frame waits for the "
            "others' time slices (on an H200, two workers took ~5x one worker's frame time). Pass "
            "Engine(..., share_gpu='mps') for a private MPS daemon on the driver's host, or start MPS on that host "
            "before Ray starts its workers (nvidia-cuda-mps-control -d; see docs/distributed.md, 'Several workers "
            "on one GPU'), or give each worker a GPU of its own")
