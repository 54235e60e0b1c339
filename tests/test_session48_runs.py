"""The session 48 figures that the README, docs/performance.md and the dense-row pass's switch quote are the
committed runs' (``bench_results/h100/session48_runs.md``): the dense-row pass as Triton kernels against its PyTorch
twins, same card, and the GPU suite on the commit before the switch went on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import kernel_ms, probe_rows

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"
PASS_KERNELS = ("_overflow_flags_kernel", "_overflow_ranks_kernel", "_gated_product_kernel", "_scatter_rows_kernel")


def _flat(text: str) -> str:
    """The text with line breaks, comment markers and runs of spaces as single spaces (quotes span wrapped lines)."""
    return " ".join(text.replace("#:", " ").split())


README = _flat((ROOT / "README.md").read_text())
PERFORMANCE = _flat((ROOT / "docs" / "performance.md").read_text())
LOG = _flat((H100 / "session48_runs.md").read_text())
SWITCH_SOURCE = _flat((ROOT / "src" / "twell" / "ops" / "hot_cold_dense_rows.py").read_text())


def _probe(label: str) -> dict[str, dict]:
    return probe_rows(H100 / f"recorded_forward_probe_{label}_session48.json")


@pytest.mark.parametrize(("label", "fused", "bound", "passes", "row_ms", "pass_us", "sparse_ms", "gpu_ratio"), [
    ("unfused_4096", False, 3.0, 23, "4.20", None, "27.11", "0.991x"),
    ("fused_4096", True, 3.0, 23, "4.21", "223.7", "26.52", "1.013x"),
    ("unfused_8192", False, 3.0, 16, "6.09", None, "45.63", "1.123x"),
    ("fused_8192", True, 3.0, 16, "6.15", "176.3", "45.40", "1.129x"),
    ("fused_bound10_4096", True, 10.0, 28, "4.86", "291.5", "26.10", "1.029x"),
])
def test_probe_figures(label, fused, bound, passes, row_ms, pass_us, sparse_ms, gpu_ratio):
    meta = json.loads((H100 / f"recorded_forward_probe_{label}_session48.json").read_text())
    assert meta["fused_pass"] is fused and meta["small_bound"] == bound and meta["cached_weights"] is True
    rows = _probe(label)
    sparse, dense = rows["sparse:tables"], rows["dense"]
    assert sum(1 for n in sparse["dense_rows"] if n) == passes
    assert f"{kernel_ms(sparse, '_twell_ffn_row_kernel'):.2f}" == row_ms
    launched = sum(kernel_ms(sparse, name) for name in PASS_KERNELS) * 1e3
    assert (f"{launched:.1f}" == pass_us) if fused else launched == 0
    assert f"{sparse['gpu_ms']:.2f}" == sparse_ms
    assert f"{dense['gpu_ms'] / sparse['gpu_ms']:.3f}x" == gpu_ratio
    assert sparse["cudagraph_skips"] == 0 and sparse["unique_graphs"] == 1 and all(sparse["cached_weights_ready"])
    table = LOG.replace("**", "")
    assert f"| {sparse_ms} |" in table and f"| {gpu_ratio} |" in table and f"| {row_ms} |" in table


def test_eager_host_times_as_quoted():
    host = {label: f"{_probe(label)['sparse:tables']['eager']['host_ms']:.2f}"
            for label in ("unfused_4096", "fused_4096", "unfused_8192", "fused_8192")}
    quote = (f"{host['unfused_4096']} -> {host['fused_4096']} / {host['unfused_8192']} -> {host['fused_8192']}")
    assert quote == "39.66 -> 38.00 / 35.58 -> 32.39"
    for text in (SWITCH_SOURCE, PERFORMANCE):
        assert quote in text


def test_switch_and_docs_quote_the_ab():
    assert "27.11 -> 26.52 ms at 4096 tokens (23 passes; 0.991x -> 1.013x of recorded dense)" in SWITCH_SOURCE
    assert "45.63 -> 45.40 at 8192 (16 passes; 1.123x -> 1.129x)" in SWITCH_SOURCE
    assert "FUSED_PASS = True" in SWITCH_SOURCE
    assert "27.11 -> 26.52 ms (0.991x -> 1.013x of dense by GPU time)" in PERFORMANCE
    assert "on since session 48 (the recorded 1.5B forward 27.11 -> 26.52 ms at 4096 tokens on an H100)" in README


def test_gpu_suites_as_quoted():
    log = (H100 / "pytest_gpu_all_callfusedpass_session48.log").read_text()
    assert re.search(r"^200 passed, 2064 deselected, \d+ warnings in 252\.54s", log, re.M)
    kernels = (H100 / "pytest_gpu_dense_rows_callfusedpass_session48.log").read_text()
    assert re.search(r"^11 passed, 127 deselected", kernels, re.M)
    assert "200 passed** in 252.54 s" in LOG and "11 passed" in LOG
    assert "commit 5464467" in (H100 / "environment_callfusedpass_session48.txt").read_text()
