"""The session 50 figures that the README, docs/performance.md and the session's log quote are the committed runs'
(``bench_results/h100/session50_runs.md``): the CPU splits that predicted the long-row bound at 32 and 128."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _helpers import flat_text

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"

LOG = flat_text(H100 / "session50_runs.md")


@pytest.mark.parametrize(("tokens", "heavy", "bound", "budgets", "left_over_32"), [
    (2048, 32, 3.0, (64, 128), 0), (2048, 128, 3.0, (64, 64), 406),
    (8192, 32, 10.0, (384, 640), 0), (8192, 128, 10.0, (128, 256), 6768)])
def test_cpu_splits_as_quoted(tokens, heavy, bound, budgets, left_over_32):
    """The bound each call size runs (3 under 8192 tokens, 10 from there): its budgets and the rows it leaves the row
    kernel with more than 32 cold pairs."""
    rows = json.loads((H100 / f"heavy_rows_stats_{tokens}_heavy{heavy}_counted_session50.json").read_text())["rows"]
    mine = [r for r in rows if r["bound"] == bound]
    assert len(mine) == 28 and all(r["heavy_pairs"] == heavy and r["count_heavy"] and r["tokens"] == tokens
                                   for r in mine)
    assert (min(r["budget"] for r in mine), max(r["budget"] for r in mine)) == budgets
    assert sum(r["left_rows_over"]["32"] for r in mine) == left_over_32
    assert all(r["left_overflow_rows"] == 0 for r in mine)


def test_predictions_quote_the_splits():
    assert "budgets of 64-128 rows a layer; at 128 up to 128 pairs (32 steps) with 64 a layer" in LOG
    assert "at 32 budgets of 384-640 rows a layer (192-384 at 64)" in LOG
