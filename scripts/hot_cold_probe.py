"""GPU probe for the hot/cold split of the sparse FFN (prints a table; one call on the H200).

Idea: the most frequent units ("hot") are computed densely, fused into the gate GEMM as extra output
columns (x @ [Wg; Wu_hot]^T) and a small [M, H] x [H, d] down GEMM; only the remaining ("cold")
pairs go through TwELL and the row-gather kernel.  This script times the pieces with the existing
kernels (the cold TwELL is built by packing a copy of g whose hot columns are zeroed, untimed) to
check the cost model before the fused pack kernel is written:

    t(H) = gemm(F + H) + pack + hot_down(H) + gather(cold pairs)

It also sweeps the pack kernel's block size and warps.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from twell.bench.timing import time_ms
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

dev = torch.device("cuda")
d, f = 2048, 5632
for m, l0 in ((131072, 28.0), (16384, 28.0), (131072, 56.0)):
    gen = torch.Generator(device=dev).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0), generator=gen, device=dev)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    wdt = wd.t().contiguous()
    dense = time_ms(lambda: F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd), device=dev)
    gate = time_ms(lambda: F.linear(x, wg), device=dev)
    g = F.linear(x, wg)
    freq = (g[:4096] > 0).float().mean(0)
    order = torch.argsort(freq, descending=True)
    print(f"M={m} l0={l0} dense={dense:.3f} gate={gate:.3f}", flush=True)
    for bm in (16, 32, 64, 128):
        for nw in (1, 2, 4, 8):
            if bm * 128 // (32 * nw) > 256 or bm * 128 // (32 * nw) < 8:
                continue
            t = time_ms(lambda: launch_pack_twell(g, 128, 16, block_m=bm, num_warps=nw), device=dev)
            print(f"  pack block_m={bm} warps={nw}: {t:.3f} ms", flush=True)
    out = torch.empty(m, d, dtype=x.dtype, device=dev)
    for h in (0, 128, 256, 384, 512, 768):
        hot = order[:h].sort().values
        w_gu = torch.cat([wg, wu[hot]], 0)
        wdt_hot = wdt[hot].contiguous()
        t_gemm = time_ms(lambda: F.linear(x, w_gu), device=dev)
        gc = g.clone()
        gc[:, hot] = 0
        t_pack = time_ms(lambda: launch_pack_twell(gc, 128, 16), device=dev)
        v, i, c = launch_pack_twell(gc, 128, 16)
        pairs = float(c.sum())
        t_gather = time_ms(lambda: launch_twell_ffn(x, v, i, c, None, None, wg, wu, wdt, n_cols=f, tile=128,
                                                    round_hidden=True, out=out), device=dev)
        h_hot = torch.randn(m, max(h, 1), device=dev, dtype=x.dtype)[:, :h]
        t_down = time_ms(lambda: h_hot @ wdt_hot, device=dev) if h else 0.0
        total = t_gemm + t_pack + t_down + t_gather
        print(f"  H={h:4d} cold pairs/token={pairs / m:6.2f} gemm={t_gemm:.3f} pack={t_pack:.3f} "
              f"down={t_down:.3f} gather={t_gather:.3f} ({t_gather * 1e6 / max(pairs, 1):.2f} ns/pair) "
              f"total={total:.3f} -> {dense / total:.2f}x", flush=True)
    torch.cuda.empty_cache()
sys.exit(0)
