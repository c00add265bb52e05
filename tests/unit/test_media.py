"""Real streams in (rxcuda.streams.media): pacing, what happens when the consumer falls behind, timestamps,
a WAV file decoded by soundfile and a video file decoded by PyAV, and every error path."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
from reactivex import operators as ops

from rxcuda.streams import MediaFrame, MediaSourceError, media


def _collect(source, timeout=10.0):
    """Every item until completion (or the error), on the test's thread."""
    got, done, err = [], threading.Event(), []
    sub = source.subscribe(got.append, lambda e: (err.append(e), done.set()), done.set)
    assert done.wait(timeout), "the source did not complete"
    sub.dispose()
    if err:
        raise err[0]
    return got


def test_block_delivers_every_item_in_order_with_its_timestamp():
    rng = np.random.default_rng()
    items = [(rng.normal(size=8).astype(np.float32), 0.01 * i) for i in range(50)]
    got = _collect(media.paced(items, realtime=False, when_behind="block", buffer=1))
    assert [f.index for f in got] == list(range(50))
    assert [f.t for f in got] == pytest.approx([0.01 * i for i in range(50)])
    assert all(f.dropped == 0 for f in got)
    for f, (data, _) in zip(got, items, strict=True):
        np.testing.assert_array_equal(f.data, data)


def test_block_makes_the_source_wait_for_a_slow_consumer():
    release, got = threading.Event(), []

    def slow(f):
        got.append(f)
        release.wait(5)

    sub = media.paced([(np.zeros(1), 0.0)] * 20, realtime=False, when_behind="block", buffer=2).subscribe(slow)
    time.sleep(0.2)
    assert len(got) == 1  # the consumer holds item 0; nothing is dropped, the reader waits
    release.set()
    deadline = time.monotonic() + 5
    while len(got) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    sub.dispose()
    assert [f.index for f in got] == list(range(20)) and sum(f.dropped for f in got) == 0


def test_drop_drops_the_oldest_and_counts_it_in_the_next_item():
    release, got, done = threading.Event(), [], threading.Event()

    def slow(f):
        got.append(f)
        release.wait(5)  # the first item blocks the consumer until the reader has read everything

    source = media.paced([(np.full(1, i), float(i)) for i in range(30)], realtime=False, buffer=3)
    sub = source.subscribe(slow, on_completed=done.set)
    time.sleep(0.3)
    release.set()
    assert done.wait(5)
    sub.dispose()
    # the first item out held the consumer; of those read meanwhile only the newest 3 waited, and each item
    # counts the ones dropped just before it
    assert [f.index for f in got[-3:]] == [27, 28, 29] and len(got) in (3, 4)  # 4: item 0 went out first
    assert [f.t for f in got[-3:]] == [27.0, 28.0, 29.0]
    previous = -1
    for f in got:
        assert f.dropped == f.index - previous - 1
        previous = f.index
    assert sum(f.dropped for f in got) + len(got) == 30


def test_realtime_plays_at_the_sources_own_rate():
    t0 = time.monotonic()
    arrivals = []
    frames = media.paced([(np.zeros(1), 0.08 * i) for i in range(4)], when_behind="block")
    for f in _collect(frames.pipe(ops.do_action(lambda f: arrivals.append(time.monotonic() - t0)))):
        assert arrivals[f.index] >= f.t - 0.01  # never before its time
    assert arrivals[-1] < 0.24 + 1.0


def test_loop_goes_on_with_time_and_index():
    frames = media.paced(lambda: iter([(np.zeros(1), 0.0), (np.zeros(1), 0.5)]), realtime=False,
                         when_behind="block", loop=True)
    got = frames.pipe(ops.take(5), ops.to_list()).run()
    assert [f.index for f in got] == [0, 1, 2, 3, 4]
    assert [f.t for f in got] == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_dispose_stops_the_source():
    got = []
    sub = media.paced(lambda: ((np.zeros(1), 0.02 * i) for i in range(10_000))).subscribe(got.append)
    time.sleep(0.1)
    sub.dispose()
    n = len(got)
    time.sleep(0.1)
    assert 0 < n == len(got) < 10_000


def test_a_decoder_error_ends_the_stream_with_it():
    def broken():
        yield np.zeros(1), 0.0
        raise OSError("corrupt block")

    with pytest.raises(OSError, match="corrupt block"):
        _collect(media.paced(broken, realtime=False, when_behind="block"))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"when_behind": "latest"}, r"when_behind=.*'drop'.*'block'.*got 'latest'"),
    ({"buffer": 0}, r"buffer=.*positive int.*got 0"),
    ({"buffer": True}, r"buffer=.*positive int"),
])
def test_options_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        media.paced([], **kwargs)


def test_loop_refuses_a_one_shot_iterator():
    with pytest.raises(ValueError, match=r"loop=True.*read again"):
        media.paced(iter([(np.zeros(1), 0.0)]), loop=True)


# -- audio ----------------------------------------------------------------------------------------------------
sf = pytest.importorskip("soundfile", reason="the media extra's soundfile is not installed")


def test_audio_file_plays_a_wav_in_blocks_with_their_times(tmp_path):
    rng = np.random.default_rng()
    rate, block = 8000, 512
    samples = rng.uniform(-0.9, 0.9, size=(5 * block + 100, 2)).astype(np.float32)
    path = tmp_path / "noise.wav"
    sf.write(path, samples, rate, subtype="FLOAT")
    got = _collect(media.audio_file(path, block, realtime=False, when_behind="block"))
    assert len(got) == 6 and all(f.data.shape == (block, 2) and f.data.dtype == np.float32 for f in got)
    assert [f.t for f in got] == pytest.approx([i * block / rate for i in range(6)])
    np.testing.assert_array_equal(np.concatenate([f.data for f in got])[:len(samples)], samples)
    assert not np.concatenate([f.data for f in got])[len(samples):].any()  # the last block padded with zeros
    mono = _collect(media.audio_file(path, block, realtime=False, when_behind="block", mono=True))
    np.testing.assert_allclose(mono[0].data, samples[:block].mean(axis=1), rtol=1e-6, atol=1e-7)


def test_audio_file_errors(tmp_path, monkeypatch):
    with pytest.raises(MediaSourceError, match=r"audio_file: no such file .*missing\.wav"):
        media.audio_file(tmp_path / "missing.wav")
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a sound file")
    with pytest.raises(MediaSourceError, match=r"soundfile cannot read .*bad\.wav"):
        media.audio_file(bad)
    with pytest.raises(ValueError, match=r"audio_file\(block=...\) must be a positive int.*got 0"):
        media.audio_file(bad, 0)
    monkeypatch.setitem(sys.modules, "soundfile", None)
    with pytest.raises(MediaSourceError, match=r"needs the 'soundfile' package.*pip install "
                                                  r"'\.\[media\]' in rxcuda's checkout"):
        media.audio_file(bad)


def test_audio_input_and_camera_say_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", None)
    monkeypatch.setitem(sys.modules, "cv2", None)
    with pytest.raises(MediaSourceError, match=r"audio_input needs the 'sounddevice' package"):
        media.audio_input()
    with pytest.raises(MediaSourceError, match=r"camera needs the 'cv2' package.*pip install opencv-python-headless"):
        media.camera()


# -- video ----------------------------------------------------------------------------------------------------
av = pytest.importorskip("av", reason="the media extra's PyAV is not installed")


def _write_gray_video(path, frames: np.ndarray, fps: int = 25) -> None:
    """Lossless (FFV1, 8-bit gray), so decoded frames equal what was written."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("ffv1", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "gray"
        for img in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="gray")))
        out.mux(stream.encode())


def test_video_file_decodes_every_frame_with_its_presentation_time(tmp_path):
    rng = np.random.default_rng()
    frames = rng.integers(0, 256, size=(7, 24, 32), dtype=np.uint8)
    path = tmp_path / "clip.mkv"
    _write_gray_video(path, frames)
    got = _collect(media.video_file(path, realtime=False, when_behind="block", gray=True))
    assert len(got) == 7
    assert [f.t for f in got] == pytest.approx([i / 25 for i in range(7)], abs=1e-3)
    for f, img in zip(got, frames, strict=True):
        assert f.data.dtype == np.float32 and f.data.shape == (24, 32)
        np.testing.assert_allclose(f.data, img / np.float32(255), rtol=0, atol=1e-6)
    rgb = _collect(media.video_file(path, realtime=False, when_behind="block"))
    assert rgb[0].data.shape == (24, 32, 3) and rgb[0].data.dtype == np.uint8
    np.testing.assert_array_equal(rgb[3].data[..., 0], frames[3])  # gray to RGB: every channel the same


def test_video_file_errors(tmp_path):
    with pytest.raises(MediaSourceError, match=r"video_file: no such file"):
        media.video_file(tmp_path / "missing.mp4")
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video")
    with pytest.raises(MediaSourceError, match=r"PyAV cannot open .*bad\.mp4"):
        media.video_file(bad)
    wav = tmp_path / "sound.wav"
    sf.write(wav, np.zeros((100, 1), np.float32), 8000)
    with pytest.raises(MediaSourceError, match=r"has no video stream"):
        media.video_file(wav)


def test_media_frame_is_a_value_with_data_and_time():
    f = MediaFrame(np.arange(3), 1.5, 7)
    assert (f.t, f.index, f.dropped) == (1.5, 7, 0)
