"""The session 55 figures that the README, docs/performance.md and ``SparseGatedMLP._training_hot_set``'s comment
quote are the committed runs' (``bench_results/h100/session55_runs.md``, H100 80GB HBM3): the 1.5B model's training
step eager and compiled, before and after the hot set was chosen inside the compiled step (calls 1-2), the compiled
forward with the causal-mask rules (calls 1-2) and the GPU suite (call ``gpus``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import flat_text

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "bench_results" / "h100"

LOG = flat_text(H100 / "session55_runs.md")
README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")
MLP = flat_text(ROOT / "src" / "twell" / "nn" / "mlp.py")


def _variants(stem: str, part: str) -> dict[str, dict]:
    meta = json.loads((H100 / f"{stem}.json").read_text())["meta"]
    assert meta["environment"]["device"] == "NVIDIA H100 80GB HBM3"
    return meta["parts"][part]["result"]["variants"]


@pytest.mark.parametrize("call", ["1", "2", "3", "gpus"])
def test_environment(call):
    env = (H100 / f"environment_call{call}_session55.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in env and "triton 3.6.0" in env and "torch 2.11.0" in env


def test_eager_training_step():
    v = _variants("model_train_eager_session55", "train")
    assert f"{v['dense']['ms']:.2f}" == "333.75" and f"{v['sparse:hot-cold']['ms']:.2f}" == "228.54"
    assert f"{v['sparse:hot-cold']['speedup']:.3f}" == "1.460"
    assert "eager with the fusions 1.460x (228.54 vs 333.75 ms)" in README


def test_compiled_training_step_with_the_stale_hot_set():
    """Call 1: every traced call used the set of the eager check call; tokens spilled to the dense recompute."""
    v = _variants("model_train_compiled_session55", "train")
    sparse = v["sparse:hot-cold"]
    assert sparse["compiled"] and f"{sparse['ms']:.2f}" == "4350.35" and f"{v['dense']['ms']:.2f}" == "295.97"
    assert f"{sparse['speedup']:.3f}" == "0.068" and max(sparse["layer_spilled_tokens_last_step"]) == 10167
    for text in (README, PERFORMANCE, MLP):
        assert "10,167" in text and "0.068x" in text


def test_compiled_training_step_with_the_set_chosen_inside():
    """Call 2: the set chosen eagerly inside the compiled step; no token spilled."""
    v = _variants("model_train_compiled_fixed_session55", "train")
    sparse, dense = v["sparse:hot-cold"], v["dense"]
    assert sparse["compiled"] and dense["compiled"]
    assert not any(sparse["layer_spilled_tokens_last_step"])
    assert f"{sparse['ms']:.2f}" == "213.45" and f"{dense['ms']:.2f}" == "299.41"
    assert f"{sparse['speedup']:.3f}" == "1.403" and round(100 * sparse["peak_memory_reduction"]) == 31
    assert f"{sparse['memory']['peak_gb']:.1f}" == "31.6" and f"{dense['memory']['peak_gb']:.1f}" == "45.5"
    assert "the compiled step 213.45 ms against compiled dense's 299.41, **1.403x**" in README
    assert "**1.403x** (213.45 vs 299.41 ms)" in PERFORMANCE


@pytest.mark.parametrize(("stem", "figures"), [
    ("model_forward_b2_compiled_session55", {"dense": ("22.91", "1.000"), "sparse:default": ("22.72", "1.009")}),
    ("model_forward_b4_compiled_session55", {"dense": ("43.74", "1.000"), "sparse:default": ("43.63", "1.003"),
                                             "sparse:tables": ("36.38", "1.203")}),
])
def test_compiled_forward(stem, figures):
    v = _variants(stem, "forward")
    for name, (ms, speedup) in figures.items():
        assert f"{v[name]['compiled_ms']:.2f}" == ms and f"{v[name]['compiled_speedup']:.3f}" == speedup, name
    assert "compiled dense 28.80 -> 22.91 ms at 4096 tokens, the default 1.009x of it" in README
    assert "at 8192 compiled dense 43.74 ms, the default 1.003x, the tables 1.203x (36.38 ms; eager 1.158x)" in README


def test_gpu_suite():
    passed = 0
    for g in range(3):
        last = (H100 / f"pytest_gpu_gpu_g{g}_callgpus_session55.log").read_text().strip().splitlines()[-1]
        assert "failed" not in last and "error" not in last and "skipped" not in last
        passed += int(re.search(r"(\d+) passed", last).group(1))
    assert passed == 204
    assert "the `-m gpu` suite **204 passed**" in LOG


def test_twell_train_compile_on_the_gpu():
    """Call 3: ``twell train --compile``, hot/cold FFN, follows the eager loop's losses (tiny preset, 30 steps)."""
    logs = {m: json.loads((H100 / f"train_log_hot-cold_{m}_call3_session55.json").read_text())
            for m in ("eager", "compile")}
    assert logs["compile"]["config"]["compile"] is True and logs["eager"]["config"]["compile"] is False
    pairs = list(zip(logs["eager"]["logs"], logs["compile"]["logs"], strict=True))
    assert len(pairs) == 30
    worst = max(abs(a["lm_loss"] - b["lm_loss"]) / a["lm_loss"] for a, b in pairs)
    assert worst < 7.5e-4 and "within **0.075 %**" in LOG
    for m in ("eager", "compile"):
        text = (H100 / f"train_hot-cold_{m}_call3_session55.log").read_text()
        assert "final lm loss" in text and "recompile" not in text.lower()
