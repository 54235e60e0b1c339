"""``twell bench ffn`` end to end on a tiny CPU problem (kernels under the interpreter)."""

from __future__ import annotations

import json

import pytest

from twell import cli
from twell.bench.timing import INTERLEAVED_ROUNDS
from twell.tolerances import REL_TOL_FP32_CLI


def test_bench_ffn_cli_writes_checked_rows(tmp_path, capsys):
    code = cli.main(["bench", "ffn", "--ms", "12", "--densities", "10", "--shape", "64x256", "--extra",
                     "--rep-ms", "1", "--dtype", "float32", "--out", str(tmp_path), "--stem", "t"])
    assert code == 0
    data = json.loads((tmp_path / "t.json").read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    assert len(rows) == 1
    r = rows[0]
    assert r["m"] == 12 and r["ok"]
    assert r["rel_err"] < REL_TOL_FP32_CLI and r["hotcold_rel_err"] < REL_TOL_FP32_CLI
    assert r["dense_ms"] > 0 and r["hotcold_ms"] > 0 and r["twell_ms"] > 0
    for path in ("dense", "hotcold", "dispatch", "dense_module"):  # timed interleaved, rounds kept
        assert len(r[f"{path}_rounds_ms"]) == INTERLEAVED_ROUNDS and min(r[f"{path}_rounds_ms"]) <= r[f"{path}_ms"]
    assert 0 <= r["n_hot"] <= 256
    assert (tmp_path / "t.csv").exists()
    assert "hot-cold" in capsys.readouterr().out


def test_bench_ffn_records_what_the_module_ran(tmp_path, capsys, monkeypatch):
    """The dispatched module's hot set and dense-row budget go into the row (and its line) when it ran sparse (a
    dense-dispatched row records none: test_bench_ffn_dispatch_table_option).  The CPU dispatch runs dense, so this
    forces the TwELL path (not the small-batch kernels, which take no hot set) with the Triton backend (the hot/cold
    split's)."""
    from twell.nn import SparseGatedMLP

    monkeypatch.setattr(SparseGatedMLP, "_path", lambda self, n_tokens, device_type, eager=False: "sparse")
    assert cli.main(["bench", "ffn", "--ms", "8", "--densities", "10", "--shape", "64x256", "--extra", "--rep-ms",
                     "1", "--dtype", "float32", "--out", str(tmp_path), "--stem", "sparse", "--backend", "triton"]) == 0
    r = json.loads((tmp_path / "sparse.json").read_text())["rows"][0]
    assert r["dispatch_sparse"] is True and r["ok"]
    # the module chooses its hot set by the bench column's rule, on the same tokens
    assert isinstance(r["dispatch_n_hot"], int) and r["dispatch_n_hot"] == r["n_hot"]
    assert 0 <= r["dispatch_dense_rows"] <= 8 and 0.0 <= r["dispatch_overflow_row_frac"] <= 1.0
    assert 0.0 <= r["dispatch_severe_overflow_row_frac"] <= r["dispatch_overflow_row_frac"]
    assert f"module H={r['dispatch_n_hot']} dense rows={r['dispatch_dense_rows']}" in capsys.readouterr().out


def test_bench_ffn_dispatch_table_option(tmp_path, capsys):
    """``--dispatch-table`` puts a candidate table in the module column (recorded in the JSON); a malformed
    table is refused with the accepted form named."""
    code = cli.main(["bench", "ffn", "--ms", "8", "--densities", "10", "--shape", "64x256", "--extra",
                     "--rep-ms", "1", "--dtype", "float32", "--out", str(tmp_path), "--stem", "t",
                     "--dispatch-table", "0:0.5,4096:0.05"])
    assert code == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["meta"]["sweep"]["dispatch_table"] == [[0, 0.5], [4096, 0.05]]
    r = data["rows"][0]
    assert r["dispatch_sparse"] is False  # CPU: the table applies on CUDA only
    assert r["dispatch_n_hot"] is None and r["dispatch_dense_rows"] == 0  # nothing of a sparse run recorded
    assert "module H=" not in capsys.readouterr().out
    for bad in ("4096", "4096:0.5,16:0.1", "16:1.5"):
        with pytest.raises(SystemExit):
            cli.main(["bench", "ffn", "--dispatch-table", bad])
        assert "min_tokens:max_density" in capsys.readouterr().err


def test_bench_ffn_energy_option_reports_why_it_is_unavailable_on_the_cpu(tmp_path, capsys):
    code = cli.main(["bench", "ffn", "--ms", "8", "--densities", "10", "--shape", "64x256", "--extra",
                     "--rep-ms", "1", "--dtype", "float32", "--out", str(tmp_path), "--stem", "t",
                     "--energy-seconds", "0.01"])
    assert code == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["meta"]["sweep"]["energy_seconds"] == 0.01
    row = data["rows"][0]
    assert "cpu" in row["energy_unavailable"] and "energy_ratio" not in row
    assert "energy unavailable: " in capsys.readouterr().out
    for bad in ("-1", "nan"):
        with pytest.raises(SystemExit):
            cli.main(["bench", "ffn", "--energy-seconds", bad])
        assert "--energy-seconds must be a number of seconds >= 0" in capsys.readouterr().err


def test_energy_fields_per_call_and_ratios():
    """Back-to-back time and energy per call from a meter's window totals, dense over dispatched."""
    from twell.bench.ffn import energy_fields

    class FakeMeter:
        method = "fake"

        def measure(self, fn, *, min_seconds):
            fn()
            joules, seconds = (9.0, 1.4) if fn() == "dense" else (6.0, 0.8)
            return {"joules": joules, "seconds": seconds, "calls": 100, "mean_watts": joules / seconds}

    got = energy_fields(FakeMeter(), {"dense": lambda: "dense", "dispatch": lambda: "sparse"}, 0.5)
    assert got["energy_method"] == "fake"
    assert got["dense_busy_ms"] == pytest.approx(14.0) and got["dispatch_busy_ms"] == pytest.approx(8.0)
    assert got["dense_j_per_call"] == pytest.approx(0.09) and got["dispatch_j_per_call"] == pytest.approx(0.06)
    assert got["busy_speedup"] == pytest.approx(1.75) and got["energy_ratio"] == pytest.approx(1.5)
    assert got["dense_watts"] == pytest.approx(9.0 / 1.4)
