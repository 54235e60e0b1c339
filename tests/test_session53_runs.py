"""The session 53 figures that the README, docs/performance.md, ``hot_cold_cache``'s comment and the session's log quote
are the committed runs' (``bench_results/h100/session53_runs.md``, H100 80GB HBM3): the steep sequence head's kernel
profile at 2048 tokens, and tune-dispatch with the long-row rule's pair bound at 0 / 256 / 128."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import flat_text

from twell.nn import hot_cold_cache

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"

LOG_TEXT = (H100 / "session53_runs.md").read_text()
LOG = flat_text(H100 / "session53_runs.md")
README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")
CACHE = flat_text(ROOT / "src" / "twell" / "nn" / "hot_cold_cache.py")
LABELS = ("head40_pairs0", "head40_pairs256", "head40_pairs128", "head4_pairs0", "head4_pairs256")
RUNS = {label: json.loads((H100 / f"dispatch_2048x5632_session53_{label}.json").read_text()) for label in LABELS}


def _point(label: str, m: int, density: float) -> dict:
    (row,) = [r for r in RUNS[label]["rows"] if r["m"] == m and r["density_pct"] == density]
    return row


def _profile(name: str) -> str:
    return (H100 / f"{name}_session53.log").read_text()


@pytest.mark.parametrize(("call", "commit"), [("steephead", "6654362"), ("2", "c33f011")])
def test_environment(call, commit):
    env = (H100 / f"environment_call{call}_session53.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in env and f"commit {commit}" in env and "triton 3.6.0" in env


def test_steep_head_profile():
    """Call 1: no budget at 2048 tokens / l0 28, the row kernel's tail; a budget at l0 56 and 4096 tokens."""
    log = _profile("profile_head40_callsteephead")
    assert ("M=2048 l0=28.0: 1728 hot units, dense-row budget 0 rows; the sample's rows with an overflowing cold tile "
            "2.0, with several 0.0, heavy rows by bound {64: 5.0, 128: 4.0}") in log
    assert "M=2048 l0=56.0: 2688 hot units, dense-row budget 64 rows" in log
    assert "M=4096 l0=28.0: 1856 hot units, dense-row budget 64 rows" in log
    module = log.split("M=2048 l0=28.0 module:")[1].split("M=2048 l0=28.0 hot/cold op")[0]
    assert "kernels 0.3422 ms/call" in module and re.search(r"0\.184 +1 +_twell_ffn_row_kernel", module)
    op56 = log.split("M=2048 l0=56.0 hot/cold op:")[1].split("M=4096")[0]
    assert re.search(r"0\.671 +1 +_twell_ffn_row_kernel", op56)
    op4096 = log.split("M=4096 l0=28.0 hot/cold op:")[1]
    assert "kernels 2.0249 ms/call" in op4096 and re.search(r"1\.764 +1 +_twell_ffn_row_kernel", op4096)
    default = _profile("profile_head4_callsteephead")
    assert "M=2048 l0=28.0: 1536 hot units, dense-row budget 0 rows" in default
    assert "module: kernels 0.1865 ms/call" in default and re.search(r"0\.035 +1 +_twell_ffn_row_kernel", default)
    assert "the row kernel **0.184 ms** (default head 0.035)" in PERFORMANCE
    assert "those rows stayed in the row kernel, 0.184 ms against 0.035 with the default head" in README


def test_pair_bound_profile():
    log = _profile("profile_head40_pairs256_call2")
    assert ("M=2048 l0=28.0: the rows with the most cold pairs (position, cold pairs, overflowing tiles) "
            "[(0, 349, 1), (2, 282, 1),") in log
    assert "M=2048 l0=14.0: 704 hot units, dense-row budget 64 rows" in log
    assert "M=2048 l0=28.0: 1728 hot units, dense-row budget 64 rows" in log
    assert "M=2048 l0=28.0 module: kernels 0.2122 ms/call" in log
    assert "(the longest 349 and 282 pairs)" in CACHE


def test_log_table_is_the_runs():
    """Every row of the log's table, read back from the five tuning runs."""
    lines = [ln for ln in LOG_TEXT.splitlines() if re.match(r"\| \d+ / [0-9.]+ % \|", ln) and ln.count("|") == 7]
    assert len(lines) == 9
    for ln in lines:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        m, dens = cells[0].split(" / ")
        want = [f"{_point(label, int(m), float(dens.rstrip(' %')))['sparse_ms']:.3f} ms, "
                f"{_point(label, int(m), float(dens.rstrip(' %')))['speedup']:.2f}x" for label in LABELS]
        assert cells[1:] == want


def test_runs_as_quoted():
    for run in RUNS.values():
        assert run["meta"]["device"] == "NVIDIA H100 80GB HBM3" and run["meta"]["commit"] == "c33f011"
        assert all(r["ok"] and f"{r['rel_err']:.1e}" == "3.3e-03" for r in run["rows"])
    before, after, p128 = (_point(k, 2048, 0.5) for k in ("head40_pairs0", "head40_pairs256", "head40_pairs128"))
    assert (f"{before['speedup']:.2f}", f"{after['speedup']:.2f}", f"{p128['speedup']:.2f}") == ("0.70", "1.02", "1.02")
    assert (f"{before['sparse_ms']:.3f}", f"{after['sparse_ms']:.3f}", f"{p128['sparse_ms']:.3f}") == \
        ("0.325", "0.221", "0.220")
    low = [f"{_point(k, 2048, 0.25)['speedup']:.2f}" for k in ("head40_pairs0", "head40_pairs256", "head40_pairs128")]
    assert low == ["0.83", "1.06", "1.07"]
    assert [f"{_point(k, 8192, 1.0)['sparse_ms']:.3f}" for k in ("head4_pairs0", "head4_pairs256")] == \
        ["0.552", "0.582"]
    for text in (LOG, CACHE):
        assert "0.70x -> 1.02x" in text and "(0.325 -> 0.221" in text
    assert "0.83x -> 1.06x / 1.07x at 0.25 %" in CACHE and "0.83x -> 1.06x / 1.07x at 0.25 %" in LOG
    assert "(0.552 / 0.582 ms" in CACHE and "(0.552 / 0.582 ms" in LOG
    for text in (README, PERFORMANCE):
        assert "0.70x -> 1.02x" in text
    later = [_point("head40_pairs256", m, d)["speedup"] for m in (4096, 8192) for d in (0.25, 0.5, 1.0)]
    assert (f"{min(later):.2f}", f"{max(later):.2f}", f"{_point('head40_pairs256', 2048, 1.0)['speedup']:.2f}") == \
        ("1.22", "1.73", "0.99")
    assert "2048 tokens / 1 % 0.99x (a budget there already), 4096-8192 tokens 1.22-1.73x as before" in README
    steep = [_point("head40_pairs256", m, d)["speedup"] for m in (2048, 4096, 8192) for d in (0.25, 0.5, 1.0)]
    assert f"{min(steep):.2f}" == "0.99" and "every steep-head point >= 0.99x" in README
    assert hot_cold_cache.DENSE_ROWS_SEVERE_PAIRS == 256


def test_gpu_tests_of_the_rule():
    log = (H100 / "pytest_gpu_dense_rows_call3_session53.log").read_text()
    assert "48 passed" in log and "failed" not in log and "48 passed" in LOG
