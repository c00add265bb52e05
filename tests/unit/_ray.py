"""The local Ray cluster of the distributed unit tests (two CPUs, as on CI): a test module that imports
``cluster`` starts it once, unless a cluster runs already, and stops what it started. Importing this module
skips the importing module where Ray is not installed."""

import pytest

ray = pytest.importorskip("ray", reason="rxcuda.distributed runs on Ray: pip install 'rxcuda[ray]'")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()
