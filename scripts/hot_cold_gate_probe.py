"""GPU time of the fused hot/cold gate kernel (GEMM + hot hidden state + cold TwELL pack in one Triton
kernel, ``twell.ops.hot_cold_gate_kernel``) against the three kernels it replaces (cuBLAS GEMM, hot
hidden kernel, cold pack), and of the hot/cold op with and without it, next to the dense FFN.

Per (M, l0) on the synthetic problems of ``twell bench ffn`` (d=2048, F=5632; hot units = the H most
frequent on a 4096-token sample): the three kernels' time, the fused kernel's per variant
(``_GPU_CONFIG`` = BM, BK, stages, warps; cold slot method: the lean PTX keys of ``FUSED_LEAN_KEYS``,
alone or in the flattened loop of ``FUSED_FLATTEN``, rank by rank, or the scan), whether its counts
equal the three kernels' (they may differ where a gate value sits within rounding of 0: the GEMMs sum
in different orders), then the whole op unfused and with the fused gate under each slot method, with
its error against the unfused op.  Medians of ``twell.bench.timing.time_ms``.  (Sessions 8-10 also
timed hot-set sizes and the gather's preload / prefetch / tensor-core variants here:
bench_results/h200/hot_cold_gate_probe_session10.log.)
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/hot_cold_gate_probe.py``; ``--device cpu --tiny``
under TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import torch
import torch.nn.functional as F

from twell.bench.ffn import _dense_ffn
from twell.bench.probe import probe_args, run_points, split_probe_setup, split_problem
from twell.bench.timing import time_ms
from twell.ops import hot_cold, hot_cold_gate_kernel, twell_ffn_kernel
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan
from twell.tolerances import rel_error

#: ((BM, BK, stages, warps), cold slot method) of the fused kernel, the shipped one first.  Sessions 8-11
#: (H200, M=131072, l0=28; bench_results/h200/hot_cold_gate_probe*_session8.log, _session10.log,
#: _session11.log): (128, 64, 3, 8) with the scan 6.038-6.148 ms, rank by rank 6.028; the tensor-core
#: prefix 8.871; flattened 6.346; BM 64 on 8 warps 6.928-8.141; BM 64 two per SM 7.035.  Session 12
#: (_session12*.log): 128 x 128 output tiles two per SM 6.458-6.943 against 6.081; the lean keys
#: (``FUSED_LEAN_KEYS``) 5.525 against 6.033 rank by rank; BK 128 on 2 stages 6.254 against 5.607.  Now:
#: the lean keys with the persistent loop flattened (``FUSED_FLATTEN``: the next tile's TMA loads issued
#: during this tile's epilogue), which spilled 556 B with the scan's epilogue and builds with none with
#: the lean one (ptxas, sm_90a, 248 registers, 164 KB of shared memory; session 12, offline).  Session 13
#: (_session13_flat.log, timed after the unflattened one): the fused gate alone the same (5.672 vs 5.671 ms at
#: M=131072, l0=28) but the op 8.077 vs 8.200, 1.056 vs 1.078 at M=16384, 9.549 vs 9.849 at l0=56; timed
#: again flattened first (_session13_flat_first.log; the rank and scan slots, slower every time, left out):
#: 5.450 vs 5.498 ms, the op 7.944 vs 7.897, at 16384 1.047 vs 1.034: within the order effect, so
#: FUSED_FLATTEN stayed off.  Session 17 turned it on, with the PTX slots (scripts/fused_gate_ab.py
#: FUSED_FLATTEN: the fused gate ~1 % faster at both sizes, fused_gate_ab_flatten_session17.log); the
#: entries here name their flattening, so this probe still times the lean keys unflattened.
#: Session 14: the lean keys with the cold gather walking flat per-row lists (``+listed``:
#: twell_ffn_kernel.GATHER_LISTED, the list pass included), timed between two runs without them so that the
#: order effect shows (_session14_listed_v2.log): the op 7.537 vs 7.828 / 7.745 ms at M=131072 / l0=28, 8.837
#: vs 9.287 / 9.162 at l0=56, 0.960 vs 1.017 / 0.993 at 16384; GATHER_LISTED is on since.
CONFIGS = [((128, 64, 3, 8), "lean"), ((128, 64, 3, 8), "lean+listed"), ((128, 64, 3, 8), "lean")]


@contextlib.contextmanager
def _variant(cfg: tuple) -> Iterator[None]:
    """The fused kernel's module settings (and the cold gather's list flag) for one entry of CONFIGS."""
    tiles, slots = cfg
    keys = slots.removesuffix("+listed")
    with mock.patch.multiple(hot_cold_gate_kernel, _GPU_CONFIG=tiles, FUSED_LEAN_KEYS=keys.startswith("lean"),
                             FUSED_RANK_SLOTS=keys != "scan", FUSED_FLATTEN=keys.endswith("-flat")), \
            mock.patch.object(twell_ffn_kernel, "GATHER_LISTED", slots.endswith("+listed")):
        yield


def _name(cfg: tuple) -> str:
    return f"{cfg[0]} {cfg[1]} slots"


def probe_point(m: int, l0: float, d: int, f: int, n_hot_units: int, tile: int, cap: int, configs: list,
                dev: torch.device, rep_ms: float) -> None:
    """Print the kernel and op lines of one (M, l0) point."""
    unit_ids = hot_cold.stores_unit_ids(f)
    p = split_problem(m, d, f, l0, dev)
    x, wg, wu, wd, wdt, order = p.x, p.w_gate, p.w_up, p.w_down, p.w_down_t, p.by_frequency
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
    for cfg in configs:
        name = f"fused {_name(cfg)}"
        with _variant(cfg):
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

    unfused_out = op(plan)
    t_dense = time_ms(lambda: _dense_ffn(x, wg, wu, wd), device=dev, rep_ms=rep_ms)
    parts = [f"dense {t_dense:.3f} ms"]
    t = time_ms(lambda: op(plan), device=dev, rep_ms=rep_ms)
    parts.append(f"hot/cold unfused {t:.3f} ({t_dense / t:.2f}x)")
    for cfg in configs:
        try:
            with _variant(cfg):
                out = op(fused_plan)
                t = time_ms(lambda: op(fused_plan), device=dev, rep_ms=rep_ms)
            parts.append(f"fused {_name(cfg)} {t:.3f} ({t_dense / t:.2f}x, rel vs unfused "
                         f"{rel_error(out, unfused_out):.1e})")
        except Exception as exc:  # noqa: BLE001 - a configuration that does not build: report, go on
            parts.append(f"fused {_name(cfg)}: FAILED {type(exc).__name__}: {str(exc)[:80]}")
    print(f"M={m:6d} l0={l0:5.1f} H={n_hot} | op: " + ", ".join(parts), flush=True)


def main() -> None:
    dev, tiny = probe_args(__doc__)
    setup = split_probe_setup(tiny)
    configs = [((16, 16, 1, 4), slots) for _, slots in CONFIGS] if tiny else CONFIGS
    run_points(setup.points,
               lambda m, l0: probe_point(m, l0, setup.d, setup.f, setup.hot_units[l0], setup.tile, setup.cap, configs,
                                         dev, setup.rep_ms), dev)


if __name__ == "__main__":
    main()
