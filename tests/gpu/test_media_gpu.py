"""Real streams into the GPU: a WAV file's blocks and a video's frames (rxcuda.streams.media) through kernels,
checked against NumPy; the peaks example on a WAV it writes, and the video example."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import gpu_subprocess_env
from reactivex import operators as ops

import rxcuda
from rxcuda.streams import media

ROOT = pathlib.Path(__file__).resolve().parents[2]
sf = pytest.importorskip("soundfile", reason="the media extra's soundfile is not installed")


def run_example(name: str, *args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                          cwd=cwd, env=gpu_subprocess_env(), timeout=300)


def test_wav_blocks_through_a_kernel_match_numpy_with_their_times(engine, rng, kernels, tmp_path):
    rate, block = 16000, 1024
    samples = rng.uniform(-1, 1, size=(8 * block, 1)).astype(np.float32)
    sf.write(tmp_path / "noise.wav", samples, rate, subtype="FLOAT")
    mul = engine.add(rxcuda.Block.from_kernel(f"{kernels}/scalar_mul.ptx", size=block, scale=0.5))
    frames = media.audio_file(tmp_path / "noise.wav", block, mono=True, realtime=False, when_behind="block")
    seen = []
    for item in frames.pipe(ops.to_list()).run():
        engine.write(mul["x"], item.data)
        engine.tick()
        np.testing.assert_array_equal(engine.read(mul["out"]), item.data * np.float32(0.5))
        seen.append(item.t)
    assert seen == pytest.approx([i * block / rate for i in range(8)])


def test_peaks_example_plays_a_wav_it_writes(tmp_path):
    proc = run_example("peaks.py", "30", "--wav", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 30 frames, 10 refined on the GPU's decision" in proc.stdout
    assert "played at its own rate" in proc.stdout and "(t= 0.256 s)" in proc.stdout


def test_peaks_example_plays_a_given_wav(tmp_path, rng):
    t = np.arange(12 * 4096) / 48000.0
    tone = (0.7 * np.sin(2 * np.pi * 3000.0 * t) + rng.normal(0, 0.05, t.size)).astype(np.float32)
    sf.write(tmp_path / "tone.wav", tone, 48000, subtype="FLOAT")
    proc = run_example("peaks.py", "12", "--wav", str(tmp_path / "tone.wav"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 12 frames, 12 refined" in proc.stdout


def test_video_example_filters_every_frame(tmp_path):
    pytest.importorskip("av", reason="the media extra's PyAV is not installed")
    proc = run_example("video_filter.py", "45", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: 45 video frames filtered on the GPU" in proc.stdout
