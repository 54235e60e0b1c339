"""The small-batch (decode) ReLU-gated FFN: 1 to 64 tokens per call.

``decode_gated_ffn(x, w_gate, w_up, w_down)`` computes what the dense FFN computes (its pure-PyTorch twin
is :func:`twell.reference.inference.dense_gated_ffn`, same rounding rules) but reads Wu and Wd only at
the rows of units that fire for at least one of the tokens: one token through the one-pass kernel
(:mod:`twell.ops.decode_onepass_kernel`), more through :mod:`twell.ops.decode_batch_kernels`, which have the
methods.  Larger token counts belong to the TwELL and hot/cold paths: past 64 tokens the union of
active units covers much of the layer and the dense tile of h grows.
"""

from __future__ import annotations

import torch

from .._validation import FLOAT_DTYPES, check_finite, check_same_device, check_same_dtype, check_tensor
from ..reference import inference as ref
from ._runtime import resolve_backend
from .decode_batch_kernels import launch_batch_ffn
from .decode_kernels import DECODE_MAX_TOKENS, launch_decode_down, launch_decode_hidden
from .decode_onepass_kernel import ONEPASS_MAX_TOKENS, launch_decode_onepass
from .inference import _check_triton_dtype, _check_x_w, check_precision

__all__ = ["DECODE_MAX_TOKENS", "decode_gated_ffn"]

#: Calls of up to this many tokens (at most :data:`~twell.ops.decode_onepass_kernel.ONEPASS_MAX_TOKENS`)
#: through the one-pass kernel (:mod:`twell.ops.decode_onepass_kernel`); 0 turns it off.  One token: on
#: an H200 (bf16, CUDA-graph GPU time, bench_results/h200/decode_probe_onepass_session6.log) it takes
#: 17.5 / 21.5 us at 0.5 / 2 % density against the two kernels' 23.3 / 30.1 us and the dense FFN's 31 us
#: (d=2048, F=5632), and 48.4 / 64.2 against 62.3 / 76.7 and 97 us (d=4096, F=14336).  At 2 and 4
#: tokens it lost to the two kernels (0.038 vs 0.033 ms at d=2048, 2 tokens, 0.5 %): every token adds
#: its own reductions over the whole gate tile (6 us per token with nothing firing).
ONEPASS_TOKENS = 1
#: Calls of more tokens through :mod:`twell.ops.decode_batch_kernels` (cuBLAS gate, up kernel, down split over
#: unit ranges, partial sum) rather than the two kernels of :mod:`twell.ops.decode_kernels`: faster at every point
#: measured from two tokens (H200, bf16, CUDA-graph GPU time, 2-64 tokens, 0.5 / 2 %, d=2048 F=5632 and d=4096
#: F=14336; with the Wd^T view that this function passes, d=2048, 0.5 %: 28.6 / 30.4 us at 2 / 8 tokens against
#: the two kernels' 33.4 / 37.7; bench_results/h200/decode_probe_final_call6_session33.log and
#: decode_probe_fused_call2_session33.log).  False: the two kernels (probes, tests).
BATCH_KERNELS = True


def decode_gated_ffn(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    precision: str = "match",
    backend: str = "auto",
    nan_policy: str = "propagate",
) -> torch.Tensor:
    """``(relu(x Wg^T) * (x Wu^T)) Wd^T`` for x [M, d] with 1 <= M <= :data:`DECODE_MAX_TOKENS` (M = 0
    gives an empty result); Wg, Wu [F, d], Wd [d, F] (read in place, in any layout).  ``precision``:
    "match" rounds g, u and h to the input dtype as the dense FFN does, "fp32" keeps u and h in fp32.
    float16, bfloat16 or float32 on CUDA (or the CPU under TRITON_INTERPRET=1); ``backend="torch"`` runs
    the dense reference.
    """
    check_precision(precision)
    _check_x_w(x, w_gate, "w_gate")
    _check_x_w(x, w_up, "w_up")
    check_tensor(w_down, "w_down", ndim=2, dtypes=FLOAT_DTYPES)
    f = w_gate.shape[0]
    if w_up.shape[0] != f:
        raise ValueError(f"w_up has shape {tuple(w_up.shape)} but w_gate has {tuple(w_gate.shape)}")
    if w_down.shape != (x.shape[1], f):
        raise ValueError(f"w_down has shape {tuple(w_down.shape)}; expected [d, F] = {(x.shape[1], f)}")
    named = {"x": x, "w_gate": w_gate, "w_up": w_up, "w_down": w_down}
    check_same_dtype(named)
    device = check_same_device(named)
    m = x.shape[0]
    if m > DECODE_MAX_TOKENS:
        raise ValueError(
            f"decode_gated_ffn takes at most {DECODE_MAX_TOKENS} tokens, got x with {m} rows; larger batches go "
            "through twell.ops.sparse_gated_ffn or twell.ops.hot_cold_gated_ffn"
        )
    check_finite(named, nan_policy)
    if resolve_backend(backend, device) == "torch":
        return ref.dense_gated_ffn(x, w_gate, w_up, w_down, precision=precision)
    _check_triton_dtype(x)
    if m == 0 or f == 0:
        return torch.zeros((m, x.shape[1]), dtype=x.dtype, device=device)
    return launch_decode_ffn(x, w_gate, w_up, w_down.t(), match=precision == "match")[0]


def launch_decode_ffn(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, *, match: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [M, d], counts [M, decode_blocks(F)])`` of :func:`decode_gated_ffn` on the Triton kernels,
    without the checks, Wd given as Wd^T [F, d] (a contiguous unit-major copy or the ``.t()`` view of the
    [d, F] weight: no copy either way): for callers that validated once (``SparseGatedMLP``, the custom
    op).  1 <= M <= DECODE_MAX_TOKENS, F >= 1, one dtype and device."""
    if x.shape[0] <= min(ONEPASS_TOKENS, ONEPASS_MAX_TOKENS):
        return launch_decode_onepass(x.contiguous(), w_gate.contiguous(), w_up.contiguous(), w_down_t, match=match)
    if BATCH_KERNELS:
        return launch_batch_ffn(x, w_gate, w_up, w_down_t, match=match)
    h, fires, counts = launch_decode_hidden(x.contiguous(), w_gate.contiguous(), w_up.contiguous(), match=match)
    return launch_decode_down(h, fires, w_down_t, x.dtype), counts
