"""The session 50 figures that the README, docs/performance.md and the session's log quote are the committed runs'
(``bench_results/h200/session50_runs.md``): the kernel tests' first native run whole (H200), the long-row bound at 32
against 64 in the recorded 1.5B forward, and the CPU splits that predicted the bound at 32 and 128."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import flat_text, long_row_probe_figures

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"
H200 = ROOT / "bench_results" / "h200"

LOG = flat_text(H200 / "session50_runs.md")
README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")


def test_kernel_tests_as_quoted():
    logs = sorted(H200.glob("pytest_gpu_kernel_g*_callkernels_session50.log"))
    assert len(logs) == 8
    passed = failed = 0
    longest = 0.0
    failures = []
    for log in logs:
        text = log.read_text()
        summary = re.search(r"=+ (?:(\d+) failed, )?(\d+) passed, \d+ deselected in ([0-9.]+)s", text)
        assert summary, log.name
        failed += int(summary.group(1) or 0)
        passed += int(summary.group(2))
        longest = max(longest, float(summary.group(3)))
        failures += re.findall(r"^FAILED (\S+)", text, re.M)
    assert (passed, failed, f"{longest:.2f}") == (1156, 1, "273.72")
    assert failures == ["tests/test_nn_overhead.py::test_unchecked_sparse_op_equals_the_public_op[torch-None]"]
    assert "**1156 passed, 1 failed** of 1157" in LOG and "the longest 273.72 s" in LOG
    assert all("NVIDIA H200" in (H200 / f"environment_call{c}_session50.txt").read_text()
               and "commit 20ce056" in (H200 / f"environment_call{c}_session50.txt").read_text()
               for c in ("kernels", "heavyrows4"))
    for text in (README, PERFORMANCE):
        assert "1156 passed, 1 failed" in text


@pytest.mark.parametrize(("label", "heavy", "budgets", "row_ms", "pass_us", "sparse_ms", "dense_ms", "ratio"), [
    ("heavy64_count_2048", 64, "64-64", "0.80", "304.5", "12.92", "13.16", "1.019x"),
    ("heavy32_count_2048", 32, "64-128", "0.70", "320.1", "12.85", "13.14", "1.023x"),
])
def test_probe_figures(label, heavy, budgets, row_ms, pass_us, sparse_ms, dense_ms, ratio):
    sparse, figures = long_row_probe_figures(H200 / f"recorded_forward_probe_{label}_session50.json", heavy, True)
    assert figures == ("28", row_ms, pass_us, sparse_ms, dense_ms, ratio)
    assert sparse["tokens"] == 2048 and (min(sparse["l0"]), max(sparse["l0"])) == (15.1, 44.6)
    assert f"{min(sparse['dense_rows'])}-{max(sparse['dense_rows'])}" == budgets
    row = f"| {label} | 2048 | {heavy} | 28 | {budgets} | {row_ms} | {pass_us} | {sparse_ms} | {dense_ms} | {ratio} |"
    assert row in LOG


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
