"""A producer inside the pending plan's locked section, for the tests of what must wait for it (the compiled
drain and the compiled fold: tests/unit/test_native.py, test_native_setter.py)."""

import threading
import time


def while_a_producer_folds(pending, call):
    """``call()``'s result, called while another thread holds ``pending._lock`` mid-fold: it folds (2, "b") = 2.0,
    sleeps 50 ms (``call`` must wait meanwhile), then counts the change and lets go."""
    inside = threading.Event()

    def producer():
        with pending._lock:
            inside.set()
            pending._params[(2, "b")] = 2.0
            time.sleep(0.05)
            pending.count += 1

    t = threading.Thread(target=producer)
    t.start()
    inside.wait()
    try:
        return call()
    finally:
        t.join()
