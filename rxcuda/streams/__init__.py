"""Streams: every change to a running pipeline is an Observable of typed events, coalesced into plans.

Producers (parameter bindings, file watchers, structure edits) emit from any thread; their events are
folded into a :class:`PendingPlan` under a lock in O(1), and the engine drains one :class:`UpdatePlan`
per frame, applying its tiers highest first (Structure > Code > Recapture > Parameters).

Real streams in (``media``): audio files and sound cards, video files and cameras as Observables of
:class:`MediaFrame` (the data, the source's timestamp ``t``), each saying what happens when the consumer
falls behind.
"""

from ..model._events import (
    BlockAdded,
    BlockChanged,
    BlockRemoved,
    ChangeEvent,
    CodeChanged,
    Connected,
    Disconnected,
    FileChanged,
    LaunchChanged,
    ParameterChanged,
    PortRebound,
    Tier,
)
from . import _media as media  # audio and video sources: rxcuda.streams.media.audio_file(...) & co.
from ._bind import bind_parameter
from ._broadcast import Broadcast
from ._coalesce import PendingPlan, UpdatePlan
from ._files import DEFAULT_PATTERNS, watch_files
from ._media import MediaFrame, MediaSourceError
from ._operators import coalesce_into, debounce_by_content, file_digest, sample_every

__all__ = [
    "Broadcast",
    "DEFAULT_PATTERNS",
    "BlockAdded",
    "BlockChanged",
    "BlockRemoved",
    "ChangeEvent",
    "CodeChanged",
    "Connected",
    "Disconnected",
    "FileChanged",
    "LaunchChanged",
    "MediaFrame",
    "MediaSourceError",
    "ParameterChanged",
    "PendingPlan",
    "PortRebound",
    "Tier",
    "UpdatePlan",
    "bind_parameter",
    "coalesce_into",
    "debounce_by_content",
    "file_digest",
    "media",
    "sample_every",
    "watch_files",
]
