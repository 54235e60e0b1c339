"""GPU probe: the hot/cold FFN with its cold pairs listed as a bitmap vs TwELL slots (prints a table).

Per point: the dense FFN, the whole hot/cold op in each cold format, and the two pack kernels alone on
the cold columns of the fused GEMM output (bench_results/h200/hot_cold_probe.log has the first probe).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import twell.ops as ops
from twell.bench.timing import time_ms
from twell.ops.bitmap_kernels import launch_pack_bitmap
from twell.ops.gate_kernel import launch_pack_twell
from twell.reference.inference import dense_gated_ffn
from twell.synthetic import SparsityProfile, synthetic_ffn_problem
from twell.tolerances import rel_error

dev = torch.device("cuda")
d, f = 2048, 5632
for m, l0 in ((16384, 28.0), (131072, 28.0), (131072, 56.0), (131072, 112.0)):
    gen = torch.Generator(device=dev).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0), generator=gen, device=dev)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    wd_t = wd.t().contiguous().t()
    plan = ops.build_hot_cold_plan(wg, wu, wd, ops.choose_hot_units(ops.unit_frequency(x, wg)))
    ref = dense_gated_ffn(x.float(), wg.float(), wu.float(), wd.float(), precision="fp32")
    dense = time_ms(lambda: F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd), device=dev)
    g_cold = F.linear(x, plan.w_gemm)[:, plan.n_hot:f]
    line = f"M={m} l0={l0} H={plan.n_hot} dense={dense:.3f}"
    for fmt in ("bitmap", "twell"):
        fn = lambda fmt=fmt: ops.hot_cold_gated_ffn(x, wg, wu, wd_t, plan, cold_format=fmt)  # noqa: E731
        err = rel_error(fn(), ref)
        t = time_ms(fn, device=dev)
        line += f" | {fmt}: {t:.3f} ms {dense / t:.2f}x err={err:.1e}"
    t_bits = time_ms(lambda: launch_pack_bitmap(g_cold, 128), device=dev)
    t_ell = time_ms(lambda: launch_pack_twell(g_cold, 128, 16), device=dev)
    print(line + f" | pack bitmap={t_bits:.3f} twell={t_ell:.3f}", flush=True)
sys.exit(0)
