"""GPU time of the two kernels of the hot/cold split's cold path, per variant, on the synthetic problems
of ``twell bench ffn``: the TwELL pack storing each pair's column inside its tile or its weight-row id
(``unit_map``, ``twell.ops.hot_cold.COLD_UNIT_IDS``), and the row-gather FFN kernel per (SB, warps), over
column indices + the unit map and over unit ids.

Per (M, l0): the cold columns (g with its units ordered by frequency on a 4096-token sample, the H most
frequent dropped: a strided column slice, as ``hot_cold_gated_ffn`` packs it); the pack time with
column indices and with unit ids (medians of ``twell.bench.timing.time_ms``), and whether both list the
same pairs (same counts and values, each id the map's entry for its column).  Then the gather over each
cold container (unit map and an fp32 init row, as the split runs it) per (SB units per step, warps): the
row-gather kernel is latency-bound; built as launched (d and the row strides multiples of 16) ptxas puts
SB 4 on 4 warps at 106 registers, 128 with a step's rows requested together and 128 over the flat lists
(shipped): 4 tokens per SM.
The variants (GATHER_VARIANTS) trade pairs per step against tokens per SM and round trips per step.
Usage (GPU machine): ``PYTHONPATH=src python3 scripts/cold_pack_gather_probe.py [--shape 4096x14336]``
(default 2048x5632); ``--device cpu --tiny`` under TRITON_INTERPRET=1 is the smoke test.
"""

from __future__ import annotations

from unittest import mock

import torch
import torch.nn.functional as F

from twell.bench.probe import builds_of, new_build_resources, probe_shape_args
from twell.bench.timing import time_ms
from twell.ops import twell_list_kernel
from twell.ops.gate_kernel import launch_pack_twell
from twell.ops.hot_cold_plan import choose_hot_units, unit_frequency
from twell.ops.twell_ffn_kernel import _twell_ffn_row_kernel, launch_twell_ffn
from twell.ops.twell_list_kernel import launch_list_twell_rows
from twell.synthetic import SparsityProfile, synthetic_ffn_problem
from twell.tolerances import REL_TOL, rel_error

TILE, CAP = 128, 16
#: (label, launch_twell_ffn keywords) of the row-gather kernel, the reference first.  Session 7 (H200,
#: cold_pack_gather_probe_session7.log): SB 2 / 1 on 4 warps, SB 2 on 8, SB 1 on 2 not faster than SB 4 on
#: 4 warps but at one point; ``preload`` (twell_ffn_kernel.GATHER_PRELOAD) and ``prefetch`` (GATHER_PREFETCH)
#: slower in session 10; fewer warps per token (SB 4 / 2, SB 2 / 2, SB 1 / 1) slower in session 13
#: (cold_pack_gather_probe_session13_warps.log); a step's Wu and Wd rows in one round trip (``rows_together``,
#: GATHER_ROWS_TOGETHER) faster at every point (_session13_together.log: 2.145 -> 1.881 ms at M=131072,
#: l0=28), on since.  The next step's container entries requested a step ahead as well (commit 2d56834,
#: since removed; _session13_ahead.log) was slower: 1.990 vs 1.861 ms at M=131072 / l0=28 capped at 128
#: registers (4 B spilled), 2.281 uncapped (141 registers, 3 programs per SM), 0.288 vs 0.277 at M=16384.
#: Session 14: each row's entries as a flat list written by a pass before the gather (``listed``,
#: GATHER_LISTED, twell.ops.twell_list_kernel; the pass's time included in the variant's) against the
#: rows-together loop (_session14_listed_v2.log, unit ids): 1.540 vs 1.865 ms at M=131072 / l0=28, 1.813 vs
#: 2.172 at l0=56, 0.273 vs 0.298 at 16384; over the lists SB 2 slower than SB 4 at every point; on since.
#: Every variant's registers and spills as the driver loaded it are printed after its timing.
GATHER_VARIANTS = (
    ("SB 4 / 4 warps, rows together", dict(sb=4, num_warps=4, rows_together=True, listed=False)),
    ("SB 4 / 4 warps, listed", dict(sb=4, num_warps=4, listed=True)),
    ("SB 2 / 4 warps, listed", dict(sb=2, num_warps=4, listed=True)),
)
#: Rows per program of the list pass (twell_list_kernel.LIST_ROWS), each timed alone.
LIST_ROWS = (4, 16)
#: The block tensor-core kernel (twell_ffn_kernel.GATHER_TENSOR_CORES) as ``(num_warps, num_stages)``:
#: slower than the row kernel at every setting in session 10 (3.195-4.779 vs 2.146 ms at M=131072, l0=28;
#: cold_pack_gather_probe_session10.log, which timed (4, 3), (4, 2), (8, 3)), so no longer timed here.  Its
#: fp32 sums are grouped differently from the row kernel's: compared within the bf16 tolerance, not bit for bit.
TC_VARIANTS: tuple[tuple[int, int], ...] = ()


def same_pairs(columns: tuple, ids: tuple, unit_map: torch.Tensor) -> bool:
    """Whether the container with unit ids lists the pairs of the one with column indices: same counts, same
    values in the used slots, and each id ``unit_map`` of its column."""
    (vc, ic, cc), (vi, ii, ci) = columns, ids
    used = torch.arange(CAP, device=cc.device)[None, None, :] < cc.clamp(max=CAP)[:, :, None]
    tiles = torch.arange(cc.shape[1], device=cc.device)[None, :, None].expand_as(ic)
    want_ids = unit_map.long()[(tiles * TILE + ic.long())[used]]
    return bool(torch.equal(cc, ci) and torch.equal(vc[used], vi[used]) and torch.equal(ii[used].long(), want_ids))


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
    for name, kwargs in GATHER_VARIANTS:
        def gather(kwargs: dict = kwargs) -> torch.Tensor:
            return launch_twell_ffn(x, v, i, c, None, None, wg, wu, wdt, n_cols=unit_map.numel(), tile=TILE,
                                    round_hidden=True, out=out, unit_map=unit_map, init=init,
                                    idx_is_unit=idx_is_unit, **kwargs)
        before = builds_of(_twell_ffn_row_kernel)
        got = gather().clone()
        resources = new_build_resources(_twell_ffn_row_kernel, before)
        t = time_ms(gather, device=dev, rep_ms=rep_ms)
        want = got if want is None else want
        parts.append(f"{name} {t:.3f} ms ({t * 1e6 / max(pairs, 1):.2f} ns/pair, same {bool(torch.equal(got, want))}"
                     + (f"; {resources}" if resources else "") + ")")
    lst_n = launch_list_twell_rows(v, i, c, tile=TILE, unit_map=unit_map, idx_is_unit=idx_is_unit)[1]
    listed_pct = float((lst_n >= 0).float().mean()) * 100
    for rows in LIST_ROWS:
        with mock.patch.object(twell_list_kernel, "LIST_ROWS", rows):
            t_list = time_ms(lambda: launch_list_twell_rows(v, i, c, tile=TILE, unit_map=unit_map,
                                                            idx_is_unit=idx_is_unit), device=dev, rep_ms=rep_ms)
        parts.append(f"the list pass alone ({rows} rows a program) {t_list:.3f} ms")
    parts.append(f"{listed_pct:.2f} % of rows listed")
    for warps, stages in TC_VARIANTS:
        def tc_gather(warps: int = warps, stages: int = stages) -> torch.Tensor:
            return launch_twell_ffn(x, v, i, c, None, None, wg, wu, wdt, n_cols=unit_map.numel(), tile=TILE,
                                    round_hidden=True, out=out, unit_map=unit_map, init=init, idx_is_unit=idx_is_unit,
                                    tensor_cores=True, tc_config=(warps, stages))
        t = time_ms(tc_gather, device=dev, rep_ms=rep_ms)
        err = rel_error(tc_gather(), want)
        parts.append(f"tensor cores {warps} warps / {stages} stages {t:.3f} ms ({t * 1e6 / max(pairs, 1):.2f} ns/pair, "
                     f"rel {err:.1e}, close {err <= REL_TOL[x.dtype]})")
    return f"{pairs / m:.2f} pairs/token: " + " | ".join(parts), want


def main() -> None:
    dev, tiny, (d, f) = probe_shape_args(__doc__, "2048x5632")
    # 0.5 % and 1 % density (l0 28 and 56 at F=5632); the hot units as SparseGatedMLP picks them (576 and 1344
    # there), or a fixed 64 on the tiny CPU problem
    points = ((16384, float(round(0.005 * f))), (131072, float(round(0.005 * f))), (131072, float(round(0.01 * f))))
    rep_ms, tiny_hot = 100.0, None
    if tiny:
        d, f, points, rep_ms, tiny_hot = 64, 700, ((64, 4.0),), 1.0, 64
    print(f"d x F = {d} x {f}", flush=True)
    for m, l0 in points:
        gen = torch.Generator(device=dev).manual_seed(0)
        p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=l0), generator=gen, device=dev)
        x, wg, wu, wdt = p["x"], p["w_gate"], p["w_up"], p["w_down"].t().contiguous()
        g = F.linear(x, wg)
        del p
        frequency = unit_frequency(x, wg)  # the module's own sample (4096 evenly spaced tokens)
        n_hot = tiny_hot if tiny_hot is not None else choose_hot_units(frequency).numel()
        order = torch.argsort(frequency, descending=True, stable=True)
        cold = g[:, order].contiguous()[:, n_hot:]  # the cold columns of a hot-first gate output
        unit_map = order[n_hot:].to(torch.int32).contiguous()
        t_cols, t_ids = (time_ms(lambda cold=cold, ids=ids: launch_pack_twell(cold, TILE, CAP, unit_map=ids),
                                 device=dev, rep_ms=rep_ms) for ids in (None, unit_map))
        columns = launch_pack_twell(cold, TILE, CAP)
        with_ids = launch_pack_twell(cold, TILE, CAP, unit_map=unit_map)
        print(f"M={m:6d} l0={l0:5.1f} cold (H={n_hot}) [{cold.shape[0]} x {cold.shape[1]}] pack: column indices "
              f"{t_cols:.3f} ms, unit ids {t_ids:.3f} ms ({t_ids - t_cols:+.3f} ms) "
              f"| same pairs {same_pairs(columns, with_ids, unit_map)}", flush=True)
        line, want = time_gathers(x, columns, (wg, wu, wdt), unit_map, dev, rep_ms)
        print(f"M={m:6d} l0={l0:5.1f} cold gather, column indices + map: " + line, flush=True)
        line, _ = time_gathers(x, with_ids, (wg, wu, wdt), unit_map, dev, rep_ms, idx_is_unit=True, want=want)
        print(f"M={m:6d} l0={l0:5.1f} cold gather, unit ids: " + line, flush=True)
        del g, cold, columns, with_ids, x, wg, wu, wdt
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
