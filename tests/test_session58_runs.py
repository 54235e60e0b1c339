"""The session 58 figures that the README, docs/performance.md, ``bench_results/h200/session58_runs.md`` and the
comments of ``twell.nn.call_graphs`` and ``SparseGatedMLP`` quote are the committed H200 runs': the 1.5B model's eager
forward with recorded calls above and below the eager floor (``eager_floor_probe.py --graphs 4``), ``twell bench
model --batch 2`` and the GPU suite's three logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _helpers import clean_gpu_suite_passed, flat_text

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "bench_results" / "h200"
RUNS = flat_text(H200 / "session58_runs.md")
README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")
CALL_GRAPHS = flat_text(ROOT / "src" / "twell" / "nn" / "call_graphs.py")
MLP = flat_text(ROOT / "src" / "twell" / "nn" / "mlp.py")
GRAPHS, DEFAULT = "sparse:default+graphs", "sparse:default"


def _rows(stem: str) -> dict[int, dict]:
    data = json.loads((H200 / f"{stem}_session58.json").read_text())
    assert data["device"] == "NVIDIA H200" and data["graphs"] == 4
    return {r["tokens"]: r for r in data["rows"]}


A, B = _rows("probe_above_floor_a_call1"), _rows("probe_above_floor_b_call1")
C, D = _rows("probe_below_floor_c_call1"), _rows("probe_bound_d_call2")
E, F = _rows("probe_shipped_e_call4"), _rows("probe_shipped_f_call4")


def _x(row: dict, name: str) -> str:
    return f"{row[f'{name}_speedup']:.3f}x"


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}x"


def test_recording_above_the_floor_as_quoted_and_the_bound_it_set():
    assert [_x(r[12288], n) for n in (GRAPHS, DEFAULT) for r in (A, B)] == ["1.351x", "1.367x", "1.242x", "1.180x"]
    assert [_x(r[16384], n) for n in (GRAPHS, DEFAULT) for r in (A, B)] == ["1.355x", "1.365x", "1.378x", "1.400x"]
    assert all(r[n][f"{GRAPHS}_recorded_layers"] == 28 for r in (A, B) for n in r)
    # 24,576-32,768 tokens: recorded 2.5-4.5 % below the default (a fraction of the default's time)
    losses = [1 - r[n][f"{GRAPHS}_speedup"] / r[n][f"{DEFAULT}_speedup"] for r in (A, B) for n in (24576, 32768)]
    assert f"{100 * min(losses):.1f}-{100 * max(losses):.1f}" == "2.5-4.5"
    quote = "1.351x / 1.367x of dense at 12,288 tokens where the unrecorded default ran 1.242x / 1.180x"
    assert quote in CALL_GRAPHS
    assert "1.355x / 1.365x at 16,384 against 1.378x / 1.400x" in CALL_GRAPHS
    assert "2.5-4.5 % below the default at 24,576-32,768" in PERFORMANCE
    assert "| 12,288 | 64.25 / 64.38 | 1.242x / 1.180x | **1.351x / 1.367x** |" in RUNS
    from twell.nn.call_graphs import RECORD_MAX_FLOPS

    assert RECORD_MAX_FLOPS == 6 * 12288 * 2048 * 5632
    assert all(r[n][f"{GRAPHS}_recorded_layers"] == (28 if n <= 12288 else 0) for r in (D, E, F) for n in r
               if n >= 4096)


def test_the_loss_at_12288_and_the_unrecorded_default_there():
    assert [_x(D[12288], GRAPHS), _x(D[12288], DEFAULT)] == ["1.272x", "1.325x"]
    assert "(1.272x against 1.325x" in PERFORMANCE and "**1.272x at 12,288 against the default's 1.325x**" in RUNS
    defaults = [r[12288][f"{DEFAULT}_speedup"] for r in (A, B, D, E, F)]
    recorded = [r[12288][f"{GRAPHS}_speedup"] for r in (A, B, D, E, F)]
    assert _span(defaults) == "0.77-1.32x" and _span(recorded) == "1.25-1.37x"
    assert "0.77-1.32x at 12,288" in MLP and "1.25-1.37x at 12,288" in MLP
    assert "1.25-1.37x at 12,288" in README and "0.77-1.32x at 12,288" in README
    assert _x(F[12288], DEFAULT) == "0.771x" and f"{F[12288][f'{DEFAULT}_ms']:.2f}" == "81.56"
    # the recorded forward's time by where its layers chose their hot units: at 12,288 tokens (a, b) or before (d-f)
    chosen_here = [r[12288][f"{GRAPHS}_ms"] for r in (A, B)]
    chosen_before = [r[12288][f"{GRAPHS}_ms"] for r in (D, E, F)]
    assert f"{min(chosen_here):.1f}-{max(chosen_here):.1f}" == "47.1-47.6"
    assert f"{min(chosen_before):.1f}-{max(chosen_before):.1f}" == "49.4-50.6"
    assert "ran 47.1-47.6 ms where its layers chose at 12,288 and 49.4-50.6 ms" in PERFORMANCE
    assert [f"{v:.2f}" for v in chosen_here + chosen_before] == ["47.57", "47.08", "49.55", "50.57", "49.35"]
    assert "took 49.55 ms here against 47.57 / 47.08 in runs a and b" in RUNS and "50.57 / 49.35 in call 4's" in RUNS


def test_recordings_below_the_floor_as_quoted():
    at_4096 = [r[4096][f"{GRAPHS}_speedup"] for r in (C, E, F)]
    assert [f"{v:.3f}x" for v in at_4096] == ["1.003x", "1.036x", "1.028x"]
    assert _span([r[6144][f"{GRAPHS}_speedup"] for r in (C, E, F)]) == "1.16-1.20x"
    assert _span([r[8192][f"{GRAPHS}_speedup"] for r in (C, D, E, F)]) == "1.21-1.26x"
    below = [r[n][f"{DEFAULT}_speedup"] for r in (C, E, F) for n in (4096, 6144, 8192)]
    assert _span(below) == "0.99-1.00x"
    assert "**1.003x / 1.036x / 1.028x at 4096 tokens, 1.16-1.20x at 6144, 1.21-1.26x at 8192, 1.25-1.37x" in README
    assert "1.00-1.09x at 4096 tokens, 1.16-1.20x at 6144, 1.21-1.26x at 8192 and 1.25-1.37x at 12,288" in MLP
    assert "1.003-1.091x at 4096 tokens" in PERFORMANCE


def test_bench_model_at_4096_tokens():
    data = json.loads((H200 / "model_forward_b2_graphs_call3_session58.json").read_text())
    variants = data["meta"]["parts"]["forward"]["result"]["variants"]
    graphed = variants[GRAPHS]
    assert f"{graphed['speedup']:.3f}x" == "1.091x" and graphed["recorded_layers"] == list(range(28))
    assert f"{variants[DEFAULT]['speedup']:.3f}x" == "0.995x"
    assert f"{graphed['ms']:.2f}" == "26.85" and f"{variants['dense']['ms']:.2f}" == "29.30"
    assert "`twell bench model --batch 2` (4096 tokens) 1.091x against the default's 0.995x" in README
    b6 = json.loads((H200 / "model_forward_b6_graphs_call3_session58.json").read_text())
    assert b6["meta"]["parts"]["forward"]["result"]["variants"][GRAPHS]["recorded_layers"] == []
    assert "nothing recorded (`recorded_layers` empty)" in RUNS


@pytest.mark.parametrize("group,passed", [(0, 93), (1, 58), (2, 56)])
def test_gpu_suite_logs(group, passed):
    assert clean_gpu_suite_passed(H200 / f"pytest_gpu_gpu_g{group}_callgpus_session58.log") == passed
    assert 93 + 58 + 56 == 207 and "**207 passed** at 27796ba in session 58, on the H200" in README
    assert "**207 passed** (93 + 58 + 56)" in RUNS
