"""Kernel arguments packed for cuLaunchKernel (rxcuda.cuda._launch): one 8-byte-aligned slot each."""

import ctypes

import numpy as np
import pytest

from rxcuda.cuda._launch import pack_args
from rxcuda.model._describe import KernelParam


def _read(address: int, dtype) -> object:
    dt = np.dtype(dtype)
    return np.frombuffer((ctypes.c_char * dt.itemsize).from_address(address), dtype=dt)[0]


def test_each_argument_in_its_own_aligned_slot_with_its_type():
    params = (
        KernelParam("out", "pointer", 8, "f32", "out"),
        KernelParam("scale", "scalar", 4, "f32"),
        KernelParam("h", "scalar", 2, "f16"),
        KernelParam("n", "scalar", 8, None),  # size only (from a PTX signature): an unsigned word
        KernelParam("count", "scalar", 4, "i32"),
        KernelParam("pair", "scalar", 12, None),  # a 12-byte struct: a 16-byte slot
        KernelParam("last", "scalar", 8, "f64"),
    )
    storage, pointers = pack_args(params, [0xDEAD_BEEF_0000, 2.5, 0.5, 1 << 40, -3, 0, -1.25])
    base = storage.ctypes.data
    assert [int(p) - base for p in pointers] == [0, 8, 16, 24, 32, 40, 56]
    assert _read(int(pointers[0]), np.uint64) == 0xDEAD_BEEF_0000
    assert _read(int(pointers[1]), np.float32) == 2.5
    assert _read(int(pointers[2]), np.float16) == 0.5
    assert _read(int(pointers[3]), np.uint64) == 1 << 40
    assert _read(int(pointers[4]), np.int32) == -3
    assert _read(int(pointers[6]), np.float64) == -1.25


def test_bf16_travels_as_its_16_bit_word_and_counts_must_match():
    storage, pointers = pack_args((KernelParam("b", "scalar", 2, "bf16"),), [0x3F80])
    assert _read(int(pointers[0]), np.uint16) == 0x3F80
    with pytest.raises(ValueError, match="2 values for 1 kernel parameters"):
        pack_args((KernelParam("b", "scalar", 2, "bf16"),), [1, 2])
    storage, pointers = pack_args((), [])
    assert len(pointers) == 0
