"""The hot/cold training op as PyTorch custom ops with an autograd formula, for torch.compile.

Dynamo cannot trace the autograd Function :class:`twell.ops.hot_cold_training.HotColdGatedFFNL1` (its
forward launches Triton kernels from Python and takes a dataclass), so a compiled training step breaks
its graph there and keeps the op's host time, the part of a step that CUDA graphs would remove (at
M=16384 on an H200 the kernels took 2.58 of the 3.25 ms).  Here the same computation is two custom ops:

* ``twell::hot_cold_gated_ffn_l1(x, w_gate, w_up, w_down, hot_ids, columns, slot, width, cont_rows)``
  -> ``[out, l1, l0, spilled_tokens, *saved]`` (``saved``: the 14 tensors the backward needs);
* ``twell::hot_cold_gated_ffn_l1_backward(grad_out, grad_l1, x, w_gate, w_up, w_down, slot, *saved,
  need_x, need_wg, need_wu, need_wd)`` -> ``[dx, dWg, dWu, dWd]`` (empty tensors where not needed),

tied by ``register_autograd``; their fake implementations give the shapes from (M, d, F, H, W, C).
They take M >= 1 and F >= 1 (the caller handles empty inputs).  Unlike the Function, dWd always comes
back as a contiguous [d, F] tensor and the backward re-derives Wd^T from ``w_down`` (a custom op may not
return a view of its input).  :func:`twell.ops.hot_cold_training.twell_gated_ffn_l1_hot_cold` runs
these while torch.compile traces and the Function otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

from .hot_cold_training import _hc_backward, _hc_forward, _unit_major

__all__ = ["hot_cold_gated_ffn_l1_op"]

#: Number of backward tensors the forward op returns after (out, l1, l0, spilled_tokens).
N_SAVED = 14


@torch.library.custom_op("twell::hot_cold_gated_ffn_l1", mutates_args=())
def hot_cold_gated_ffn_l1_op(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    hot_ids: torch.Tensor,
    columns: torch.Tensor,
    slot: torch.Tensor,
    width: int,
    cont_rows: int,
) -> list[torch.Tensor]:
    """``[out, l1, l0, spilled_tokens, *saved]`` of the hot/cold op (module docstring)."""
    out, l1, l0, n_spill, _, saved = _hc_forward(x, w_gate, w_up, w_down, hot_ids, columns, slot, width, cont_rows)
    # n_spill is also the last saved tensor: an op's outputs may not alias each other
    return [out, l1, l0, n_spill.clone(), *saved]


@hot_cold_gated_ffn_l1_op.register_fake
def _(x, w_gate, w_up, w_down, hot_ids, columns, slot, width, cont_rows):  # noqa: ANN001, ANN202
    m, d = x.shape
    h = hot_ids.shape[0]
    rows = m + cont_rows
    f32, i32 = torch.float32, torch.int32
    return [
        x.new_empty((m, d)), x.new_empty((), dtype=f32), x.new_empty((), dtype=f32), x.new_empty((1,), dtype=i32),
        x.new_empty((2 * h, d)), x.new_empty((h, d)), x.new_empty((m, h)), x.new_empty((m, h), dtype=f32),
        x.new_empty((rows, width), dtype=i32), x.new_empty((rows, width)), x.new_empty((rows, width), dtype=f32),
        *(x.new_empty((m,), dtype=i32) for _ in range(4)),  # counts, lo, hi, order
        x.new_empty((max(1, cont_rows),), dtype=i32), x.new_empty((m,), dtype=i32), x.new_empty((1,), dtype=i32),
    ]


@torch.library.custom_op("twell::hot_cold_gated_ffn_l1_backward", mutates_args=())
def hot_cold_gated_ffn_l1_backward_op(
    grad_out: torch.Tensor,
    grad_l1: torch.Tensor,
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    slot: torch.Tensor,
    saved: list[torch.Tensor],
    need_x: bool,
    need_wg: bool,
    need_wu: bool,
    need_wd: bool,
) -> list[torch.Tensor]:
    """``[dx, dWg, dWu, dWd]`` (an empty tensor for each one not needed)."""
    need = (need_x, need_wg, need_wu, need_wd)
    grads = _hc_backward(grad_out, grad_l1, x, w_gate, w_up, _unit_major(w_down), slot, tuple(saved), need)
    dx, dwg, dwu, dwdt = grads
    dwd = None if dwdt is None else dwdt.t().contiguous()
    return [t if t is not None else x.new_empty((0,)) for t in (dx, dwg, dwu, dwd)]


@hot_cold_gated_ffn_l1_backward_op.register_fake
def _(grad_out, grad_l1, x, w_gate, w_up, w_down, slot, saved, need_x, need_wg, need_wu, need_wd):  # noqa: ANN001, ANN202
    shapes = (x.shape, w_gate.shape, w_up.shape, w_down.shape)
    return [x.new_empty(s if n else (0,)) for s, n in zip(shapes, (need_x, need_wg, need_wu, need_wd), strict=True)]


def _setup_context(ctx: Any, inputs: tuple, output: list[torch.Tensor]) -> None:
    x, w_gate, w_up, w_down, _hot_ids, _columns, slot, _width, _cont_rows = inputs
    ctx.save_for_backward(x, w_gate, w_up, w_down, slot, *output[4:])


def _backward(ctx: Any, grads: list[torch.Tensor]) -> tuple[torch.Tensor | None, ...]:
    x, w_gate, w_up, w_down, slot, *saved = ctx.saved_tensors
    need = tuple(bool(n) for n in ctx.needs_input_grad[:4])
    out = hot_cold_gated_ffn_l1_backward_op(grads[0], grads[1], x, w_gate, w_up, w_down, slot, saved, *need)
    return (*(g if n else None for g, n in zip(out, need, strict=True)), None, None, None, None, None)


hot_cold_gated_ffn_l1_op.register_autograd(_backward, setup_context=_setup_context)
