"""The training dispatch table a `twell bench train-ffn --sparse-impl hot-cold` sweep writes
(twell.bench.train_ffn_policy): from the hot/cold column against dense, failed points counted as losses, and the CLI's
<stem>_train_policy.json."""

from __future__ import annotations

import json

import pytest
import torch

from twell.bench import train_ffn
from twell.bench.train_ffn_policy import train_points, train_policy_of, train_table_text
from twell.nn import load_train_policy
from twell.nn.dispatch_tuning import derive_table

CUDA = torch.device("cuda")


def _row(m: int, dens_pct: float, dense: float, hotcold: float | None, ok: bool = True, **extra) -> dict:
    f = 1000
    row = {"d": 64, "f": f, "m": m, "density_pct": dens_pct, "gate_l0": dens_pct / 100 * f, "dense_ms": dense, **extra}
    if hotcold is not None:
        row.update(hotcold_ms=hotcold, hotcold_ok=ok, hotcold_l0=dens_pct / 100 * f * 1.02)
    return row


def _sweep() -> list[dict]:
    rows = []
    for m, wins in ((4096, ()), (16384, (0.5, 1.0)), (65536, (0.5, 1.0, 2.0))):
        for dens in (0.5, 1.0, 2.0, 5.0):
            rows.append(_row(m, dens, 10.0, 5.0 if dens in wins else 12.0))
    return rows


def test_the_table_starts_where_hot_cold_wins_and_stops_at_the_first_loss():
    policy = train_policy_of(_sweep(), ((64, 1000),), device=CUDA, dtype=torch.bfloat16, capability=(9, 0))
    assert policy.tables == {(64, 1000): ((16384, pytest.approx(0.0102)), (65536, pytest.approx(0.0204)))}
    assert policy.device_types == ("cuda",) and policy.dtypes == (torch.bfloat16,) and policy.capabilities == ((9, 0),)
    assert policy.use_sparse(20000, 0.01, device_type="cuda", shape=(64, 1000), dtype=torch.bfloat16,
                             capability=(9, 0))
    assert not policy.use_sparse(20000, 0.01, device_type="cuda", shape=(64, 1000), dtype=torch.bfloat16,
                                 capability=(8, 0))
    text = train_table_text(policy)
    assert "64x1000 16384 <= M < 65536: hot/cold when density <= 1.02 %" in text
    assert "64x1000 M >= 65536: hot/cold when density <= 2.04 %" in text


def test_densities_come_from_the_measured_l0_and_points_without_dense_are_left_out():
    rows = [_row(16384, 1.0, 10.0, 5.0), _row(16384, 2.0, None, 5.0)]  # type: ignore[arg-type]
    (p,) = train_points(rows, 64, 1000)
    assert p.density == pytest.approx(0.0102) and p.speedup == pytest.approx(2.0) and p.ok


@pytest.mark.parametrize("bad", [
    {"hotcold": None, "extra": {"hotcold_error": "OutOfMemoryError"}},
    {"hotcold": 5.0, "ok": False},
    {"hotcold": 5.0, "ok": None},
], ids=["raised", "wrong", "unchecked"])
def test_a_failed_or_unchecked_hot_cold_point_is_a_loss(bad):
    rows = [_row(16384, 0.5, 10.0, 5.0), _row(16384, 1.0, 10.0, bad["hotcold"], bad.get("ok", True),
                                                **bad.get("extra", {}))]
    pts = train_points(rows, 64, 1000)
    assert [p.ok for p in pts] == [True, False]
    assert derive_table(pts) == ((16384, pytest.approx(0.0051)),)


def test_a_shape_that_never_wins_gets_an_empty_table_and_says_so():
    rows = [_row(m, 0.5, 10.0, 11.0) for m in (4096, 16384)]
    policy = train_policy_of(rows, ((64, 1000), (128, 512)), device=torch.device("cpu"), dtype=torch.float32,
                             capability=None)
    assert policy.tables == {(64, 1000): ()} and policy.capabilities is None  # 128x512 had no rows
    assert train_table_text(policy) == ("  64x1000: dense at every measured point (the hot/cold op never won by the "
                                        "margin)")


def test_cli_writes_the_train_policy_file_it_derived(tmp_path, capsys):
    code = train_ffn.main(["--ms", "16", "32", "--densities", "5", "--shape", "32x128", "--dtype", "float32",
                           "--rep-ms", "1", "--warmup-ms", "1", "--sparse-impl", "hot-cold", "--min-speedup", "1.0",
                           "--out", str(tmp_path), "--stem", "t"])
    assert code == 0
    rows = json.loads((tmp_path / "t.json").read_text())["rows"]
    policy = load_train_policy(tmp_path / "t_train_policy.json")
    assert policy.tables == {(32, 128): derive_table(train_points(rows, 32, 128), min_speedup=1.0)}
    assert policy.device_types == ("cpu",) and policy.dtypes == (torch.float32,) and policy.capabilities is None
    measured = json.loads((tmp_path / "t_train_policy.json").read_text())["measured"]
    assert measured["source"] == "t.json" and measured["min_speedup"] == 1.0 and measured["dtype"] == "float32"
    printed = capsys.readouterr().out
    assert "training dispatch table (hot/cold against dense, >= 1x, float32):" in printed
    assert "t_train_policy.json" in printed


def test_cli_without_the_hot_cold_column_writes_no_policy_and_refuses_a_margin_below_one(tmp_path, monkeypatch):
    from twell.reference.training import gated_ffn_l1

    monkeypatch.setattr(train_ffn, "twell_gated_ffn_l1",
                        lambda x, wg, wu, wd, *, width=None, token_splits=None: gated_ffn_l1(x, wg, wu, wd))
    assert train_ffn.main(["--ms", "16", "--densities", "5", "--shape", "32x128", "--dtype", "float32",
                           "--rep-ms", "1", "--warmup-ms", "1", "--out", str(tmp_path), "--stem", "v"]) == 0
    assert (tmp_path / "v.json").exists() and not (tmp_path / "v_train_policy.json").exists()
    with pytest.raises(SystemExit):
        train_ffn.main(["--min-speedup", "0.9"])
