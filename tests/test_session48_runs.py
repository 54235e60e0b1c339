"""The session 48 figures that the README, docs/performance.md and the dense-row pass's switch quote are the
committed runs' (``bench_results/h100/session48_runs.md``): the dense-row pass as Triton kernels against its PyTorch
twins, same card, and the GPU suite on the commit before the switch went on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import flat_text, kernel_ms, pass_kernels_us, probe_rows

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"


README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")
LOG = flat_text(H100 / "session48_runs.md")
SWITCH_SOURCE = flat_text(ROOT / "src" / "twell" / "ops" / "hot_cold_dense_rows.py")


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
    launched = pass_kernels_us(sparse)
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


@pytest.mark.parametrize(("label", "bound", "passes", "row_ms", "gate_ms", "hot", "sparse_ms", "dense_ms", "ratio"), [
    ("bound10_4096_a", 10.0, 28, "4.89", "4.39", 10688, "25.92", "26.59", "1.026x"),
    ("bound3_4096_a", 3.0, 23, "4.20", "5.07", 46848, "26.22", "26.67", "1.017x"),
    ("bound10_4096_b", 10.0, 28, "4.93", "4.37", 10688, "25.94", "26.67", "1.028x"),
    ("bound3_4096_b", 3.0, 23, "4.21", "5.08", 46848, "26.29", "26.68", "1.015x"),
    ("bound10_2048", 10.0, 28, "4.41", "2.34", 10560, "16.22", "13.41", "0.827x"),
    ("bound3_2048", 3.0, 28, "3.67", "2.66", 46208, "16.06", "13.42", "0.835x"),
])
def test_small_bound_probes(label, bound, passes, row_ms, gate_ms, hot, sparse_ms, dense_ms, ratio):
    meta = json.loads((H100 / f"recorded_forward_probe_{label}_session48.json").read_text())
    assert meta["small_bound"] == bound and meta["fused_pass"] is True and meta["cached_weights"] is True
    rows = _probe(label)
    sparse, dense = rows["sparse:tables"], rows["dense"]
    assert sum(1 for n in sparse["dense_rows"] if n) == passes and sum(sparse["hot_units"]) == hot
    assert f"{kernel_ms(sparse, '_twell_ffn_row_kernel'):.2f}" == row_ms
    assert f"{kernel_ms(sparse, '_hot_cold_gate_kernel'):.2f}" == gate_ms
    assert (f"{sparse['gpu_ms']:.2f}", f"{dense['gpu_ms']:.2f}") == (sparse_ms, dense_ms)
    assert f"{dense['gpu_ms'] / sparse['gpu_ms']:.3f}x" == ratio
    tokens = label.split("_")[1]
    row = f"| {label} | {tokens} | {int(bound)} | {passes} | {row_ms} | {gate_ms} | {hot:,} | {sparse_ms} |"
    assert row in LOG.replace("**", "")


def test_synthetic_bound_points():
    import csv

    got = {}
    for bound in (3, 10):
        for r in csv.DictReader((H100 / f"dispatch_2048x5632_session48_small_bound{bound}.csv").open()):
            cell = f"{float(r['sparse_ms']):.3f} ({float(r['speedup']):.2f}x)"
            got[(int(r["m"]), float(r["density_pct"]), bound)] = cell
    table = LOG
    for m in (2048, 4096):
        cells = " | ".join(f"{got[(m, p, 3)]} / {got[(m, p, 10)]}" for p in (0.25, 0.5, 1.0, 2.0))
        assert f"| {m} | {cells} |" in table
    # the synthetic layer's whole op that the 2048-token forward is set against
    assert got[(2048, 0.5, 3)] == "0.158 (1.43x)"
    assert "the bound stays 3" in table and "the bound stays 3" in PERFORMANCE


def test_bench_recorded_backbone_with_the_fused_pass():
    result = json.loads((H100 / "model_forward_recorded_b2_session48.json").read_text())["meta"]["parts"]["forward"][
        "result"]
    v = result["variants"]
    assert result["cached_weights"] is True and result["tokens"] == 4096
    assert f"{v['sparse:default']['compiled_speedup']:.3f}x" == "1.025x"
    assert (f"{v['sparse:default']['compiled_ms']:.2f}", f"{v['dense']['compiled_ms']:.2f}") == ("27.82", "28.53")
    for text in (README, LOG):
        assert "1.025x" in text and "27.82 vs 28.53 ms" in text
    layers = result["layers"]
    first8 = [r["l0_first8"] for r in layers]
    rest = [r["l0_rest"] for r in layers]
    assert (round(min(first8), -1), round(max(first8), -1)) == (360, 830)
    assert (round(min(rest)), round(max(rest))) == (14, 42)
    assert "positions fire 360-830 units against 14-42" in PERFORMANCE


def test_heavy_rows_on_the_cpu_as_quoted():
    stats = json.loads((H100 / "heavy_rows_stats_2048_session48.json").read_text())
    rows = [r for r in stats["rows"] if r["bound"] == 3.0]
    assert len(rows) == 28 and stats["tokens"] == 2048 and (stats["tile"], stats["capacity"]) == (128, 16)
    heaviest = [r["heaviest_left"][0]["pairs"] for r in rows]
    assert (min(heaviest), max(heaviest)) == (188, 321)
    assert {h["row"] for r in rows for h in r["heaviest_left"]} <= set(range(2, 11))
    over = {k: (min(r["left_rows_over"][k] for r in rows), max(r["left_rows_over"][k] for r in rows))
            for k in ("16", "32", "64", "128")}
    assert over == {"16": (36, 49), "32": (13, 31), "64": (7, 15), "128": (2, 7)}
    mean = [r["cold_pairs_per_row"] for r in rows]
    assert (f"{min(mean):.1f}", f"{max(mean):.1f}") == ("2.0", "2.6")
    assert {r["budget"] for r in rows} == {64} and {r["overflow_rows"] for r in rows} == {2, 3, 4}
    for text in (SWITCH_SOURCE, README, LOG):
        assert "188-321" in text and "2.0-2.6" in text
    assert "7-15 rows a layer there (31 at most over 32 pairs, 49 over 16)" in SWITCH_SOURCE
    assert "13-31 rows a layer over 32 pairs at 2048 tokens, 2-7 over 128" in PERFORMANCE


def test_heavy_rows_run_as_quoted():
    meta = json.loads((H100 / "recorded_forward_probe_heavy64_2048_session48.json").read_text())
    assert meta["heavy_pairs"] == 64 and meta["fused_pass"] is True and meta["small_bound"] == 3.0
    new, old = _probe("heavy64_2048"), _probe("bound3_2048")
    sparse, dense = new["sparse:tables"], new["dense"]
    assert f"{kernel_ms(sparse, '_twell_ffn_row_kernel'):.2f}" == "0.92"
    assert f"{kernel_ms(sparse, '_hot_cold_gate_kernel'):.2f}" == "2.62"
    assert f"{kernel_ms(sparse, '_list_twell_rows_kernel'):.2f}" == "0.66"
    assert (f"{sparse['gpu_ms']:.2f}", f"{dense['gpu_ms']:.2f}") == ("13.25", "13.42")
    assert f"{dense['gpu_ms'] / sparse['gpu_ms']:.3f}x" == "1.014x"
    assert f"{old['dense']['gpu_ms']:.2f}" == "13.42"
    eager = [f"{r['sparse:tables']['eager']['gpu_ms']:.2f} ({r['dense']['eager']['gpu_ms']:.2f})" for r in (old, new)]
    assert eager == ["14.27 (11.76)", "11.52 (11.74)"]
    table = LOG.replace("**", "")
    assert "| heavy64_2048 | 2048 | 0.92 | 2.62 | 0.66 | 13.25 | 13.42 | 1.014x | 11.52 (11.74) |" in table
    assert ("| bound3_2048 (call 2, bound 0) | 2048 | 3.67 | 2.66 | 0.68 | 16.06 | 13.42 | 0.835x | 14.27 (11.76) |"
            in table)
    assert "the row kernel 3.67 -> 0.92 ms, the forward 16.06 -> 13.25 ms, 0.835x -> 1.014x" in SWITCH_SOURCE
    assert "HEAVY_ROW_PAIRS = 64" in SWITCH_SOURCE
    assert "the forward **1.014x** of dense (13.25 vs 13.42 ms" in README
    tests = (H100 / "pytest_gpu_heavy_callheavyshort_session48.log").read_text()
    assert re.search(r"^21 passed, 101 deselected", tests, re.M)
    assert "commit b3a14df" in (H100 / "environment_callheavyshort_session48.txt").read_text()
    assert "commit 6daa5c1" in (H100 / "environment_callbound_session48.txt").read_text()
