"""SM clock, board power and energy per call of the FFN's kernels run back to back, against the same
kernels run with idle gaps between calls: is the fused gate's time at M=131072 a clock (power) matter?

Why: ncu timed one launch of the fused hot/cold gate (``_hot_cold_gate_kernel``) at 5.35 ms (SM clock
1.76 GHz, cold L2) where ``do_bench``'s back-to-back median is 6.03-6.08 ms (session 12,
bench_results/h200/ncu_fused_gate_session12.log, hot_cold_gate_probe_session12.log), while the cold
gather took 2.09 ms in both.  If the board's power limit lowers the clock during a long run of GEMM
work, the epilogue's instructions cost energy as much as issue time, and which kernels are cheaper
per call then depends on their joules as well as their cycles.

Per callable (cuBLAS's GEMM of the split's gate weight, the fused gate, the whole hot/cold op, the dense
FFN): ``busy``: calls back to back for ~2 s, NVML polled every 5 ms in a thread (SM clock, power,
clock-event reasons), per call the events' median time and the energy counter's joules per call;
``gapped``: each call followed by an idle gap of twice its time, the events' median time and the clock
seen during the calls.  Usage (GPU machine): ``PYTHONPATH=src python3 scripts/clock_probe.py``;
``--device cpu --tiny`` under TRITON_INTERPRET=1 is the smoke test (host timing, no NVML).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from triton_gemm_probe import fused_gate_mainloop  # scripts/ (the script's own directory is on sys.path)

from twell.bench.ffn import _dense_ffn
from twell.bench.probe import probe_args, split_problem
from twell.ops import hot_cold
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan
from twell.ops.twell_ffn_kernel import launch_twell_ffn

#: NVML's clock-event reason bits worth naming (nvml.h, nvmlClocksEventReason*).
REASONS = {0x2: "app-clocks", 0x4: "sw-power-cap", 0x8: "hw-slowdown", 0x20: "sw-thermal", 0x40: "hw-thermal",
           0x80: "hw-power-brake"}


class Nvml:
    """SM clock (MHz), power (W), clock-event reasons and the energy counter (mJ) of one GPU, or nothing."""

    def __init__(self, index: int | None) -> None:
        self.nv = None
        if index is None:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no NVML: the probe reports times only
            self.nv = None

    def sample(self) -> tuple[float, float, int]:
        nv, h = self.nv, self.handle
        reasons = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or nv.nvmlDeviceGetCurrentClocksThrottleReasons)
        return (nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), nv.nvmlDeviceGetPowerUsage(h) / 1e3, reasons(h))

    def energy_mj(self) -> float:
        return float(self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle))


def _poll(nvml: Nvml, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        out.append(nvml.sample())
        time.sleep(0.005)


def _events_median(fn: Callable[[], object], calls: int, gap_s: float) -> float:
    """Median ms of ``calls`` calls timed by CUDA events, ``gap_s`` of idle host time after each."""
    times = []
    for _ in range(calls):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
        if gap_s:
            time.sleep(gap_s)
    return statistics.median(times)


def measure(name: str, fn: Callable[[], object], nvml: Nvml, dev: torch.device, seconds: float) -> str:
    """One line: busy (back to back) and gapped time per call, with clocks, power and energy."""
    if dev.type != "cuda":  # the CPU smoke test: one call, timed (a warm-up call doubled its interpreted work)
        t0 = time.perf_counter()
        fn()
        return f"{name}: {(time.perf_counter() - t0) * 1e3:.3f} ms/call (host clock, no NVML)"
    fn()
    torch.cuda.synchronize()
    t_one = _events_median(fn, 5, 0.0)
    calls = max(5, int(seconds * 1e3 / t_one))
    samples: list = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(nvml, stop, samples)) if nvml.nv else None
    e0 = nvml.energy_mj() if nvml.nv else 0.0
    if poller:
        poller.start()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(calls):
        fn()
        if i % 64 == 63:  # bound the launch queue
            torch.cuda.synchronize()
    end.record()
    end.synchronize()
    busy_ms = start.elapsed_time(end) / calls
    parts = [f"busy {busy_ms:.3f} ms/call ({calls} calls)"]
    if poller:
        stop.set()
        poller.join()
        joules = (nvml.energy_mj() - e0) / 1e3 / calls
        steady = samples[len(samples) // 4:] or samples  # past the first quarter: the clock has settled
        bits = 0
        for s in steady:
            bits |= s[2]
        named = ",".join(v for k, v in REASONS.items() if bits & k) or "none"
        parts.append(f"SM clock {statistics.median(s[0] for s in steady):.0f} MHz "
                     f"(min {min(s[0] for s in steady)}), power {statistics.mean(s[1] for s in steady):.0f} W, "
                     f"{joules * 1e3:.1f} mJ/call, clock events {named}")
    time.sleep(1.0)  # let the board cool down between the busy and the gapped runs
    samples = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(nvml, stop, samples)) if nvml.nv else None
    if poller:
        poller.start()
    gapped = _events_median(fn, max(5, min(200, int(0.5 * seconds * 1e3 / t_one))), 2 * t_one / 1e3)
    if poller:
        stop.set()
        poller.join()
    parts.append(f"gapped {gapped:.3f} ms/call ({busy_ms / gapped:.2f}x of busy)"
                 + (f", SM clock {statistics.median(s[0] for s in samples):.0f} MHz" if samples else ""))
    time.sleep(1.0)
    return f"{name}: " + ", ".join(parts)


def probe_point(m: int, l0: float, n_hot_units: int, d: int, f: int, tile: int, cap: int, nvml: Nvml,
                dev: torch.device, seconds: float) -> None:
    """The lines of one (M, l0) point on the synthetic problem of ``twell bench ffn``."""
    p = split_problem(m, d, f, l0, dev)
    x, wg, wu, wd, wdt = p.x, p.w_gate, p.w_up, p.w_down, p.w_down_t
    hot = p.by_frequency[:n_hot_units]
    plan = build_hot_cold_plan(wg, wu, wd, hot)
    fused = build_hot_cold_plan(wg, wu, wd, hot, fused_tile=tile)
    unit_ids = hot_cold.stores_unit_ids(f)
    n_cold = f - plan.n_hot

    def fused_gate():
        return launch_hot_cold_gate(x, fused.w_gemm, plan.n_hot, n_cold, plan.cold, tile=tile, capacity=cap,
                                    unit_ids=unit_ids)

    # the op's parts alone, on the fused gate's outputs: the hot down GEMM and the cold gather (list pass
    # included), so that the op's joules split by kernel
    h_hot, _, *cold = fused_gate()
    init = hot_cold._hot_partial(h_hot, fused.w_down_hot_t)
    out = torch.empty_like(x)
    mainloop = fused_gate_mainloop(x, plan.w_gemm, tile)
    callables = {
        "cuBLAS gate GEMM": lambda: F.linear(x, plan.w_gemm),
        # the fused gate's mainloop configuration, as a plain GEMM: with its output stored as cuBLAS does,
        # and without any store (the mainloop's own joules)
        "Triton TMA GEMM": lambda: mainloop(True),
        "Triton TMA GEMM, no store": lambda: mainloop(False),
        "fused gate": fused_gate,
        "hot down GEMM": lambda: hot_cold._hot_partial(h_hot, fused.w_down_hot_t),
        "cold gather": lambda: launch_twell_ffn(x, *cold, None, None, wg, wu, wdt, n_cols=n_cold, tile=tile,
                                                round_hidden=True, out=out, unit_map=fused.cold, init=init,
                                                idx_is_unit=unit_ids),
        "hot/cold op": lambda: hot_cold.launch_hot_cold_ffn(x, fused, wg, wu, wdt, tile=tile, capacity=cap),
        "dense FFN": lambda: _dense_ffn(x, wg, wu, wd),
    }
    for name, fn in callables.items():
        print(f"M={m:6d} l0={l0:4.1f} | " + measure(name, fn, nvml, dev, seconds), flush=True)


def main() -> None:
    dev, tiny = probe_args(__doc__)
    d, f, tile, cap, points, seconds = 2048, 5632, 128, 16, ((131072, 28.0, 576), (16384, 28.0, 576)), 2.0
    if tiny:
        d, f, tile, cap, points, seconds = 64, 700, 32, 4, ((40, 6.0, 64),), 0.1
    nvml = Nvml((dev.index or 0) if dev.type == "cuda" else None)
    for m, l0, n_hot_units in points:
        probe_point(m, l0, n_hot_units, d, f, tile, cap, nvml, dev, seconds)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
