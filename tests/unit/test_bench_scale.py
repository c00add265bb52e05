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


def _plan_ab():
    path = BENCH.with_name("plan_ab.py")
    spec = importlib.util.spec_from_file_location("bench_plan_ab", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plan_ab_cold_compares_fresh_engines_of_two_checkouts_on_the_null_driver(capsys):
    """bench/plan_ab.py --cold against this very checkout as the base: a row per timed step, each a median of
    positive times, and a ratio near 1 is possible (the same code both sides)."""
    root = BENCH.parents[1]
    assert _plan_ab().main(["--base", str(root), "--null", "--cold", "--pairs", "2", "--blocks", "8"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[0].strip(): line.split("|")[1:] for line in out.splitlines() if line.count("|") == 3}
    assert set(rows) == {"", "first tick", "+1 block", "-1 block"}
    assert all(float(v) > 0 for k, r in rows.items() if k for v in r)


def test_plan_ab_refuses_a_base_without_a_package(capsys, tmp_path):
    with pytest.raises(SystemExit):
        _plan_ab().main(["--base", str(tmp_path), "--null"])
    assert "holds no rxcuda/ package" in capsys.readouterr().err
