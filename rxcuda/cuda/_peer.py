"""Devices of one host seen from each other: whether one reads the other's memory (peer access), and what a
device's graph needs of the others when one pipeline spans several (events, the other devices' buffers, the
route each copy takes).

A copy between two devices takes one of three routes:

- ``"local"``: both "devices" are the same GPU (``Engine(devices=[0, 0])``): a device-to-device copy;
- ``"peer"``: the reading device has peer access to the other's memory (``cuDeviceCanAccessPeer``, enabled
  with ``cuCtxEnablePeerAccess``): one copy over NVLink or PCIe;
- ``"host"``: no peer access: staged through page-locked host memory, a device-to-host copy and a
  host-to-device copy.

>>> from rxcuda.cuda import NullDriver
>>> from rxcuda.cuda._device import Device
>>> api = NullDriver(devices=2)
>>> d0, d1 = Device(0, api=api), Device(1, api=api)
>>> route(d0, d1), route(d0, Device(0, api=api))
('peer', 'local')
>>> api.peer_access = False
>>> route(d1, d0)
'host'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._driver import check, is_sticky

LOCAL, PEER, HOST = "local", "peer", "host"
ROUTES = {LOCAL: "a device-to-device copy (both are one GPU)", PEER: "a peer copy (peer access on)",
          HOST: "staged through page-locked host memory (no peer access between them)"}
ON_HOST = "a device-to-device copy (both are the CPU device, whose memory is the host's)"  # its only route


def describe_route(name: str, api) -> str:
    """How a copy of route ``name`` goes, in words, on the driver ``api`` (the CPU device is one device)."""
    return ON_HOST if getattr(api, "on_host", False) and name == LOCAL else ROUTES[name]


def route(src, dst) -> str:
    """How a copy from device ``src``'s memory into device ``dst``'s goes (``rxcuda.cuda._device.Device``
    each); enables ``dst``'s access to ``src``'s memory where the hardware allows it."""
    if src.ordinal == dst.ordinal:
        return LOCAL
    api = dst.api
    if not check(api.cuDeviceCanAccessPeer(dst.handle, src.handle), "cuDeviceCanAccessPeer"):
        return HOST
    enable_peer_access(src, dst)
    return PEER


def enable_peer_access(src, dst) -> None:
    """Let ``dst``'s context read and write ``src``'s memory (once; an access enabled already is fine).
    Leaves ``dst``'s context current."""
    api = dst.api
    dst.make_current()
    (err,) = api.cuCtxEnablePeerAccess(src.context, 0)
    if err != api.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
        check((err,), f"cuCtxEnablePeerAccess (device {dst.ordinal} reading device {src.ordinal})")


class Crossing:
    """What the graph of device ``device`` (a position in the engine's device list) needs of the others:
    ``events``: the events ordering the devices' graphs (by the split's event index); ``remote``: (device,
    buffer id) -> device pointer of another device's buffer; ``routes``: source device -> the route of a copy
    from it (``route``); ``contexts``: each device's context, for the copy nodes' staged halves."""

    __slots__ = ("contexts", "device", "events", "remote", "routes")

    def __init__(self, device: int, events: Sequence, remote: Mapping[tuple[int, int], int],
                 routes: Mapping[int, str], contexts: Sequence = ()):
        self.device = device
        self.events = events
        self.remote = remote
        self.routes = routes
        self.contexts = contexts

    def event(self, index: int):
        return self.events[index]

    def pointer(self, device: int, buffer: int) -> int:
        try:
            return self.remote[(device, buffer)]
        except KeyError:
            raise KeyError(f"buffer {buffer} of device {device} has no memory yet: build the device it lives on "
                           "before the devices reading it") from None

    def route(self, src_device: int) -> str:
        return self.routes.get(src_device, LOCAL)


def lost(stream, *, api) -> bool:
    """Whether ``stream``'s context is lost (a sticky error, such as a kernel's illegal address); never waits."""
    try:
        check(api.cuStreamQuery(stream), "cuStreamQuery")
    except Exception as e:
        return is_sticky(e)
    return False
