"""bench/scale.py on the null driver (``--null``): the host's share of its table, with the declare rows."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "scale.py"


def _scale():
    spec = importlib.util.spec_from_file_location("bench_scale", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_null_run_prints_a_row_per_size_with_declaring_by_path(capsys):
    assert _scale().main(["--null", "--sizes", "5", "12", "--repeats", "1", "--live-seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert "on Null Device" in out and "blocks(code) ms" in out and "blocks(path) ms" in out
    rows = [line.split("|") for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [5, 12]
    assert all(float(v) >= 0 for r in rows for v in r[1:])
    assert "blocks(path) <= 30 ms" in out


def test_sizes_and_repeats_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        _scale().main(["--null", "--sizes", "0"])
    assert "--sizes and --repeats take positive ints" in capsys.readouterr().err
