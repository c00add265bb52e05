"""CUDA IPC: device memory and events shared between processes of one host, as named verbs.

An exporting process allocates memory with ``cuMemAlloc`` (IPC refuses memory from pools) and hands its
64-byte handle (``cuIpcGetMemHandle``) to another process, which maps it (``cuIpcOpenMemHandle``) and reads it
in place; an interprocess event (``cuEventCreate`` with ``CU_EVENT_INTERPROCESS``, ``cuIpcGetEventHandle`` /
``cuIpcOpenEventHandle``) orders the importer's stream after the exporter's writes with no host wait. Handles
travel as ``bytes`` (picklable), since cuda.bindings' handle structs are not.

>>> from rxcuda.cuda import NullDriver
>>> api = NullDriver()
>>> mem = export_memory(api, 1024)
>>> ptr = open_memory(api, mem.handle)
>>> close_memory(api, ptr); mem.close()
>>> api.leaks()
{}
"""

from __future__ import annotations

import ctypes
from typing import Any

import attrs

from ._driver import check, drv

HANDLE_BYTES = 64  # CU_IPC_HANDLE_SIZE


def _to_bytes(handle) -> bytes:
    return ctypes.string_at(handle.getPtr(), HANDLE_BYTES)


def _from_bytes(cls, data: bytes):
    if not isinstance(data, bytes | bytearray) or len(data) != HANDLE_BYTES:
        raise ValueError(f"an IPC handle is {HANDLE_BYTES} bytes (got {type(data).__name__} of "
                         f"{len(data) if isinstance(data, bytes | bytearray) else '?'})")
    handle = cls()
    ctypes.memmove(handle.getPtr(), bytes(data), HANDLE_BYTES)
    return handle


@attrs.define(eq=False)
class ExportedMemory:
    """Device memory this process owns and shares: ``ptr`` here, ``handle`` (bytes) for the other process.
    ``close()`` frees it; the importers must have closed their mapping first."""

    api: Any
    ptr: int
    nbytes: int
    handle: bytes

    def close(self) -> None:
        if self.ptr:
            check(self.api.cuMemFree(self.ptr), "cuMemFree")
            self.ptr = 0


@attrs.define(eq=False)
class ExportedEvent:
    """An interprocess event this process records; ``handle`` (bytes) opens it in another process."""

    api: Any
    event: Any
    handle: bytes

    def record(self, stream: int) -> None:
        check(self.api.cuEventRecord(self.event, stream), "cuEventRecord")

    def synchronize(self) -> None:
        """Wait on the host until the work before the event's latest record has run."""
        check(self.api.cuEventSynchronize(self.event), "cuEventSynchronize")

    def close(self) -> None:
        if self.event is not None:
            check(self.api.cuEventDestroy(self.event), "cuEventDestroy")
            self.event = None


def export_memory(api, nbytes: int) -> ExportedMemory:
    """Allocate ``nbytes`` of device memory in the current context and export it."""
    api = api if api is not None else drv
    ptr = check(api.cuMemAlloc(max(int(nbytes), 1)), "cuMemAlloc")
    try:
        handle = check(api.cuIpcGetMemHandle(ptr), "cuIpcGetMemHandle")
    except BaseException:
        api.cuMemFree(ptr)
        raise
    return ExportedMemory(api, int(ptr), int(nbytes), _to_bytes(handle))


def open_memory(api, handle: bytes) -> int:
    """Map memory another process exported (its handle bytes) into the current context; returns the pointer.
    Close it with :func:`close_memory` before the exporter frees it."""
    api = api if api is not None else drv
    h = _from_bytes(api.CUipcMemHandle, handle)
    flags = api.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    return int(check(api.cuIpcOpenMemHandle(h, flags), "cuIpcOpenMemHandle"))


def close_memory(api, ptr: int) -> None:
    api = api if api is not None else drv
    check(api.cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")


def export_event(api) -> ExportedEvent:
    """An interprocess event (no timing, as CUDA requires for IPC) in the current context, exported."""
    api = api if api is not None else drv
    flags = int(api.CUevent_flags.CU_EVENT_DISABLE_TIMING) | int(api.CUevent_flags.CU_EVENT_INTERPROCESS)
    ev = check(api.cuEventCreate(flags), "cuEventCreate")
    try:
        handle = check(api.cuIpcGetEventHandle(ev), "cuIpcGetEventHandle")
    except BaseException:
        api.cuEventDestroy(ev)
        raise
    return ExportedEvent(api, ev, _to_bytes(handle))


def open_event(api, handle: bytes):
    """An event another process exported (its handle bytes), usable in ``cuStreamWaitEvent`` here. Destroy it
    with ``cuEventDestroy`` when done."""
    api = api if api is not None else drv
    return check(api.cuIpcOpenEventHandle(_from_bytes(api.CUipcEventHandle, handle)), "cuIpcOpenEventHandle")


def copy_after(api, stream: int, event, dst: int, src: int, nbytes: int) -> None:
    """On ``stream``: wait for ``event`` (when given; on the GPU, no host wait), then copy ``nbytes`` from
    ``src`` to ``dst`` (device to device)."""
    api = api if api is not None else drv
    if event is not None:
        check(api.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")
    check(api.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")


def destroy_event(api, event) -> None:
    api = api if api is not None else drv
    check(api.cuEventDestroy(event), "cuEventDestroy")
