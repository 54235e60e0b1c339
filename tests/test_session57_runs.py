"""The session 57 figures that the README, docs/performance.md, ``bench_results/h100/session57_runs.md`` and
``twell.nn.call_graphs.RECORD_MIN_FLOPS``'s comment quote are the committed H100 runs': the 1.5B model's eager forward
with every layer's calls recorded (``eager_floor_probe.py --graphs 4``, runs a and b, then c at 1024-4096 tokens) and
the GPU suite's three logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _helpers import clean_gpu_suite_passed, flat_text

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"
RUNS = flat_text(H100 / "session57_runs.md")
README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")
CALL_GRAPHS = flat_text(ROOT / "src" / "twell" / "nn" / "call_graphs.py")
GRAPHS = "sparse:default+graphs"


def _rows(run: str) -> dict[int, dict]:
    data = json.loads((H100 / f"eager_floor_probe_{run}_session57.json").read_text())
    assert data["device"] == "NVIDIA H100 80GB HBM3" and data["graphs"] == 4
    return {r["tokens"]: r for r in data["rows"]}


A, B, C = _rows("a_call1"), _rows("b_call1"), _rows("c_call2")


def _x(row: dict, name: str) -> str:
    return f"{row[f'{name}_speedup']:.3f}x"


def test_recorded_forward_wins_from_4096_tokens_in_every_run():
    assert [_x(r[4096], GRAPHS) for r in (A, B, C)] == ["1.197x", "1.200x", "1.116x"]
    assert [_x(r[6144], GRAPHS) for r in (A, B)] == ["1.186x", "1.183x"]
    assert [_x(r[8192], GRAPHS) for r in (A, B)] == ["1.222x", "1.208x"]
    assert all(r[n][f"{GRAPHS}_recorded_layers"] == 28 for r in (A, B) for n in (2048, 4096, 6144, 8192))
    assert all(r[n][f"{GRAPHS}_recorded_layers"] == 0 for r in (A, B) for n in (12288, 16384))
    for text in (RUNS, PERFORMANCE, CALL_GRAPHS):
        assert "1.197x / 1.200x" in text
    want = "**1.197x / 1.200x / 1.116x at 4096 tokens, 1.186x / 1.183x at 6144, 1.222x / 1.208x at 8192**"
    assert want in PERFORMANCE
    assert "| 4096 | 23.73 / 23.73 | 0.994x / 0.997x | 0.737x / 0.715x | **1.197x / 1.200x** |" in RUNS
    assert "| 8192 | 45.14 / 44.81 | 0.990x / 0.998x | 1.238x / 1.233x | **1.222x / 1.208x** |" in RUNS


def test_recorded_forward_does_not_win_below_4096_tokens():
    below = [_x(A[2048], GRAPHS), _x(B[2048], GRAPHS), _x(C[2048], GRAPHS), _x(C[1024], GRAPHS)]
    assert below == ["0.981x", "0.916x", "0.972x", "0.946x"]
    assert "0.981x / 0.916x / 0.972x at 2048 and 0.946x at 1024" in PERFORMANCE
    assert "0.981x / 0.916x / 0.972x at 2048 and 0.946x at 1024" in CALL_GRAPHS
    assert "(0.916-0.981x on an H100)" in README and "(0.916-0.981x)" in RUNS
    assert C[1024][f"{GRAPHS}_recorded_layers"] == 27 and "(27 of 28 layers recorded)" in RUNS
    # hence the floor: 4096 tokens' work at 2048 x 5632
    from twell.nn.call_graphs import RECORD_MIN_FLOPS

    assert RECORD_MIN_FLOPS == 6 * 4096 * 2048 * 5632


def test_unrecorded_calls_and_the_default_as_quoted():
    assert [_x(r[4096], "sparse:tables") for r in (A, B)] == ["0.737x", "0.715x"]
    assert [_x(r[6144], "sparse:tables") for r in (A, B)] == ["1.027x", "0.976x"]
    assert [_x(r[8192], "sparse:tables") for r in (A, B)] == ["1.238x", "1.233x"]
    assert "unrecorded ran 0.737x / 0.715x, 1.027x / 0.976x, 1.238x / 1.233x" in PERFORMANCE
    assert [f"{r[2048]['dense_ms']:.2f}" for r in (A, B)] == ["12.93", "13.11"]
    assert "dense 12.9-13.1 ms at 2048 tokens" in PERFORMANCE
    assert [_x(r[12288], n) for r in (A, B) for n in ("sparse:default", GRAPHS)] == ["1.341x", "1.272x", "1.332x",
                                                                                       "1.268x"]
    assert "| 12,288 | 67.01 / 66.49 | 1.341x / 1.332x | 1.260x / 1.261x | 1.272x / 1.268x |" in RUNS


@pytest.mark.parametrize("group,passed", [(0, 38), (1, 121), (2, 48)])
def test_gpu_suite_logs(group, passed):
    assert clean_gpu_suite_passed(H100 / f"pytest_gpu_gpu_g{group}_session57.log") == passed
    assert 38 + 121 + 48 == 207 and "**207 passed**" in README and "**207 passed**" in RUNS


A5, B5 = _rows("a_call5"), _rows("b_call5")


def test_second_machine_as_quoted():
    assert [_x(r[n], GRAPHS) for n in (4096, 6144, 8192) for r in (A5, B5)] == [
        "1.217x", "0.996x", "1.214x", "1.151x", "1.238x", "1.228x"]
    assert all(r[2048][f"{GRAPHS}_recorded_layers"] == 0 for r in (A5, B5))  # under the shipped recording floor
    assert all(r[n][f"{GRAPHS}_recorded_layers"] == 28 for r in (A5, B5) for n in (4096, 6144, 8192))
    # the README's summary of both machines (since session 58): 1.00-1.22x at 4096, 1.15-1.24x at 6144-8192
    at_4096 = [r[4096][f"{GRAPHS}_speedup"] for r in (A, B, C, A5, B5)]
    at_6144_8192 = [r[n][f"{GRAPHS}_speedup"] for r in (A, B, A5, B5) for n in (6144, 8192)]
    assert f"{min(at_4096):.2f}-{max(at_4096):.2f}x" == "1.00-1.22x"
    assert f"{min(at_6144_8192):.2f}-{max(at_6144_8192):.2f}x" == "1.15-1.24x"
    assert "On two H100 machines (session 57): 1.00-1.22x at 4096, 1.15-1.24x at 6144-8192" in README
    assert "1.217x / 0.996x at 4096 tokens, 1.214x / 1.151x at 6144, 1.238x / 1.228x at 8192" in PERFORMANCE
    row = "| 4096 | 23.77 / 24.17 | 0.979x / 0.990x | 0.557x / 0.449x | **1.217x / 0.996x** | 1.197x / 1.200x |"
    assert row in RUNS
    tables = [r[n]["sparse:tables_speedup"] for r in (A5, B5) for n in (2048, 4096, 6144, 8192)]
    assert f"{min(tables):.2f}" == "0.45" and f"{max(tables):.2f}" == "0.81"
    assert "the unrecorded tables 0.45-0.81x up to 8192" in PERFORMANCE


def test_bench_model_graphed_variant_as_quoted():
    data = json.loads((H100 / "model_forward_b2_graphs_call5_session57.json").read_text())
    variants = data["meta"]["parts"]["forward"]["result"]["variants"]
    graphed = variants["sparse:default+graphs"]
    assert f"{graphed['speedup']:.3f}x" == "1.034x" and graphed["recorded_layers"] == list(range(28))
    assert f"{variants['dense']['ms']:.2f}" == "30.54" and f"{graphed['ms']:.2f}" == "29.54"
    assert graphed["ok"] is True
    assert "**default+graphs 1.034x** (29.54 ms; all 28 layers recorded;" in RUNS
