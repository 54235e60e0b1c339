"""Whole-model checks on a CUDA GPU (skipped elsewhere): greedy generation and prefill of a small random
ReLU model, dense vs the sparse Triton path forced by the dispatch policy, and ``twell bench model`` on
the tiny preset end to end (a pre-flight for the published-shape run).

The model is the benchmark's tiny preset (hidden 64, FFN 176, 2 layers, vocab 512) with its calibrated
sparsity (about 8 active units of 176 per token), so the kernels see a realistic sparse gate.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="twell.models needs the hf extra")

from _helpers import count_sparse_calls  # noqa: E402

from twell.bench import model as bench_model  # noqa: E402
from twell.bench.model_setup import prepare  # noqa: E402
from twell.bench.model_sparsity import SparsityTarget  # noqa: E402
from twell.ops._runtime import resolve_backend  # noqa: E402
from twell.tolerances import REL_TOL  # noqa: E402

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _bench(dtype: torch.dtype, batch: int = 4, seq: int = 64):  # noqa: ANN202 - a BenchModel
    return prepare("tiny", device=CUDA, dtype=dtype, batch=batch, seq=seq, target=SparsityTarget(mean_l0=8.0),
                   policies=("always-sparse",))


def _divergence(bench, dense: torch.Tensor, sparse: torch.Tensor, prompt_len: int) -> str:  # noqa: ANN001
    """Where the greedy outputs part, and the dense top-2 logit margin there (a near-tie explains a flip)."""
    row = int((dense != sparse).any(dim=1).nonzero()[0])
    pos = int((dense[row] != sparse[row]).nonzero()[0])
    bench.sets.use("dense")
    with torch.no_grad():
        logits = bench.model(dense[row : row + 1, :pos]).logits[0, -1].float()
    top = logits.topk(2).values
    return (f"row {row} differs from position {pos} (generated token {pos - prompt_len}); dense top-2 logit "
            f"margin there {float(top[0] - top[1]):.3e} of {float(top[0]):.3e}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_generate_identical_dense_vs_sparse(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench(dtype)
    mlps = bench.sets.sets["sparse:always-sparse"]
    assert all(resolve_backend(m.backend, CUDA) == "triton" for m in mlps)
    seen = count_sparse_calls(monkeypatch)
    prompt_len, new = 16, 24
    prompt = bench.tokens[:, :prompt_len].contiguous()
    kw = {"attention_mask": torch.ones_like(prompt), "max_new_tokens": new, "min_new_tokens": new,
          "do_sample": False, "use_cache": True, "pad_token_id": 0}
    with torch.no_grad():
        bench.sets.use("dense")
        dense = bench.model.generate(prompt, **kw)
        bench.sets.use("sparse:always-sparse")
        sparse = bench.model.generate(prompt, **kw)
    assert dense.shape == (prompt.shape[0], prompt_len + new)
    # Every decode step (M = batch) of every layer ran the sparse path; the first call of a layer (the
    # prefill, M = batch x prompt) measures l0 on the dense path.
    assert seen.count(prompt.shape[0]) == len(mlps) * (new - 1)
    assert all(m.last_l0 is not None and 0 < float(m.last_l0) < 176 for m in mlps)
    assert torch.equal(dense, sparse), _divergence(bench, dense, sparse, prompt_len)


def test_block_union_prefill_matches_dense_at_bf16_level() -> None:
    # 4 x 2048 = 8192 tokens: the block-union method (BLOCK_UNION_MIN_TOKENS) in every layer.
    bench = _bench(torch.bfloat16, batch=4, seq=2048)
    ids = bench.tokens
    backbone = bench.model.model
    with torch.inference_mode():
        bench.sets.use("dense")
        dense = backbone(input_ids=ids, use_cache=False).last_hidden_state
        bench.sets.use("sparse:always-sparse")
        backbone(input_ids=ids, use_cache=False)  # first call: l0 measured on the dense path
        sparse = backbone(input_ids=ids, use_cache=False).last_hidden_state
        bench.sets.use("dense")
        ref = backbone.float()(input_ids=ids[:1], use_cache=False).last_hidden_state
    dense_err = float(torch.linalg.vector_norm(dense[:1].float() - ref) / torch.linalg.vector_norm(ref))
    sparse_err = float(torch.linalg.vector_norm(sparse[:1].float() - ref) / torch.linalg.vector_norm(ref))
    assert sparse_err <= max(1.5 * dense_err, REL_TOL[torch.bfloat16]), (sparse_err, dense_err)
    assert all(float(m.last_l0) < 30 for m in bench.sets.sets["sparse:always-sparse"])


def test_bench_model_tiny_end_to_end_on_gpu(tmp_path: Path) -> None:
    # 32 x 256 = 8192 forward tokens: the block-union kernels; the training step runs the hot/cold op.
    args = ["--preset", "tiny", "--batch", "32", "--seq", "256", "--train-batch", "4", "--warmup", "1", "--reps",
            "2", "--energy-seconds", "0.5", "--train-warmup", "1", "--train-reps", "2", "--decode-batches", "1,4",
            "--prompt-len", "16", "--new-tokens", "8", "--decode-reps", "1", "--isolation", "none",
            "--out", str(tmp_path)]
    rc = bench_model.main(args)
    parts = json.loads((tmp_path / "model_tiny.json").read_text())["meta"]["parts"]
    assert {k: v["status"] for k, v in parts.items()} == {"forward": "ok", "decode": "ok", "train": "ok"}
    fwd = parts["forward"]["result"]["variants"]
    assert fwd["sparse:always-sparse"]["ok"] is True
    assert fwd["dense"]["memory"]["peak_gb"] > 0
    train = parts["train"]["result"]["variants"]
    assert "error" not in train["sparse:hot-cold"], train["sparse:hot-cold"].get("error")
    assert train["sparse:hot-cold"]["ok"] is True, train["sparse:hot-cold"]["grad_rel_err_vs_fp32"]
    assert rc == 0
