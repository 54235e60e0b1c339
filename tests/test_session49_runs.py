"""The session 49 figures that the README, docs/performance.md and the long-row switches' comments quote are the
committed runs' (``bench_results/h100/session49_runs.md``): the long-row bound and the budget that counts the long
rows, same-call A/Bs of the recorded 1.5B forward on H100 machines; the CPU splits that predicted them; the GPU
tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import flat_text, kernel_ms, long_row_probe_figures, probe_rows

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"

README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")
LOG = flat_text(H100 / "session49_runs.md")
BOUND_SOURCE = flat_text(ROOT / "src" / "twell" / "ops" / "hot_cold_dense_rows.py")
COUNT_SOURCE = flat_text(ROOT / "src" / "twell" / "nn" / "hot_cold_cache.py")


def _meta_and_rows(label: str) -> tuple[dict, dict[str, dict]]:
    path = H100 / f"recorded_forward_probe_{label}_session49.json"
    return json.loads(path.read_text()), probe_rows(path)


@pytest.mark.parametrize(("label", "heavy", "counted", "passes", "row_ms", "pass_us", "sparse_ms", "dense_ms",
                          "ratio"), [
    ("heavy64_4096", 64, False, 23, "2.03", "266.7", "24.10", "26.82", "1.113x"),
    ("heavy0_4096", 0, False, 23, "4.22", "268.5", "26.39", "26.65", "1.010x"),
    ("heavy64_count_4096", 64, True, 28, "1.35", "352.5", "23.74", "26.64", "1.122x"),
    ("heavy64_2048", 64, False, 28, "0.93", "316.9", "13.32", "13.36", "1.002x"),
    ("heavy0_2048", 0, False, 28, "3.66", "319.2", "16.11", "13.41", "0.832x"),
    ("heavy64_count_2048", 64, True, 28, "0.93", "317.6", "13.32", "13.40", "1.006x"),
    ("heavy64_8192", 64, False, 17, "6.04", "219.2", "45.42", "51.51", "1.134x"),
    ("heavy0_8192", 0, False, 16, "6.13", "211.4", "45.42", "51.31", "1.130x"),
    ("heavy64_count_8192", 64, True, 28, "2.87", "443.6", "43.52", "51.41", "1.181x"),
])
def test_probe_figures(label, heavy, counted, passes, row_ms, pass_us, sparse_ms, dense_ms, ratio):
    sparse, figures = long_row_probe_figures(H100 / f"recorded_forward_probe_{label}_session49.json", heavy, counted)
    assert figures == (str(passes), row_ms, pass_us, sparse_ms, dense_ms, ratio)
    row = f"| {label} | {sparse['tokens']} | {heavy} | {'yes' if counted else 'no'} | {passes} | {row_ms} | {pass_us} |"
    assert row in LOG.replace("**", "")
    assert f"| {sparse_ms} | {dense_ms} | {ratio} |" in LOG.replace("**", "")


def test_what_outweighs_the_row_kernel_at_2048_tokens():
    _, rows = _meta_and_rows("heavy64_count_2048")
    sparse = rows["sparse:tables"]
    gate, lists = kernel_ms(sparse, "_hot_cold_gate_kernel"), kernel_ms(sparse, "_list_twell_rows_kernel")
    quote = (f"the gate ({gate:.2f} ms over 28 layers) and the list pass ({lists:.2f} ms) now outweigh the row kernel "
             f"({kernel_ms(sparse, '_twell_ffn_row_kernel'):.2f} ms)")
    assert quote == ("the gate (2.64 ms over 28 layers) and the list pass (0.67 ms) now outweigh the row kernel "
                     "(0.93 ms)")
    assert quote in PERFORMANCE


def test_layers_without_a_pass_at_8192_tokens():
    passes = {label: sum(1 for n in _meta_and_rows(label)[1]["sparse:tables"]["dense_rows"] if n)
              for label in ("heavy64_8192", "heavy0_8192")}
    assert sorted(28 - n for n in passes.values()) == [11, 12]
    assert "and 11-12 of the 28 layers ran no pass" in README


def test_counted_budgets_match_the_cpu_split():
    """The 8192-token run's counted budgets are the 192-384 rows a layer the CPU split predicted."""
    _, rows = _meta_and_rows("heavy64_count_8192")
    cpu = json.loads((H100 / "heavy_rows_stats_8192_heavy64_counted_session49.json").read_text())["rows"]
    assert (min(rows["sparse:tables"]["dense_rows"]), max(rows["sparse:tables"]["dense_rows"])) == (192, 384)
    assert (min(r["budget"] for r in cpu), max(r["budget"] for r in cpu)) == (192, 384)
    assert all(r["count_heavy"] and r["heavy_pairs"] == 64 and r["left_rows_over"]["64"] == 0 for r in cpu)


def test_long_rows_left_at_8192_tokens_as_quoted():
    rows = json.loads((H100 / "heavy_rows_stats_8192_heavy64_session49.json").read_text())["rows"]
    left = [r["left_rows_over"]["64"] for r in rows]
    assert f"{min(left)}-{max(left)}" == "51-196"
    for text in (README, PERFORMANCE, LOG, BOUND_SOURCE):
        assert "51-196 rows a layer over 64" in text


@pytest.mark.parametrize(("name", "no_budget", "left_over_64"), [
    ("4096_heavy64", 7, 173), ("4096_heavy64_counted", 0, 0), ("8192_heavy64", 13, 3274),
    ("8192_heavy64_counted", 0, 0)])
def test_cpu_splits_as_quoted(name, no_budget, left_over_64):
    rows = json.loads((H100 / f"heavy_rows_stats_{name}_session49.json").read_text())["rows"]
    assert len(rows) == 28 and all(r["heavy_pairs"] == 64 for r in rows)
    assert sum(r["budget"] == 0 for r in rows) == no_budget
    assert sum(r["left_rows_over"]["64"] for r in rows) == left_over_64


def test_switch_comments_and_docs_quote_the_runs():
    assert ("2048 tokens 16.11 -> 13.32 ms (row kernel 3.66 -> 0.93 ms; 0.832x -> 1.002x of dense), 4096 26.39 -> "
            "24.10 (4.22 -> 2.03 ms; 1.010x -> 1.113x") in BOUND_SOURCE
    assert "8192 45.42 both (6.13 -> 6.04 ms" in BOUND_SOURCE
    assert ("8192 tokens 45.42 -> 43.52 ms, 1.134x -> 1.181x of dense (row kernel 6.04 -> 2.87 ms; budgets of 192-384 "
            "rows a layer") in COUNT_SOURCE
    assert "4096 24.10 -> 23.74 ms (2.03 -> 1.35;" in COUNT_SOURCE and "DENSE_ROWS_COUNT_HEAVY = True" in COUNT_SOURCE
    for text in (README, PERFORMANCE):
        assert "1.181x" in text and "1.122x" in text and "1.006x" in text


def test_gpu_tests_as_quoted():
    first = (H100 / "pytest_gpu_heavy_rows_callheavyrows1_session49.log").read_text()
    assert re.search(r"^9 failed, 115 passed in 40\.42s", first, re.M)
    failed = re.findall(r"^FAILED (\S+)", first, re.M)
    assert len(failed) == 9 and all("test_gated_product_matches_torch_bits" in f for f in failed)
    fixed = (H100 / "pytest_gpu_gated_product_callheavyrows2_session49.log").read_text()
    assert re.search(r"^79 passed in ", fixed, re.M)
    suite = (H100 / "pytest_gpu_all_callheavyrows2_session49.log").read_text()
    # progress dots only (no F, E or s), cut by the call's limit before pytest's summary line
    assert suite.count(".") == 132 and set(suite) <= set(". []%0123456789\n")
    assert "9 failed, 115 passed" in LOG and "79 passed" in LOG and "132 passed, none failed" in LOG
    assert "commit c98a84b" in (H100 / "environment_callheavyrows1_session49.txt").read_text()
    assert "commit eb3b775" in (H100 / "environment_callheavyrows2_session49.txt").read_text()
