"""The session 47 figures that the README, docs/performance.md and the dense-row rule's comment quote are the committed
runs' (``bench_results/h100/session47_runs.md``): the same-card A/B of the dense-row pass's several-tiles rule, the
cached weight copies, and the recorded 1.5B backbone with both."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import flat_text, kernel_ms, probe_rows

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"


README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")
LOG = flat_text(H100 / "session47_runs.md")
CACHE_SOURCE = flat_text(ROOT / "src" / "twell" / "nn" / "hot_cold_cache.py")
MLP_SOURCE = flat_text(ROOT / "src" / "twell" / "nn" / "mlp.py")


def _probe(label: str) -> dict[str, dict]:
    return probe_rows(H100 / f"recorded_forward_probe_{label}_session47.json")


def _forward(name: str) -> dict:
    return json.loads((H100 / name).read_text())["meta"]["parts"]["forward"]["result"]


@pytest.mark.parametrize(("label", "row_ms", "sparse_ms", "gpu_ratio", "passes"), [
    ("severe0_4096", "11.15", "33.99", "0.787x", 0),
    ("shipped_4096", "4.16", "28.88", "0.921x", 23),
    ("rows1_4096", "3.83", "28.95", "0.920x", 28),
    ("cached_4096", "4.16", "26.94", "0.988x", 23),
    ("severe0_8192", "8.75", "49.27", "1.046x", 4),
    ("shipped_8192", "6.08", "47.46", "1.083x", 16),
    ("cached_8192", "6.09", "46.10", "1.114x", 16),
])
def test_probe_figures(label, row_ms, sparse_ms, gpu_ratio, passes):
    rows = _probe(label)
    sparse, dense = rows["sparse:tables"], rows["dense"]
    assert f"{kernel_ms(sparse, '_twell_ffn_row_kernel'):.2f}" == row_ms
    assert f"{sparse['gpu_ms']:.2f}" == sparse_ms
    assert f"{dense['gpu_ms'] / sparse['gpu_ms']:.3f}x" == gpu_ratio
    assert sum(1 for n in sparse["dense_rows"] if n) == passes
    assert sparse["cudagraph_skips"] == 0 and sparse["unique_graphs"] == 1
    assert sparse["cached_weights_ready"] is None or all(sparse["cached_weights_ready"]) == label.startswith("cached")
    table = LOG.replace("**", "")  # the log's tables, bold figures plain
    assert f"| {gpu_ratio} |" in table and f"| {row_ms} |" in table and f"| {sparse_ms} |" in table


def test_rule_and_copies_as_the_readme_and_the_rule_quote_them():
    for text in (README, CACHE_SOURCE):
        assert "11.15" in text and "4.16" in text
    assert "0.787x to 0.921x of dense at 4096 tokens, 1.046x to 1.083x at 8192" in README
    assert "1.94 / 1.36 ms off (0.988x / 1.114x)" in README
    assert "0.787x -> 0.921x of dense by GPU time; 8192 tokens 8.75 -> 6.08 ms, 1.046x -> 1.083x" in CACHE_SOURCE
    assert "1.285x -> 1.310x" in CACHE_SOURCE and "1.285x -> 1.310x" in PERFORMANCE
    assert "28.88 -> 26.94 ms at 4096 tokens (0.921x -> 0.988x of recorded dense)" in MLP_SOURCE
    assert "47.46 -> 46.10 ms at 8192 (1.083x -> 1.114x)" in MLP_SOURCE


def test_eager_wall_at_12288_tokens():
    off, on = _probe("severe0_12288"), _probe("shipped_12288")
    ratios = [f"{r['dense']['eager']['wall_ms'] / r['sparse:tables']['eager']['wall_ms']:.3f}x" for r in (off, on)]
    assert ratios == ["1.285x", "1.310x"]
    assert "from 1.285x to 1.310x" in README


@pytest.mark.parametrize(("name", "cached", "speedup", "sparse_ms", "dense_ms"), [
    ("model_forward_recorded_b2_session47.json", False, "0.950x", "29.97", "28.46"),
    ("model_forward_recorded_b2_cached_session47.json", True, "1.016x", "28.05", "28.49"),
    ("model_forward_recorded_cached_b2_session47.json", True, "0.980x", "29.75", "29.16"),
    ("model_forward_recorded_cached_b4_session47.json", True, "1.136x", "48.26", "54.84"),
])
def test_recorded_backbone_figures(name, cached, speedup, sparse_ms, dense_ms):
    result = _forward(name)
    assert result["cached_weights"] is cached
    v = result["variants"]
    assert f"{v['sparse:default']['compiled_speedup']:.3f}x" == speedup
    assert f"{v['sparse:default']['compiled_ms']:.2f}" == sparse_ms
    assert f"{v['dense']['compiled_ms']:.2f}" == dense_ms
    if cached:
        assert all(v["sparse:default"]["cached_weights_ready"])
        assert f"{sparse_ms} vs {dense_ms}" in README
        assert speedup in PERFORMANCE
    assert f"{sparse_ms} vs {dense_ms}" in LOG


def test_partial_gpu_suite_as_quoted():
    log = (H100 / "pytest_gpu_all_callcached_session47.log").read_text()
    progress = [line for line in log.splitlines() if re.fullmatch(r"\.+( +\[ *\d+%\])?", line)]
    assert sum(line.split(" ")[0].count(".") for line in progress) == 153
    assert not re.search(r"\bfailed\b|FAILED|^[.sF]*F", log, re.M)  # cut by the limit before pytest's summary
    assert "153 passed, none failed" in LOG and "153 passed, none failed" in PERFORMANCE


def test_recorded_call_gpu_tests_as_quoted():
    log = (H100 / "pytest_gpu_recorded_callrowsab_session47.log").read_text()
    assert re.search(r"^5 passed, 32 deselected", log, re.M)
    assert "test_gpu_reduce_overhead_compile_matches_eager[True]" in log
    assert "the recorded-call GPU tests 5 passed" in README and "**5 passed**" in LOG
