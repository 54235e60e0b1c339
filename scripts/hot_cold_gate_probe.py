"""GPU time of the fused hot/cold gate kernel (GEMM + hot hidden state + cold TwELL pack in one Triton
kernel, ``twell.ops.hot_cold_gate_kernel``) against the three kernels it replaces (cuBLAS GEMM, hot
hidden kernel, cold pack), and of the hot/cold op with and without it, next to the dense FFN.

Per (M, l0) on the synthetic problems of ``twell bench ffn`` (d=2048, F=5632; hot units = the H most
frequent on a 4096-token sample): the three kernels' time, the fused kernel's per configuration
(``_GPU_CONFIG`` = BM, BK, stages, warps) and cold-slot prefix (``FUSED_PREFIX_DOT``: tensor-core
product or scan), whether its counts equal the three kernels' (they may differ where a gate value sits
within rounding of 0: the GEMMs sum in different orders), then the whole op both ways with its error
against the unfused op, the fused op by hot-set size, and the fused op with the cold gather's preload /
prefetch / tensor-core variants (``twell_ffn_kernel``).  Medians of ``twell.bench.timing.time_ms``.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/hot_cold_gate_probe.py``; ``--device cpu --tiny``
under TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

from unittest import mock

import torch
import torch.nn.functional as F

from twell.bench.ffn import _dense_ffn
from twell.bench.probe import probe_args, run_points, split_probe_setup
from twell.bench.timing import time_ms
from twell.ops import hot_cold, hot_cold_gate_kernel, twell_ffn_kernel
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan, unit_frequency
from twell.synthetic import SparsityProfile, synthetic_ffn_problem
from twell.tolerances import rel_error

#: ((BM, BK, stages, warps), tensor-core prefix, flattened loop, programs per SM) of the fused kernel,
#: the shipped one first.  Session 8 (H200, M=131072, l0=28): (128, 64, 3, 8) with the scan 6.038-6.148
#: ms; the dot prefix 8.871; flattened 6.346; BM 64 on 8 warps 6.928-8.141
#: (bench_results/h200/hot_cold_gate_probe*_session8.log).  Now: two programs per SM, whose epilogues
#: can overlap each other's mainloop (BM 64 on 4 warps, 2 stages: two fit by registers and shared
#: memory), against the same configuration at one per SM.
CONFIGS = [((128, 64, 3, 8), False, False, 1), ((64, 64, 2, 4), False, False, 2),
           ((64, 64, 2, 4), False, False, 1), ((64, 64, 3, 4), False, False, 1)]
#: Hot-set sizes timed with the fused gate, as multiples of the probe's own (rounded to 64 units).
HOT_SIZES = (0.5, 1.5, 2.0)


def probe_point(m: int, l0: float, d: int, f: int, n_hot_units: int, tile: int, cap: int, configs: list,
                dev: torch.device, rep_ms: float) -> None:
    """Print the kernel and op lines of one (M, l0) point."""
    unit_ids = hot_cold.COLD_UNIT_IDS and f < 2**15
    gen = torch.Generator(device=dev).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0), generator=gen, device=dev)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    wdt = wd.t().contiguous()
    order = torch.argsort(unit_frequency(x, wg), descending=True)
    hot = order[:n_hot_units]
    plan = build_hot_cold_plan(wg, wu, wd, hot)
    n_hot, n_cold = plan.n_hot, f - plan.n_hot
    fused_plan = build_hot_cold_plan(wg, wu, wd, hot, fused_tile=tile)

    def three() -> tuple:
        gu = F.linear(x, plan.w_gemm)
        return (*hot_cold.launch_hot_hidden(gu, n_hot, f, tile),
                *launch_pack_twell(gu[:, n_hot:f], tile, cap, unit_map=plan.cold if unit_ids else None))

    def fused() -> tuple:
        return launch_hot_cold_gate(x, fused_plan.w_gemm, n_hot, n_cold, plan.cold, tile=tile, capacity=cap,
                                    unit_ids=unit_ids)

    want = three()
    parts = [f"three kernels {time_ms(three, device=dev, rep_ms=rep_ms):.3f} ms "
             f"(GEMM alone {time_ms(lambda: F.linear(x, plan.w_gemm), device=dev, rep_ms=rep_ms):.3f})"]
    for cfg, prefix_dot, flatten, per_sm in configs:
        name = f"fused {cfg} {'dot' if prefix_dot else 'scan'}{' flat' if flatten else ''} x{per_sm}/SM"
        with mock.patch.multiple(hot_cold_gate_kernel, _GPU_CONFIG=cfg, FUSED_PREFIX_DOT=prefix_dot,
                                 FUSED_FLATTEN=flatten, FUSED_PROGRAMS_PER_SM=per_sm):
            try:
                got = fused()
                same = sum(int(torch.equal(got[i], want[i])) for i in (1, 4))
                t = time_ms(fused, device=dev, rep_ms=rep_ms)
                parts.append(f"{name} {t:.3f} ms (counts equal {same}/2, h rel {rel_error(got[0], want[0]):.1e})")
            except Exception as exc:  # noqa: BLE001 - a configuration that does not build: report, go on
                parts.append(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:80]}")
    print(f"M={m:6d} l0={l0:5.1f} H={n_hot} | " + " | ".join(parts), flush=True)
    def op(a_plan) -> torch.Tensor:
        return hot_cold.launch_hot_cold_ffn(x, a_plan, wg, wu, wdt, tile=tile, capacity=cap)[0]

    unfused_out, fused_out = op(plan), op(fused_plan)
    t_dense = time_ms(lambda: _dense_ffn(x, wg, wu, wd), device=dev, rep_ms=rep_ms)
    t_unfused = time_ms(lambda: op(plan), device=dev, rep_ms=rep_ms)
    t_fused = time_ms(lambda: op(fused_plan), device=dev, rep_ms=rep_ms)
    print(f"M={m:6d} l0={l0:5.1f} H={n_hot} | op: dense {t_dense:.3f} ms, hot/cold {t_unfused:.3f} "
          f"({t_dense / t_unfused:.2f}x), with the fused gate {t_fused:.3f} ({t_dense / t_fused:.2f}x); fused vs "
          f"unfused rel {rel_error(fused_out, unfused_out):.1e}", flush=True)
    # The hot set's size with the fused gate: a cold column now costs an epilogue column (the scan and
    # predicated stores) besides its pairs in the gather, a hot one two GEMM columns and a down-GEMM row.
    parts = []
    for n in sorted({n_hot, *(round(n_hot * r / 64) * 64 for r in HOT_SIZES)} - {0}):
        sized = build_hot_cold_plan(wg, wu, wd, order[:n], fused_tile=tile)
        t = time_ms(lambda sized=sized: op(sized), device=dev, rep_ms=rep_ms)
        parts.append(f"H={sized.n_hot} {t:.3f} ms ({t_dense / t:.2f}x)")
    print(f"M={m:6d} l0={l0:5.1f} | fused op by hot-set size: " + " | ".join(parts), flush=True)
    # The op with the cold gather's variants (twell_ffn_kernel.GATHER_PRELOAD / GATHER_PREFETCH /
    # GATHER_TENSOR_CORES): in the op the gather follows the hot down GEMM, where session 7's gain of the
    # gather alone did not show.
    parts = []
    for name, knobs in (("preload", dict(GATHER_PRELOAD=True)), ("prefetch", dict(GATHER_PREFETCH=True)),
                        ("tensor cores", dict(GATHER_TENSOR_CORES=True))):
        with mock.patch.multiple(twell_ffn_kernel, **knobs):
            out_v = op(fused_plan)
            t = time_ms(lambda: op(fused_plan), device=dev, rep_ms=rep_ms)
        parts.append(f"{name} {t:.3f} ms ({t_dense / t:.2f}x, rel {rel_error(out_v, fused_out):.1e})")
    print(f"M={m:6d} l0={l0:5.1f} H={n_hot} | fused op, gather variants: " + " | ".join(parts), flush=True)


def main() -> None:
    dev, tiny = probe_args(__doc__)
    setup = split_probe_setup(tiny)
    configs = [((16, 16, 1, 4), False, False, 1)] if tiny else CONFIGS
    run_points(setup, lambda m, l0: probe_point(m, l0, setup.d, setup.f, setup.hot_units[l0], setup.tile, setup.cap,
                                                configs, dev, setup.rep_ms), dev)


if __name__ == "__main__":
    main()
