"""The engine's streams: diagnostics, frames, updates and change events as Observables, and the watcher that
turns saved kernel files into new code. A mixin of :class:`rxcuda.Engine` (``_engine``), kept apart so the
facade stays a list of verbs; it reads the engine's runtime, reporter and broadcasts."""

from __future__ import annotations

from typing import Any

from reactivex import Observable
from reactivex.disposable import Disposable

from ..model._events import STRUCTURE_EVENTS, CodeChanged, ParameterChanged
from ._reload import HotReload, reload_failed


class EngineStreams:
    """What an Engine offers as Observables (see :class:`rxcuda.Engine`)."""

    _rt: Any
    _frames: Any
    _updater: Any
    _file_changes: Any
    _reload: Any
    blocks: Any  # (the Engine's)

    def _check_open(self) -> None:  # the Engine's own check (it raises EngineClosedError once closed)
        raise NotImplementedError

    # -- streams -------------------------------------------------------------------------------------------
    @property
    def diagnostics(self) -> Observable:
        """Errors and warnings (Diagnostic), each naming its block, port or file. Past ones: diagnostic_log."""
        return self._rt.reporter.stream.observable

    @property
    def diagnostic_log(self) -> tuple:
        """The last 1000 diagnostics, oldest first: a snapshot (a tuple), so it can be indexed and sliced
        (``engine.diagnostic_log[-5:]``) while the engine goes on publishing."""
        return tuple(self._rt.reporter.log.copy())  # deque.copy() is atomic under the GIL; iterating is not

    @property
    def frames(self) -> Observable:
        """One Frame per tick (index, host time, tiers applied, state, GPU time with ``timing``), on the
        engine thread. A subscriber that raises is reported as a diagnostic; the frames go on."""
        return self._frames.observable

    @property
    def updates(self) -> Observable:
        """One AppliedUpdate per applied update plan (tiers, blocks, seconds)."""
        return self._updater.updates.observable

    @property
    def changes(self) -> Observable:
        """Every change event (ParameterChanged, CodeChanged, Connected, BlockAdded, ...) as it is made."""
        return self._rt.pending.changes

    @property
    def parameter_changes(self) -> Observable:
        """ParameterChanged events (block, parameter, value), as each value is set."""
        return self._rt.pending.of_type(ParameterChanged)

    @property
    def structure_changes(self) -> Observable:
        """Blocks added, removed or changed, connections made or removed."""
        return self._rt.pending.of_type(*STRUCTURE_EVENTS)

    @property
    def code_changes(self) -> Observable:
        """CodeChanged events: a block's kernel replaced (a saved file, a new source)."""
        return self._rt.pending.of_type(CodeChanged)

    @property
    def file_changes(self) -> Observable:
        """FileChanged events from watch() (debounced, deduplicated by content)."""
        return self._file_changes.observable

    def watch(self, *, debounce: float = 0.05, scheduler=None) -> Disposable:
        """Reload kernels when their files (.ptx/.cubin/.fatbin/.cu and .json sidecars) are saved.

        Reloading or recompiling happens on the watcher's thread; the new code is swapped in before a
        following frame (in place when the signature is unchanged). A broken save produces one diagnostic
        with the loader's or compiler's message and the old kernel keeps running. Returns a disposable.
        """
        self._check_open()
        if self._reload is None:
            self._reload = HotReload(lambda: self.blocks, reload_failed(self._rt),
                                     self._file_changes.emit,
                                     debounce=debounce, scheduler=scheduler)
        self._reload.refresh()
        return Disposable(self._stop_watch)

    def _watch_new(self) -> None:
        """Watch the files of blocks just added (while watch() is on)."""
        if self._reload is not None:
            self._reload.refresh()

    def _stop_watch(self) -> None:
        if self._reload is not None:
            self._reload.close()
            self._reload = None
