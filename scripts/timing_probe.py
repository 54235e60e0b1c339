"""Why the FFN sweep's interleaved timing reads the sparse paths slower than ``triton.testing.do_bench``.

Session 10's sweep (bench_results/h200/ffn_sweep_session10.log, ``time_ms_interleaved``) read the hot/cold
op at M=131072, 0.5 % 9.608 ms where the same op timed alone by do_bench read 8.576 ms in the same hour
(cold_down_probe_session10.log), and the dispatched module, which runs the very kernels of the dense
module at small M, 0.63-0.88x of it.  Two explanations: (a) host time inside the timed intervals: when
any callable of a cycle is host-bound (the sparse paths at small M launch many kernels), the device
catches up with the host and waits at each start event for the call's kernels; (b) the device's clocks:
a sparse call that follows a dense GEMM (at the power limit) starts at the lowered clock.

Per point (d=2048, F=5632, synthetic problem), for the dense FFN, the hot/cold op, the dispatched module
and the dense module: do_bench alone; interleaved as the sweep runs it; interleaved with the device held
``HOLD_MS`` before each call's start event (``time_ms_interleaved(hold_ms=...)``: removes (a), and lets
the clock recover for (b) only as far as a spinning kernel does).

Usage (GPU machine): ``PYTHONPATH=src python3 scripts/timing_probe.py``; ``--device cpu --tiny`` under
TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

import torch

from twell import ops
from twell.bench.ffn import _dense_ffn
from twell.bench.probe import probe_args, run_points
from twell.bench.timing import time_ms, time_ms_interleaved
from twell.nn import SparseGatedMLP
from twell.ops.hot_cold_plan import fused_gate_tile
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

HOLD_MS = (0.5, 2.0)


def probe_point(m: int, dens: float, d: int, f: int, dev: torch.device, rep_ms: float) -> None:
    gen = torch.Generator(device=dev).manual_seed(0)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=dens / 100 * f), generator=gen, device=dev)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    wd_t = wd.t().contiguous().t()
    hot = ops.choose_hot_units(ops.unit_frequency(x, wg))
    plan = ops.build_hot_cold_plan(wg, wu, wd, hot, fused_tile=fused_gate_tile(128, x.dtype, d, x.device))
    mlp = SparseGatedMLP.from_weights(wg, wu, wd, eager_graphs=0).eval()  # the kernels, not a replay
    dense_mlp = mlp.to_dense().eval()
    with torch.no_grad():
        mlp(x)
        fns = {
            "dense": lambda: _dense_ffn(x, wg, wu, wd),
            "hotcold": lambda: ops.hot_cold_gated_ffn(x, wg, wu, wd_t, plan),
            "dispatch": lambda: mlp(x),
            "dense_module": lambda: dense_mlp(x),
        }
        alone = {name: time_ms(fn, device=dev, rep_ms=rep_ms) for name, fn in fns.items()}
        lines = [("do_bench alone", alone),
                 ("interleaved", time_ms_interleaved(fns, device=dev, rep_ms=rep_ms, hold_ms=0.0))]
        for hold in HOLD_MS:
            held = time_ms_interleaved(fns, device=dev, rep_ms=rep_ms, hold_ms=hold if dev.type == "cuda" else 0.0)
            lines.append((f"interleaved, hold {hold} ms", held))
    sparse = "sparse" if mlp._use_sparse(m, x.device.type) else "dense"
    for what, t in lines:
        print(f"M={m:6d} dens={dens:4.1f}% {what:>26}: " + " | ".join(f"{k} {v:.3f} ms" for k, v in t.items())
              + f" | hotcold {t['dense'] / t['hotcold']:.2f}x, dispatch ({sparse}) "
              f"{t['dense'] / t['dispatch']:.2f}x, dispatch vs dense module {t['dense_module'] / t['dispatch']:.2f}x",
              flush=True)


def main() -> None:
    dev, tiny = probe_args(__doc__)
    d, f, points, rep_ms = 2048, 5632, ((256, 0.5), (1024, 5.0), (16384, 0.5), (131072, 0.5)), 100.0
    if tiny:
        d, f, points, rep_ms = 64, 256, ((8, 5.0),), 2.0
    run_points(points, lambda m, dens: probe_point(m, dens, d, f, dev, rep_ms), dev)


if __name__ == "__main__":
    main()
