"""Regions in an engine: adding a region with its bodies' blocks, and removing a region or a body member.

The region blocks themselves (``If``, ``IfElse``, ``While``, ``For``) are declarations: ``rxcuda.blocks._regions``.
"""

from __future__ import annotations

from ..blocks._blocks import Block
from ..blocks._regions import CONDITION, Region


def add_region(engine, region: Region) -> None:
    """Add ``region`` with every block of its bodies not yet in ``engine`` (regions in a body recursively),
    then connect its condition. A failure undoes what this call added."""
    rt = engine._rt
    added: list[Block] = []
    try:
        for member in region.members:
            if member._engine is engine:
                continue
            if isinstance(member, Region):
                add_region(engine, member)
            else:
                engine._model.add(member, engine)
            added.append(member)
        engine._model.add(region, engine)
        added.append(region)
        with rt.lock:
            for other in rt.regions.values():
                twice = {b.id for b in other.members} & {b.id for b in region.members}
                if twice:
                    name = rt.blocks[next(iter(twice))].name
                    raise ValueError(f"{name} is already in the body of {other.name}; a block runs in one place: "
                                     f"take it out of one of the regions")
            rt.regions[region.id] = region
        if region.condition is not None:
            engine.connect(region.condition, region[CONDITION])
    except BaseException:
        with rt.lock:
            rt.regions.pop(region.id, None)
        for b in reversed(added):
            if b._engine is engine:
                engine._model.remove(b, engine._gpu)
        raise
    if engine._reload is not None:
        engine._reload.refresh()


def remove_region_member(engine, block: Block) -> None:
    """Remove ``block``; a region goes with its bodies' blocks, and a body member leaves its region's body."""
    rt = engine._rt
    if rt.blocks.get(block.id) is not block:
        raise ValueError(f"{block.name} is not in this engine")
    with rt.lock:
        for region in rt.regions.values():
            if block in region.members:
                region.bodies = tuple(tuple(b for b in body if b is not block) for body in region.bodies)
        rt.regions.pop(block.id, None)
    engine._model.remove(block, engine._gpu)
    if isinstance(block, Region):
        for member in block.members:
            if rt.blocks.get(member.id) is member:
                remove_region_member(engine, member)
