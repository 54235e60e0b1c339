"""``twell bench model`` training part: one optimizer step (forward + backward + AdamW), dense vs sparse FFN.

Both variants compute the same loss, the LM cross-entropy plus ``l1_coef`` x the mean over layers of the
per-layer L1 penalty (mean over tokens of ``sum_j |h_j|``), on the same weights and tokens (the first
``--train-batch`` sequences of the benchmark batch):

* ``dense``: :class:`DenseL1MLP`, plain bf16 autograd of ``down(relu(gate(x)) * up(x))`` (cuBLAS), the L1
  term from ``torch.linalg.vector_norm(h, 1)`` (which saves no tensor the matmuls do not save already).
  Not ``SparseGatedMLP(train_impl="dense")``: that one is the reference of the sparse kernels and
  computes in float32, which would make a slow baseline.
* ``sparse:<impl>``: the model's :class:`~twell.nn.SparseGatedMLP` with ``train_impl`` = ``--train-impl``
  (``triton``: the sparse Triton training kernels).

Parameters, gradients and AdamW states are bf16 (no float32 master copy); the learning rate defaults to
0: AdamW then runs the same kernels (its update is scaled by the rate) and the weights stay put.  The
calibrated sparsity of the untrained model (:mod:`.model_sparsity`) puts every unit's threshold
half-way between two tokens' gate inputs, so any weight update tips tokens over: at lr=1e-6 the
per-layer l0 in layers 14-27 had risen from 14-35 (check step) to 74-1090 (last step) within 7 steps
(H200, 1.5B preset, bench_results/h200/model/model_1.5b_session4_lr1e-6.json), and the forced hot/cold
op then spilled up to 4,067 of the 16,384 tokens per layer to its exact fallback (0.29x of dense).  A
model trained with L1 keeps its sparsity under training; this calibrated one does not.  At lr=0 the
last step's l0 stayed at 15-46 with no token spilled, and the step ran 1.29x of dense
(bench_results/h200/model/model_1.5b_train_session4.json).

Before timing, one forward + backward of each variant and of a float32 copy of the model (dense FFN, same loss)
runs on the first ``--train-check-seqs`` sequences (by default enough for :data:`CHECK_MIN_TOKENS`); the loss and the
gradients of a few weights are compared with the float32 ones, and a sparse variant is ``ok`` when each gradient
error is within 1.5x the dense bf16 error or the bf16 bar.  The dense variant runs completely before the sparse one,
so a sparse failure (a crash in a Triton training kernel leaves the CUDA
context unusable) cannot take the dense numbers with it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..nn import DenseReluGatedMLP
from ..tolerances import MODEL_DENSE_ERROR_FACTOR, REL_TOL_GRAD, within_tolerance
from .model_measure import (
    PROFILE_TOP,
    compile_backend,
    describe_error,
    free_device_memory,
    kernel_lines,
    peak_memory,
    profile_kernels,
    time_interleaved,
)
from .model_setup import BenchModel

__all__ = ["CHECK_MIN_TOKENS", "DenseL1MLP", "TrainConfig", "check_sequences", "layer_mlp", "run_train", "train_rows"]


#: The fewest tokens the float32 gradient check covers when ``TrainConfig.check_seqs`` is None (whole sequences, at
#: most the batch).  Why: the calibration puts some units' gate inputs within 1e-4 to 1e-3 of zero, so each variant's
#: roundings switch a few units at a few tokens against the float32 model, and on 64 tokens one such token was most of
#: a weight's error: the tiny preset's hot-cold check read WRONG at two of five seeds and 1.47x at a third (layer 0's
#: down_proj 1.06e-2 / 1.26e-2 / 1.04e-2 against dense 6.21e-3 / 8.32e-3 / 7.08e-3, each with a layer-1 flip of its
#: own; the bound is 1.5x), and at most 1.19x the dense error at those three seeds on 256 tokens
#: (bench_results/cpu/train_check_flips_session56.log,
#: scripts/train_check_flips.py).  The 1.5B preset's sequence (2048 tokens) already covers it.
CHECK_MIN_TOKENS = 256


@dataclass(frozen=True)
class TrainConfig:
    batch: int = 8
    #: sequences of the float32 gradient check (0: none; None: enough for CHECK_MIN_TOKENS, at most the batch)
    check_seqs: int | None = None
    impl: str = "hot-cold"
    lr: float = 0.0  # see the module docs: the calibrated sparsity does not survive updates
    weight_decay: float = 0.1
    l1_coef: float = 2e-5
    warmup: int = 2
    reps: int = 5
    profile: bool = False  # one more step per variant under torch.profiler: its largest GPU kernels
    #: run each variant's forward under torch.compile (inductor on CUDA, aot_eager elsewhere; a dynamo
    #: reset before each variant, whose MLP modules the model swaps in): the elementwise work outside
    #: the FFN fused for both variants; the sparse FFN is its custom op with its autograd formula
    compile: bool = False

    def __post_init__(self) -> None:
        c = self.check_seqs
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 0):
            raise ValueError(f"check_seqs must be None (enough sequences for {CHECK_MIN_TOKENS} tokens) or an int "
                             f">= 0 (0: no check); got {c!r}")


class DenseL1MLP(nn.Module):
    """The dense bf16 ReLU-gated FFN of a :class:`DenseReluGatedMLP` (shared weights) that also records
    ``last_l1`` (float32, differentiable) like :class:`SparseGatedMLP` does in training."""

    def __init__(self, dense: DenseReluGatedMLP) -> None:
        super().__init__()
        self.inner = dense
        self.last_l1: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.inner
        h = F.relu(F.linear(x, m.gate_proj.weight)) * F.linear(x, m.up_proj.weight)
        n_tokens = max(1, h.numel() // h.shape[-1])
        self.last_l1 = torch.linalg.vector_norm(h, 1, dtype=torch.float32) / n_tokens
        return F.linear(h, m.down_proj.weight)


def layer_mlp(model: nn.Module, i: int) -> nn.Module:
    """Layer ``i``'s MLP module with its projections: any of the MLP modules in the layers (:class:`DenseL1MLP`
    keeps its weights one level down)."""
    m = model.model.layers[i].mlp
    return m.inner if isinstance(m, DenseL1MLP) else m


def _checked_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """A few weights whose gradients are checked: the first layer's MLP and attention (their gradient has
    come back through every layer) and the last layer's down projection (:func:`layer_mlp`)."""
    layers = model.model.layers
    last = len(layers) - 1
    first = layer_mlp(model, 0)
    return {
        "layers.0.mlp.gate_proj": first.gate_proj.weight,
        "layers.0.mlp.up_proj": first.up_proj.weight,
        "layers.0.mlp.down_proj": first.down_proj.weight,
        "layers.0.self_attn.q_proj": layers[0].self_attn.q_proj.weight,
        f"layers.{last}.mlp.down_proj": layer_mlp(model, last).down_proj.weight,
    }


def check_sequences(cfg: TrainConfig, seq: int) -> int:
    """The sequences of ``seq`` tokens the gradient check runs on: ``cfg.check_seqs`` (at most the batch; 0 still
    gives 1, unused then), or with None as many as :data:`CHECK_MIN_TOKENS` needs, at most the batch."""
    want = -(-CHECK_MIN_TOKENS // max(1, seq)) if cfg.check_seqs is None else cfg.check_seqs
    return max(1, min(want, cfg.batch))


def _loss_backward(model: nn.Module, ids: torch.Tensor, l1_coef: float) -> torch.Tensor:
    """LM loss + ``l1_coef`` x mean per-layer L1 (from the MLPs in the layers), backward; returns the loss."""
    out = model(input_ids=ids, labels=ids, use_cache=False)
    l1 = torch.stack([layer.mlp.last_l1 for layer in model.model.layers]).mean()
    loss = out.loss + l1_coef * l1
    loss.backward()
    return loss.detach()


def _fp32_reference(bench: BenchModel, ids: torch.Tensor, l1_coef: float) -> dict[str, Any]:
    """Loss and checked gradients of a float32 copy of the model with the dense L1 FFN, on ``ids``."""
    bench.sets.use("train:dense")
    ref = copy.deepcopy(bench.model).float().train()
    try:
        loss = float(_loss_backward(ref, ids, l1_coef))
        return {"loss": loss, "grads": {k: p.grad.detach().clone() for k, p in _checked_params(ref).items()}}
    finally:
        del ref
        free_device_memory(bench.device)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref))


def run_train(bench: BenchModel, cfg: TrainConfig, log: Callable[[str], None],
              update: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run the training part (see the module docs); ``update(result)`` after every piece."""
    model = bench.model
    ids = bench.tokens[: cfg.batch]
    check_ids = bench.tokens[: check_sequences(cfg, ids.shape[1])]
    bench.sets.add("train:dense", [DenseL1MLP(m) for m in bench.sets.sets["dense"]])
    for m in bench.sets.sets["sparse:default"]:
        m.train_impl = cfg.impl
    variants = {"dense": "train:dense", f"sparse:{cfg.impl}": "sparse:default"}
    result: dict[str, Any] = {"batch": ids.shape[0], "seq": ids.shape[1], "tokens": ids.numel(), "lr": cfg.lr,
                              "l1_coef": cfg.l1_coef, "train_impl": cfg.impl, "check_tokens": check_ids.numel(),
                              "variants": {n: {} for n in variants}}
    reference: dict[str, Any] | None = None
    if cfg.check_seqs != 0:
        log(f"train: float32 reference gradients on {check_ids.numel()} tokens")
        try:
            reference = _fp32_reference(bench, check_ids, cfg.l1_coef)
            result["fp32_loss"] = reference["loss"]
        except Exception as exc:  # noqa: BLE001 - the check is optional; the timing goes on
            result["fp32_reference_error"] = describe_error(exc)
    # Every variant starts from the same weights: the optimizer steps of one (tiny as they are at the
    # default learning rate) must not change what the next one is checked and timed on.
    # The copy is kept on the CPU so that it does not count in the peak device memory of either variant.
    params = list(model.parameters())
    with torch.no_grad():
        snapshot = [p.detach().to("cpu", copy=True) for p in params]
    try:
        for name, set_name in variants.items():
            with torch.no_grad():
                for p, saved in zip(params, snapshot, strict=True):
                    p.copy_(saved)
            bench.sets.use(set_name)
            model.train()  # after the swap: modules outside the model do not follow train()/eval()
            entry = result["variants"][name]
            if reference is not None:
                _check_variant(bench, check_ids, cfg, entry, reference, name, log)
                update(result)
            _time_variant(bench, ids, cfg, entry, name, log)
            update(result)
    finally:
        with torch.no_grad():
            for p, saved in zip(params, snapshot, strict=True):
                p.copy_(saved)
        del snapshot
        model.eval()
    _add_ratios(result)
    _check_ok(result, bench.dtype)
    update(result)
    return result


def _check_variant(bench: BenchModel, ids: torch.Tensor, cfg: TrainConfig, entry: dict[str, Any],
                   reference: dict[str, Any], name: str, log: Callable[[str], None]) -> None:
    """One forward + backward on ``ids``: loss and checked gradients against the float32 reference."""
    model = bench.model
    log(f"train: {name}: check forward + backward")
    try:
        loss = float(_loss_backward(model, ids, cfg.l1_coef))
        entry["check_loss_rel_err_vs_fp32"] = abs(loss - reference["loss"]) / abs(reference["loss"])
        entry["grad_rel_err_vs_fp32"] = {
            k: _rel(p.grad, reference["grads"][k]) for k, p in _checked_params(model).items()
        }
        _record_l0(model, entry, "layer_l0")
    except Exception as exc:  # noqa: BLE001 - recorded; the timing is still attempted
        entry["check_error"] = describe_error(exc)
    finally:
        model.zero_grad(set_to_none=True)
        free_device_memory(bench.device)


def _time_variant(bench: BenchModel, ids: torch.Tensor, cfg: TrainConfig, entry: dict[str, Any], name: str,
                  log: Callable[[str], None]) -> None:
    """Warm-up and timed optimizer steps of the variant in the model, then the peak memory of one step."""
    model, device = bench.model, bench.device
    optimizer: dict[str, torch.optim.Optimizer] = {}  # dropped at the end: the next variant starts afresh
    forward: nn.Module = model
    if cfg.compile:
        torch._dynamo.reset()
        forward = torch.compile(model, backend=compile_backend(device))
        entry["compiled"] = True

    def step() -> None:
        _loss_backward(forward, ids, cfg.l1_coef)
        optimizer["adamw"].step()
        optimizer["adamw"].zero_grad(set_to_none=True)

    try:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer["adamw"] = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                               fused=True if device.type == "cuda" else None)
        log(f"train: {name}: timing ({cfg.warmup} warm-up + {cfg.reps} steps of {ids.numel()} tokens)")
        timings = time_interleaved({name: step}, device=device, warmup=cfg.warmup, reps=cfg.reps)
        if name in timings.errors:
            entry["error"] = timings.errors[name]
            return
        ms = timings.median_ms(name)
        entry.update({"ms": ms, "ms_samples": timings.samples[name], "tokens_per_ms": ids.numel() / ms})
        entry["memory"] = peak_memory(step, device)
        _record_l0(model, entry, "layer_l0_last_step")
        if cfg.profile and device.type == "cuda":
            entry["profile"] = profile_kernels(step, device, PROFILE_TOP)
            log(f"train: {name}: kernels of one step (ms, calls):\n" + kernel_lines(entry["profile"]))
    except Exception as exc:  # noqa: BLE001 - recorded; the next variant goes on
        entry["error"] = describe_error(exc)
    finally:
        optimizer.clear()
        model.zero_grad(set_to_none=True)
        if cfg.compile:
            torch._dynamo.reset()
        free_device_memory(device)


def _record_l0(model: nn.Module, entry: dict[str, Any], key: str) -> None:
    """``entry[key]``: per-layer l0 of the last training forward, when the MLPs measure it (the sparse ones)."""
    layer_l0 = [getattr(layer.mlp, "last_l0", None) for layer in model.model.layers]
    if all(v is not None for v in layer_l0):
        entry[key] = [float(v) for v in layer_l0]
    # The hot/cold op's tokens recomputed densely because their cold pairs did not fit (slow when many).
    spilled = [getattr(layer.mlp, "last_spilled_tokens", None) for layer in model.model.layers]
    if all(v is not None for v in spilled):
        entry[key.replace("layer_l0", "layer_spilled_tokens")] = [int(v) for v in spilled]


def _check_ok(result: dict[str, Any], dtype: torch.dtype) -> None:
    """Per sparse variant: every checked gradient's error within 1.5x the dense bf16 one or the bf16 bar."""
    dense = result["variants"]["dense"].get("grad_rel_err_vs_fp32")
    for name, entry in result["variants"].items():
        errs = entry.get("grad_rel_err_vs_fp32")
        if name == "dense" or not dense or not errs:
            continue
        entry["ok"] = all(within_tolerance(errs[k], dtype, dense[k], MODEL_DENSE_ERROR_FACTOR, REL_TOL_GRAD)
                          for k in errs)


def _add_ratios(result: dict[str, Any]) -> None:
    dense = result["variants"]["dense"]
    if "ms" in dense:
        dense["speedup"] = 1.0
    for name, entry in result["variants"].items():
        if name == "dense" or "ms" not in entry or "ms" not in dense:
            continue
        entry["speedup"] = dense["ms"] / entry["ms"]
        d_mem, s_mem = dense.get("memory"), entry.get("memory")
        if d_mem and s_mem:
            entry["peak_memory_reduction"] = 1.0 - s_mem["peak_gb"] / d_mem["peak_gb"]


def train_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat CSV/table rows of a training result."""
    rows = []
    for name, v in result.get("variants", {}).items():
        mem = v.get("memory") or {}
        l0 = v.get("layer_l0")
        grad_errs = v.get("grad_rel_err_vs_fp32")
        spilled = v.get("layer_spilled_tokens_last_step")
        rows.append({
            "part": "train", "variant": name, "batch": result.get("batch"), "tokens": result.get("tokens"),
            "ms": v.get("ms"), "tokens_per_ms": v.get("tokens_per_ms"), "speedup": v.get("speedup"),
            "peak_gb": mem.get("peak_gb"), "peak_memory_reduction": v.get("peak_memory_reduction"),
            "l0_mean": sum(l0) / len(l0) if l0 else None,
            "grad_rel_err_vs_fp32_max": max(grad_errs.values()) if grad_errs else None, "ok": v.get("ok"),
            "compiled": bool(v.get("compiled", False)),
            # tokens the hot/cold op recomputed densely in the last timed step, over all layers: slow when many
            "spilled_tokens_last_step": sum(spilled) if spilled is not None else None,
            "error": (v.get("error") or v.get("check_error") or "").split("\n")[0] or None,
        })
    return rows
