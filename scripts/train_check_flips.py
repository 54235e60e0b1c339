"""Why a sparse variant's gradient check in ``twell bench model --parts train`` can read WRONG on a small model: the
gradient errors of each training implementation against the float32 model, beside the gate units whose sign differs
from the float32 model's at each layer's input (a "flip").

Why: under the interpreter (bf16, tiny preset, 64 check tokens) the hot-cold variant's ``layers.0.mlp.down_proj``
gradient read 1.06e-2 against dense 6.2e-3 (session 55, bench_results/cpu/tiny_train_check_session55.md).  The
calibration (``twell.bench.model_sparsity``) puts each unit's threshold half-way between two tokens' gate inputs, so
some gate inputs lie within ~1e-3 of zero; each variant's own roundings (dense bf16 rounds u and h, the sparse
reference keeps them in fp32, the hot/cold op rounds only the hot units' GEMM operands) move a layer's input by
~4e-3 of its norm, enough to switch such a unit on or off at one token.  A switched unit changes that token's
gradient wholly, and with 64 tokens one such token is most of a weight's error.  For each variant this prints the
checked gradients' errors (as the benchmark computes them), then per layer the flips as (token, unit, float32 gate,
variant gate).  With the float32 model's gate input replayed through the variant's layer the op's own gradients agree
with float64 to ~2-3e-3 (checked by hand in session 56; ``tests/test_ops_hot_cold_training.py`` does it on random
inputs), so a large error with a flip beside it is the flip's, not the op's.  Since session 56 the benchmark's check
covers at least ``model_train.CHECK_MIN_TOKENS`` tokens (256), over which such flips average out.

    TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/train_check_flips.py --seeds 0 1 2 3 4   # CPU, ~1 min a seed
"""

from __future__ import annotations

import argparse
import copy

import torch

from twell.bench.model_setup import DEFAULT_L0, prepare
from twell.bench.model_sparsity import SparsityTarget
from twell.bench.model_train import DenseL1MLP, TrainConfig, _checked_params, _loss_backward, _rel, layer_mlp

IMPLS = ("dense", "sparse-reference", "hot-cold")


def _layer_inputs(model: torch.nn.Module, ids: torch.Tensor, l1_coef: float) -> dict[int, torch.Tensor]:
    """One forward + backward (gradients left in the parameters); each layer's MLP input, float32, [tokens, d]."""
    seen: dict[int, torch.Tensor] = {}
    hooks = [layer.mlp.register_forward_hook(
        lambda mod, inp, out, i=i: seen.__setitem__(i, inp[0].detach().float().reshape(-1, inp[0].shape[-1])))
        for i, layer in enumerate(model.model.layers)]
    try:
        _loss_backward(model, ids, l1_coef)
    finally:
        for h in hooks:
            h.remove()
    return seen


def run_seed(preset: str, seed: int, device: torch.device, batch: int, seq: int, check_seqs: int) -> None:
    """The model calibrated on ``batch`` x ``seq`` tokens (as the benchmark's), checked on its first ``check_seqs``."""
    bench = prepare(preset, device=device, dtype=torch.bfloat16, batch=max(batch, check_seqs), seq=seq,
                    target=SparsityTarget(mean_l0=DEFAULT_L0[preset]), policies=["default"], seed=seed)
    model, ids, coef = bench.model, bench.tokens[:check_seqs], TrainConfig().l1_coef
    bench.sets.add("train:dense", [DenseL1MLP(m) for m in bench.sets.sets["dense"]])
    bench.sets.use("train:dense")
    ref_model = copy.deepcopy(model).float().train()
    ref_inputs = _layer_inputs(ref_model, ids, coef)
    ref_grads = {k: p.grad.detach().clone() for k, p in _checked_params(ref_model).items()}
    ref_gates = {i: x @ layer_mlp(ref_model, i).gate_proj.weight.detach().float().T for i, x in ref_inputs.items()}
    del ref_model
    params = list(model.parameters())
    snapshot = [p.detach().clone() for p in params]
    for impl in IMPLS:
        with torch.no_grad():
            for p, saved in zip(params, snapshot, strict=True):
                p.copy_(saved)
        if impl == "dense":
            bench.sets.use("train:dense")
        else:
            bench.sets.use("sparse:default")
            for m in bench.sets.sets["sparse:default"]:
                m.train_impl = impl
        model.train()
        inputs = _layer_inputs(model, ids, coef)
        errs = {k: _rel(p.grad, ref_grads[k]) for k, p in _checked_params(model).items()}
        model.zero_grad(set_to_none=True)
        print(f"seed {seed} {impl:16s} " + " ".join(f"{k} {v:.2e}" for k, v in errs.items()), flush=True)
        for i, x in inputs.items():
            w = layer_mlp(model, i).gate_proj.weight.detach()
            gate = (x.to(w.dtype) @ w.T).float()
            flips = ((gate > 0) != (ref_gates[i] > 0)).nonzero().tolist()
            shown = [(t, u, round(float(ref_gates[i][t, u]), 5), round(float(gate[t, u]), 5)) for t, u in flips[:6]]
            print(f"    layer {i}: {len(flips)} flips {shown}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--batch", type=int, default=4, help="sequences the calibration sees (session 55's run: 4)")
    p.add_argument("--seq", type=int, default=64, help="tokens a sequence (session 55's run: 64)")
    p.add_argument("--check-seqs", type=int, default=1,
                   help="sequences checked (1: the benchmark's check until session 56, which now takes enough "
                        "sequences for model_train.CHECK_MIN_TOKENS)")
    p.add_argument("--device", default=None)
    p.add_argument("--tiny", action="store_true", help="one seed of the tiny preset on 2 x 32 tokens (smoke test)")
    a = p.parse_args()
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    preset, seeds, batch, seq = a.preset, a.seeds, a.batch, a.seq
    if a.tiny:
        preset, seeds, batch, seq = "tiny", [0], 2, 32
    for seed in seeds:
        run_seed(preset, seed, device, batch, seq, a.check_seqs)


if __name__ == "__main__":
    main()
