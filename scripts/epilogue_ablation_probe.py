"""Where the fused hot/cold gate's time and joules above its mainloop go: the fused gate as shipped, with its
cold output tiles' epilogue skipped, with its hot tiles' epilogue skipped (``hot_cold_gate_kernel.
PROBE_SKIP_EPILOGUE``: timing only, the skipped outputs are garbage), and its mainloop alone as a plain TMA GEMM
of the same configuration without a store; back to back at the power cap (``clock_probe.measure``), at
M=131072 and 16384, l0=28, d=2048, F=5632, 576 hot units (5 hot and 20 cold output tiles per row block).

Why: session 16 measured the hot epilogue in PTX with ~1100 fewer instructions per hot tile at no change
(fused_gate_ab_ptx_hot_tma_hot_session16.log), so the ~0.4 J a call that the fused gate spends above its
mainloop is not instruction issue; this says which epilogue holds it.  Prediction: the cold tiles' (~370
instructions each, but 20 of the 25 tiles) ~0.3 J, the hot tiles' ~0.1 J.
Session 17: under the flattened loop (``FUSED_FLATTEN``, on since) skipping an epilogue made the fused gate
slower, not faster (M=131072: 7.155 ms cold skipped, 7.349 hot skipped, against 5.337 as shipped;
bench_results/h200/epilogue_ablation_probe_session17.log): with a branch emptied the pipeliner schedules the
flattened loop differently, so the skips no longer isolate an epilogue.  The skipped variants therefore run
unflattened, next to the unflattened gate they are compared with, and the shipped gate is timed first and last.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/epilogue_ablation_probe.py``; ``--device cpu --tiny``
under TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

import torch
from clock_probe import Nvml, measure  # scripts/ (the script's own directory is on sys.path)
from triton_gemm_probe import fused_gate_mainloop

from twell.bench.probe import probe_args, split_problem
from twell.ops import hot_cold, hot_cold_gate_kernel
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan

#: (PROBE_SKIP_EPILOGUE, FUSED_FLATTEN or None for the shipped value, label) timed in order; the shipped gate
#: again last, so that the order's drift shows
SETTINGS = (
    (0, None, "fused gate"),
    (0, False, "fused gate unflattened"),
    (1, False, "fused gate unflattened, cold epilogue skipped"),
    (2, False, "fused gate unflattened, hot epilogue skipped"),
    (0, None, "fused gate"),
)


def main() -> None:
    dev, tiny = probe_args(__doc__)
    d, f, tile, cap, n_hot, points, seconds = 2048, 5632, 128, 16, 576, (131072, 16384), 2.0
    if tiny:
        d, f, tile, cap, n_hot, points, seconds = 64, 700, 32, 8, 64, (40,), 0.1
    nvml = Nvml((dev.index or 0) if dev.type == "cuda" else None)
    for m in points:
        p = split_problem(m, d, f, 28.0, dev)
        x, wg, wu, wd = p.x, p.w_gate, p.w_up, p.w_down
        fused = build_hot_cold_plan(wg, wu, wd, p.by_frequency[:n_hot], fused_tile=tile)
        unfused = build_hot_cold_plan(wg, wu, wd, p.by_frequency[:n_hot])
        unit_ids = hot_cold.stores_unit_ids(f)

        def fused_gate():
            return launch_hot_cold_gate(x, fused.w_gemm, n_hot, f - n_hot, fused.cold, tile=tile, capacity=cap,
                                        unit_ids=unit_ids)

        mainloop = fused_gate_mainloop(x, unfused.w_gemm, tile)
        shipped_flatten = hot_cold_gate_kernel.FUSED_FLATTEN
        try:
            for skip, flatten, label in SETTINGS:
                hot_cold_gate_kernel.PROBE_SKIP_EPILOGUE = skip
                hot_cold_gate_kernel.FUSED_FLATTEN = shipped_flatten if flatten is None else flatten
                print(f"M={m:6d} | " + measure(label, fused_gate, nvml, dev, seconds), flush=True)
        finally:
            hot_cold_gate_kernel.PROBE_SKIP_EPILOGUE = 0
            hot_cold_gate_kernel.FUSED_FLATTEN = shipped_flatten
        print(f"M={m:6d} | " + measure("mainloop alone (TMA GEMM, no store)",
                                       lambda: mainloop(False), nvml, dev, seconds), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
