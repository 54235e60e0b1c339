"""The session 54 figures that the README, docs/performance.md, ``twell.models.causal_mask`` and
``hot_cold_dense_rows.BATCH_PASS_MAX_ROWS``'s comment quote are the committed runs' (``bench_results/h100/
session54_runs.md``, H100 80GB HBM3): the dense-row pass through the small-batch kernels (calls 1-2), and the recorded
1.5B forward with the traced causal mask left to SDPA's ``is_causal`` (calls 2-4)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import flat_text, kernel_ms, probe_rows

from twell.ops import hot_cold_dense_rows

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"

LOG = flat_text(H100 / "session54_runs.md")
README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")
DENSE_ROWS = flat_text(ROOT / "src" / "twell" / "ops" / "hot_cold_dense_rows.py")
CAUSAL = flat_text(ROOT / "src" / "twell" / "models" / "causal_mask.py")
CUDNN = "cudnn_generated_fort_native_sdpa"


def _tune(label: str) -> dict[tuple[int, float], dict]:
    rows = json.loads((H100 / f"dispatch_2048x5632_session54_{label}.json").read_text())["rows"]
    return {(r["m"], r["density_pct"]): r for r in rows}


def _forward(label: str) -> dict[str, dict]:
    return probe_rows(H100 / f"recorded_forward_probe_{label}_session54.json")


@pytest.mark.parametrize("call", ["1", "2", "3", "5"])
def test_environment(call):
    env = (H100 / f"environment_call{call}_session54.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in env and "triton 3.6.0" in env and "torch 2.11.0" in env


def test_batch_pass_profile():
    """Call 1: the pass's kernels at 2048 tokens / l0 28, steep head: three GEMMs against the small-batch kernels."""
    gemms = (H100 / "profile_head40_batch0_call1_session54.log").read_text().split(" module: ")[1].split("hot/cold")[0]
    batch = (H100 / "profile_head40_batch64_call1_session54.log").read_text().split(" module: ")[1].split("hot/cold")[0]
    assert "kernels 0.2130 ms/call" in gemms and "kernels 0.2300 ms/call" in batch
    assert re.search(r"0\.024 +2 +nvjet_sm90_tst_64x64", gemms) and re.search(r"0\.012 +1 +nvjet_sm90_tst_32x64", gemms)
    for t, name in (("0.012", "nvjet_sm90_tst_64x64"), ("0.013", "_batch_up_kernel"), ("0.014", "_batch_down_kernel"),
                    ("0.002", "_partial_sum_kernel")):
        assert re.search(rf"{re.escape(t)} +1 +{name}", batch), name
    assert "the pass **0.041 against 0.038 ms**" in PERFORMANCE
    assert "the pass 0.041 ms (cuBLAS gate 0.012, up kernel 0.013, down kernel 0.014, partial sum 0.002)" in DENSE_ROWS
    assert hot_cold_dense_rows.BATCH_PASS_MAX_ROWS == 0  # measured no faster: off


def test_batch_pass_tuning():
    off, on = _tune("head40_batch0"), _tune("head40_batch64")
    assert f"{off[(2048, 0.5)]['sparse_ms']:.3f}" == "0.220" and f"{on[(2048, 0.5)]['sparse_ms']:.3f}" == "0.222"
    assert f"{off[(2048, 1.0)]['sparse_ms']:.3f}" == "0.245" and f"{on[(2048, 1.0)]['sparse_ms']:.3f}" == "0.251"
    assert f"{off[(2048, 1.0)]['speedup']:.2f}" == "0.92"
    for label in ("head40_batch0", "head40_batch64", "head4_batch0", "head4_batch64"):
        assert all(r["ok"] for r in _tune(label).values())
    assert "held sparse 0.220 -> 0.222 ms at 0.5 %, 0.245 -> 0.251 at 1 %" in PERFORMANCE


def test_batch_pass_forward():
    """Call 2: the recorded forward at 2048 tokens as before the session, with the small-batch pass, with rule 1."""
    base, batch, rule1 = _forward("base_2048"), _forward("batch64_2048"), _forward("causalskip_2048")
    assert f"{base['sparse:tables']['gpu_ms']:.2f}" == "13.30" and f"{base['dense']['gpu_ms']:.2f}" == "13.44"
    assert f"{batch['sparse:tables']['gpu_ms']:.2f}" == "13.34" and f"{batch['dense']['gpu_ms']:.2f}" == "13.40"
    assert f"{rule1['sparse:tables']['gpu_ms']:.2f}" == "13.32"
    assert kernel_ms(rule1["sparse:tables"], CUDNN) > 3.7  # rule 1 alone: the mask still materialised
    assert "the forward 13.30 -> 13.34 ms (dense 13.44 / 13.40)" in PERFORMANCE


@pytest.mark.parametrize(("tokens", "off", "on"), [(2048, ("13.33", "13.40"), ("11.06", "11.18")),
                                                  (8192, ("42.83", "51.23"), ("32.79", "40.91"))])
def test_causal_mask_forward(tokens, off, on):
    """Calls 3-4: both rules off and on, each in its own process; the attention as eager's with them on."""
    rows_off, rows_on = _forward(f"skipoff_{tokens}"), _forward(f"skipon_{tokens}")
    for rows, want in ((rows_off, off), (rows_on, on)):
        assert (f"{rows['sparse:tables']['gpu_ms']:.2f}", f"{rows['dense']['gpu_ms']:.2f}") == want
        assert all(r["cudagraph_skips"] == 0 and r["unique_graphs"] == 1 for r in rows.values())
    for variant in ("sparse:tables", "dense"):
        assert kernel_ms(rows_on[variant], CUDNN) < 0.45 * kernel_ms(rows_off[variant], CUDNN)
    meta_on = json.loads((H100 / f"recorded_forward_probe_skipon_{tokens}_session54.json").read_text())
    meta_off = json.loads((H100 / f"recorded_forward_probe_skipoff_{tokens}_session54.json").read_text())
    assert meta_on["causal_skip"] is True and meta_off["causal_skip"] is False
    assert f"{off[0]} -> {on[0]} ms" in README
    assert f"| {tokens} | on | **{on[0]}" in LOG


def test_causal_mask_forward_4096():
    """Call 5: the rules-on run at 4096 tokens; the rules-off run cut after its dense forwards."""
    rows = _forward("skipon_4096")
    assert f"{rows['sparse:tables']['gpu_ms']:.2f}" == "18.84" and f"{rows['dense']['gpu_ms']:.2f}" == "21.82"
    assert f"{rows['dense']['gpu_ms'] / rows['sparse:tables']['gpu_ms']:.3f}" == "1.158"
    cut = (H100 / "probe_skipoff_4096_call5_session54.log").read_text()
    assert "tokens=4096 dense: wall 28.78 ms, held call host 1.92 gpu 26.80" in cut and "sparse:tables:" not in cut
    assert "at 4096 tokens 18.84 ms against recorded dense's 21.82 (1.158x; dense 26.80 ms with the mask)" in README


def test_causal_mask_quotes():
    assert "cuDNN's attention 3.77 ms over 28 layers recorded against 1.56 ms eager" in CAUSAL
    assert "13.33 -> 11.06 ms at 2048 tokens" in CAUSAL and "42.83 -> 32.79 ms at 8192" in CAUSAL
    assert "1.196x -> 1.248x" in README and "1.196x -> 1.248x" in PERFORMANCE


def test_gpu_suite():
    counts = []
    for g in range(3):
        last = (H100 / f"pytest_gpu_gpu_g{g}_callgpus_session54.log").read_text().strip().splitlines()[-1]
        counts.append(int(re.search(r"(\d+) passed", last).group(1)))
        assert "failed" not in last and "error" not in last and "skipped" not in last
    assert sum(counts) == 204
    assert "**204 passed**" in LOG
