"""The session 56 figures that the README, docs/performance.md and ``bench_results/h100/session56_runs.md`` quote from
the H100 calls (the 1.5B model's eager forward by the wall clock, one layer's eager calls, the forward at 8192 tokens
compiled, twice) are the committed runs'; and the figures that ``twell.bench.model_train.CHECK_MIN_TOKENS``'s
comment and ``bench_results/cpu/tiny_train_check_session55.md`` quote are the committed log's
(``bench_results/cpu/train_check_flips_session56.log``, ``scripts/train_check_flips.py`` under the interpreter): the
tiny model's gradient check on 64 tokens, seeds 0-4, then on 256 tokens, seeds 0, 1 and 4."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import flat_text

ROOT = Path(__file__).resolve().parents[1]
LOG = (ROOT / "bench_results" / "cpu" / "train_check_flips_session56.log").read_text()
NOTE = flat_text(ROOT / "bench_results" / "cpu" / "tiny_train_check_session55.md")
MODEL_TRAIN = flat_text(ROOT / "src" / "twell" / "bench" / "model_train.py")
DOWN = "layers.0.mlp.down_proj"
H100 = ROOT / "bench_results" / "h100"
RUNS = flat_text(H100 / "session56_runs.md")
README = flat_text(ROOT / "README.md")
PERFORMANCE = flat_text(ROOT / "docs" / "performance.md")


def _errors(section: str) -> dict[tuple[int, str], dict[str, float]]:
    """(seed, implementation) -> checked weight -> gradient error, from one section of the log."""
    out = {}
    for line in section.splitlines():
        m = re.match(r"seed (\d+) (\S+)\s+(.*)$", line)
        if m:
            vals = re.findall(r"(\S+) ([0-9.]+e[-+]\d+)", m.group(3))
            out[(int(m.group(1)), m.group(2))] = {k: float(v) for k, v in vals}
    return out


SHORT, LONG = (_errors(part) for part in LOG.split("# the same with --check-seqs 4"))


def test_64_tokens_hot_cold_lost_the_check_at_two_seeds():
    ratio = {s: SHORT[(s, "hot-cold")][DOWN] / SHORT[(s, "dense")][DOWN] for s in range(5)}
    assert sorted(s for s, r in ratio.items() if r > 1.5) == [0, 1]
    assert [f"{ratio[s]:.2f}" for s in (0, 1, 4)] == ["1.71", "1.51", "1.47"]
    assert "1.71x / 1.51x / 1.47x, so the check's 1.5x bound fails at seeds 0 and 1" in NOTE
    assert [f"{SHORT[(s, 'hot-cold')][DOWN]:.2e}" for s in (0, 1, 4)] == ["1.06e-02", "1.26e-02", "1.04e-02"]
    assert [f"{SHORT[(s, 'dense')][DOWN]:.2e}" for s in (0, 1, 4)] == ["6.21e-03", "8.32e-03", "7.08e-03"]
    assert "(1.06e-2 / 1.26e-2 / 1.04e-2 against dense 6.21e-3 / 8.32e-3 / 7.08e-3:" in NOTE
    assert "WRONG at two of five seeds and 1.47x at a third" in MODEL_TRAIN
    assert "down_proj 1.06e-2 / 1.26e-2 / 1.04e-2 against dense 6.21e-3 / 8.32e-3 / 7.08e-3" in MODEL_TRAIN
    # the sparse reference never lost it
    assert all(SHORT[(s, "sparse-reference")][DOWN] <= 1.5 * SHORT[(s, "dense")][DOWN] for s in range(5))


def test_the_lost_seeds_have_a_layer_one_flip_of_their_own():
    assert "seed 0 hot-cold" in LOG and "(49, 93, -0.001, 0.00011)" in LOG
    assert "(token 49, unit 93: float32 gate -0.001, hot-cold +0.00011)" in NOTE


def test_256_tokens_keep_every_variant_within_the_bound():
    assert sorted({s for s, _ in LONG}) == [0, 1, 4]
    worst = max(LONG[(s, impl)][k] / LONG[(s, "dense")][k] for s in (0, 1, 4)
                for impl in ("sparse-reference", "hot-cold") for k in LONG[(s, impl)])
    assert f"{worst:.2f}" == "1.19"
    assert f"{LONG[(1, 'hot-cold')][DOWN]:.2e}" == "8.38e-03" and f"{LONG[(1, 'dense')][DOWN]:.2e}" == "7.06e-03"
    assert "at most 1.19x the dense error: 8.38e-3 against 7.06e-3" in NOTE
    assert "at most 1.19x the dense error at those three seeds on 256 tokens" in MODEL_TRAIN


@pytest.mark.parametrize("call", ["1", "2"])
def test_h100_environment(call):
    env = (H100 / f"environment_call{call}_session56.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in env and "triton 3.6.0" in env and "torch 2.11.0" in env


def test_eager_floor_probe_on_the_h100():
    probe = json.loads((H100 / "eager_floor_probe_call1_session56.json").read_text())
    assert probe["device"] == "NVIDIA H100 80GB HBM3"
    tables = [f"{r['sparse:tables_speedup']:.3f}" for r in probe["rows"]]
    assert [r["tokens"] for r in probe["rows"]] == [2048, 4096, 6144, 8192, 12288, 16384]
    assert tables == ["0.438", "0.570", "0.797", "1.051", "1.172", "1.386"]
    assert probe["floors"]["tables"] == 8192
    assert "the tables **0.438x / 0.570x / 0.797x / 1.051x / 1.172x / 1.386x**" in RUNS


def _forward(stem: str) -> dict[str, dict]:
    meta = json.loads((H100 / f"{stem}.json").read_text())["meta"]
    assert meta["environment"]["device"] == "NVIDIA H100 80GB HBM3"
    return meta["parts"]["forward"]["result"]["variants"]


@pytest.mark.parametrize(("stem", "compiled", "eager"), [
    ("model_forward_b4_compiled_session56", "0.884", "0.898"),
    ("model_forward_b4_compiled_repeat_session56", "0.866", "1.185"),
])
def test_tables_at_8192_tokens_on_one_h100(stem, compiled, eager):
    tables = _forward(stem)["sparse:tables"]
    assert f"{tables['compiled_speedup']:.3f}" == compiled and f"{tables['speedup']:.3f}" == eager
    assert f"**the tables {compiled}x**" in RUNS
    for text in (README, PERFORMANCE):
        assert f"{compiled}x" in text
