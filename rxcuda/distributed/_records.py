"""What a distributed engine tells its users: frames and diagnostics tagged with the fragment (the worker) they
come from, one distributed frame's outcome, and the pipeline as data with its placement and links."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ..engine._engine import Diagnostic, Frame
from ..model._describe import PipelineDescription
from ._placement import RemoteLink, Worker


@attrs.frozen
class FragmentFrame:
    """One worker's frame within distributed frame ``index`` (``engine.frames`` emits one per worker)."""

    worker: str
    index: int
    frame: Frame


@attrs.frozen
class FragmentDiagnostic:
    """A diagnostic of one worker's engine, or about the worker itself (it died, it is back), tagged with the
    worker's name."""

    worker: str
    diagnostic: Diagnostic

    @property
    def severity(self) -> str:
        return self.diagnostic.severity

    @property
    def message(self) -> str:
        return self.diagnostic.message

    def __str__(self) -> str:
        d = self.diagnostic
        return f"[{self.worker}] {d.severity}: {d.subject}: {d.message}"


@attrs.frozen
class DistributedFrame:
    """What one distributed frame did: its index and each worker's :class:`~rxcuda.Frame` (None for a worker
    that skipped it: down, restarting, or fed by one that is)."""

    index: int
    fragments: Mapping[str, Frame | None]

    @property
    def complete(self) -> bool:
        """Whether every worker ran this frame."""
        return all(f is not None for f in self.fragments.values())


@attrs.frozen
class DistributedDescription:
    """The pipeline as data (``pipeline``: what ``rxcuda.plan`` takes), where each block runs (``placement``:
    block id -> worker), the workers, the links between them with the transport each one uses, and how each
    worker's frames are stepped (``stepping``: ``"clock"``, through named pipes on the driver's host, or ``"ray"``,
    a Ray call per frame), and what ``Engine(share_gpu=...)`` came to and why (``share_gpu``: ``"share_gpu='auto' ->
    mps: workers 'a', 'b' share a GPU of the driver's host: ..."``)."""

    pipeline: PipelineDescription
    placement: Mapping[int, str]
    workers: Mapping[str, Worker]
    links: tuple[RemoteLink, ...]
    stepping: Mapping[str, str] = attrs.field(factory=dict)
    share_gpu: str = ""

    def transports(self, why: bool = False) -> dict[str, str]:
        """Each link's transport by its label: ``{"first.out -> second.x": "ipc"}``; ``why=True``: with why it was
        chosen and how the ends meet (``"host: one host: through a shared-memory board, ..."``)."""
        return {ln.label: f"{ln.transport}: {ln.why}" if why else ln.transport for ln in self.links}
