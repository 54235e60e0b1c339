"""The GPU evidence pipeline (twell.train.evidence) end to end at a tiny scale on the CPU, its corpus
builder, its budget arithmetic and acceptance checks, and the trainer options it uses."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_train_helpers import corpus_dir, stand_in_fn

from twell.tolerances import REL_TOL_FP32_CLI
from twell.train import evidence_data
from twell.train.data import prepare_data
from twell.train.evidence import EvidenceConfig, _acceptance, _run_seconds, _steps_for, run_evidence
from twell.train.evidence_data import build_python_corpus, python_source_files
from twell.train.trainer import TrainConfig, train


def _py_corpus(root) -> list:
    """Eleven distinct .py files, one duplicate of the first, one blank, one too large, one symlink."""
    d = root / "src"
    (d / "pkg").mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    words = ["def", "return", "self", "import", "class", "value", "for", "in", "range", "if", "else", "print"]
    for i in range(11):
        idx = torch.randint(0, len(words), (240,), generator=g).tolist()
        text = f"# file {i}\n" + "\n".join(" ".join(words[j] for j in idx[k:k + 6]) for k in range(0, 240, 6))
        (d / "pkg" / f"m{i}.py").write_text(text)
    (d / "copy_of_m0.py").write_bytes((d / "pkg" / "m0.py").read_bytes())
    (d / "blank.py").write_text("   \n")
    (d / "huge.py").write_text("x = 1\n" * 400)
    (d / "link.py").symlink_to(d / "pkg" / "m1.py")
    (d / "notes.txt").write_text("not python")
    return [d]


def test_corpus_lists_splits_by_file_and_dedupes(tmp_path) -> None:
    roots = _py_corpus(tmp_path)
    listed = python_source_files(roots, max_file_bytes=2000)
    names = sorted(p.name for p, _ in listed)
    # huge.py (2400 bytes) is over the cap, the symlink is not followed, notes.txt is no .py file
    assert names == sorted([f"m{i}.py" for i in range(11)] + ["copy_of_m0.py", "blank.py"])
    data, stats = build_python_corpus(train_tokens=10**9, heldout_tokens=10**9, seq_len=16, vocab_size=300,
                                      tokenizer_sample_bytes=2000, chunk_bytes=3000, heldout_every=4,
                                      max_file_bytes=2000, roots=roots, log=lambda m: None)
    # 13 listed, one blank, one duplicate content: 11 documents; every 4th file of the shuffle is held out
    assert stats["train_docs"] + stats["heldout_docs"] == 11 and stats["heldout_docs"] == 3
    assert stats["vocab_size"] == data.vocab_size <= 300 and stats["tokenizer"] == "byte-level BPE"
    assert data.train.shape[1] == data.heldout.shape[1] == 17
    assert stats["train_tokens"] >= data.train.numel() // 17 * 16
    # no held-out document also appears in training (decoded text of each split, split on EOT)
    tok = data.tokenizer
    held = {t.strip() for t in tok.decode(data.heldout[:, :-1].flatten().tolist(), skip_special_tokens=False)
            .split("<|endoftext|>") if t.strip().startswith("# file")}
    train_text = tok.decode(data.train[:, :-1].flatten().tolist(), skip_special_tokens=False)
    assert held and all(h.split("\n")[0] + "\n" not in train_text for h in held)


def test_corpus_time_box_and_byte_fallback(tmp_path, monkeypatch) -> None:
    roots = _py_corpus(tmp_path)

    def missing(*args, **kwargs):
        raise ImportError("No module named 'tokenizers'")

    monkeypatch.setattr(evidence_data, "train_tokenizer", missing)
    data, stats = build_python_corpus(train_tokens=10**9, heldout_tokens=100, seq_len=16, tokenizer_sample_bytes=1,
                                      chunk_bytes=1, heldout_every=4, max_file_bytes=2000, roots=roots,
                                      deadline=0.0, log=lambda m: None)
    assert stats["tokenizer"].startswith("bytes") and data.vocab_size == 257
    # deadline already passed: only the tokenizer sample (one file) was encoded, then encoding stopped
    assert stats["train_docs"] == 1 and stats["train_tokens"] == stats["train_bytes"] + 1
    assert int(data.train.max()) <= 256


def test_budget_arithmetic() -> None:
    cfg = EvidenceConfig(out="-", n_evals=10, eval_batches=8, final_eval_batches=32)
    cal = {"step_s": 0.1, "eval_s": 0.5, "setup_s": 4.0}
    fixed = 4.0 + (10 + 4 + 1) * 0.5
    assert _run_seconds(cfg, cal, 0) == pytest.approx(fixed)
    assert _run_seconds(cfg, cal, 1000) == pytest.approx(fixed + 100.0)
    assert _steps_for(cfg, cal, fixed + 100.0 + 0.05) == 1000
    assert _steps_for(cfg, cal, fixed - 1.0) == 0


def test_acceptance_checks() -> None:
    runs = {"dense": {"l1_coef": 0.0, "heldout_loss": 2.00},
            "l1": {"l1_coef": 1e-3, "heldout_loss": 2.05, "dead_fraction_end": 0.30, "sparsity": {"l0_mean": 20.0}},
            "l1_revive": {"l1_coef": 1e-3, "heldout_loss": 2.04, "dead_fraction_end": 0.05,
                          "sparsity": {"l0_mean": 25.0}}}
    acc = _acceptance({"runs": runs}, n_units=2112)
    assert acc["l1"]["l0_ok"] and acc["l1"]["loss_ok"] and acc["l1"]["loss_gap"] == pytest.approx(0.025)
    assert not acc["l1_revive"]["l0_ok"]  # 25 > 21.12
    rev = acc["revival"]
    assert rev["dead_cut"] and rev["dead_below_target"] and rev["loss_not_raised"]
    assert rev["heldout_change"] == pytest.approx(-0.01)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return prepare_data([corpus_dir(str(root))], seq_len=16, vocab_size=256, cache_dir=str(root / "cache"),
                        heldout_every=3)


def test_trainer_autocast_on_step_and_device_noise(data) -> None:
    """precision="autocast" keeps fp32 parameters and trains; on_step sees every step; revival noise on
    the model's device; bad option values are refused."""
    seen: list[int] = []
    cfg = TrainConfig(steps=6, batch_size=4, seq_len=16, lr=1e-2, l1_coef=1e-2, eval_every=3, eval_batches=1,
                      dead_window_tokens=64, progress=False, warmup_steps=1, device="cpu", precision="autocast",
                      revive_noise_device="model")
    r = train(cfg, data=data, model_fn=stand_in_fn, on_step=lambda rec: seen.append(rec["step"]))
    assert seen == [1, 2, 3, 4, 5, 6]
    assert all(p.dtype == torch.float32 for p in r.model.parameters())
    assert all(math.isfinite(x["lm_loss"]) for x in r.logs) and math.isfinite(r.final_eval_loss)
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="revive_noise_device"):
        TrainConfig(revive_noise_device="gpu")


def test_evidence_pipeline_end_to_end_tiny(tmp_path) -> None:
    """Every stage at a tiny scale on the CPU: same steps for the three runs, L1 lowers l0, the dead
    fraction is logged over training, statistics, speed rows, plots and acceptance in the summary."""
    roots = _py_corpus(tmp_path / "corpus")
    cfg = EvidenceConfig(
        out=str(tmp_path / "ev"), preset="tiny", model_overrides={"n_layers": 1, "hidden_size": 64, "n_heads": 2,
                                                                  "intermediate_size": 96},
        vocab_size=300, seq_len=16, batch_size=4, lr=1e-2, l1_coef=5e-2, extra_l1_coefs=(2e-1,),
        dead_window_tokens=128, steps=24,
        calib_steps=3, n_evals=2, eval_batches=1, final_eval_batches=2, stats_sequences=4, speed_reps=1,
        capture_tokens=32, tokenizer_sample_bytes=20_000, data_seconds=30.0, roots=[str(r) for r in roots],
        precision="fp32", speed_dtype="float32", device="cpu", total_seconds=3600.0)
    summary = run_evidence(cfg)
    out = tmp_path / "ev"
    assert {k: v["status"] for k, v in summary["stages"].items()} == {
        "environment": "ok", "calibrate": "ok", "data": "ok", "run_dense": "ok", "run_l1": "ok",
        "speed_l1": "ok", "run_l1_revive": "ok", "speed_l1_revive": "ok", "run_l1_x0.2": "ok",
        "speed_l1_x0.2": "ok", "plots": "ok"}
    runs = summary["runs"]
    assert [runs[n]["steps"] for n in ("dense", "l1", "l1_revive", "l1_x0.2")] == [24, 24, 24, 24]
    assert runs["l1"]["train_l0_end"] < runs["dense"]["train_l0_end"]
    assert runs["l1"]["l1_warmup_steps"] == 6 and runs["dense"]["revived_rows_total"] == 0
    steps = [json.loads(line) for line in (out / "runs" / "l1_revive" / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 24 and all(s["dead_fraction"] is not None and len(s["l0_layers"]) == 1 for s in steps)
    rows = runs["l1"]["ffn_speed"]
    # the default dispatch policy answers dense off CUDA
    assert len(rows) == 1 and rows[0]["max_rel_error"] < REL_TOL_FP32_CLI and rows[0]["module_path"] == "dense"
    assert summary["calibration"]["step_s"] > 0 and summary["plan"]["steps"] == 24
    assert set(summary["acceptance"]) >= {"l1", "l1_revive", "l1_x0.2", "revival"}
    for name in ("summary.json", "training.png", "l0_layers.png", "speed.png", "sparsity/l1.json",
                 "patterns/l1.npz", "runs/dense/train_log.json"):
        assert (out / name).exists(), name
    assert json.loads((out / "summary.json").read_text())["runs"]["l1"]["heldout_loss"] == runs["l1"]["heldout_loss"]
