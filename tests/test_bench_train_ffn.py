"""``twell bench train-ffn`` on tiny CPU problems: the real Triton op under the interpreter, the CLI
entry, failing and skipped points (the GPU sweep itself is run by hand on an H200)."""

from __future__ import annotations

import json

import pytest
import torch

import twell.bench.train_ffn as tf
from twell import cli
from twell.nn.train_dispatch import TrainDispatchPolicy
from twell.reference.training import gated_ffn_l1
from twell.tolerances import REL_TOL, REL_TOL_GRAD

SHAPE = (32, 128)
CPU = torch.device("cpu")


def _cfg(**kw) -> tf.TrainFfnSweep:
    base = {"shapes": (SHAPE,), "ms": (16,), "densities": (5.0,), "dtype": torch.float32, "rep_ms": 1.0,
            "warmup_ms": 1.0}
    return tf.TrainFfnSweep(**{**base, **kw})


def _fast_sparse(x, w_gate, w_up, w_down, *, width=None, token_splits=None):
    """The pure-PyTorch sparse reference in place of the interpreted Triton op (same contract, fast)."""
    return gated_ffn_l1(x, w_gate, w_up, w_down)


def test_point_with_the_real_sparse_op_is_checked_and_auto_goes_sparse_when_forced():
    rows = tf.run_sweep(_cfg(train_policy=TrainDispatchPolicy.always_sparse()), CPU, log=lambda s: None)
    (r,) = rows
    assert "error" not in r and not any(k.endswith("_error") for k in r)
    for path in ("dense", "sparse", "auto"):
        assert r[f"{path}_ok"] is True and r[f"{path}_deterministic"] is True
        assert r[f"{path}_ms"] > 0
        assert r[f"{path}_err_out"] <= REL_TOL[torch.float32]
        assert max(r[f"{path}_err_{k}"] for k in ("dx", "dwg", "dwu", "dwd")) <= REL_TOL_GRAD[torch.float32]
    # l0 as the op measured it: fp32 gate, same pattern as the reference's
    assert r["l0"] == r["sparse_l0"] == r["gate_l0"] == r["ref_l0"] > 0
    assert r["auto_path"] == "sparse" and r["ok"] is True
    assert r["sparse_speedup"] == pytest.approx(r["dense_ms"] / r["sparse_ms"])
    for path in ("dense", "sparse", "auto"):  # fast paths: the groups' medians are kept with the median
        if "interleaved" in r[f"{path}_timing"]:
            assert len(r[f"{path}_rounds_ms"]) == tf.TIMING_ROUNDS
        if f"{path}_rounds_ms" in r:
            assert min(r[f"{path}_rounds_ms"]) <= r[f"{path}_ms"] <= max(r[f"{path}_rounds_ms"])
    assert "dense_rounds_ms" in r
    assert r["dense_mem_mb"] is None  # no memory statistics off CUDA


def test_cli_writes_json_csv_and_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tf, "twell_gated_ffn_l1", _fast_sparse)
    out = tmp_path / "res"
    code = cli.main(["bench", "train-ffn", "--ms", "16", "32", "--densities", "5", "--shape", "32x128",
                     "--dtype", "float32", "--rep-ms", "1", "--warmup-ms", "1", "--out", str(out), "--stem", "t"])
    assert code == 0
    data = json.loads((out / "t.json").read_text())
    assert data["meta"]["sweep"]["ms"] == [16, 32]
    assert [r["m"] for r in data["rows"]] == [16, 32]
    assert all(r["sparse_ok"] and r["auto_path"] == "dense" for r in data["rows"])  # default policy: dense on CPU
    header = (out / "t.csv").read_text().splitlines()[0].split(",")
    assert {"dense_ms", "sparse_ms", "sparse_speedup", "sparse_err_dwd", "sparse_deterministic"} <= set(header)
    printed = capsys.readouterr().out
    assert "| 32x128 | 16 | 5.0% |" in printed and "| 32x128 | 32 | 5.0% |" in printed


def test_cli_refuses_bad_arguments():
    with pytest.raises(SystemExit):
        tf.main(["--shape", "2048-5632"])
    with pytest.raises(SystemExit):
        tf.main(["--width", "0"])


def test_failing_points_are_recorded_and_the_sweep_goes_on(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    real_problem = tf.synthetic_ffn_problem

    def problem_or_oom(n, d, f, profile, **kw):
        if profile.mean_l0 < 0.02 * f:  # the 1 % density: inputs cannot even be generated
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")
        return real_problem(n, d, f, profile, **kw)

    monkeypatch.setattr(tf, "twell_gated_ffn_l1", boom)
    monkeypatch.setattr(tf, "synthetic_ffn_problem", problem_or_oom)
    written: list[int] = []
    rows = tf.run_sweep(_cfg(densities=(1.0, 5.0), ms=(16, 32)), CPU, log=lambda s: None,
                        on_row=lambda rs: written.append(len(rs)))
    assert written == [1, 2, 3, 4]  # results written after every point
    assert [r["density_pct"] for r in rows] == [1.0, 1.0, 5.0, 5.0]
    for r in rows[:2]:
        assert r["error"].startswith("OutOfMemoryError: CUDA out of memory")
    for r in rows[2:]:
        assert r["sparse_error"] == "RuntimeError: kernel exploded"
        assert r["dense_ok"] is True and r["dense_ms"] > 0 and r["ok"] is None
    table = tf.summary_table(rows)
    assert "error: OutOfMemoryError" in table and "sparse error: RuntimeError: kernel exploded" in table


def test_time_budget_and_slow_sparse_calls_are_skipped(monkeypatch):
    monkeypatch.setattr(tf, "twell_gated_ffn_l1", _fast_sparse)
    rows = tf.run_sweep(_cfg(budget_s=0.0), CPU, log=lambda s: None)
    assert rows[0]["skipped"].startswith("time budget")
    rows = tf.run_sweep(_cfg(ms=(16, 32, 64), max_call_s=1e-9), CPU, log=lambda s: None)
    assert "sparse_ms" in rows[0]
    for r in rows[1:]:  # projected from the M before, and carried on to the next M
        assert r["sparse_skipped"].startswith("projected") and "sparse_ms" not in r
        assert r["auto_path"] == "dense" and r["dense_ms"] > 0  # auto could not go sparse: still measured
    assert "sparse skipped: projected" in tf.format_row(rows[1])
