"""The frame-time picture (``rxcuda plot TRACE -o PNG`` / ``rxcuda.view.plot_frames``) from a trace made on the
null driver. Drawing needs matplotlib (the ``view`` extra); without it these tests skip, except the one that
checks the message saying how to install it."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import rxcuda
from rxcuda import _cli
from rxcuda.cuda import NullDriver
from rxcuda.view._trace import TIERS

N = 64
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def matplotlib():
    return pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install '.[view]')")


@pytest.fixture
def trace_file(tmp_path):
    """A trace with a structure build, parameter updates, a code reload, a failed rebuild (a diagnostic)."""
    with rxcuda.Engine(driver=NullDriver(), timing=True) as engine:
        add = engine.add(rxcuda.Block.from_kernel("kernels/vector_add.ptx", size=N))
        mul = engine.add(rxcuda.Block.from_kernel("kernels/scalar_mul.ptx", size=N))
        engine.connect(add["out"], mul["x"])
        engine.write(add["a"], np.ones(N, np.float32))
        engine.write(add["b"], np.ones(N, np.float32))
        with engine.trace(tmp_path / "trace.json"):
            for i in range(60):
                if i and i % 10 == 0:
                    mul.params["scale"].value = float(i)
                if i == 30:
                    add.set_code(None, rxcuda.load_kernel_file("kernels/vector_sub.ptx"))
                if i == 45:
                    add.set_code(None, rxcuda.load_kernel_file("kernels/saxpy.ptx"))
                engine.tick()
    return tmp_path / "trace.json"


def test_plot_frames_writes_a_png(matplotlib, trace_file, tmp_path):
    out = rxcuda.view.plot_frames(trace_file, tmp_path / "frames.png")
    assert out == tmp_path / "frames.png"
    data = out.read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (11 * 120, int(4.8 * 120))


def test_plot_marks_tiers_reloads_and_diagnostics(matplotlib, trace_file, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **k: saved.append(self))
    rxcuda.view.plot_frames(trace_file, tmp_path / "frames.png", log=False)
    ax = saved[0].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["host", "GPU", "structure update", "code update", "parameters update", "reload", "diagnostic"]
    assert ax.get_yscale() == "linear"
    frames = rxcuda.view.read_trace(trace_file).frames
    slowest = max(frames, key=lambda f: f.host_us)  # the first build, unless a loaded machine stalled another
    assert any(t.get_text().startswith(f"frame {slowest.index}: ") for t in ax.texts)
    assert "60 frames" in ax.get_title(loc="left")


def test_log_scale_is_chosen_when_a_stutter_dwarfs_the_median(matplotlib, trace_file, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    data = rxcuda.view.read_trace(trace_file)
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **k: saved.append(self))
    rxcuda.view.plot_frames(data, tmp_path / "a.png", log=True)
    rxcuda.view.plot_frames(data, tmp_path / "b.png", log=False)
    assert [f.axes[0].get_yscale() for f in saved] == ["log", "linear"]


def test_the_command_writes_the_picture_and_a_summary(matplotlib, trace_file, tmp_path, capsys):
    assert _cli.main(["plot", str(trace_file), "-o", str(tmp_path / "f.png")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {tmp_path / 'f.png'}: 60 frames: host median ")
    assert (tmp_path / "f.png").read_bytes().startswith(PNG)


def test_the_command_defaults_to_the_trace_name_with_png(matplotlib, trace_file, capsys):
    assert _cli.main(["plot", str(trace_file), "--log"]) == 0
    assert trace_file.with_suffix(".png").read_bytes().startswith(PNG)


def test_svg_too(matplotlib, trace_file, tmp_path):
    out = rxcuda.view.plot_frames(trace_file, tmp_path / "frames.svg")
    assert b"<svg" in out.read_bytes()[:2000]


@pytest.mark.parametrize("args, message", [
    (["plot", "{missing}"], "no trace file"),
    (["plot", "{trace}", "-o", "{dir}/frames.txt"], "writes .png, .svg"),
    (["plot", "{trace}", "-o", "{dir}/nowhere/frames.png"], "does not exist"),
    (["plot", "{notjson}"], "is not a JSON trace"),
])
def test_bad_input_is_one_line_and_exit_2(matplotlib, trace_file, tmp_path, capsys, args, message):
    (tmp_path / "notes.txt").write_text("hello")
    fill = {"missing": tmp_path / "none.json", "trace": trace_file, "dir": tmp_path, "notjson": tmp_path / "notes.txt"}
    assert _cli.main([a.format(**fill) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rxcuda plot: error: ") and message in err and "\n" not in err


def test_log_and_linear_exclude_each_other(trace_file, capsys):
    with pytest.raises(SystemExit) as e:
        _cli.main(["plot", str(trace_file), "--log", "--linear"])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_without_matplotlib_the_error_says_how_to_install_it(trace_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if it were not installed
    with pytest.raises(rxcuda.view.MatplotlibNotFoundError, match=r"pip install '\.\[view\]' in rxcuda's checkout"):
        rxcuda.view.plot_frames(trace_file, tmp_path / "f.png")
    assert _cli.main(["plot", str(trace_file)]) == 2
    assert "pip install '.[view]'" in capsys.readouterr().err
    assert not (tmp_path / "f.png").exists()


def test_every_tier_has_a_colour():
    from rxcuda.view._plot import TIER_COLORS

    assert set(TIER_COLORS) == set(TIERS)
