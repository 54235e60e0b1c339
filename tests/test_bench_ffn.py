"""``twell bench ffn`` end to end on a tiny CPU problem (kernels under the interpreter)."""

from __future__ import annotations

import json

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
