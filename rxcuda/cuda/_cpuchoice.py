"""Which engines run on the CPU device (``rxcuda/cuda/_cpu.py``): ``Engine(device="cpu")``,
``Engine(devices=["cpu", "cpu"])`` (two positions on it, each with its own graph and stream), every engine under
``RXCUDA_DEVICE=cpu``, and an engine that names no driver on a machine without a CUDA device (said once in the
log). The CPU device is one device, ordinal 0: positions on it are ``devices=["cpu", "cpu"]`` or ``[0, 0]``.

>>> from rxcuda.cuda._cpuchoice import choose_driver
>>> ordinal, driver, devices = choose_driver(0, None, ["cpu", "cpu"])
>>> ordinal, type(driver).__name__, devices
(0, 'CpuDriver', [0, 0])
>>> choose_driver(0, None, ["cpu", 1])  # doctest: +ELLIPSIS
Traceback (most recent call last):
ValueError: devices=['cpu', 1] mixes the CPU device and GPU ordinals, and one engine runs on one kind of device: ...
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from ._cpu import ENV, CpuDriver
from ._driver import probe

_CPU_POSITIONS = "two positions on it are devices=['cpu', 'cpu'] (or [0, 0]), each with its own graph and stream"


def choose_driver(device: int | str, driver, devices=None) -> tuple[int, object, object]:
    """(ordinal, driver, devices) for ``Engine(device, devices=devices, driver=driver)``: ``device="cpu"``,
    ``devices=["cpu", ...]`` or ``RXCUDA_DEVICE=cpu`` is the CPU device; with no driver given and no CUDA device
    on the machine, the CPU device too, said once in the log. ``devices`` comes back with each ``"cpu"`` as the
    CPU device's ordinal, 0 (the rest of it is checked by ``rxcuda.engine._devices.check_devices``); on the CPU
    device another ordinal is refused, naming the positions to give instead. A given driver other than the CPU
    device's, or a GPU ordinal on a machine with a GPU, is left as it is."""
    cpu = isinstance(driver, CpuDriver)
    named = device.lower() if isinstance(device, str) else None
    if named is not None:
        if named not in ("cpu", "cuda", "gpu"):
            raise ValueError(f"'device' must be a GPU ordinal (an int), 'cuda' or 'cpu' (got {device!r})")
        if named != "cpu" and _names_cpu(devices):
            raise ValueError(f"device={device!r} and devices={list(devices)!r} name two kinds of device: give "
                             f"devices={list(devices)!r} alone for the CPU device, or GPU ordinals for the GPUs")
        cpu, device = cpu or named == "cpu", 0
    if _names_cpu(devices):
        if any(not (isinstance(d, str) and d.lower() == "cpu") for d in devices):
            raise ValueError(f"devices={list(devices)!r} mixes the CPU device and GPU ordinals, and one engine runs "
                             "on one kind of device: give devices=['cpu', 'cpu'] (two positions on the CPU device, "
                             "each with its own graph and stream) or GPU ordinals, e.g. devices=[0, 1]")
        if device != 0:
            raise ValueError(f"give Engine either device={device!r} or devices={list(devices)!r}, not both (devices[0] "
                             "is the engine's first device)")
        cpu, devices = True, [0] * len(devices)
    why = ""
    if not cpu and driver is None and named is None and cpu_by_default():
        cpu, why = True, _why_cpu()
    if cpu and isinstance(devices, Sequence) and not isinstance(devices, (str, bytes)):
        other = [d for d in devices if isinstance(d, int) and not isinstance(d, bool) and d > 0]
        if other:
            raise ValueError(f"devices={list(devices)!r}: this engine runs on the CPU device{why}, which is one "
                             f"device (ordinal 0), so it has no device {other[0]}: {_CPU_POSITIONS}")
    if cpu and not isinstance(driver, CpuDriver):
        driver = CpuDriver()
    return device, driver, devices


def _names_cpu(devices) -> bool:
    """Whether ``devices`` (a list, as given to Engine) names the CPU device."""
    return (isinstance(devices, Sequence) and not isinstance(devices, (str, bytes))
            and any(isinstance(d, str) and d.lower() == "cpu" for d in devices))


def _why_cpu() -> str:
    """Why an engine that names no device runs on the CPU device, for a message."""
    if os.environ.get(ENV, "").strip().lower() == "cpu":
        return f" ({ENV}=cpu)"
    return f" (no CUDA device here: {probe()[1]})"


def cpu_by_default() -> bool:
    """Whether an engine that names no device runs on the CPU device: ``RXCUDA_DEVICE=cpu``, or no CUDA device
    and ``RXCUDA_DEVICE`` unset or ``auto`` (said once, in the log)."""
    env = os.environ.get(ENV, "").strip().lower()
    if env == "cpu":
        return True
    if env in ("", "auto"):
        ok, why = probe()
        if not ok:
            global _said
            if not _said:
                _said = True
                logging.getLogger("rxcuda").info("rxcuda: no CUDA device (%s); running on the CPU device "
                                                 "(set %s=cuda to refuse instead)", why, ENV)
            return True
    return False


_said = False
