"""Realistic activation sparsity in an untrained model, for ``twell bench model``.

A randomly initialised ReLU-gated model fires about half of its FFN units per token; a model trained with
the L1 penalty fires ~0.5 % of them (29 of 5632 per token and layer, 1.5B), unevenly over layers and
units.  Kernel speed depends on that pattern, so the benchmark model is given it, by this method:

1. **A bias channel.**  The gate projection has no bias, so residual channel ``c = BIAS_CHANNEL`` is made
   a constant: every token embedding gets ``e[c] = B`` (``B`` = the initializer range, a typical
   embedding magnitude), and the rows of every ``o_proj`` and ``down_proj`` that write channel ``c`` are
   zeroed, so the residual stream keeps ``h[c] == B`` exactly through all layers.  The MLP input is
   ``n = RMSNorm(h) = w * h / rms(h)``, so its channel ``c`` is ``n_c = B w_c / rms(h) > 0`` (``w_c = 1``).
   The gate pre-activation of unit j is ``g_j = n . Wg_j = n_c (z_j + Wg_jc)`` with
   ``z_j = (n . Wg_j - n_c Wg_jc) / n_c``: the positive per-token factor ``n_c`` (it carries ``1/rms(h)``)
   does not change the sign, so unit j fires exactly when ``z_j > t_j`` with ``Wg_jc = -t_j``.  Column
   ``c`` of ``Wg`` is therefore a per-unit firing threshold, whatever scale the residual stream grows to.
   (Tied embeddings: ``e[c] = B`` for every token adds the same amount to every logit, so greedy
   decoding is unaffected.)
2. **Targets.**  Per-layer mean l0 from :func:`twell.synthetic.layer_profiles` (a Gaussian bump at a third
   of the depth, the densest layer ~3x the sparsest, the mean over layers equal to the target, 29 for the
   published shapes); per-unit firing probabilities ``p_j`` from :func:`twell.synthetic.unit_frequencies`
   (30 % dead units, Zipf exponent 1 over the live ones, no unit above 0.9).
3. **Calibration, one forward pass.**  Calibration tokens (the first sequences of the benchmark batch)
   go through the model with the dense MLPs; a forward pre-hook on each layer's MLP sees that layer's
   real input (all earlier layers already calibrated, so the input is what the benchmark will see),
   computes ``z`` for every (token, unit) in float32 from the same bf16 values the GEMM reads, and sets
   ``t_j`` half-way between the two calibration tokens' values that make exactly ``round(p_j M)`` of the
   M tokens exceed it (an exact per-unit quantile that no token sits on).  Dead units get a zero gate
   row and ``Wg_jc = -1``: they can never fire.
4. **Not imposed, measured.**  The position profile (the first tokens of a sequence fire more units in
   trained models) and the per-token spread (max/mean l0) are whatever the random model produces from
   these thresholds; :func:`measure_layers` reports them with the achieved per-layer l0 on the benchmark
   batch itself, next to the targets.  Rounding the thresholds to bf16 moves them by <= 2^-9 relative, so
   the achieved l0 deviates from the target by a few percent at most on the calibration tokens.
   The same holds for the token overlap (``union64``: the units active on any of 64 consecutive tokens),
   and there the result is far from independent tokens.  At 1.5B on 64 x 2048 tokens the union is
   1.6-1.9 l0 in layers 5-27, against 23-31 l0 for independent tokens with the same unit frequencies
   (bench_results/h200/forward_unions_session23.log).  It follows the calibration batch: at 0.5B the same
   weights give 2.3-7.3 l0 calibrated on 64 sequences and 9.2-13.5 l0 on one.  Presumably the per-unit
   thresholds, set over many sequences, make a unit that fires on ~1.6 % of the tokens (one sequence in 64)
   fire mostly on the sequences whose input drives it highest.  A trained model's overlap is not known
   here, so methods that gain from it (block-union) are not used to read this benchmark.

Attention, norms and the up/down projections keep their random initialisation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..synthetic import layer_profiles, measure_sparsity, unit_frequencies

__all__ = ["BIAS_CHANNEL", "METHOD", "SparsityTarget", "calibrate", "install_bias_channel", "measure_layers"]

#: The residual channel used as the gate's bias input.
BIAS_CHANNEL = 0

#: One-paragraph description stored in the result JSON (the module docstring has the details).
METHOD = (
    "bias channel + per-unit quantile thresholds: residual channel 0 is held constant (embedding column set "
    "to the initializer range, o_proj/down_proj rows writing it zeroed), so column 0 of each gate projection "
    "acts as a per-unit threshold that RMSNorm cannot rescale away; per layer (in one calibration forward "
    "pass, on the first sequences of the benchmark batch, each layer seeing the real input of the already "
    "calibrated layers before it) every unit's threshold is set to the exact quantile of its gate input "
    "that makes it fire on a fraction p_j of the calibration tokens, p_j from twell.synthetic "
    "(layer_profiles: early-middle layers densest; unit_frequencies: Zipf, 30% dead units). Dead units get "
    "a zero gate row. Position and per-token effects are not imposed; they are measured."
)


@dataclass(frozen=True)
class SparsityTarget:
    """What the calibration aims at (see the module docs, step 2)."""

    mean_l0: float
    dead_fraction: float = 0.3
    tail_exponent: float = 1.0
    max_probability: float = 0.9
    peak_ratio: float = 3.0
    peak_depth: float = 1.0 / 3.0

    def unit_probabilities(self, n_layers: int, n_units: int, *, seed: int) -> list[torch.Tensor]:
        """Per layer, the target firing probability of every unit (float64, CPU, ``[n_units]``)."""
        profiles = layer_profiles(
            n_layers,
            self.mean_l0,
            peak_depth=self.peak_depth,
            peak_ratio=self.peak_ratio,
            dead_fraction=self.dead_fraction,
            tail_exponent=self.tail_exponent,
            max_probability=self.max_probability,
        )
        gen = torch.Generator().manual_seed(seed)
        return [unit_frequencies(n_units, p, generator=gen) for p in profiles]

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def install_bias_channel(model: nn.Module, value: float) -> None:
    """Make residual channel :data:`BIAS_CHANNEL` the constant ``value`` in every layer (module docs, step 1)."""
    if not value > 0:
        raise ValueError(f"the bias channel value must be > 0 (it divides the gate input), got {value}")
    c = BIAS_CHANNEL
    backbone = model.model
    with torch.no_grad():
        backbone.embed_tokens.weight[:, c] = value
        for layer in backbone.layers:
            layer.self_attn.o_proj.weight[c, :] = 0.0
            layer.mlp.down_proj.weight[c, :] = 0.0
            # The sign argument needs w_c > 0; transformers initialises RMSNorm weights to 1 anyway.
            layer.post_attention_layernorm.weight[c] = 1.0


def _thresholds(
    x: torch.Tensor, w_gate: torch.Tensor, probs: torch.Tensor, *, chunk: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t [F] fp32, fired [F] int64)``: per unit a threshold exceeded by exactly ``round(p_j M)`` of the M
    tokens' ``z_j`` (ties aside).

    The threshold lies half-way between the ``k``-th and ``(k+1)``-th largest ``z_j`` (above the largest
    by the top gap when ``k = 0``), not on a token's value: a token sitting exactly on its unit's threshold
    would have a gate of ~0 whose sign flips with any rounding difference, and a flipped active unit
    changes the gate gradient discontinuously.  Units are processed ``chunk`` at a time so that the sort
    needs ~16 M ``chunk`` bytes (131k tokens: ~1 GB), not 16 M F.
    """
    c = BIAS_CHANNEL
    m, f = x.shape[0], w_gate.shape[0]
    if m < 2:
        raise ValueError(f"calibration needs at least 2 tokens, got {m}")
    xf = x.float()
    scale = xf[:, c : c + 1].reciprocal()
    fired = torch.round(probs.to(x.device) * m).to(torch.int64).clamp(0, m - 1)
    t = torch.empty(f, dtype=torch.float32, device=x.device)
    for lo in range(0, f, chunk):
        w = w_gate[lo : lo + chunk].float()
        w[:, c] = 0.0
        z = torch.sort((xf @ w.T) * scale, dim=0, descending=True).values
        k = fired[None, lo : lo + chunk]
        below = z.gather(0, k)[0]  # the (k+1)-th largest: must not fire
        above = z.gather(0, (k - 1).clamp(min=0))[0]  # the k-th largest: must fire (k >= 1)
        top_gap = (z[0] - z[1]).abs()
        t[lo : lo + chunk] = torch.where(k[0] > 0, 0.5 * (above + below), z[0] + top_gap)
    return t, fired


def calibrate(
    model: nn.Module, mlps: list[nn.Module], tokens: torch.Tensor, probs: list[torch.Tensor]
) -> list[dict[str, float]]:
    """Set every layer's gate thresholds (module docs, step 3) with one forward pass over ``tokens``.

    ``mlps`` are the modules currently in the decoder layers (their ``gate_proj`` weights are edited in
    place, so every MLP set sharing them sees the result); ``probs`` per layer the units' target
    probabilities.  Returns per layer the target l0 and the l0 the thresholds give on the calibration tokens.
    """
    if len(mlps) != len(probs):
        raise ValueError(f"{len(mlps)} MLPs but {len(probs)} probability vectors")
    c = BIAS_CHANNEL
    report: list[dict[str, float]] = []

    def hook_for(index: int):  # noqa: ANN202 - a forward pre-hook
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0].reshape(-1, args[0].shape[-1])
            if not bool((x[:, c] > 0).all()):
                raise RuntimeError(f"layer {index}: the bias channel of the MLP input is not positive")
            p = probs[index]
            w = module.gate_proj.weight
            t, fired = _thresholds(x, w, p)
            dead = (p == 0).to(w.device)
            w[:, c] = (-t).to(w.dtype)
            w[dead] = 0.0
            w[dead, c] = -1.0
            report.append({
                "layer": index,
                "target_l0": float(p.sum()),
                "calibrated_l0": float(fired[~dead].sum()) / x.shape[0],
                "calibration_tokens": int(x.shape[0]),
                "dead_units": int(dead.sum()),
            })

        return hook

    _backbone_with_pre_hooks(model, tokens, [(m, hook_for(i)) for i, m in enumerate(mlps)])
    return report


def _backbone_with_pre_hooks(model: nn.Module, tokens: torch.Tensor, hooks: list[tuple[nn.Module, Any]]) -> None:
    """One backbone forward (no grad, no KV cache) with forward pre-hooks attached for its duration."""
    handles = [module.register_forward_pre_hook(hook) for module, hook in hooks]
    try:
        with torch.no_grad():
            model.model(input_ids=tokens, use_cache=False)
    finally:
        for h in handles:
            h.remove()


def measure_layers(
    model: nn.Module, mlps: list[nn.Module], tokens: torch.Tensor, *, positions_from: int = 0
) -> list[dict[str, float]]:
    """Per layer, :func:`twell.synthetic.measure_sparsity` of ``relu(x Wg^T)`` on ``tokens`` (dense path).

    The gate is recomputed in a forward pre-hook on each of ``mlps`` (the modules in the decoder layers)
    from the layer's real input, in the model dtype, as the dense FFN computes it.  Only positions
    ``>= positions_from`` of each sequence are counted (decode: the generated tokens).
    """
    seq_len = tokens.shape[1]
    stats: list[dict[str, float]] = []

    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0][:, positions_from:]
        a = F.relu(F.linear(x.reshape(-1, x.shape[-1]), module.gate_proj.weight))
        row = measure_sparsity(a, seq_len=seq_len - positions_from)
        row["units"] = a.shape[-1]
        stats.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})

    _backbone_with_pre_hooks(model, tokens, [(m, hook) for m in mlps])
    for i, row in enumerate(stats):
        row["layer"] = i
    return stats
