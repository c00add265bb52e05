"""Which GPU architecture to compile for: the device's own (``sm_XY``), and whether NVRTC can compile for
a given one (a wrong ``arch`` is named, with the valid ones)."""

from __future__ import annotations

import functools
import re
import threading

from ..cuda._context import device_arch as cuda_device_arch
from ..cuda._nvrtc import supported_archs as nvrtc_supported_archs

_arch_lock = threading.Lock()
_device_arch: list[str | None] = []


def device_arch() -> str | None:
    """``sm_XY`` of CUDA device 0, or ``None`` when there is no usable device (no driver, no GPU). Asked of
    the CUDA layer once per process."""
    with _arch_lock:
        if not _device_arch:
            try:
                arch: str | None = cuda_device_arch(0)
            except Exception:  # NoDeviceError, a driver that refuses: compile for the default instead
                arch = None
            _device_arch.append(arch)
        return _device_arch[0]


def default_arch() -> str:
    """The architecture to compile for: the current device's, else ``sm_90``."""
    return device_arch() or "sm_90"


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """Compute capabilities NVRTC can compile for, e.g. ``(75, 80, 86, ..., 120)``."""
    return nvrtc_supported_archs()


_ARCH_RE = re.compile(r"^(sm|compute)_(\d+)([af]?)$")


def check_arch(arch: str, target: str) -> str:
    """``arch`` when NVRTC can compile ``target`` for it; otherwise a ValueError naming the value and the
    valid ones."""
    valid = supported_archs()
    listing = ", ".join(f"sm_{a}" for a in valid)
    m = _ARCH_RE.match(arch) if isinstance(arch, str) else None
    if m is None or int(m.group(2)) not in valid:
        raise ValueError(f"arch {arch!r} is not an architecture this NVRTC compiles for; use one of "
                         f"{listing} (or compute_XY for PTX)")
    if target == "cubin" and m.group(1) == "compute":
        raise ValueError(f"a cubin needs a real architecture such as 'sm_90' (got {arch!r}); use one of "
                         f"{listing}, or target='ptx'")
    return arch
