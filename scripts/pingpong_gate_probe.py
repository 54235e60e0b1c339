"""The fused hot/cold gate as shipped against its Gluon ping-pong form (``twell.ops.pingpong_gate_kernel``): the
same outputs bit for bit (hot h and counts, cold counts and used slots), then the gate alone and the whole
hot/cold op (``hot_cold.PINGPONG_GATE``) back to back at the power cap (``clock_probe.measure``: shipped,
ping-pong, shipped), at M=131072 and 16384, l0=28, d=2048, F=5632, 576 hot units.

Why (docs/performance.md, next step 0): the flattened fused gate runs 0.435 ms above its mainloop alone at
M=131072 (epilogue_ablation_probe_session17.log); the plain ping-pong GEMM kept up with that mainloop
(pingpong_gemm_probe_session17.log), so the ping-pong gate shows how much of the 0.435 ms is latency that a
second warpgroup's mainloop can hide.  Prediction: the gate 5.34 -> 5.0-5.2 ms (the bf16-output GEMMs say a
store's energy stays), the op -0.1 to -0.3 ms.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/pingpong_gate_probe.py [--stages 6]`` (Hopper only:
Gluon's wgmma and setmaxnreg; the interpreter cannot run it, so its CPU check is the offline sm_90a build in
tests/test_ops_pingpong_gate.py; 6 stages build offline with no spill in 196,920 B of shared memory).
"""

from __future__ import annotations

import torch
from clock_probe import Nvml, measure  # scripts/ (the script's own directory is on sys.path)

from twell.bench.probe import gate_outputs_agree, probe_device, probe_parser, split_problem
from twell.ops import hot_cold, pingpong_gate_kernel
from twell.ops.hot_cold import launch_hot_cold_ffn
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan
from twell.ops.pingpong_gate_kernel import launch_pingpong_gate


def main() -> None:
    ap = probe_parser(__doc__)
    ap.add_argument("--stages", type=int, default=pingpong_gate_kernel.STAGES,
                    help=f"ring stages of the ping-pong gate (32 KB each; shipped {pingpong_gate_kernel.STAGES})")
    a = ap.parse_args()
    if a.tiny:
        raise SystemExit("the ping-pong gate is Gluon for Hopper: no interpreter run (see the docstring)")
    if not 2 <= a.stages <= 6:
        raise SystemExit(f"--stages takes 2 to 6 (32 KB of shared memory each, 227 KB a block), got {a.stages}")
    pingpong_gate_kernel.STAGES = a.stages
    dev = probe_device(a.device)
    print(f"ping-pong gate on {a.stages} stages", flush=True)
    d, f, tile, cap, n_hot, seconds = 2048, 5632, 128, 16, 576, 1.0
    nvml = Nvml(dev.index or 0)
    for m in (131072, 16384):
        p = split_problem(m, d, f, 28.0, dev)
        plan = build_hot_cold_plan(p.w_gate, p.w_up, p.w_down, p.by_frequency[:n_hot], fused_tile=tile)
        unit_ids = hot_cold.stores_unit_ids(f)
        gate_args = (p.x, plan.w_gemm, n_hot, f - n_hot, plan.cold)
        kw = {"tile": tile, "capacity": cap, "unit_ids": unit_ids}
        same = gate_outputs_agree(launch_hot_cold_gate(*gate_args, **kw), launch_pingpong_gate(*gate_args, **kw))
        print(f"M={m:6d} | same outputs: " + ", ".join(f"{k} {v}" for k, v in same.items()), flush=True)

        def op(x=p.x, plan=plan, p=p):
            return launch_hot_cold_ffn(x, plan, p.w_gate, p.w_up, p.w_down_t, tile=tile, capacity=cap)

        out_a = op()[0]
        hot_cold.PINGPONG_GATE = True
        try:
            out_b = op()[0]
        finally:
            hot_cold.PINGPONG_GATE = False
        print(f"M={m:6d} | op outputs equal bit for bit: {torch.equal(out_a, out_b)}", flush=True)
        runs = [("shipped fused gate", lambda: launch_hot_cold_gate(*gate_args, **kw), False),
                ("ping-pong gate", lambda: launch_pingpong_gate(*gate_args, **kw), False),
                ("shipped fused gate", lambda: launch_hot_cold_gate(*gate_args, **kw), False),
                ("hot/cold op, shipped gate", op, False), ("hot/cold op, ping-pong gate", op, True),
                ("hot/cold op, shipped gate", op, False)]
        for label, fn, pingpong in runs:
            hot_cold.PINGPONG_GATE = pingpong
            try:
                print(f"M={m:6d} | " + measure(label, fn, nvml, dev, seconds), flush=True)
            finally:
                hot_cold.PINGPONG_GATE = False
        del p, plan, out_a, out_b
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
