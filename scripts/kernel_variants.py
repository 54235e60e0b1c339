"""Diagnostics on the GPU: where the time of the gate and FFN kernels goes (one call, prints a table).

Gate: the same GEMM with three epilogues (dense store = plain matmul, counts only, full TwELL) vs
cuBLAS.  FFN: the row kernel with different warps / units-per-step.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from twell.bench.timing import time_ms
from twell.ops.gate_kernel import _gate_twell_kernel, launch_gate_twell
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

dev = torch.device("cuda")
d, f = 2048, 5632
for m in (16384, 131072):
    gen = torch.Generator(device=dev).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=28.0), generator=gen, device=dev)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    t = {"cublas": time_ms(lambda: F.linear(x, wg), device=dev)}
    for epi in (2, 1, 0):
        t[f"epi{epi}"] = time_ms(lambda: launch_gate_twell(x, wg, 128, 16, epilogue=epi), device=dev)
        print(f"M={m} epilogue {epi}: best config {_gate_twell_kernel.best_config}", flush=True)
    print(f"M={m} gate ms: " + "  ".join(f"{k}={v:.3f}" for k, v in t.items()), flush=True)
    v, i, c = launch_gate_twell(x, wg, 128, 16)
    wdt = wd.t().contiguous()
    out = torch.empty(m, d, dtype=x.dtype, device=dev)
    pairs = float(c.sum())
    for sb in (2, 4, 8):
        for nw in (2, 4, 8):
            if sb * 2048 / (32 * nw) > 128:
                continue
            ms = time_ms(lambda: launch_twell_ffn(x, v, i, c, None, None, wg, wu, wdt, n_cols=f, tile=128,
                                                  round_hidden=True, out=out, sb=sb, num_warps=nw), device=dev)
            print(f"M={m} ffn sb={sb} warps={nw}: {ms:.3f} ms  {ms * 1e6 / pairs:.2f} ns/pair", flush=True)
sys.exit(0)
