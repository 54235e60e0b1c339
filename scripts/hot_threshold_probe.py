"""Energy and time per call of the hot/cold op against the firing frequency above which a unit is hot
(``hot_cold_plan.HOT_MIN_FREQUENCY``), back to back at the power cap (``clock_probe.measure``), at d=2048,
F=5632: M=131072 at l0 14, 28 and 56 and M=16384 at l0 28, with the dense FFN at each point.

Why: the threshold (0.6 %) was set in session 8 from a probe of hot counts (384 / 512 / 768 units at M=131072,
l0=28), when the cold gather took 2.15 ms; it now takes ~1.5 ms with its list pass, and the fused gate's cold
epilogue runs in PTX.  A hot unit costs two GEMM columns for every token (its up row in the fused gate, its
down row in the hot down GEMM: ~1.2 mJ a unit at M=131072 by session 15's clock probe), a cold one ~1 uJ per
firing token in the gather on average, less at the margin; the break-even frequency may have moved up.
Each threshold's hot set is the prefix of the units by sampled frequency that ``choose_hot_units`` takes;
the shipped threshold runs first and again last (the order's drift shows), and every output is compared with
the first one's (relative L2: only the summation order differs between splits).  ``--bounds`` times the hot
sets of other cold-pairs bounds (``HOT_MAX_COLD_L0``, session 20) at the shipped threshold after those: where
the bound sets the hot count (4096 tokens at 3 %, session 21's 0.91x), every threshold gives the same set.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/hot_threshold_probe.py [--points 16384:56 ...]
[--bounds 5 10 20]``;
``--device cpu --tiny`` under TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

import argparse

import torch
from clock_probe import Nvml, measure  # scripts/ (the script's own directory is on sys.path)

from twell.bench.ffn import _dense_ffn
from twell.bench.probe import probe_device, probe_parser, run_points, split_problem
from twell.ops import hot_cold
from twell.ops.hot_cold_plan import HOT_MIN_FREQUENCY, build_hot_cold_plan, choose_hot_units

#: the problem's d x F (``--tiny``: 64 x 700)
D, F = 2048, 5632
#: session 16's and 20's points (M, l0); ``--points`` picks others
POINTS = ((131072, 28.0), (131072, 56.0), (131072, 14.0), (16384, 28.0))
THRESHOLDS = (0.004, 0.006, 0.008, 0.010, 0.013, 0.016)
#: --tiny: 40 tokens give frequencies in steps of 2.5 %, so the smoke test's thresholds are coarser
TINY_THRESHOLDS = (0.03, 0.08)


def probe_point(m: int, l0: float, d: int, f: int, tile: int, cap: int, thresholds: tuple[float, ...], nvml: Nvml,
                dev: torch.device, seconds: float, bounds: tuple[float, ...] = ()) -> None:
    """Each threshold's hot set (with the shipped cold-pairs bound), the shipped one first and last, then each
    of ``bounds``' (cold pairs per token, at the shipped threshold), timed back to back."""
    p = split_problem(m, d, f, l0, dev)
    x, wg, wu, wd, wdt = p.x, p.w_gate, p.w_up, p.w_down, p.w_down_t
    freq = p.frequency
    head = f"M={m:6d} l0={l0:4.1f}"
    print(f"{head} | " + measure("dense FFN", lambda: _dense_ffn(x, wg, wu, wd), nvml, dev, seconds), flush=True)
    first = None
    sets = [(f"threshold {t:.3f}", choose_hot_units(freq, min_frequency=t))
            for t in (HOT_MIN_FREQUENCY, *thresholds, HOT_MIN_FREQUENCY)]
    sets += [(f"bound {b:4.1f}", choose_hot_units(freq, max_cold_l0=b)) for b in bounds]
    for label, hot in sets:
        if hot.numel() == 0:
            print(f"{head} {label}: no hot unit, skipped", flush=True)
            continue
        plan = build_hot_cold_plan(wg, wu, wd, hot, fused_tile=tile)
        cold_pairs = max(0.0, float(freq.sum() - freq[hot].sum()))  # no "-0.0" when every unit is hot

        def op(plan=plan):
            return hot_cold.launch_hot_cold_ffn(x, plan, wg, wu, wdt, tile=tile, capacity=cap)

        out = op()[0].float()
        if first is None:
            first = out
        rel = float((out - first).norm() / first.norm().clamp_min(1e-30))
        print(f"{head} {label} H={hot.numel():4d} cold pairs/token {cold_pairs:5.1f} rel vs first "
              f"{rel:.1e} | " + measure("hot/cold op", op, nvml, dev, seconds), flush=True)


def parse_point(text: str) -> tuple[int, float]:
    """``M:L0`` -> (M, l0), e.g. ``16384:56``."""
    try:
        m, l0 = text.split(":")
        point = int(m), float(l0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a point is M:L0 (tokens : active units per token), got {text!r}") from None
    if point[0] < 1 or not 0 < point[1] < F:
        raise argparse.ArgumentTypeError(f"a point needs M >= 1 and 0 < l0 < {F} (F), got {text!r}")
    return point


def parse_bound(text: str) -> float:
    """A cold-pairs bound (pairs per token, > 0)."""
    try:
        bound = float(text)
    except ValueError:
        bound = float("nan")
    if not bound > 0:
        raise argparse.ArgumentTypeError(f"a bound is a number of cold pairs per token > 0, got {text!r}")
    return bound


def parse_threshold(text: str) -> float:
    """A firing-frequency threshold in (0, 1]."""
    try:
        t = float(text)
    except ValueError:
        t = float("nan")
    if not 0 < t <= 1:
        raise argparse.ArgumentTypeError(f"a threshold is a firing frequency in (0, 1], got {text!r}")
    return t


def main() -> None:
    ap = probe_parser(__doc__)
    ap.add_argument("--points", type=parse_point, nargs="+", default=list(POINTS),
                    help="M:L0 points to probe (default: " + " ".join(f"{m}:{l0:g}" for m, l0 in POINTS) + ")")
    ap.add_argument("--bounds", type=parse_bound, nargs="+", default=[],
                    help="cold-pairs bounds (pairs per token) whose hot sets are timed after the thresholds' "
                         "(at the shipped threshold), e.g. 5 10 20")
    ap.add_argument("--thresholds", type=parse_threshold, nargs="*", default=list(THRESHOLDS),
                    help="frequency thresholds timed between the shipped one's two runs (default: "
                         + " ".join(f"{t:g}" for t in THRESHOLDS) + "; none: only the shipped one)")
    a = ap.parse_args()
    dev, tiny = probe_device(a.device), a.tiny
    d, f, tile, cap, seconds, thresholds = D, F, 128, 16, 2.0, tuple(a.thresholds)
    points, bounds = tuple(a.points), tuple(a.bounds)
    if tiny:  # one bound too, so that the smoke test runs that path
        d, f, tile, cap, seconds, thresholds, points = 64, 700, 32, 8, 0.1, TINY_THRESHOLDS, ((40, 6.0),)
        bounds = bounds or (1.0,)
    nvml = Nvml((dev.index or 0) if dev.type == "cuda" else None)
    run_points(points, lambda m, l0: probe_point(m, l0, d, f, tile, cap, thresholds, nvml, dev, seconds, bounds),
               dev)


if __name__ == "__main__":
    main()
