"""Streams and events: make, order, wait for and release them.

Every verb takes the driver as ``api`` (keyword; default: cuda.bindings' driver, or pass the engine's, which
may be a :class:`~rxcuda.cuda.NullDriver`) and raises :class:`~rxcuda.CudaError` naming the call that failed.

>>> from rxcuda.cuda import NullDriver
>>> from rxcuda.cuda import _stream
>>> api = NullDriver()
>>> s, t = _stream.create_stream(api=api), _stream.create_stream(api=api)
>>> _stream.wait_stream(s, t, api=api)  # s waits for t's work so far: no host wait
>>> api.names()[-4:]
['cuEventCreate', 'cuEventRecord', 'cuStreamWaitEvent', 'cuEventDestroy']
"""

from __future__ import annotations

from ._driver import check, drv


def create_stream(*, api=None):
    """A new non-blocking stream (never ordered with the legacy default stream); release it with
    :func:`destroy_stream`."""
    api = api if api is not None else drv
    return check(api.cuStreamCreate(api.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")


def destroy_stream(stream, *, api=None) -> None:
    """Release a stream made by :func:`create_stream` (work queued on it still completes)."""
    api = api if api is not None else drv
    check(api.cuStreamDestroy(stream), "cuStreamDestroy")


def synchronize(stream, *, api=None, what: str = "") -> None:
    """Wait on the host until the work queued on ``stream`` so far has finished; ``what`` says why, for the
    error message."""
    api = api if api is not None else drv
    check(api.cuStreamSynchronize(stream), f"cuStreamSynchronize ({what})" if what else "cuStreamSynchronize")


def create_event(*, timing: bool = True, api=None):
    """A new event; ``timing=False`` makes a cheaper one that cannot time (only order and query)."""
    api = api if api is not None else drv
    flags = 0 if timing else api.CUevent_flags.CU_EVENT_DISABLE_TIMING
    return check(api.cuEventCreate(flags), "cuEventCreate")


def destroy_event(event, *, api=None) -> None:
    """Release an event (legal while work before it is still pending: the driver frees it afterwards)."""
    api = api if api is not None else drv
    check(api.cuEventDestroy(event), "cuEventDestroy")


def record_event(event, stream, *, api=None) -> None:
    """Mark the point in ``stream`` that ``event`` stands for (the work queued so far)."""
    api = api if api is not None else drv
    check(api.cuEventRecord(event, stream), "cuEventRecord")


def event_synchronize(event, *, api=None) -> None:
    """Wait on the host until the work before ``event``'s latest record has run (at once if it never was)."""
    api = api if api is not None else drv
    check(api.cuEventSynchronize(event), "cuEventSynchronize")


def wait_event(stream, event, *, api=None) -> None:
    """Order ``stream`` after ``event``: its later work starts once the work before the event is done."""
    api = api if api is not None else drv
    check(api.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")


def wait_stream(stream, other, *, api=None) -> None:
    """Order ``stream`` after the work queued on ``other`` so far (an event recorded on ``other`` and
    waited on; the event is released at once, as CUDA allows)."""
    api = api if api is not None else drv
    event = create_event(timing=False, api=api)
    try:
        record_event(event, other, api=api)
        wait_event(stream, event, api=api)
    finally:
        api.cuEventDestroy(event)  # a failure to release must not hide the one that matters
