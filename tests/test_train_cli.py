"""``twell demo --quick`` and ``twell train`` end to end (CPU)."""

from __future__ import annotations

import json

from test_train_helpers import corpus_dir

from twell.cli import main
from twell.tolerances import REL_TOL_BF16_CLI, REL_TOL_FP32_CLI


def test_demo_quick_end_to_end(tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "held-out loss" in text and "dense F.linear vs twell.ops.sparse_gated_ffn" in text
    summary = json.loads((out / "demo.json").read_text())
    runs = summary["runs"]
    assert runs["L1"]["final_l0"] < runs["no-L1"]["final_l0"]
    # fp32 on the CPU; on a GPU the model trains in bf16, so sparse and dense round differently
    tol = REL_TOL_FP32_CLI if summary["ffn_speed"][0]["device"] == "cpu" else REL_TOL_BF16_CLI
    assert all(row["max_rel_error"] < tol for row in summary["ffn_speed"])
    for name in ("training.png", "sparsity_l1.json", "sparsity_l1_positions.png", "sparsity_no_l1.json",
                 "patterns_l1.npz", "L1/train_log.json", "no-L1/train_log.json"):
        assert (out / name).exists(), name


def test_train_subcommand(tmp_path, capsys) -> None:
    corpus = corpus_dir(str(tmp_path))
    out = tmp_path / "run"
    args = ["train", "--arch", "builtin", "--steps", "4", "--batch-size", "2", "--seq-len", "16", "--vocab-size",
            "300", "--data", corpus, "--cache-dir", str(tmp_path / "c"), "--out", str(out), "--eval-every", "2",
            "--eval-batches", "1", "--device", "cpu", "--checkpoint-dir", str(tmp_path / "ck"), "--no-progress",
            "--l1-coef", "1e-2"]
    assert main(args) == 0
    assert "held-out" in capsys.readouterr().out
    log = json.loads((out / "train_log.json").read_text())
    assert len(log["logs"]) == 4 and log["config"]["l1_coef"] == 1e-2
    assert (out / "sparsity.json").exists() and (tmp_path / "ck" / "latest").exists()
    assert main(["train", *args[1:], "--resume", str(tmp_path / "ck"), "--steps", "6"]) == 0


def test_train_ffn_choices_match_the_module():
    from twell.cli import TRAIN_FFN_CHOICES
    from twell.nn.mlp import TRAIN_IMPLS

    assert tuple(TRAIN_FFN_CHOICES) == TRAIN_IMPLS
