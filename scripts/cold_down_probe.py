"""GPU time of the hot/cold split's tail with the cold pairs in the hot down GEMM's epilogue
(``twell.ops.cold_down_kernel``, ``hot_cold.COLD_IN_DOWN_GEMM``) against the shipped tail (cuBLAS down GEMM
with an fp32 output, then the row-gather kernel reading it back), and the whole op both ways.

Per (M, l0) on the synthetic problems of ``twell bench ffn`` (d=2048, F=5632, the fused gate's plan with the
H most frequent units hot, TILE 128, CAP 16): the shipped tail; the new tail per down-GEMM configuration
(``cold_down_kernel._GPU_CONFIG`` = BM, BN, BK, stages, warps, list steps per epilogue step) with its error
against the shipped tail; the list kernel alone; how many tokens were left to the row-gather kernel; then
dense and the op with the new tail off and on.  Medians of ``twell.bench.timing.time_ms``.

Usage (GPU machine): ``PYTHONPATH=src python3 scripts/cold_down_probe.py``; ``--device cpu --tiny`` under
TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

from unittest import mock

import torch

from twell.bench.ffn import _dense_ffn
from twell.bench.probe import probe_args, run_points, split_probe_setup, split_problem
from twell.bench.timing import time_ms
from twell.ops import cold_down_kernel, hot_cold
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.tolerances import rel_error

#: Down-GEMM configurations (BM, BN, BK, stages, warps, STEPS), the default first.  Session 10's first
#: run (H200, bench_results/h200/cold_down_probe_session10_v1.log; each step's ids, then its rows): 64 x 128
#: on 4 warps best, 4.516 ms for the two kernels and the row kernel at M=131072, l0=28 against 2.609 for
#: the shipped tail.  Now with the next step's ids prefetched; ptxas (sm_90a): 161, 241, 208, 240 registers.
CONFIGS = [(64, 64, 64, 3, 4, 2), (64, 64, 64, 3, 4, 4), (128, 64, 64, 3, 8, 2), (128, 64, 64, 3, 8, 4)]


def probe_point(m: int, l0: float, d: int, f: int, n_hot_units: int, tile: int, cap: int, configs: list,
                dev: torch.device, rep_ms: float) -> None:
    p = split_problem(m, d, f, l0, dev)
    x, wg, wu, wd, wdt = p.x, p.w_gate, p.w_up, p.w_down, p.w_down_t
    hot = p.by_frequency[:n_hot_units]
    plan = build_hot_cold_plan(wg, wu, wd, hot, fused_tile=tile)
    n_hot, n_cold = plan.n_hot, f - plan.n_hot
    unit_ids = hot_cold.stores_unit_ids(f)
    h_hot, _, *cold = launch_hot_cold_gate(x, plan.w_gemm, n_hot, n_cold, plan.cold, tile=tile, capacity=cap,
                                           unit_ids=unit_ids)
    out = torch.empty_like(x)

    def shipped_tail() -> torch.Tensor:
        init = hot_cold._hot_partial(h_hot, plan.w_down_hot_t)
        return launch_twell_ffn(x, *cold, None, None, wg, wu, wdt, n_cols=n_cold, tile=tile, round_hidden=True,
                                out=out, unit_map=plan.cold, init=init, idx_is_unit=unit_ids)

    def new_tail() -> torch.Tensor:
        init, taken = cold_down_kernel.launch_down_cold(x, h_hot, plan.w_down_hot_t, *cold, wu, wdt, tile=tile,
                                                        unit_map=plan.cold, idx_is_unit=unit_ids, out=out)
        return launch_twell_ffn(x, *cold, None, None, wg, wu, wdt, n_cols=n_cold, tile=tile, round_hidden=True,
                                out=out, unit_map=plan.cold, init=init, idx_is_unit=unit_ids, taken=taken)

    want = shipped_tail().clone()
    pairs = float(cold[2].clamp(max=cap).sum()) / m
    parts = [f"shipped tail {time_ms(shipped_tail, device=dev, rep_ms=rep_ms):.3f} ms"]
    for cfg in configs:
        with mock.patch.object(cold_down_kernel, "_GPU_CONFIG", cfg):
            try:
                out.fill_(float("nan"))
                err = rel_error(new_tail(), want)
                t = time_ms(new_tail, device=dev, rep_ms=rep_ms)
                parts.append(f"new {cfg} {t:.3f} ms (rel {err:.1e})")
            except Exception as exc:  # noqa: BLE001 - a configuration that does not build: report, go on
                parts.append(f"new {cfg}: FAILED {type(exc).__name__}: {str(exc)[:80]}")
    _, taken = cold_down_kernel.launch_down_cold(x, h_hot, plan.w_down_hot_t, *cold, wu, wdt, tile=tile,
                                                 unit_map=plan.cold, idx_is_unit=unit_ids, out=out)
    left = int((taken == 0).sum())
    t_both = time_ms(lambda: cold_down_kernel.launch_down_cold(x, h_hot, plan.w_down_hot_t, *cold, wu, wdt, tile=tile,
                                                               unit_map=plan.cold, idx_is_unit=unit_ids, out=out),
                     device=dev, rep_ms=rep_ms)
    t_list = time_ms(lambda: cold_down_kernel.launch_cold_list(x, *cold, wu, tile=tile, unit_map=plan.cold,
                                                               idx_is_unit=unit_ids), device=dev, rep_ms=rep_ms)
    t_hot = time_ms(lambda: hot_cold._hot_partial(h_hot, plan.w_down_hot_t), device=dev, rep_ms=rep_ms)
    print(f"M={m:6d} l0={l0:5.1f} H={n_hot} ({pairs:.2f} cold pairs/token, {left} tokens left to the row kernel) | "
          + " | ".join(parts) + f" | list + down kernels alone {t_both:.3f} ms, list kernel alone {t_list:.3f} ms, "
          f"cuBLAS hot down GEMM alone {t_hot:.3f} ms", flush=True)

    def op() -> torch.Tensor:
        return hot_cold.launch_hot_cold_ffn(x, plan, wg, wu, wdt, tile=tile, capacity=cap)[0]

    t_dense = time_ms(lambda: _dense_ffn(x, wg, wu, wd), device=dev, rep_ms=rep_ms)
    with mock.patch.object(hot_cold, "COLD_IN_DOWN_GEMM", False):
        off = op().clone()
        t_off = time_ms(op, device=dev, rep_ms=rep_ms)
    with mock.patch.object(hot_cold, "COLD_IN_DOWN_GEMM", True):
        on = op()
        t_on = time_ms(op, device=dev, rep_ms=rep_ms)
    print(f"M={m:6d} l0={l0:5.1f} | op: dense {t_dense:.3f} ms, shipped {t_off:.3f} ({t_dense / t_off:.2f}x), cold in "
          f"the down GEMM {t_on:.3f} ({t_dense / t_on:.2f}x); rel {rel_error(on, off):.1e}", flush=True)


def main() -> None:
    dev, tiny = probe_args(__doc__)
    setup = split_probe_setup(tiny)
    configs = [(16, 16, 16, 1, 4, 2)] if tiny else CONFIGS
    run_points(setup.points,
               lambda m, l0: probe_point(m, l0, setup.d, setup.f, setup.hot_units[l0], setup.tile, setup.cap, configs,
                                         dev, setup.rep_ms), dev)


if __name__ == "__main__":
    main()
