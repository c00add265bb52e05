"""Hot reload: a saved kernel file becomes new code for the blocks that use it, off the engine thread.

File events are debounced and deduplicated by content (``watch_files``). For each change the kernel is
loaded or recompiled on the watcher's thread by ``Block.reload_kernel`` (the path ``Block.reload`` takes
too), which hands new code to ``Block.set_code``: a Code-tier change (same parameter layout) or a
Structure-tier change folded into the engine's pending plan. The Code tier swaps the function in the exec
node and records the code key in the running plan (``_build.runs_code``), the one place that says what
runs. A file that fails to load or compile produces one diagnostic with the loader's or compiler's message;
the old kernel keeps running.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from reactivex.disposable import CompositeDisposable

from ..cuda import _nvtx
from ..model._events import FileChanged, Tier
from ..streams._files import watch_files
from ._records import Diagnostic


def kernel_files(blocks) -> dict[str, list[tuple[object, str]]]:
    """path -> [(block, kernel name)] for every kernel that came from a file (and its .json sidecar)."""
    from ..model._describe import KernelSpec

    out: dict[str, list] = {}
    for b in blocks:
        for k in b.description.kernels:
            if isinstance(k, KernelSpec) and os.path.isfile(k.code.origin):
                origin = str(Path(k.code.origin).resolve())
                out.setdefault(origin, []).append((b, k.name))
                out.setdefault(str(Path(origin).with_suffix(".json")), []).append((b, k.name))
    return out


def reload_failed(rt) -> Callable[[Exception, object, str], None]:
    """What a HotReload of the engine with runtime ``rt`` reports through: a failed reload (or watch) puts its
    block in "warning" and publishes one error diagnostic saying the previous kernel keeps running."""

    def report(err: Exception, block, what: str) -> None:
        message = f"{what} failed, the previous kernel keeps running: {err}"
        if block is not None:
            block.state, block.message = "warning", message
        details = tuple(getattr(err, "diagnostics", ()))
        rt.reporter.publish(Diagnostic("error", block.name if block else "watch", message, rt.frame,
                                    block.id if block else None, details))

    return report


class HotReload:
    """Watches the kernel files of an engine's blocks; new blocks' directories join as they are added."""

    def __init__(self, blocks: Callable[[], tuple], report: Callable[[Exception, object, str], None],
                 publish: Callable[[FileChanged], None], *, debounce: float = 0.05, scheduler=None):
        self._blocks = blocks
        self._report = report
        self._publish = publish
        self._debounce = debounce
        self._scheduler = scheduler
        self._dirs: set[str] = set()
        self._subs = CompositeDisposable()
        self.reloads = 0
        self.failures = 0
        _nvtx.instrument(self, reload=lambda block, kernel: f"reload {block.name}/{kernel}")  # only under Nsight

    def refresh(self) -> None:
        """Watch every directory holding a kernel file of a current block (idempotent)."""
        dirs = {str(Path(p).parent) for p in kernel_files(self._blocks())}
        for d in sorted(dirs - self._dirs):
            self._dirs.add(d)
            obs = watch_files([d], debounce=self._debounce, scheduler=self._scheduler)
            self._subs.add(obs.subscribe(on_next=self._changed, on_error=lambda e: self._report(e, None, "watch")))

    def _changed(self, ev: FileChanged) -> None:
        self._publish(ev)
        users = kernel_files(self._blocks()).get(str(Path(ev.path).resolve()), [])
        for block, kernel in users:
            self.reload(block, kernel)

    def reload(self, block, kernel: str) -> Tier | None:
        """The one reload path (``Block.reload_kernel``, which ``Block.reload`` takes too), reporting a broken
        save instead of raising; the tier of the change, or None."""
        try:
            tier = block.reload_kernel(kernel)
        except Exception as e:  # a broken save: report it, keep the old kernel
            self.failures += 1
            self._report(e, block, "reload")
            return None
        if tier is not None:
            self.reloads += 1
        return tier

    def close(self) -> None:
        self._subs.dispose()
