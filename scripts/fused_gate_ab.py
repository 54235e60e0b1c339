"""Energy and time per call of the fused hot/cold gate and of the whole hot/cold op with some of
``hot_cold_gate_kernel``'s switches on and off together, back to back at the power cap (``clock_probe.measure``;
shipped value, other value, shipped again), at M=131072 and 16384, l0=28, d=2048, F=5632, 576 hot units.

Why: at M=131072 time per call follows energy per call (session 12), and the epilogue's joules are the
fused gate's lever (session 15 clock probe: 4.012 J against 3.333 for its mainloop alone); a switch that
changes the epilogue is judged on both figures, measured in one run.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/fused_gate_ab.py FUSED_TMA_SLOTS`` (several switches:
``FUSED_PTX_HOT,FUSED_TMA_HOT``, each set to the first one's value and its opposite); ``--device cpu
--tiny`` under TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

import argparse

import torch
from clock_probe import Nvml, measure  # scripts/ (the script's own directory is on sys.path)

from twell.bench.probe import split_problem
from twell.ops import hot_cold, hot_cold_gate_kernel
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("switch", help="boolean module constants of twell.ops.hot_cold_gate_kernel, comma-separated")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    switches = a.switch.split(",")
    for name in switches:
        if not isinstance(getattr(hot_cold_gate_kernel, name, None), bool):
            raise SystemExit(f"{name} is not a boolean switch of twell.ops.hot_cold_gate_kernel")
    dev = torch.device(a.device)
    d, f, tile, cap, n_hot, points, seconds = 2048, 5632, 128, 16, 576, (131072, 16384), 2.0
    if a.tiny:
        d, f, tile, cap, n_hot, points, seconds = 64, 700, 32, 8, 64, (40,), 0.1
    nvml = Nvml((dev.index or 0) if dev.type == "cuda" else None)
    if dev.type == "cuda":
        print(torch.cuda.get_device_name(dev), "torch", torch.__version__, flush=True)
    shipped = {name: getattr(hot_cold_gate_kernel, name) for name in switches}
    first = shipped[switches[0]]
    for m in points:
        p = split_problem(m, d, f, 28.0, dev)
        x, wg, wu, wd, wdt = p.x, p.w_gate, p.w_up, p.w_down, p.w_down_t
        hot = p.by_frequency[:n_hot]
        fused = build_hot_cold_plan(wg, wu, wd, hot, fused_tile=tile)
        outs = {}
        for value in (first, not first, first):  # the first value again: the order's drift shows
            for name in switches:
                setattr(hot_cold_gate_kernel, name, value)
            fns = {"fused gate": lambda: launch_hot_cold_gate(x, fused.w_gemm, n_hot, f - n_hot, fused.cold, tile=tile,
                                                              capacity=cap, unit_ids=True),
                   "hot/cold op": lambda: hot_cold.launch_hot_cold_ffn(x, fused, wg, wu, wdt, tile=tile, capacity=cap)}
            outs[value] = fns["hot/cold op"]()[0]
            for name, fn in fns.items():
                print(f"M={m:6d} {a.switch}={value} | " + measure(name, fn, nvml, dev, seconds), flush=True)
        print(f"M={m:6d} op outputs equal bit for bit: {torch.equal(outs[True], outs[False])}", flush=True)
        for name, value in shipped.items():
            setattr(hot_cold_gate_kernel, name, value)


if __name__ == "__main__":
    main()
