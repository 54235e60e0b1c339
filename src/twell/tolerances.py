"""Every numerical tolerance of the project, in one place.

Relative errors are ``||out - ref|| / ||ref||`` (Frobenius norms) against a float64 (or float32 on
the GPU) reference of the same mathematical function.  The bf16 figure follows from its 8-bit
mantissa: a unit roundoff of 2**-8 = 3.9e-3 per rounding, several roundings per output, but errors
of independent roundings average out in the norm; bf16 matmuls on random data land between 1e-3 and
4e-3 in practice, so 5e-3 is the acceptance bar that issue 3 sets for the whole FFN.
"""

from __future__ import annotations

import torch

#: Relative Frobenius error allowed for a whole FFN output / gradient, by compute dtype.
REL_TOL: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    # Triton's fp32 dot uses tf32 on tensor cores unless told otherwise (~3e-4 on random data).
    torch.float16: 2e-3,
    torch.bfloat16: 5e-3,
}

#: Where the dense module of the same dtype misses :data:`REL_TOL` itself, a sparse output passes if its error is at
#: most this factor of the dense module's on the same tokens.  A bf16 FFN on one or a few tokens sums few products per
#: output, so its own error spreads: at 896 x 4864 and 0.25 % density (l0 ~12) 4.8 % of single tokens had a dense bf16
#: error over 5e-3 (median 2.9e-3, largest 7.6e-3; 2000 tokens on the CPU, session 31), and the sparse path, which
#: rounds as the dense module does, matched it token by token (error ratio 1.000-1.001 over 200 single tokens).  The
#: H200 tuning run that found this (session 31, tune_896x4864_b_call2_session31.log) read 6.0e-3 at one token.  1.1
#: leaves room for the kernels' other summation order and no more.
DENSE_ERROR_FACTOR = 1.1
#: The same for a whole model (``twell bench model``: the forward's output and the training step's gradients), whose
#: layers compound each other's roundings.
MODEL_DENSE_ERROR_FACTOR = 1.5

#: fp32 kernels that use tf32 tensor-core dots (GPU only) are checked against this.
REL_TOL_TF32 = 2e-3

#: Gradients accumulate more roundings than the forward (sums over tokens); bf16 bar for them.
REL_TOL_GRAD: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 1e-2,
}


# Cross-checks of one quantity computed two ways (the tests).  Each bound is sized from the unit roundoff of the dtype
# compared: 2**-53 ~ 1.1e-16 for float64 (an ulp is 2**-52 ~ 2.2e-16), 2**-24 ~ 6e-8 for float32.

#: Relative error between float64 results of the same sums added in another order (the training dispatcher's dense
#: branch against the reference, a decode step through the unit-major down weight): each reordered addition moves the
#: result by a few ulps of 2**-52 ~ 2.2e-16, over tens to hundreds of terms ~1e-14 at most; hence 1e-12.
REL_TOL_FP64_REORDER = 1e-12
#: Relative error between float64 results of the same sums split at other chunk boundaries (the reference's chunked
#: twell product): the terms and their order inside a chunk are unchanged, only the few additions that join chunk
#: results differ, each a few ulps of 2.2e-16; hence 1e-14, 100x tighter than a free reordering.
REL_TOL_FP64_CHUNKED = 1e-14
#: Absolute gap of a float64 statistic summed from the twell entries and from the dense tensor (the mean over rows of
#: ``sum |h|``, of order 1-10): the REL_TOL[float64] figure taken absolutely, orders of magnitude above the ~1e-15
#: that the two summation orders give and far below any missed or doubled entry.
ABS_TOL_FP64_STAT = 1e-10
#: Absolute gap between a sparsity report's ``l0_mean`` and the Python (float64) mean of its per-position means (values
#: below 64 units): a dozen divisions and additions of a few ulps each, ~1e-14; 1e-9 catches a wrong count (>= 1e-2)
#: and never rounding.
ABS_TOL_MEAN_OF_MEANS = 1e-9
#: ``torch.autograd.gradcheck`` in float64, tighter than its defaults (atol 1e-5, rtol 1e-3): central differences with
#: step ``eps`` 1e-6 are off by O(eps**2) ~1e-12 (truncation) plus ~ulp(f) / eps ~1e-10 (rounding), so the analytic
#: Jacobian must match within atol 1e-8 + rtol 1e-6; the inputs keep every gate >= 1e-2 (1e4 x eps) from the ReLU kink.
GRADCHECK: dict[str, float] = {"eps": 1e-6, "atol": 1e-8, "rtol": 1e-6}
#: fp32 results one or a few roundings apart (the same ops through another module or graph, a float64 count ratio
#: rounded once to float32): each rounding moves a value by at most 2**-24 ~ 6e-8 of it, so a few stay below 1e-6.
#: Relative, or absolute on values of order 1 to 15 (an l0 mean of ~15 rounded once is within 15 * 6e-8 = 9e-7).
FP32_ROUNDING_TOL = 1e-6
#: Absolute floor for fp32 values of at most ~1 (unit firing frequencies in [0, 1] rounded once from float64, gradient
#: entries near 0 of a compiled training step against eager): one rounding of a value <= 1 is <= 2**-24 ~ 6e-8.
FP32_UNIT_ABS_TOL = 1e-7
#: Elementwise gap between fp32 results of the same function along different paths (another summation order over up
#: to a few hundred terms, the L1 term by module and by hand, a float64 model cast to fp32 against the fp32 model, row
#: norms of normalised fp32 weights): relative, or absolute on values of order 1.  Per element the REL_TOL[float32]
#: figure: a few hundred roundings of 6e-8 partly cancel to ~1e-6, 1e-5 leaves a margin.
FP32_ELEMENT_TOL = 1e-5
#: Absolute gap of an l0 (mean active units per token) a module accumulates in fp32 (``layer_l0``, ``last_l0``) against
#: a count made elsewhere: the counts are exact in fp32 below 2**24 and the mean rounds once, ~1e-6 on l0 of 10-100;
#: 1e-4 is far above that and far below one miscounted unit (1 / tokens >= 1e-2 here).
L0_ABS_TOL_FP32 = 1e-4
#: The error figures that ``twell bench ffn`` (Frobenius, fp32) and ``twell train evidence``'s speed rows (max |out -
#: ref| / max |ref|, fp32) record, checked by the tests of those CLIs: fp32-sized, 10x REL_TOL[float32] because the
#: largest single element of a max-based ratio sits above the norm ratio (the CLIs' own ``ok`` applies REL_TOL).
REL_TOL_FP32_CLI = 1e-4
#: Fraction of the GPU gate's (token, tile) active counts allowed to differ from those of cuBLAS's dense gate: only
#: gates that round to exactly 0 one way and not the other flip, vanishingly rare on random data; 1e-4 of the test's
#: 4096 x 44 counts is 18.
GATE_COUNT_MISMATCH_FRACTION = 1e-4
#: Relative gap (floored at one unit) of the GPU training kernels' l0 against the float64 oracle (also the hot/cold
#: op's l0 in a ``twell bench train-ffn`` row): gates within fp32 accumulation noise of 0 may fall on the other side
#: of the ReLU, up to 0.1 % of the active units.
L0_REL_TOL_GATE_FLIPS = 1e-3
#: The max-based error figure of ``twell demo``'s speed rows (as :data:`REL_TOL_FP32_CLI`) where the model runs in bf16
#: (on a GPU): dense and sparse round differently, so 10x REL_TOL[bfloat16], for the reason REL_TOL_FP32_CLI is 10x
#: REL_TOL[float32].
REL_TOL_BF16_CLI = 5e-2
#: Relative gap between logit differences (a top-2 gap, the gap between two chosen tokens) or the std of a logit row
#: that ``twell bench model``'s divergence diagnostic takes from one batched teacher-forced fp32 forward, and the same
#: figures from a forward per prefix.  The logits (of order 1) agree within ~2e-7; a difference of two of them keeps
#: that absolute error, so its relative error grows as the gap shrinks: 2.4e-5 at a near tie of 6e-3 on the tiny
#: preset.  With :data:`FP32_ELEMENT_TOL` as the absolute floor for gaps closer still.
REL_TOL_FP32_LOGIT_GAP = 1e-4
#: Elementwise relative gap between bf16 results of one function that two kernels each round once from fp32 (the fused
#: add + RMS norm against PyTorch's): bf16 keeps 8 significant bits, so nearly equal fp32 values round at most one bf16
#: step apart, 2**-8 to 2**-7 of the value; hence 2**-7.
BF16_ONE_ROUNDING_REL_TOL = 2**-7
#: Float64 values that a closed-form solve makes exact in exact arithmetic (synthetic unit frequencies clipped at their
#: cap, the position scale's mean 1 over a sequence and its head equal to ``early_boost``): relative, or absolute on
#: values of order 1.  Only the roundings of the solve and of a sum over up to a few thousand terms remain (measured
#: 0 to 2.2e-16); 1e-12, as :data:`REL_TOL_FP64_REORDER`.
FP64_CLOSED_FORM_TOL = 1e-12
#: Relative gap between a target and the float64 sum (or mean) of the values rescaled to hit it (synthetic unit
#: frequencies water-filled to ``mean_l0``, layer profiles to a mean l0): the scale is solved in closed form, so only
#: roundings remain (measured <= 6.7e-16 over up to 5632 terms); 1e-9 still fails any error of the solve itself.
REL_TOL_FP64_SCALED_SUM = 1e-9
#: The same two bounds for any profile the property test draws (up to 3000 units, tail exponents up to 3, so weights
#: down to ~4e-11 of the largest, and the cap binding on most live units, where the scale ``(T - k cap) / S_k``
#: subtracts nearly equal numbers): the sum's relative gap and the largest frequency's excess over the cap.  3000 such
#: draws gave at most 4e-15 and 0; the bars are 100x and 1000x looser than the fixed profiles' so an extreme draw's
#: cancellation does not fail them, and still far below a wrong solve.
REL_TOL_WATER_FILL_ANY_PROFILE = 1e-7
ABS_TOL_WATER_FILL_CAP_ANY_PROFILE = 1e-9
#: Relative gap of a seeded random weight matrix's std from the scale it is drawn at (``synthetic_ffn_problem``'s
#: ``w_up ~ N(0, 1/d)``, ``w_down ~ N(0, 1/F)``, 256 x 1024 entries): the std of n = 262144 normal samples has a
#: standard error of 1/sqrt(2n) ~ 1.4e-3 of it (measured 1.0e-3 and 4e-4); 0.05 is ~35 of those and still catches a
#: wrong scale (1/sqrt(d) and 1/sqrt(F) are 2x apart here).
REL_TOL_SAMPLED_STD = 0.05
#: Relative gap of the 64-token block union of independent random tokens (seeded, 4096 tokens, 64 blocks) from what
#: the unit frequencies predict: the ratio ``union64_vs_independent`` (expectation 1, so absolute there) and the
#: predicted union against the one of the nominal frequency.  Sampling noise, measured 0.27 % and 0.19 %; 0.03 is
#: ~10x that and far from the < 0.5 of blocks that repeat one active set.
REL_TOL_UNION64_SAMPLE = 0.03
#: ``twell bench model``'s sparsity calibration on its tiny preset: the achieved mean l0 per layer (and over layers)
#: against the target, relative, and the achieved dead fraction against the target, absolute.  Thresholds rounded to
#: bf16 (<= 2**-9 relative) and the ``round(p M)`` quantile granularity move l0 by a few percent at most (measured
#: 0.1 %); live units too rare to fire on the batch add to the dead fraction (measured +0.001).
REL_TOL_CALIBRATED_L0 = 0.1
ABS_TOL_CALIBRATED_DEAD_FRACTION = 0.02
#: Absolute gap of the l0 a layer measures on the tests' ``make_inputs`` tensors against ``density * units``: the
#: inputs hit the density in float64 up to rounding the number of active (token, unit) pairs to an integer (half a
#: pair, 0.5 / tokens per token: 6.375 against 6.4 at 8 tokens, 10 % of 64 units), and the float32 cast may flip a
#: gate set half-way between two gate values; half a unit per token is far below the densities the tests tell apart.
L0_ABS_TOL_SET_DENSITY = 0.5
#: Absolute gap between a ratio computed from committed benchmark runs and the figure quoted for it to two decimals (a
#: speedup in a comment or the README): half a unit in the last quoted place.
ABS_TOL_TWO_DECIMALS = 0.005
#: Absolute gap between a shipped dispatch table's density limit (a typed 7-decimal literal, <= 1) and the same limit
#: derived from the committed runs (``ceil(d * 1e7) / 1e7``): both are the float64 nearest one 7-decimal number (the
#: division rounds correctly), so equal; 1e-12 allows a few ulps (2.2e-16) and is far below the 1e-7 step of a limit.
ABS_TOL_DENSITY_LIMIT = 1e-12


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere in ``out`` that is not in ``ref`` gives inf."""
    o = out.detach().to(torch.float64).cpu()
    r = ref.detach().to(torch.float64).cpu()
    if o.shape != r.shape:
        raise ValueError(f"shape mismatch: {tuple(o.shape)} vs {tuple(r.shape)}")
    if bool((torch.isnan(o) != torch.isnan(r)).any()):
        return float("inf")
    finite = ~torch.isnan(r)
    o, r = o[finite], r[finite]
    denom = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / denom


def within_tolerance(err: float, dtype: torch.dtype, dense_err: float | None = None,
                     factor: float = DENSE_ERROR_FACTOR, table: dict[torch.dtype, float] | None = None) -> bool:
    """True iff a relative error ``err`` passes for ``dtype``: at most ``table[dtype]`` (default :data:`REL_TOL`;
    :data:`REL_TOL_GRAD` for gradients), or at most ``factor`` times ``dense_err``, the dense module's own error on the
    same tokens and reference (None: not measured)."""
    table = REL_TOL if table is None else table
    if dtype not in table:
        raise ValueError(f"no tolerance for dtype {dtype}; accepted: {', '.join(str(t) for t in table)}")
    if err <= table[dtype]:
        return True
    return dense_err is not None and err <= factor * dense_err
