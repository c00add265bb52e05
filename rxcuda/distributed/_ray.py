"""Ray, imported when a distributed engine needs it (importing rxcuda.distributed does not), and what its errors
say about an actor."""

from __future__ import annotations

from typing import Any

INSTALL = "pip install '.[ray]' from a checkout of rxcuda (docs/getting-started.md#install)"


def ray_module():
    """The ``ray`` module, or an ImportError saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"rxcuda.distributed runs on Ray, which is not installed: {INSTALL} ({e})") from e
    if not hasattr(ray, "init"):  # without Ray, a folder named ray on the path imports as an empty namespace package
        where = ", ".join(getattr(ray, "__path__", ())) or "?"
        raise ImportError(f"rxcuda.distributed runs on Ray, which is not installed: {INSTALL} ('import ray' found "
                          f"only the folder {where}, not Ray)")
    return ray


def backend_module(backend: str):
    """What a distributed engine's workers run on: ``"ray"`` (the ``ray`` module) or ``"process"`` (child
    processes of this one, with the part of Ray's API the engine uses: ``_procs``)."""
    if backend == "ray":
        return ray_module()
    if backend == "process":
        from . import _procs

        return _procs
    raise ValueError(f"'backend' must be 'ray' or 'process' (got {backend!r})")


def cluster_address(address: str | None, environ=None) -> str:
    """Where a distributed engine that finds Ray not initialised starts it: ``address`` when given, else
    ``RAY_ADDRESS``, else a new local cluster (``"local"``: plain ``ray.init()`` would join the latest cluster started
    on this machine instead, another process's included).

    >>> cluster_address(None, {}), cluster_address(None, {"RAY_ADDRESS": "auto"}), cluster_address("ray://h:1", {})
    ('local', 'auto', 'ray://h:1')
    """
    import os

    return address or (os.environ if environ is None else environ).get("RAY_ADDRESS") or "local"


def names_actor(err, actor) -> bool:
    """Whether a Ray error is about ``actor`` (or names no actor)."""
    aid = getattr(err, "actor_id", None)
    return aid is None or str(aid) == actor._actor_id.hex()


_OFFERED: list[tuple[str, ...]] = []  # what direct_transports found, once per process


def direct_transports(ray, nodes) -> tuple[str, ...]:
    """The tensor transports Ray Direct Transport offers between actors in this process (``NCCL``, ``NIXL``,
    ``GLOO``, ``CUDA_IPC``: Ray registers them when torch imports; ``NIXL`` counted only where the ``nixl`` package
    is installed); () on one node (``nodes``: worker -> Ray node id), without torch, or off Ray (``_procs``).
    Looked up once per process (importing torch takes seconds)."""
    if getattr(ray, "__name__", "") != "ray" or len({n for n in nodes.values() if n is not None}) < 2:
        return ()
    if not _OFFERED:
        import importlib
        import importlib.util

        found: list[str] = []
        try:
            util: Any = importlib.import_module("ray.experimental.rdt.util")
        except ImportError:  # a Ray without Ray Direct Transport
            util = None
        for name in ("NCCL", "NIXL", "GLOO", "CUDA_IPC") if util is not None else ():
            try:
                util.get_transport_data_type(name)  # ValueError: not registered (no torch)
            except Exception:
                continue
            if name != "NIXL" or importlib.util.find_spec("nixl") is not None:
                found.append(name)
        _OFFERED.append(tuple(found))
    return _OFFERED[0]
