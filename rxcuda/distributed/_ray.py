"""Ray, imported when a distributed engine needs it (importing rxcuda.distributed does not), and what its errors
say about an actor."""

from __future__ import annotations

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


def names_actor(err, actor) -> bool:
    """Whether a Ray error is about ``actor`` (or names no actor)."""
    aid = getattr(err, "actor_id", None)
    return aid is None or str(aid) == actor._actor_id.hex()
