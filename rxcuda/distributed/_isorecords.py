"""The isolated engine's records and the words of its messages: :class:`Fault` (one fault survived),
:class:`RestartingError`, the ``devices=`` check, and how a hang, a lost context or an ended process is told.

>>> _how(-9), _how(3), _how(None)
('killed by signal 9', 'exit status 3', 'no exit status')
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..blocks._blocks import Block
from ..blocks._regions import Region
from ..model._errors import DeviceLostError, RxcudaError


class RestartingError(RxcudaError, RuntimeError):
    """The GPU process is being replaced after a fault and did not come back in time to answer."""


@attrs.frozen
class Fault:
    """One fault the isolated engine survived: the frame it ended, what ended it (``"fault"``: the process lost
    its CUDA context; ``"hang"``: the frame passed its deadline; ``"crash"``: the process ended otherwise;
    ``"trial"``: new code faulted or hung in its trial run in the standby, costing no frame), the
    error as the GPU process reported it, the code rolled back (``block.kernel`` -> the file of the code that
    faulted), and, once frames resumed, seconds from the fault seen to the next good frame."""

    frame: int
    kind: str
    message: str
    rolled_back: tuple[tuple[str, str], ...] = ()
    seen_at: float = 0.0  # time.perf_counter() when this side saw it
    recovered_s: float | None = None  # seen -> the next good frame
    back_s: float | None = None  # seen -> a new GPU process serves the pipeline, built
    build_s: float | None = None  # of which the build in the new process


def _check_devices(devices, device, null: bool) -> tuple | None:
    """``IsolatedEngine(devices=...)`` checked as ``rxcuda.Engine``'s: a non-empty list of GPU ordinals (one may
    repeat: two positions on one GPU) or of ``"cpu"`` (positions on the CPU device), not beside ``device``."""
    if devices is None:
        return None
    if device is not None:
        raise ValueError(f"give IsolatedEngine either device={device!r} or devices={devices!r}, not both "
                         "(devices[0] is the engine's first device)")
    if isinstance(devices, str | bytes) or not isinstance(devices, Sequence) or not devices:
        raise ValueError(f"'devices' takes a non-empty list of GPU ordinals, e.g. devices=[0, 0] (two positions on "
                         f"GPU 0), or devices=['cpu', 'cpu'] (got {devices!r})")
    cpu = [isinstance(d, str) and d.lower() == "cpu" for d in devices]
    if any(cpu) and (not all(cpu) or null):
        raise ValueError(f"devices={list(devices)!r}: " + ("null=True runs on the null driver, not the CPU device: "
                         "give positions as ordinals, devices=[0, 0]" if null else "one engine runs on one kind of "
                         "device: give devices=['cpu', 'cpu'] or GPU ordinals, e.g. devices=[0, 0]"))
    if all(cpu):
        return tuple("cpu" for _ in devices)
    bad = next((d for d in devices if isinstance(d, bool) or not isinstance(d, int) or d < 0), None)
    if bad is not None:
        raise ValueError(f"'devices' takes GPU ordinals (ints >= 0), or 'cpu' for positions on the CPU device; got "
                         f"{bad!r} in {list(devices)!r}")
    return tuple(devices)


def _loops(blocks) -> str:
    """What a hang message says of the pipeline's loops: a While runs until its condition clears or its
    ``max_iterations``, which may take longer than the deadline. (A loop that reaches its bound within the
    deadline is reported by the GPU process's engine: a warning naming it, rxcuda.engine._loops.)"""
    loops = [f"{type(b).__name__} '{b.name}' (at most {b.params['max_iterations'].value} passes)" for b in blocks
             if isinstance(b, Region) and b.kind == "while"]
    if not loops:
        return ""
    return (f" (its loops: {', '.join(loops)}; a condition that never clears runs every pass: lower "
            "max_iterations so that a frame ends within the deadline (a loop that reaches it is then reported by a "
            "warning naming it), or fix the condition that never clears)")


def _said(words: str | None) -> str | None:
    """A GPU process's last words as this side tells them: that process is gone and this one goes on, so a lost
    context's advice to restart the process is left out."""
    return words.replace(DeviceLostError.STICKY, "").replace(DeviceLostError.STICKY_CPU, "") if words else words


def _members(block: Block) -> list[Block]:
    """A block; for a region, it, the blocks of its bodies, and theirs (nested regions)."""
    out: list[Block] = [block]
    for b in block.members if isinstance(block, Region) else ():
        out.extend(_members(b))
    return out


def _visible(device: int) -> str:
    import os

    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen:
        ids = [s.strip() for s in seen.split(",") if s.strip()]
        if device < len(ids):
            return ids[device]
    return str(device)


def _how(code: int | None) -> str:
    if code is None:
        return "no exit status"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"
