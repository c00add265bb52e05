"""Real streams in: audio and video as Rx Observables of :class:`MediaFrame`, played at their own rate.

Every source here has the same shape: a reader thread takes items from the source (a WAV file through
``soundfile``, a sound card through ``sounddevice``, a video file through PyAV, a camera through OpenCV),
paces them by the source's own timestamps (a file plays at its own rate; a device paces itself), and hands
them to the subscriber's thread through a small bounded queue. What happens when the consumer (the GPU, or
whatever the subscriber does) falls behind is chosen per subscription, ``when_behind=``:

- ``"drop"`` (the default): the reader never waits. When ``buffer`` items are already waiting, the
  oldest waiting item is dropped, and the next item delivered counts it in ``MediaFrame.dropped``. The
  source's clock is kept: what arrives is always recent. Right for live input (a sound card, a camera).
- ``"block"``: the reader waits for room, so nothing is lost and the source slows down to the consumer's
  pace (its timestamps still say where in the source each item is). Right for processing a file fully.

Each item carries the source's timestamp ``t`` (seconds from the start of the source: a file's
presentation time, a device's capture time) and its ``index``; ``engine.feed`` takes arrays, so feed
``frames.pipe(ops.map(lambda f: f.data))`` and put ``t`` into the frame through a scalar parameter
(``frames.subscribe(lambda f: block.set(t=f.t))``) or pair it with the outputs you observe.

>>> import numpy as np
>>> from reactivex import operators as ops
>>> from rxcuda.streams import media
>>> items = [(np.full(4, i, np.float32), i * 0.5) for i in range(3)]
>>> frames = media.paced(items, realtime=False, when_behind="block")
>>> [(f.index, f.t, float(f.data[0])) for f in frames.pipe(ops.to_list()).run()]
[(0, 0.0, 0.0), (1, 0.5, 1.0), (2, 1.0, 2.0)]
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import attrs
import numpy as np
import reactivex
from reactivex import Observable
from reactivex.disposable import Disposable

WHEN_BEHIND = ("drop", "block")

__all__ = ["WHEN_BEHIND", "MediaFrame", "MediaSourceError", "audio_file", "audio_input", "camera", "paced",
           "video_file"]


class MediaSourceError(RuntimeError):
    """A media source could not start: a missing optional package, a file it cannot read, no such device."""


@attrs.frozen(eq=False)
class MediaFrame:
    """One item of a media source.

    ``data``: audio as float32 ``(block, channels)``, video as uint8 ``(height, width, 3)`` (RGB).
    ``t``: the source's timestamp in seconds (its presentation time). ``index``: the item's number in the
    source. ``dropped``: items dropped just before this one because the consumer fell behind (``"drop"``).
    """

    data: np.ndarray
    t: float
    index: int
    dropped: int = 0


def _check_options(buffer: int, when_behind: str, what: str) -> None:
    if when_behind not in WHEN_BEHIND:
        raise ValueError(f"{what}(when_behind=...) takes 'drop' (live: the oldest waiting item is dropped) or "
                         f"'block' (the source waits for the consumer) (got {when_behind!r})")
    if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
        raise ValueError(f"{what}(buffer=...) must be a positive int: how many items may wait (got {buffer!r})")


def paced(items: Iterable[tuple[np.ndarray, float]] | Callable[[], Iterator[tuple[np.ndarray, float]]], *,
          realtime: bool = True, buffer: int = 4, when_behind: str = "drop", loop: bool = False,
          name: str = "paced") -> Observable:
    """An Observable of :class:`MediaFrame` from ``(data, t)`` pairs, emitted at the times ``t`` say.

    ``items``: an iterable, or a function returning a fresh iterator (each subscription reads its own).
    ``realtime``: wait until ``t`` seconds after the subscription started before handing item ``t`` over
    (``False``: as fast as the consumer takes them). ``buffer`` and ``when_behind``: see the module docstring.
    ``loop``: start over at the end (a fresh iterator, with ``t`` and ``index`` going on). Items arrive on a
    thread of the subscription's own; disposing the subscription stops both threads.
    """
    _check_options(buffer, when_behind, name)
    if not callable(items) and iter(items) is items and loop:
        raise ValueError(f"{name}(loop=True) needs items it can read again: a list, or a function returning "
                         "an iterator (got a one-shot iterator)")

    def subscribe(observer, scheduler=None):
        return _Pump(items, observer, realtime, buffer, when_behind, loop, name).start()

    return reactivex.create(subscribe)


class _Pump:
    """A reader thread (paces, fills the queue) and a delivery thread (empties it into the observer)."""

    def __init__(self, items, observer, realtime, buffer, when_behind, loop, name):
        self.items, self.observer, self.realtime, self.loop, self.name = items, observer, realtime, loop, name
        self.buffer, self.block = buffer, when_behind == "block"
        self.queue: collections.deque = collections.deque()
        self.cv = threading.Condition()
        self.stopped = False
        self.done: BaseException | bool | None = None  # True: completed; an exception: failed

    def start(self) -> Disposable:
        for target, what in ((self._read, "reader"), (self._deliver, "delivery")):
            threading.Thread(target=target, name=f"rxcuda-{self.name}-{what}", daemon=True).start()
        return Disposable(self.stop)

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()

    def _iterate(self):
        offset_t, offset_i = 0.0, 0
        while True:
            t_last, i = 0.0, -1
            source = self.items() if callable(self.items) else self.items
            for i, (data, t) in enumerate(source):
                t_last = offset_t + float(t)
                yield data, t_last, offset_i + i
            if not self.loop or i < 0:
                return
            offset_t, offset_i = t_last + (t_last - offset_t) / max(i, 1), offset_i + i + 1

    def _read(self) -> None:
        start = time.monotonic()
        try:
            for data, t, index in self._iterate():
                if self.realtime:
                    with self.cv:
                        self.cv.wait_for(lambda: self.stopped, timeout=max(0.0, start + t - time.monotonic()))
                with self.cv:
                    if self.block:
                        self.cv.wait_for(lambda: self.stopped or len(self.queue) < self.buffer)
                    if self.stopped:
                        return
                    carried = 0
                    if len(self.queue) >= self.buffer:  # "drop": the oldest waiting item goes; the item
                        gone = self.queue.popleft()     # after it (now the oldest) counts it
                        if self.queue:
                            self.queue[0][3] += gone[3] + 1
                        else:
                            carried = gone[3] + 1
                    self.queue.append([data, t, index, carried])
                    self.cv.notify_all()
            self._finish(True)
        except Exception as e:  # a decoder error ends the stream with it
            self._finish(e)

    def _finish(self, how) -> None:
        with self.cv:
            self.done = how
            self.cv.notify_all()

    def _deliver(self) -> None:
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.stopped or self.queue or self.done is not None)
                if self.stopped:
                    return
                if not self.queue:
                    done = self.done
                    break
                data, t, index, dropped = self.queue.popleft()
                self.cv.notify_all()
            self.observer.on_next(MediaFrame(data, t, index, dropped))
        if done is True:
            self.observer.on_completed()
        else:
            self.observer.on_error(done)


def _need(module: str, what: str, install: str = "pip install '.[media]' in rxcuda's checkout"):
    import importlib

    try:
        return importlib.import_module(module)
    except (ImportError, OSError) as e:  # sounddevice raises OSError where PortAudio is missing
        raise MediaSourceError(f"{what} needs the '{module}' package ({e}); install it with {install}") from e


def _existing(path, what: str) -> str:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise MediaSourceError(f"{what}: no such file {path!r}")
    return path


def audio_file(path: str | os.PathLike, block: int = 4096, *, realtime: bool = True, buffer: int = 4,
               when_behind: str = "drop", loop: bool = False, mono: bool = False) -> Observable:
    """A sound file (WAV, FLAC, OGG: what ``soundfile`` reads) as blocks of ``block`` frames, float32
    ``(block, channels)`` (``mono=True``: ``(block,)``, the channels averaged), played at the file's own
    rate. ``t`` is the block's first sample's time. The last block is padded with zeros to ``block``.

    >>> sound = media.audio_file("tone.wav", 4096, mono=True)                  # doctest: +SKIP
    >>> engine.feed(window["x"], sound.pipe(ops.map(lambda f: f.data)))        # doctest: +SKIP
    """
    _check_options(buffer, when_behind, "audio_file")
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise ValueError(f"audio_file(block=...) must be a positive int: frames per block (got {block!r})")
    sf = _need("soundfile", "audio_file")
    path = _existing(path, "audio_file")
    try:
        rate = sf.info(path).samplerate
    except Exception as e:
        raise MediaSourceError(f"audio_file: soundfile cannot read {path!r} ({e})") from e

    def items():
        for i, chunk in enumerate(sf.blocks(path, blocksize=block, dtype="float32", always_2d=True, fill_value=0)):
            yield (chunk.mean(axis=1, dtype=np.float32) if mono else chunk), i * block / rate

    return paced(items, realtime=realtime, buffer=buffer, when_behind=when_behind, loop=loop, name="audio_file")


def audio_input(block: int = 4096, *, samplerate: float = 48_000, channels: int = 1, device=None,
                buffer: int = 4, when_behind: str = "drop") -> Observable:
    """A sound card's input through ``sounddevice`` (PortAudio), blocks of ``block`` frames as float32
    ``(block, channels)``; ``t`` is the block's capture time (the stream's ADC clock, from its start).
    The device paces itself; ``when_behind="block"`` lets the reader wait, and PortAudio then reports
    input overflows (printed once as a warning by sounddevice). Fails with :class:`MediaSourceError`
    naming the reason where there is no sound card.
    """
    _check_options(buffer, when_behind, "audio_input")
    sd = _need("sounddevice", "audio_input")

    def items():
        try:
            stream = sd.InputStream(samplerate=samplerate, blocksize=block, channels=channels, device=device,
                                    dtype="float32")
        except Exception as e:
            raise MediaSourceError(f"audio_input: no sound card input ({e})") from e
        with stream:
            t0 = None
            while True:
                data, _overflowed = stream.read(block)
                now = stream.time
                t0 = now if t0 is None else t0
                yield data.copy(), now - t0

    return paced(items, realtime=False, buffer=buffer, when_behind=when_behind, name="audio_input")


def video_file(path: str | os.PathLike, *, realtime: bool = True, buffer: int = 2, when_behind: str = "drop",
               loop: bool = False, gray: bool = False) -> Observable:
    """A video file decoded by PyAV, one item per frame: uint8 RGB ``(height, width, 3)`` (``gray=True``:
    float32 luminance in [0, 1], ``(height, width)``), played at its own rate. ``t`` is the frame's
    presentation time in seconds.

    >>> frames = media.video_file("clip.mp4", gray=True)                          # doctest: +SKIP
    """
    _check_options(buffer, when_behind, "video_file")
    av = _need("av", "video_file")
    path = _existing(path, "video_file")
    try:
        with av.open(path) as probe:
            if not probe.streams.video:
                raise MediaSourceError(f"video_file: {path!r} has no video stream")
    except MediaSourceError:
        raise
    except Exception as e:
        raise MediaSourceError(f"video_file: PyAV cannot open {path!r} ({e})") from e

    def items():
        with av.open(path) as container:
            stream = container.streams.video[0]
            for i, frame in enumerate(container.decode(stream)):
                t = float(frame.pts * stream.time_base) if frame.pts is not None else i / float(stream.average_rate)
                if gray:
                    yield frame.to_ndarray(format="gray").astype(np.float32) / 255.0, t
                else:
                    yield frame.to_ndarray(format="rgb24"), t

    return paced(items, realtime=realtime, buffer=buffer, when_behind=when_behind, loop=loop, name="video_file")


def camera(index: int = 0, *, buffer: int = 2, when_behind: str = "drop") -> Observable:
    """A camera through OpenCV (``cv2.VideoCapture(index)``), uint8 RGB ``(height, width, 3)`` frames; ``t``
    is the capture time in seconds from the first frame. The camera paces itself. Fails with
    :class:`MediaSourceError` where OpenCV is missing or there is no such camera."""
    _check_options(buffer, when_behind, "camera")
    cv2 = _need("cv2", "camera", "pip install opencv-python-headless (OpenCV is left out of the media extra)")

    def items():
        cap = cv2.VideoCapture(index)
        if not cap.isOpened():
            raise MediaSourceError(f"camera: OpenCV cannot open camera {index}")
        try:
            t0 = None
            while True:
                ok, bgr = cap.read()
                if not ok:
                    return
                now = time.monotonic()
                t0 = now if t0 is None else t0
                yield cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), now - t0
        finally:
            cap.release()

    return paced(items, realtime=False, buffer=buffer, when_behind=when_behind, name="camera")
