"""The local Ray cluster of the distributed unit tests (two CPUs, as on CI): a test module that imports
``cluster`` starts it once, unless a cluster runs already, and stops what it started. Importing this module
skips the importing module where Ray is not installed."""

import time

import pytest

ray = pytest.importorskip("ray", reason="rxcuda.distributed runs on Ray: pip install '.[ray]'")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def run_with_slow_b(engine, seconds: float, delay: float = 0.05) -> tuple[dict[str, int], int]:
    """Frames per worker and the most frames in flight while ``engine.run(500)`` drives a pipeline whose worker
    ``b`` takes ``delay`` seconds a step (far slower than the clock asks) for ``seconds``."""
    ray.get(engine.actor("b").throttle.remote(delay))
    counts = {"a": 0, "b": 0}
    most = [0]

    def on_frame(f) -> None:
        counts[f.worker] += 1
        most[0] = max(most[0], len(engine._inflight))

    sub = engine.frames.subscribe(on_frame)
    running = engine.run(500)
    time.sleep(seconds)
    running.dispose()
    sub.dispose()
    ray.get(engine.actor("b").throttle.remote(0))
    return counts, most[0]
