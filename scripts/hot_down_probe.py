"""The hot/cold split's hot down GEMM (fp32 output) in Triton against cuBLAS, alone and inside the op, on the GPU.

Why: cuBLAS's ``torch.mm(h_hot, Wd_hot^T, out_dtype=torch.float32)`` took 0.073 ms at M=16384, H=256,
d=2048 back to back (bench_results/h200/clock_probe_session15.log), ~8 % of the op, against ~0.03-0.04 ms
for writing its 134 MB; ``twell.ops.hot_down_kernel`` is the Triton GEMM that may take its place
(``hot_cold.HOT_DOWN_TRITON``).

Part 1, per (M, H): interleaved call by call (``time_ms_interleaved``: an L2 flush before each call), the
median ms of cuBLAS with an fp32 output, cuBLAS with a bf16 output (half the bytes written), an fp32
``zero_`` of the output (the write floor) and each Triton configuration, with its relative error against
cuBLAS's fp32 output.  Part 2, per (M, l0) of the synthetic problem with the shipped hot set: the whole op
with the flag off, on, off, interleaved, and back to back at the power cap (``clock_probe.measure``), with
the output's relative error on against off.
Usage (GPU machine): ``PYTHONPATH=src:scripts python3 scripts/hot_down_probe.py``; ``--device cpu --tiny``
under TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

import torch
from clock_probe import Nvml, measure  # scripts/ (the script's own directory is on sys.path)

from twell.bench.probe import probe_args, run_points, split_problem
from twell.bench.timing import time_ms_interleaved
from twell.ops import hot_cold
from twell.ops.hot_cold_plan import build_hot_cold_plan, choose_hot_units
from twell.ops.hot_down_kernel import _GPU_CONFIG, launch_hot_down
from twell.tolerances import rel_error

#: (BM, BN, BK, stages, warps, TMA store); the shipped one first
CONFIGS = [
    _GPU_CONFIG,
    (128, 128, 64, 2, 4, True),
    (128, 128, 64, 3, 8, False),
    (64, 128, 64, 2, 4, False),
    (128, 64, 64, 3, 4, False),
    (64, 256, 64, 2, 8, False),
    (128, 256, 64, 2, 8, False),
    (64, 64, 64, 2, 4, False),
]
TINY_CONFIGS = [(16, 32, 16, 1, 4, False), (16, 32, 16, 1, 4, True)]


def gemm_point(m: int, n_hot: int, d: int, configs: list, dev: torch.device, rep_ms: float) -> None:
    gen = torch.Generator(device=dev).manual_seed(0)
    if dev.type == "cuda":  # random values: the board's power (and so its clock at the cap) depends on the data
        h = torch.relu(torch.randn((m, n_hot), generator=gen, device=dev)).to(torch.bfloat16)
        w = (torch.randn((n_hot, d), generator=gen, device=dev) / n_hot**0.5).to(torch.bfloat16)
    else:  # the smoke test: values on a coarse grid, so every fp32 sum is exact in any order and the check is 0
        h = (torch.randint(0, 4, (m, n_hot), generator=gen, device=dev) / 4).to(torch.bfloat16)
        w = (torch.randint(-3, 4, (n_hot, d), generator=gen, device=dev) / 8).to(torch.bfloat16)
    fp32_out = torch.empty((m, d), dtype=torch.float32, device=dev)
    if dev.type == "cuda":
        fns = {"cuBLAS fp32": lambda: torch.mm(h, w, out_dtype=torch.float32),
               "cuBLAS bf16": lambda: torch.mm(h, w), "zero_ fp32": fp32_out.zero_}
    else:
        fns = {"torch fp32": lambda: h.float() @ w.float()}
    want = next(iter(fns.values()))().float()
    errors = {}
    for cfg in configs:
        name = "triton " + ",".join(str(int(v)) for v in cfg)
        try:
            errors[name] = rel_error(launch_hot_down(h, w, cfg), want)
        except Exception as exc:  # noqa: BLE001 - a configuration that does not build: report, go on
            print(f"M={m} H={n_hot} {name}: FAILED {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        fns[name] = lambda cfg=cfg: launch_hot_down(h, w, cfg)
    times = time_ms_interleaved(fns, device=dev, rep_ms=rep_ms)
    base = next(iter(times.values()))
    for name, t in times.items():
        err = f", rel err {errors[name]:.1e}" if name in errors else ""
        print(f"M={m:6d} H={n_hot:4d} d={d} | {name:26s} {t:.4f} ms ({base / t:.2f}x of the first{err})", flush=True)


def op_point(m: int, l0: float, d: int, f: int, tile: int, cap: int, nvml: Nvml, dev: torch.device,
             rep_ms: float, seconds: float) -> None:
    p = split_problem(m, d, f, l0, dev)
    hot = choose_hot_units(p.frequency)
    plan = build_hot_cold_plan(p.w_gate, p.w_up, p.w_down, hot, fused_tile=tile)

    def op(on: bool) -> torch.Tensor:
        hot_cold.HOT_DOWN_TRITON = on
        return hot_cold.launch_hot_cold_ffn(p.x, plan, p.w_gate, p.w_up, p.w_down_t, tile=tile, capacity=cap)[0]

    shipped = hot_cold.HOT_DOWN_TRITON
    try:
        err = rel_error(op(True), op(False))
        head = f"M={m:6d} l0={l0:4.1f} H={hot.numel()} (on vs off rel {err:.1e})"
        times = time_ms_interleaved({"off": lambda: op(False), "on": lambda: op(True), "off again": lambda: op(False)},
                                    device=dev, rep_ms=rep_ms)
        print(f"{head} interleaved | " + " | ".join(f"{k} {t:.4f} ms" for k, t in times.items()), flush=True)
        for name, on in (("off", False), ("on", True), ("off again", False)):
            print(f"{head} back to back | " + measure(f"op, Triton hot down {name}", lambda on=on: op(on), nvml, dev,
                                                      seconds), flush=True)
    finally:
        hot_cold.HOT_DOWN_TRITON = shipped


def main() -> None:
    dev, tiny = probe_args(__doc__)
    d, f, tile, cap, rep_ms, seconds, configs = 2048, 5632, 128, 16, 100.0, 2.0, CONFIGS
    gemms = ((16384, 256), (16384, 1152), (131072, 256), (131072, 1152))
    ops = ((16384, 28.0), (16384, 56.0), (131072, 28.0))
    if tiny:
        d, f, tile, cap, rep_ms, seconds, configs = 64, 700, 32, 8, 1.0, 0.1, TINY_CONFIGS
        gemms, ops = ((40, 16),), ((40, 6.0),)
    nvml = Nvml((dev.index or 0) if dev.type == "cuda" else None)
    for m, n_hot in gemms:
        gemm_point(m, n_hot, d, configs, dev, rep_ms)
    run_points(ops, lambda m, l0: op_point(m, l0, d, f, tile, cap, nvml, dev, rep_ms, seconds), dev)


if __name__ == "__main__":
    main()
