"""GPU time of the two kernels of the hot/cold split's cold path, per variant, on the synthetic problems
of ``twell bench ffn``: the TwELL pack with and without its fast path for sparse row-tiles
(``twell.ops.gate_kernel.PACK_FEW``) and with unit ids (``twell.ops.hot_cold.COLD_UNIT_IDS``), and the
row-gather FFN kernel per (SB, warps), over column indices + the unit map and over unit ids.

Per (M, l0): the whole gate pre-activation g [M, F] (the "gemm+pack" gate) and the cold columns (g
with its units ordered by frequency on a 4096-token sample, the H most frequent dropped: a strided
column slice, as ``hot_cold_gated_ffn`` packs it); for each, the share of programs (16 rows x 128
columns) whose rows all hold <= 2 non-zeros (those take the fast path), the pack time with the general
epilogue and with the fast path (medians of ``twell.bench.timing.time_ms``), and whether both wrote the
same container.  Then the gather over the cold container (unit map and an fp32 init row, as the split
runs it) per (SB units per step, warps): the row-gather kernel is latency-bound, and ptxas puts SB 4 on
4 warps (shipped) at 227 registers = 2 tokens per SM, SB 1 on 4 warps at 107 = 4 (docs/performance.md).
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/cold_pack_gather_probe.py``; ``--device cpu --tiny``
under TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from twell.bench.timing import time_ms
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.twell_ffn_kernel import launch_twell_ffn
from twell.synthetic import SparsityProfile, synthetic_ffn_problem

TILE, CAP, BLOCK_M = 128, 16, 16
#: (SB, warps) of the row-gather kernel: the shipped (4, 4) first.
GATHER_VARIANTS = ((4, 4), (2, 4), (1, 4), (2, 8), (1, 2))


def fast_share(g: torch.Tensor) -> float:
    """Share of the pack's programs whose row-tiles all hold at most two non-zeros."""
    m, f = g.shape
    pad_m, pad_f = -m % BLOCK_M, -f % TILE
    nz = F.pad((torch.relu(g.float()) != 0).float(), (0, pad_f, 0, pad_m))
    per_row_tile = nz.reshape(nz.shape[0], -1, TILE).sum(-1)
    per_program = per_row_tile.reshape(-1, BLOCK_M, per_row_tile.shape[1]).amax(1)
    return float((per_program <= 2).float().mean())


def same(a: tuple, b: tuple) -> bool:
    (va, ia, ca), (vb, ib, cb) = a, b
    used = torch.arange(CAP, device=ca.device)[None, None, :] < cb.clamp(max=CAP)[:, :, None]
    return bool(torch.equal(ca, cb) and torch.equal(ia[used], ib[used]) and torch.equal(va[used], vb[used]))


def time_gathers(x: torch.Tensor, container: tuple, weights: tuple, unit_map: torch.Tensor, dev: torch.device,
                 rep_ms: float, idx_is_unit: bool = False, want: torch.Tensor | None = None
                 ) -> tuple[str, torch.Tensor]:
    """The row-gather kernel over the cold ``container`` per GATHER_VARIANTS, with the split's unit map
    and an fp32 init row (the hot units' partial sums), and whether each variant gives the bits of
    ``want`` (default: the first variant's); ``(line, first variant's output)``."""
    v, i, c = container
    wg, wu, wdt = weights
    m, d = x.shape
    init = torch.zeros((m, d), dtype=torch.float32, device=dev)
    out = torch.empty((m, d), dtype=x.dtype, device=dev)
    pairs = float(c.clamp(max=CAP).sum())
    parts = []
    for sb, warps in GATHER_VARIANTS:
        def gather(sb: int = sb, warps: int = warps) -> torch.Tensor:
            return launch_twell_ffn(x, v, i, c, None, None, wg, wu, wdt, n_cols=unit_map.numel(), tile=TILE,
                                    round_hidden=True, out=out, unit_map=unit_map, init=init, sb=sb, num_warps=warps,
                                    idx_is_unit=idx_is_unit)
        t = time_ms(gather, device=dev, rep_ms=rep_ms)
        got = gather().clone()
        want = got if want is None else want
        parts.append(f"SB {sb} / {warps} warps {t:.3f} ms ({t * 1e6 / max(pairs, 1):.2f} ns/pair, "
                     f"same {bool(torch.equal(got, want))})")
    return f"{pairs / m:.2f} pairs/token: " + " | ".join(parts), want


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    dev = torch.device(a.device)
    d, f, points, hot = 2048, 5632, ((16384, 28.0), (131072, 28.0), (131072, 56.0)), {28.0: 576, 56.0: 1344}
    rep_ms = 100.0
    if a.tiny:
        d, f, points, hot, rep_ms = 64, 700, ((64, 4.0),), {4.0: 64}, 1.0
    if dev.type == "cuda":
        print(torch.cuda.get_device_name(dev), "torch", torch.__version__, flush=True)
    for m, l0 in points:
        gen = torch.Generator(device=dev).manual_seed(0)
        p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0), generator=gen, device=dev)
        x, wg, wu, wdt = p["x"], p["w_gate"], p["w_up"], p["w_down"].t().contiguous()
        g = F.linear(x, wg)
        del p
        order = torch.argsort((g[:4096] > 0).float().mean(0), descending=True)
        cold = g[:, order].contiguous()[:, hot[l0]:]  # the cold columns of a hot-first gate output
        unit_map = order[hot[l0]:].to(torch.int32).contiguous()
        for name, mat in (("whole gate", g), (f"cold (H={hot[l0]})", cold)):
            times = {few: time_ms(lambda few=few: launch_pack_twell(mat, TILE, CAP, few=few), device=dev,
                                  rep_ms=rep_ms) for few in (False, True)}
            ok = same(launch_pack_twell(mat, TILE, CAP, few=True), launch_pack_twell(mat, TILE, CAP, few=False))
            print(f"M={m:6d} l0={l0:5.1f} {name:14s} [{mat.shape[0]} x {mat.shape[1]}] fast-path programs "
                  f"{fast_share(mat):6.1%} | pack general {times[False]:.3f} ms, with fast path {times[True]:.3f} ms "
                  f"({times[False] / times[True]:.2f}x) | same container {ok}", flush=True)
        t_ids = time_ms(lambda cold=cold: launch_pack_twell(cold, TILE, CAP, few=True, unit_map=unit_map), device=dev,
                        rep_ms=rep_ms)
        print(f"M={m:6d} l0={l0:5.1f} cold pack with the fast path and unit ids (COLD_UNIT_IDS): {t_ids:.3f} ms",
              flush=True)
        line, want = time_gathers(x, launch_pack_twell(cold, TILE, CAP), (wg, wu, wdt), unit_map, dev, rep_ms)
        print(f"M={m:6d} l0={l0:5.1f} cold gather, column indices + map: " + line, flush=True)
        ids = launch_pack_twell(cold, TILE, CAP, unit_map=unit_map)
        line, _ = time_gathers(x, ids, (wg, wu, wdt), unit_map, dev, rep_ms, idx_is_unit=True, want=want)
        print(f"M={m:6d} l0={l0:5.1f} cold gather, unit ids: " + line, flush=True)
        del g, cold, x, wg, wu, wdt
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
