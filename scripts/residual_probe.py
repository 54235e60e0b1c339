"""GPU time of the decoder layer's two residual adds with and without the fusions of ``twell.nn.fuse_residual_adds``,
at the 1.5B forward's shape (131,072 tokens, d=2048, F=5632, l0 28 on the synthetic problem).

Why (session 24): each add reads two [tokens, d] tensors and writes one, 1.5 GB at 131,072 tokens in bf16, 56 of them
per 1.5B forward in both the dense and the sparse model.  Predicted per layer: the attention's add + RMSNorm as one
pass 0.668 -> ~0.47 ms (2.0 instead of 2.5 GB); the sparse op with the residual added by its gather -0.25 ms
(the add's ~0.35 ms for one more 0.5 GB read in a kernel bound by its dependent loads); the dense FFN's down
projection with the residual in cuBLAS's epilogue 4.915 -> 4.709 ms (session 23).  Whole forward: sparse ~-12 ms,
dense ~-11 ms, the ratio ~1.349 -> ~1.356.
Measured (H200, session 24, bench_results/h200/residual_probe_session24.log): the add + norm 0.666 -> 0.508 ms;
the sparse op then add 6.900 ms, the residual in its gather 6.702 ms; the dense FFN then add 13.226 ms, with
addmm 13.403 ms (slower as a whole FFN: ``twell.nn.mlp.DENSE_RESIDUAL_ADDMM`` is off).

Interleaved medians (``time_ms_interleaved``) of: the add then ``F.rms_norm`` against ``add_rms_norm``; the hot/cold
op (576 hot units, the fused gate where it runs) then ``+ residual`` against the op with ``residual=``; the dense FFN
then ``+ residual`` against it with ``torch.addmm``; the outputs compared bit for bit (sparse) or by the largest
difference (dense, the norm).  Usage (GPU machine): ``PYTHONPATH=src python3 scripts/residual_probe.py``;
``--device cpu --tiny`` is the smoke test.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import twell.ops as ops
from twell.bench.probe import probe_args, split_probe_setup, split_problem
from twell.bench.timing import time_ms_interleaved
from twell.ops.add_norm_kernel import add_rms_norm
from twell.ops.hot_cold_plan import fused_gate_tile


def main() -> None:
    device, tiny = probe_args(__doc__)
    setup = split_probe_setup(tiny)
    m, l0 = setup.points[-1] if tiny else (131072, 28.0)
    d, f = setup.d, setup.f
    rep = setup.rep_ms
    p = split_problem(m, d, f, l0, device)
    dtype = p.x.dtype
    gen = torch.Generator(device=device).manual_seed(7)
    r = torch.randn(m, d, generator=gen, device=device).to(dtype)
    a = torch.randn(m, d, generator=gen, device=device).to(dtype)
    weight = (1 + 0.1 * torch.randn(d, generator=gen, device=device)).to(dtype)
    print(f"M={m} d={d} F={f} l0={l0} {dtype}: per layer, interleaved medians")

    def eager_pair():
        h = r + a
        return h, F.rms_norm(h, (d,), weight, 1e-6)

    t = time_ms_interleaved({"eager": eager_pair, "fused": lambda: add_rms_norm(r, a, weight, 1e-6)}, device=device,
                            rep_ms=rep)
    h_e, y_e = eager_pair()
    h_f, y_f = add_rms_norm(r, a, weight, 1e-6)
    print(f"attention add + rms_norm: eager {t['eager']:.3f} ms, one pass {t['fused']:.3f} ms "
          f"({t['eager'] / t['fused']:.3f}x); sum bit for bit {torch.equal(h_e, h_f)}, norm max |diff| "
          f"{(y_e.float() - y_f.float()).abs().max().item():.2e}")

    fused_tile = fused_gate_tile(setup.tile, dtype, d, device)
    hot = p.by_frequency[:setup.hot_units[l0]]
    plan = ops.build_hot_cold_plan(p.w_gate, p.w_up, p.w_down, hot, fused_tile=fused_tile)

    def op(residual=None):
        return ops.hot_cold_gated_ffn(p.x, p.w_gate, p.w_up, p.w_down, plan, tile=setup.tile, capacity=setup.cap,
                                      residual=residual)

    t = time_ms_interleaved({"op": op, "op + add": lambda: r + op(), "op(residual)": lambda: op(r)}, device=device,
                            rep_ms=rep)
    same = torch.equal(op(r), r + op())
    print(f"sparse FFN (hot/cold, {plan.n_hot} hot, fused gate {bool(plan.fused_tile)}): op {t['op']:.3f} ms, op then "
          f"add {t['op + add']:.3f} ms, residual in the gather {t['op(residual)']:.3f} ms "
          f"({t['op + add'] - t['op(residual)']:+.3f} ms); bit for bit {same}")

    def dense(addmm: bool):
        h = F.relu(F.linear(p.x, p.w_gate)) * F.linear(p.x, p.w_up)
        return torch.addmm(r, h, p.w_down.t()) if addmm else r + F.linear(h, p.w_down)

    t = time_ms_interleaved({"add": lambda: dense(False), "addmm": lambda: dense(True)}, device=device, rep_ms=rep)
    diff = (dense(True).float() - dense(False).float()).abs().max().item()
    print(f"dense FFN + residual: then add {t['add']:.3f} ms, addmm {t['addmm']:.3f} ms "
          f"({t['add'] - t['addmm']:+.3f} ms), max |diff| {diff:.2e}")


if __name__ == "__main__":
    main()
