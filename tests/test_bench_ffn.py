"""``twell bench ffn`` end to end on a tiny CPU problem (kernels under the interpreter)."""

from __future__ import annotations

import json

import pytest

from twell import cli
from twell.bench.timing import INTERLEAVED_ROUNDS


def test_bench_ffn_cli_writes_checked_rows(tmp_path, capsys):
    code = cli.main(["bench", "ffn", "--ms", "12", "--densities", "10", "--shape", "64x256", "--extra",
                     "--rep-ms", "1", "--dtype", "float32", "--out", str(tmp_path), "--stem", "t"])
    assert code == 0
    data = json.loads((tmp_path / "t.json").read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    assert len(rows) == 1
    r = rows[0]
    assert r["m"] == 12 and r["ok"]
    assert r["rel_err"] < 1e-4 and r["hotcold_rel_err"] < 1e-4
    assert r["dense_ms"] > 0 and r["hotcold_ms"] > 0 and r["twell_ms"] > 0
    for path in ("dense", "hotcold", "dispatch", "dense_module"):  # timed interleaved, rounds kept
        assert len(r[f"{path}_rounds_ms"]) == INTERLEAVED_ROUNDS and min(r[f"{path}_rounds_ms"]) <= r[f"{path}_ms"]
    assert 0 <= r["n_hot"] <= 256
    assert (tmp_path / "t.csv").exists()
    assert "hot-cold" in capsys.readouterr().out


def test_bench_ffn_dispatch_table_option(tmp_path, capsys):
    """``--dispatch-table`` puts a candidate table in the module column (recorded in the JSON); a malformed
    table is refused with the accepted form named."""
    code = cli.main(["bench", "ffn", "--ms", "8", "--densities", "10", "--shape", "64x256", "--extra",
                     "--rep-ms", "1", "--dtype", "float32", "--out", str(tmp_path), "--stem", "t",
                     "--dispatch-table", "0:0.5,4096:0.05"])
    assert code == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["meta"]["sweep"]["dispatch_table"] == [[0, 0.5], [4096, 0.05]]
    assert data["rows"][0]["dispatch_sparse"] is False  # CPU: the table applies on CUDA only
    for bad in ("4096", "4096:0.5,16:0.1", "16:1.5"):
        with pytest.raises(SystemExit):
            cli.main(["bench", "ffn", "--dispatch-table", bad])
        assert "min_tokens:max_density" in capsys.readouterr().err
