"""GPU tests: skipped, with the reason, where no CUDA device is usable."""

import os
import pathlib

import numpy as np
import pytest

from rxcuda.cuda._driver import probe

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "kernels"

_ok, _why = probe()

# Modules whose tests that take the ``engine`` fixture run on every device there is: the CPU device always (so CI
# checks their numbers), the GPU where there is one. The others need what the CPU device does not run (CuPy
# arrays, GL textures) or check GPU-only behaviour (faults, NVTX, timings).
ON_CPU = {"test_append_gpu", "test_bounds_gpu", "test_composite_gpu", "test_delays_gpu", "test_engine_gpu",
          "test_footguns", "test_frames_gpu", "test_param_path_gpu", "test_profile_gpu", "test_regions_gpu",
          "test_regions_unroll_gpu", "test_replan_gpu", "test_shapes_gpu", "test_shipped_kernels_gpu",
          "test_sources_gpu", "test_streams_gpu", "test_structure_async_gpu", "test_dot_gpu", "test_trace_gpu",
          "test_tensor_block_gpu", "test_serve_controls_gpu", "test_media_gpu", "test_libraries_engine",
          "test_libraries_capture", "test_gl_gpu"}

# tests of those modules that check what only a GPU has, and why
NOT_ON_CPU = {
    "test_a_bound_cupy_array_of_lanes_is_a_float4_port":
        "it uses CuPy arrays (GPU memory)",
    "test_a_float4_buffer_through_two_kernels":
        "it uses CuPy arrays (GPU memory)",
    "test_a_ptx_without_sidecar_has_untyped_pointer_ports_named_arg0":
        "it uses CuPy arrays (GPU memory)",
    "test_a_rebound_delayed_output_feeds_the_copy_from_the_new_array":
        "it uses CuPy arrays (GPU memory)",
    "test_array_view_is_zero_copy":
        "it uses CuPy arrays (GPU memory)",
    "test_bind_copies_a_numpy_array_and_writing_makes_an_input_host_fed":
        "it uses CuPy arrays (GPU memory)",
    "test_bind_wrong_dtype_and_size":
        "it uses CuPy arrays (GPU memory)",
    "test_engine_array_is_a_view_that_changes_with_the_next_frame":
        "it uses CuPy arrays (GPU memory)",
    "test_input_stream_through_kernel_to_output_stream":
        "it uses CuPy arrays (GPU memory)",
    "test_memset_counter_reset":
        "it uses CuPy arrays (GPU memory)",
    "test_observe_cupy_of_synced_frames_emits_views_valid_until_the_next_frame":
        "it uses CuPy arrays (GPU memory)",
    "test_output_bound_to_user_array_zero_copy":
        "it uses CuPy arrays (GPU memory)",
    "test_warm_rebind_to_new_input":
        "it uses CuPy arrays (GPU memory)",
    "test_a_graph_added_in_one_compiled_call_holds_each_nodes_function_launch_arguments_and_edges":
        "the compiled node-adding path calls the GPU driver",
    "test_a_profiled_batch_times_its_frames":
        "it compares with the GPU's own clock",
    "test_per_block_times_match_each_kernels_own_clock":
        "it compares with the GPU's own clock",
    "test_rebind_reaches_library_call":
        "it uses CuPy arrays (GPU memory)",
    "test_rebind_reaches_a_chain_step":
        "it uses CuPy arrays (GPU memory)",
    "test_curand_backend":
        "cuRAND's own generator does not run on the CPU device (backend='philox' does; docs/cpu.md)",
    "test_low_occupancy_is_reported_per_kernel":
        "occupancy is a GPU's",
    "test_the_drivers_picture_names_the_kernels_of_the_running_graph":
        "the driver's own DOT picture (cuGraphDebugDotPrint) is the GPU driver's",
    "test_the_drivers_picture_of_a_graph_with_a_conditional_node":
        "the driver's own DOT picture (cuGraphDebugDotPrint) is the GPU driver's",
    "test_unsynced_frames_never_wait_and_their_timings_arrive_later":
        "the CPU device runs a frame when it is launched",
    "test_a_gl_texture_gets_the_2d_port_after_each_frame":
        "the CPU device does not copy into GL textures yet (GL buffers it does: docs/opengl.md)",
}


def pytest_generate_tests(metafunc):
    if "engine" in metafunc.fixturenames:
        on_cpu = metafunc.module.__name__.rsplit(".", 1)[-1] in ON_CPU
        devices = (["cpu"] if on_cpu else []) + (["cuda"] if _ok else [])
        only = os.environ.get("RXCUDA_TEST_DEVICES")  # "cuda" or "cpu": the one device to test (CI runs "cpu")
        if only:
            devices = [d for d in devices if d in only.split(",")]
        metafunc.parametrize("device", devices or ["cuda"])


def _on_cpu(item) -> bool:
    """Whether a test runs on the CPU device: the ``engine`` fixture's ``device="cpu"``, or test_devices_gpu.py's
    ``devices=["cpu", "cpu"]`` (two positions of it)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("device") == "cpu" or params.get("devices") == ["cpu", "cpu"]


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu_fault`` make a kernel fault on purpose (in a subprocess) and run last: after a fault
    anywhere on the GPU, CUDA-OpenGL interop on that machine stops ordering GL's draws after the frame (39 of 40
    first draws wrong, even with a host sync before the unmap) and a later map can hang, in new processes too,
    until the GPU is reset (seen on an H200, driver 580.159.04, headless EGL). Everything else keeps working.
    The tests' runs on the CPU device come last of all. Tests in NOT_ON_CPU skip on the CPU device, saying why."""
    only = os.environ.get("RXCUDA_TEST_DEVICES")
    for item in items:
        why = NOT_ON_CPU.get(item.originalname) if hasattr(item, "originalname") else None
        if why and _on_cpu(item):
            item.add_marker(pytest.mark.skip(reason=f"not on the CPU device: {why}"))
        elif only and "cpu" not in only.split(",") and _on_cpu(item):  # (the engine fixture's are not made)
            item.add_marker(pytest.mark.skip(reason=f"RXCUDA_TEST_DEVICES={only}"))
    if _ok:
        # the CPU device's runs come after every GPU test (docs/cpu.md, Known issues: a CPU-device engine in a
        # process that also JITs PTX for a GPU was seen to leave that JIT failing), the faulting ones before them
        faulting = [item for item in items if item.get_closest_marker("gpu_fault") and not _on_cpu(item)]
        # the faulting GL tests first: they measure whether drawing works after their own fault, on a GPU that has
        # not faulted yet (after one, in-process interop was seen broken machine-wide: docs/opengl.md)
        faulting.sort(key=lambda item: getattr(item, "module", None) is None or
                      item.module.__name__.rsplit(".", 1)[-1] != "test_gl_gpu")
        on_cpu = [item for item in items if _on_cpu(item)]
        rest = [item for item in items if not _on_cpu(item) and not item.get_closest_marker("gpu_fault")]
        items[:] = rest + faulting + on_cpu
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: {_why}")
    for item in items:
        if "tests/gpu" in str(item.fspath).replace("\\", "/") and not _on_cpu(item):
            item.add_marker(skip)


def gpu_subprocess_env() -> dict:
    """The environment for a child Python: the checkout first on PYTHONPATH, keeping what was there (the
    wheels the GPU machine installs beside it, say)."""
    root = str(KERNELS.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def engine(device):
    """An engine on ``device`` (the test runs once per device there is, for the modules in ON_CPU)."""
    import rxcuda

    with rxcuda.Engine(device=device) as e:
        yield e


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster that knows this machine's GPU, for the distributed tests' module (one already
    running in the process is used as it is)."""
    ray = pytest.importorskip("ray", reason="rxcuda.distributed runs on Ray: pip install '.[ray]'")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture
def rng():
    return np.random.default_rng()


@pytest.fixture
def kernels():
    return KERNELS
