"""A null driver that reads what a launch of a parameter-block kernel hands over (rxcuda.cuda._kernels.BlockLauncher:
one by-value struct through ``kernelParams``), for the launcher's and the tensor interpreter's tests."""

from __future__ import annotations

import ctypes

from rxcuda.cuda import NullDriver


class BlockReading(NullDriver):
    """Keeps each launch's grid, block, stream and its parameter block of ``size`` bytes (``seen``; ``blocks``:
    the parameter blocks alone)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size
        self.seen: list[tuple] = []

    @property
    def blocks(self) -> list[bytes]:
        return [s[3] for s in self.seen]

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        (pointer,) = (ctypes.c_void_p * 1).from_address(params)
        self.seen.append(((gx, gy, gz), (bx, by, bz), int(stream), ctypes.string_at(pointer, self.size)))
        return super().cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
