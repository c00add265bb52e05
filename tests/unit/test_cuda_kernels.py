"""rxcuda.cuda._kernels on the null driver: loading a module (PTX with JIT options, or an image), getting a
function, and the launcher's argument packing, read back through the ``void**`` the driver would be handed."""

from __future__ import annotations

import ctypes
import gc
import struct

import numpy as np
import pytest
from _blocks import BlockReading

from rxcuda.cuda import NullDriver
from rxcuda.cuda._kernels import KernelLauncher, KernelModule, load_module
from rxcuda.model._errors import CudaError, RxcudaError


class Reading(NullDriver):
    """A null driver that reads each launch's arguments through ``kernelParams`` as the driver would."""

    def __init__(self, layout: str):
        super().__init__()
        self.layout = layout  # struct codes of the parameters, one each
        self.seen: list[tuple] = []

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_void_p * len(self.layout)).from_address(params)
        self.seen.append(tuple(struct.unpack("<" + c, ctypes.string_at(p, struct.calcsize("<" + c)))[0]
                               for c, p in zip(self.layout, pointers, strict=True)))
        return super().cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)


def test_ptx_loads_with_the_jit_level_and_a_terminating_nul():
    api = NullDriver()
    module = load_module(b".version 7.0", ptx=True, optimization_level=0, api=api)
    ((name, (size, options, values)),) = [c for c in api.calls if c[0].startswith("cuModuleLoad")]
    assert name == "cuModuleLoadDataEx" and size == len(b".version 7.0") + 1
    assert options == (int(api.CUjit_option.CU_JIT_OPTIMIZATION_LEVEL),) and values == (0,)
    assert isinstance(module, KernelModule) and not module.closed


def test_an_image_loads_without_options():
    api = NullDriver()
    load_module(b"\x7fELF....", api=api)
    assert api.count("cuModuleLoadData") == 1 and api.count("cuModuleLoadDataEx") == 0


def test_a_bad_optimization_level_is_named():
    with pytest.raises(ValueError, match=r"'optimization_level' must be an int in 0\.\.4 \(got 7\)"):
        load_module(b"x", ptx=True, optimization_level=7, api=NullDriver())


def test_a_load_the_driver_refuses_names_the_code_and_the_reason():
    api = NullDriver()
    api.fail("cuModuleLoadDataEx", "CUDA_ERROR_INVALID_PTX")
    with pytest.raises(CudaError, match=r"cuModuleLoadDataEx \(my kernel\) failed with CUDA_ERROR_INVALID_PTX.*"
                                        r"could not load this PTX") as info:
        load_module(b"x", ptx=True, optimization_level=0, origin="my kernel", api=api)
    assert isinstance(info.value, RxcudaError) and info.value.name == "CUDA_ERROR_INVALID_PTX"


def test_a_missing_entry_is_named():
    api = NullDriver()
    module = load_module(b"x", ptx=True, api=api, origin="k.ptx")
    api.fail("cuModuleGetFunction", "CUDA_ERROR_NOT_FOUND")
    with pytest.raises(CudaError, match=r"\(k\.ptx\).*no kernel 'nope' in this module"):
        module.function("nope")


def test_close_unloads_once_and_a_closed_module_gives_no_function():
    api = NullDriver()
    module = load_module(b"x", api=api)
    function = module.function("k")
    assert function.module is module and function.entry == "k"
    module.close()
    module.close()
    assert api.count("cuModuleUnload") == 1 and module.closed
    with pytest.raises(CudaError, match="is closed; load it again"):
        module.function("k")


def test_a_dropped_module_is_unloaded():
    api = NullDriver()
    load_module(b"x", api=api)
    gc.collect()
    assert api.count("cuModuleUnload") == 1


def test_the_launcher_packs_each_argument_as_its_kind():
    api = Reading("QfBqdQ")
    function = load_module(b"x", api=api).function("k")
    launch = KernelLauncher(function, ("pointer", "<f4", np.uint8, np.int64, "float64", "pointer"), api=api)
    launch((3, 2, 1), (128, 1, 1), (0x7F00_0000_1000, np.float32(1.5), np.uint8(1), -5, 0.25, 0x7F00_0000_2000),
           stream=0x1234, shared_mem=64)
    launch(7, 256, (1, 2.0, 0, 3, 4.0, 5), stream=0)  # the storage is reused: the second launch's values
    assert api.seen == [(0x7F00_0000_1000, 1.5, 1, -5, 0.25, 0x7F00_0000_2000), (1, 2.0, 0, 3, 4.0, 5)]
    launches = [args for name, args in api.calls if name == "cuLaunchKernel"]
    assert launches[0][1:] == ((3, 2, 1), (128, 1, 1), 64, 0x1234) and launches[1][1:] == ((7, 1, 1), (256, 1, 1),
                                                                                             0, 0)
    assert launch.launches == 2


def test_wrong_arguments_and_kinds_are_named():
    api = NullDriver()
    function = load_module(b"x", api=api).function("k")
    with pytest.raises(ValueError, match=r"complex128 has no kernel argument type"):
        KernelLauncher(function, ("pointer", np.complex128), api=api)
    launch = KernelLauncher(function, ("pointer", "<f4"), api=api)
    with pytest.raises(ValueError, match=r"1 arguments for kernel 'k' with parameters \('pointer', '<f4'\)"):
        launch(1, 1, (0,), stream=0)
    assert api.count("cuLaunchKernel") == 0


def test_a_failed_launch_names_the_kernel_and_its_code():
    api = NullDriver()
    function = load_module(b"x", api=api, origin="a tensor kernel").function("rx_group")
    launch = KernelLauncher(function, (), api=api)
    api.fail("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(CudaError, match=r"cuLaunchKernel \(rx_group of a tensor kernel\) failed with "
                                        r"CUDA_ERROR_INVALID_VALUE"):
        launch(1, 32, (), stream=0)


def test_a_block_launcher_packs_the_values_over_its_template():
    from rxcuda.cuda._kernels import BlockLauncher

    api = BlockReading(32)
    function = load_module(b"x", api=api).function("k")
    template = bytes(16) + b"PROGRAM!" + b"12345678"
    launch = BlockLauncher(function, template, struct.Struct("<Qd"), api=api)
    launch(4, 256, (0x7F00_0000_1000, 2.5), stream=0x9)
    launch((2, 1, 1), (128, 1, 1), (7, -1.0), stream=0)
    assert api.blocks == [struct.pack("<Qd", 0x7F00_0000_1000, 2.5) + template[16:],
                          struct.pack("<Qd", 7, -1.0) + template[16:]]
    launches = [args for name, args in api.calls if name == "cuLaunchKernel"]
    assert launches[0][1:] == ((4, 1, 1), (256, 1, 1), 0, 0x9) and launch.launches == 2


def test_a_block_launcher_names_values_that_do_not_fit_and_a_failed_launch():
    from rxcuda.cuda._kernels import BlockLauncher

    api = NullDriver()
    function = load_module(b"x", api=api, origin="the interpreter").function("rx_interp_f4")
    with pytest.raises(ValueError, match=r"the values \(16 bytes\) do not fit the parameter block of 8 bytes of "
                                         r"kernel 'rx_interp_f4'"):
        BlockLauncher(function, bytes(8), struct.Struct("<Qd"), api=api)
    launch = BlockLauncher(function, bytes(32), struct.Struct("<Qd"), api=api)
    with pytest.raises(ValueError, match=r"1 values for the parameter block of kernel 'rx_interp_f4' \(<Qd\)"):
        launch(1, 1, (0,), stream=0)
    api.fail("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(CudaError, match=r"cuLaunchKernel \(rx_interp_f4 of the interpreter\) failed with "
                                        r"CUDA_ERROR_INVALID_VALUE"):
        launch(1, 32, (1, 2.0), stream=0)
