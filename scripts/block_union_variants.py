"""Diagnostics on the GPU: block-union FFN tile choices vs the row-gather kernel and dense (one call)."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

import twell.ops as ops
from twell.bench.timing import time_ms
from twell.ops.block_union_kernel import launch_block_union_ffn
from twell.ops.gate_kernel import launch_pack_twell
from twell.reference.inference import dense_gated_ffn
from twell.synthetic import SparsityProfile, synthetic_ffn_problem
from twell.tolerances import rel_error

dev = torch.device("cuda")
d, f = 2048, 5632
for m, dens in ((131072, 0.5), (131072, 1.0), (131072, 2.0), (16384, 0.5), (4096, 0.5), (256, 0.5)):
    gen = torch.Generator(device=dev).manual_seed(0)
    p = synthetic_ffn_problem(max(m, 4096), d, f, SparsityProfile(mean_l0=dens / 100 * f), generator=gen, device=dev)
    x, wg, wu, wd = p["x"][:m].contiguous(), p["w_gate"], p["w_up"], p["w_down"]
    wdt = wd.t().contiguous()
    g = F.linear(x, wg)
    dense = time_ms(lambda: F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd), device=dev)
    cub = time_ms(lambda: F.linear(x, wg), device=dev)
    ref = dense_gated_ffn(x.float(), wg.float(), wu.float(), wd.float(), precision="fp32")
    line = f"M={m} dens={dens}% dense={dense:.3f} cublas_gate={cub:.3f}"
    for bm in (32, 64, 128):
        nb = -(-m // bm)
        gp = torch.zeros(nb * bm, f, dtype=g.dtype, device=dev)
        gp[:m] = g
        union = (gp.view(nb, bm, f) > 0).any(1).sum(1).float().mean().item()
        line += f" union@{bm}={union:.0f}"
    print(line, flush=True)
    for pd in (True, False):
        t = time_ms(lambda: launch_pack_twell(g, 128, 16, prefix_dot=pd), device=dev)
        print(f"  pack prefix_dot={pd}: {t:.3f} ms", flush=True)
    best = None
    for bm, bu, nw, ns in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (3,)):
        if bm == 128 and bu == 128 and nw == 4:
            continue
        try:
            out, _ = launch_block_union_ffn(x, g, wu, wdt, round_hidden=True, block_m=bm, block_u=bu, block_k=64,
                                            num_warps=nw, num_stages=ns)
            err = rel_error(out, ref)
            t = time_ms(lambda: launch_block_union_ffn(x, g, wu, wdt, round_hidden=True, block_m=bm, block_u=bu,
                                                       block_k=64, num_warps=nw, num_stages=ns), device=dev)
        except Exception as exc:  # report and go on: a config can run out of shared memory
            print(f"  bm={bm} bu={bu} warps={nw}: FAILED {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        print(f"  block-union bm={bm} bu={bu} warps={nw}: {t:.3f} ms (+gate {cub:.3f}) err={err:.1e}", flush=True)
        if best is None or t < best[0]:
            best = (t, bm, bu, nw)
    rg = time_ms(lambda: ops.sparse_gated_ffn(x, wg, wu, wd, method="row-gather"), device=dev)
    assert best is not None
    total = best[0] + cub
    print(f"  BEST block-union {best} total~{total:.3f} -> {dense / total:.2f}x ; row-gather total {rg:.3f} "
          f"-> {dense / rg:.2f}x", flush=True)
    p = ref = out = None  # free the big tensors before the next problem
    torch.cuda.empty_cache()
