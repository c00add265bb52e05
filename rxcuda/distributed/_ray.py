"""Ray, imported when a distributed engine needs it (importing rxcuda.distributed does not), and what its errors
say about an actor."""

from __future__ import annotations


def ray_module():
    """The ``ray`` module, or an ImportError saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("rxcuda.distributed runs on Ray, which is not installed: pip install 'rxcuda[ray]' "
                          f"({e})") from e
    return ray


def names_actor(err, actor) -> bool:
    """Whether a Ray error is about ``actor`` (or names no actor)."""
    aid = getattr(err, "actor_id", None)
    return aid is None or str(aid) == actor._actor_id.hex()
