"""The composite instances of an engine: adding one adds its blocks and inner connections, removing one
removes them. The definitions and the instances themselves are ``rxcuda.blocks._composite``.
"""

from __future__ import annotations

from collections.abc import Callable

from reactivex.disposable import CompositeDisposable

from ..blocks._blocks import Block
from ..blocks._composite import Composite, CompositeInstance, flat_index, instantiate
from ..model._errors import ValidationError
from ._model import Model
from ._runtime import Runtime


class Composites:
    """The composite instances of an engine: adding one adds its blocks and inner connections (all or
    nothing), removing one removes them; blocks inside are removed or replaced only through it."""

    def __init__(self, rt: Runtime, model: Model):
        self.rt = rt
        self.model = model
        self.instances: dict[str, CompositeInstance] = {}  # by name, outermost instances only
        self.owner: dict[int, CompositeInstance] = {}  # block id -> the outermost instance it is part of

    def add(self, composite: Composite, engine) -> CompositeInstance:
        desc = composite.describe()
        flat_index(desc)  # every inner connection checked before the engine changes
        rt = self.rt
        with rt.lock:  # a rebuild on the engine thread sees all of the instance or none of it
            taken = {b.name for b in rt.blocks.values()}
            paths = ["/".join(path) for path, _ in desc.leaves()]
            name, i = desc.name, 2
            while name in self.instances or name in taken or any(f"{name}/{p}" in taken for p in paths):
                name, i = f"{desc.name}_{i}", i + 1
            inst = instantiate(name, desc)
            added: list[Block] = []
            try:
                for b in inst.blocks:
                    self.model.add(b, engine)
                    added.append(b)
                leaf = {tuple(b.name.split("/")[1:]): b for b in added}
                for (sp, s), (dp, d), c in desc.flat_connections():
                    self.model.connect(leaf[sp][s], leaf[dp][d], c.delay, c.initial)
            except BaseException:
                for b in reversed(added):
                    self.model.remove(b, _here)
                raise
            for x in inst._walk():
                x._engine = engine
            self.instances[name] = inst
            for b in added:
                self.owner[b.id] = inst
        return inst

    def remove(self, inst: CompositeInstance, gpu: Callable) -> None:
        root = inst.root
        if root is not inst:
            raise ValidationError(f"{inst.name} is part of composite instance '{root.name}'; remove that one",
                                  subject=inst.name)
        if self.instances.get(inst.name) is not inst:
            raise ValueError(f"composite instance {inst.name} is not in this engine")
        for x in inst._walk():
            subs, x._subscriptions = x._subscriptions, CompositeDisposable()
            subs.dispose()
        for b in inst.blocks:
            self.model.remove(b, gpu)
        with self.rt.lock:
            del self.instances[inst.name]
            for b in inst.blocks:
                self.owner.pop(b.id, None)
            for x in inst._walk():
                x._engine = None

    def check_removable(self, block: Block) -> None:
        """Refuse to remove a block that is part of an instance (naming the instance to remove instead)."""
        inst = self.owner.get(block.id)
        if inst is not None and self.rt.blocks.get(block.id) is block:
            raise ValidationError(f"{block.name} is part of composite instance '{inst.name}'; remove the whole "
                                  f"instance (engine.remove(instance)), or swap the block with engine.replace",
                                  subject=block.name)

    def replaced(self, block_id: int, old: Block, new: Block) -> None:
        """``new`` took ``old``'s place (and id) in the engine: the instance holding it now holds ``new``."""
        root = self.owner.get(block_id)
        if root is None:
            return
        for x in root._walk():
            for n, m in x._members.items():
                if m is old:
                    x._members[n] = new
            for p in x._params.values():
                p._targets = None  # resolved again on next use


def _here(fn, *args):
    return fn(*args)
