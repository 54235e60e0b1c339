"""Would an fp8 gate GEMM that only screens for the active units (exact bf16 values recomputed on them) pay?

Why: at M=131072, l0=28 (0.5 %) the exact hot/cold op holds at ~2.0x of the dense FFN and the issue asks 2.2x.
docs/performance.md's floor argument: the fused gate's mainloop alone (a bf16 GEMM, 3.33 J of the op's ~5.5 J
at the power cap) leaves no room for 2.2x unless the gate GEMM gets cheaper.  An fp8 e4m3 GEMM has twice the
bf16 tensor-core rate on Hopper, but its values are ~3 % off (3 mantissa bits), so it can only pick candidates:
unit j is a candidate for token t when its screened gate exceeds ``-margin``, and the exact gate
``x_t . Wg[j]`` is then recomputed in bf16 from its row (4 KB more per candidate pair in the cold gather, on
top of the Wu and Wd rows' 8 KB).  Whether that pays depends on two things this probe measures:

* accuracy, on the synthetic problem of ``twell bench ffn``: per margin, the candidates per token (against
  l0), the active pairs the screen misses and the relative error those misses leave in the FFN output
  (against the exact FFN, fp32 from the same bf16 inputs).  Two margins: ``est`` = k * sqrt(sum_i x_i^2 w_i^2)
  (the rounding error's own scale, which an epilogue cannot afford: it is a third GEMM) and ``norms`` =
  k * |x_t| |w_j| / sqrt(d) (a rank-1 product of per-token and per-row norms, free in an epilogue that
  already applies per-token and per-row scales);
* speed (CUDA): cuBLAS's bf16 gate GEMM against ``torch._scaled_mm`` in fp8 e4m3 with row-wise scales (and
  fast accumulation), the dense FFN beside them, interleaved call by call; and the quantisation of x as
  unfused torch ops (amax, scale, cast) for what a fused pass would have to beat.

Usage (GPU machine): ``PYTHONPATH=src python3 scripts/fp8_screen_probe.py``; ``--device cpu --tiny`` (with
TRITON_INTERPRET=1 or not: no Triton kernel runs here) is the smoke test.
"""

from __future__ import annotations

import math

import torch

from twell.bench.ffn import _dense_ffn
from twell.bench.probe import probe_args, run_points
from twell.bench.timing import time_ms_interleaved
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

#: e4m3's largest finite value: row-wise scales map each row's largest magnitude onto it.
E4M3_MAX = 448.0
#: margin factors k of the two margin rules (see the module docstring); 0 is the plain sign test.
EST_KS = (0.0, 0.02, 0.05, 0.1)
NORM_KS = (0.0, 0.01, 0.02, 0.03, 0.05)


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: ``t`` [R, K] as e4m3 with one fp32 scale per row (``t ~= q * scale``); an all-zero row
    gets scale 1 (its codes are all 0)."""
    amax = t.abs().amax(dim=1, keepdim=True).float()
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (t.float() / scale).to(torch.float8_e4m3fn), scale


def screened_gate(xq: torch.Tensor, sx: torch.Tensor, wq: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """The fp8 screen's gate values as fp32 from :func:`quantize_rows`'s codes and scales of x and Wg, computed from
    the dequantised operands in fp32 (the values an fp8 GEMM with fp32 accumulation gives, up to its summation
    order)."""
    return (xq.float() * sx) @ (wq.float() * sw).T


def accuracy(m: int, density: float, d: int, f: int, device: torch.device) -> None:
    """Candidates, misses and the misses' output error per margin at one point of the synthetic problem."""
    gen = torch.Generator(device=device).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=density / 100 * f), generator=gen, device=device)
    x, wg, wu, wd = (p[k].float() for k in ("x", "w_gate", "w_up", "w_down"))
    gate = x @ wg.T
    active = gate > 0
    n_active = int(active.sum())
    h = torch.relu(gate) * (x @ wu.T)
    out_norm = float((h @ wd.T).norm())
    screened = screened_gate(*quantize_rows(p["x"]), *quantize_rows(p["w_gate"]))
    err = screened - gate
    est = torch.sqrt((x * x) @ (wg * wg).T)
    norms = x.norm(dim=1, keepdim=True) * wg.norm(dim=1)[None, :] / math.sqrt(d)
    ratio = err.abs() / est.clamp(min=1e-30)
    rms = float(ratio.pow(2).mean().sqrt())
    print(f"M={m:>6} density {density:g} % l0 {n_active / m:.2f}: screen error / est rms {rms:.4f} "
          f"max {float(ratio.max()):.4f}", flush=True)
    for rule, scale, ks in (("est", est, EST_KS), ("norms", norms, NORM_KS)):
        for k in ks:
            cand = screened > -k * scale
            miss = active & ~cand
            missed_out = torch.where(miss, h, torch.zeros_like(h)) @ wd.T
            rel = float(missed_out.norm()) / max(out_norm, 1e-30)
            print(f"M={m:>6} density {density:g} % margin {rule} k={k:g}: candidates/token {float(cand.sum()) / m:.2f} "
                  f"(x{float(cand.sum()) / max(n_active, 1):.3f} of l0), missed pairs {int(miss.sum())} of {n_active}, "
                  f"misses' rel err {rel:.2e}", flush=True)


def speed(m: int, d: int, f: int, device: torch.device, rep_ms: float) -> None:
    """The bf16 gate GEMM against the fp8 screen GEMM (cuBLAS both), the dense FFN and x's quantisation."""
    gen = torch.Generator(device=device).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=0.005 * f), generator=gen, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    xq, sx = quantize_rows(x)
    wq, sw = quantize_rows(wg)
    sw_row = sw.reshape(1, -1).contiguous()

    def fp8_gemm(fast: bool):
        return lambda: torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw_row, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast)

    fns = {
        "dense FFN": lambda: _dense_ffn(x, wg, wu, wd),
        "bf16 gate GEMM": lambda: x @ wg.T,
        "fp8 gate GEMM": fp8_gemm(False),
        "fp8 gate GEMM fast accum": fp8_gemm(True),
        "quantize x (torch ops)": lambda: quantize_rows(x),
    }
    fp8_out = fns["fp8 gate GEMM"]().float()
    ref = screened_gate(xq, sx, wq, sw)
    agree = float((fp8_out - ref).norm() / ref.norm())
    times = time_ms_interleaved(fns, device=device, rep_ms=rep_ms)
    parts = " | ".join(f"{name} {ms:.4f} ms" for name, ms in times.items())
    print(f"M={m:>6} speed: {parts} | fp8 GEMM vs its fp32 model rel {agree:.1e}", flush=True)
    print(f"M={m:>6} speed ratios: bf16 / fp8 gate {times['bf16 gate GEMM'] / times['fp8 gate GEMM']:.3f}x, "
          f"with fast accum {times['bf16 gate GEMM'] / times['fp8 gate GEMM fast accum']:.3f}x; "
          f"dense FFN / bf16 gate {times['dense FFN'] / times['bf16 gate GEMM']:.3f}x", flush=True)


def main() -> None:
    device, tiny = probe_args(__doc__)
    d, f = (64, 512) if tiny else (2048, 5632)
    acc_points = ((256, 2.0),) if tiny else ((16384, 0.5), (16384, 1.0), (16384, 2.0), (16384, 5.0))
    run_points(acc_points, lambda m, dens: accuracy(m, dens, d, f, device), device)
    if device.type != "cuda":
        print("M=     0 speed: not timed (cuBLAS's fp8 GEMM needs a CUDA GPU)")
        return
    run_points(((m, 0.0) for m in (16384, 131072)), lambda m, _: speed(m, d, f, device, 200.0), device)


if __name__ == "__main__":
    main()
