"""``twell bench ffn``: the inference FFN sweep, dense vs TwELL, over token counts and densities.

Per point it times (median of many reps, same process, same inputs; the dense chain, the hot/cold
split and the two modules interleaved call by call, see ``time_ms_interleaved``): the dense PyTorch FFN with
separate linears, the cuBLAS gate GEMM alone (the floor: the sparse FFN cannot beat it), the TwELL
gate kernel alone, the whole TwELL FFN, the hot/cold split, ``SparseGatedMLP`` with the default
dispatch and the dense FFN module (``DenseReluGatedMLP``: a module's per-call overhead is part of what
a model pays), and at M <= 64 the small-batch kernels (``twell.ops.decode``) alone and through the
module with the decode path on; it checks the TwELL output against an fp32 dense
reference and reports l0 as measured on the kernel's own output.  A fast but wrong point is
reported as wrong (``ok = False``), a slow one as slow.  With ``--energy-seconds S`` it also runs the
dense FFN and the dispatched module back to back for S seconds each and reports the board's energy per
call and the time per call there: at M=131072 both hold an H200 at its power cap, where the time per
call follows the energy per call (bench_results/h200/clock_probe_session12*.log), so the back-to-back
ratio can differ from the interleaved one.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import ops
from ..format import DEFAULT_TILE
from ..nn import DEFAULT_POLICY, DenseReluGatedMLP, DispatchPolicy, SparseGatedMLP
from ..ops import hot_cold_plan
from ..ops.hot_cold_plan import fused_gate_tile
from ..reference.inference import dense_gated_ffn
from ..synthetic import SparsityProfile, synthetic_ffn_problem
from ..tolerances import rel_error, within_tolerance
from .environment import environment
from .model_energy import EnergyMeter
from .results import plot_speedup, record_row, write_results
from .shape_arg import parse_shape
from .timing import DEFAULT_HOLD_MS, time_ms, time_ms_interleaved

DEFAULT_MS = (1, 16, 256, 1024, 4096, 16384, 131072)
DEFAULT_DENSITIES = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
DEFAULT_SHAPES = ((2048, 5632), (4096, 14336))


@dataclass
class FfnSweep:
    shapes: tuple[tuple[int, int], ...] = DEFAULT_SHAPES
    ms: tuple[int, ...] = DEFAULT_MS
    densities: tuple[float, ...] = DEFAULT_DENSITIES
    extra_points: tuple[tuple[int, int, int, float], ...] = ()
    dtype: torch.dtype = torch.bfloat16
    backend: str = "auto"
    seed: int = 0
    rep_ms: float = 100.0
    tags: dict = field(default_factory=dict)
    #: rows ``(min_tokens, max_density)`` of a candidate dispatch table for the module column (any layer
    #: shape, CUDA only, like the default); None: the default policy.
    dispatch_table: tuple[tuple[int, float], ...] | None = None
    #: ``time_ms_interleaved``'s ``hold_ms``: the device held before each interleaved call's start event, so
    #: that a host-bound callable in the cycle does not put host time into the others' intervals.
    hold_ms: float = DEFAULT_HOLD_MS
    #: seconds of back-to-back calls per path for the energy per call (0: not measured)
    energy_seconds: float = 0.0


def _dense_ffn(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    return F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd)


def _rows_for(x_all: torch.Tensor, m: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """The first m tokens when m spans whole sequences; else m tokens from random positions.

    Taking the first m < seq_len tokens would benchmark only the densest, earliest positions.
    """
    if m >= seq_len or m >= x_all.shape[0]:
        return x_all[:m].contiguous()
    idx = torch.randperm(x_all.shape[0], generator=gen, device=gen.device)[:m]
    return x_all[idx].contiguous()


def run_point(
    problem: dict[str, torch.Tensor], x: torch.Tensor, density_pct: float, cfg: FfnSweep, device: torch.device
) -> dict:
    wg, wu, wd = problem["w_gate"], problem["w_up"], problem["w_down"]
    wd_t = wd.t().contiguous().t()  # Wd stored unit-major, as SparseGatedMLP keeps it
    m, d = x.shape
    f = wg.shape[0]
    row: dict = {"d": d, "f": f, "m": m, "density_pct": density_pct, "target_l0": density_pct / 100 * f}
    gate = ops.gate_twell(x, wg, backend=cfg.backend)
    counts = gate.counts.to(torch.float64)
    row_nnz = counts.sum(1)
    row["l0"] = float(row_nnz.mean()) if m else 0.0
    row["max_row_l0"] = float(row_nnz.max()) if m else 0.0
    row["overflow_tile_frac"] = float((gate.counts > gate.capacity).float().mean()) if m else 0.0

    out = ops.twell_gated_ffn(x, gate, wu, wd_t, backend=cfg.backend)
    ref = dense_gated_ffn(x.float(), wg.float(), wu.float(), wd.float(), precision="fp32")
    err = rel_error(out, ref)
    dense_out = _dense_ffn(x, wg, wu, wd)
    row["rel_err"] = err
    row["dense_rel_err"] = rel_error(dense_out, ref)
    # The hot/cold split, hot units chosen from a 4096-token sample by the module's own rule (the bound on cold pairs
    # follows the call's tokens and the sample's density: hot_cold_plan.hot_units_for_call)
    hot = hot_cold_plan.hot_units_for_call(ops.unit_frequency(x, wg), x.shape[0])
    # the fused gate layout where hot_cold_plan.FUSED_GATE (--fused-gate) and the layer allow it
    fused_tile = fused_gate_tile(DEFAULT_TILE, x.dtype, x.shape[1], x.device)
    plan = ops.build_hot_cold_plan(wg, wu, wd, hot, fused_tile=fused_tile)
    row["n_hot"] = plan.n_hot
    row["hotcold_rel_err"] = rel_error(ops.hot_cold_gated_ffn(x, wg, wu, wd_t, plan, backend=cfg.backend), ref)
    decode = 1 <= m <= ops.DECODE_MAX_TOKENS
    if decode:  # the small-batch kernels (twell.ops.decode)
        row["decode_rel_err"] = rel_error(ops.decode_gated_ffn(x, wg, wu, wd_t, backend=cfg.backend), ref)
    dense_err = row["dense_rel_err"]
    row["ok"] = all(within_tolerance(e, cfg.dtype, dense_err)
                    for e in (err, row["hotcold_rel_err"], row.get("decode_rel_err", 0.0)))
    del ref, dense_out

    row["gate_cublas_ms"] = time_ms(lambda: F.linear(x, wg), device=device, rep_ms=cfg.rep_ms)
    row["gate_twell_ms"] = time_ms(lambda: ops.gate_twell(x, wg, backend=cfg.backend), device=device, rep_ms=cfg.rep_ms)
    if device.type == "cuda":  # the single-kernel gate (epilogue writes TwELL), for the record
        row["gate_fused_ms"] = time_ms(lambda: ops.gate_twell(x, wg, backend=cfg.backend, impl="fused"),
                                       device=device, rep_ms=cfg.rep_ms)
    row["twell_ms"] = time_ms(
        lambda: ops.sparse_gated_ffn(x, wg, wu, wd_t, backend=cfg.backend), device=device, rep_ms=cfg.rep_ms
    )
    # What a user gets: SparseGatedMLP with the default dispatch policy (sparse or dense per call), and
    # the dense FFN as a model holds it (an nn.Module around the same five ops: the baseline of a
    # module's per-call overhead, which at M <= 256 is comparable to the FFN itself).  These and the
    # plain dense chain are timed interleaved (time_ms_interleaved), as are the hot/cold op's calls.
    # The default policy without its eager floor: these calls are timed with the GPU held, so the host's issuing is
    # hidden as in a model whose host runs ahead (or a recorded one), which is where the tables apply; the floor
    # (DEFAULT_POLICY.eager_floor_tokens, written to the row) is for callers whose host is the bottleneck.
    policy = (DEFAULT_POLICY.without_eager_floor() if cfg.dispatch_table is None
              else DispatchPolicy(table=cfg.dispatch_table, shapes=None))
    row["eager_floor_tokens"] = DEFAULT_POLICY.eager_floor_tokens((d, f))
    # No recorded calls (eager_graphs=0): the sweep times the policy's kernels, which a replay would hide behind its
    # input and output copies.
    mlp = SparseGatedMLP.from_weights(wg, wu, wd, backend=cfg.backend, policy=policy, eager_graphs=0).eval()
    dense_mlp: DenseReluGatedMLP = mlp.to_dense().eval()
    with torch.no_grad():
        mlp(x)  # first call measures l0 on the dense path and sets the estimate
        row["dispatch_sparse"] = bool(mlp._use_sparse(m, x.device.type, eager=True))  # its timed calls are eager
        per_round: dict[str, list[float]] = {}
        timed = time_ms_interleaved({
            "dense": lambda: _dense_ffn(x, wg, wu, wd),
            "hotcold": lambda: ops.hot_cold_gated_ffn(x, wg, wu, wd_t, plan, backend=cfg.backend),
            "dispatch": lambda: mlp(x),
            "dense_module": lambda: dense_mlp(x),
        }, device=device, rep_ms=cfg.rep_ms, samples_out=per_round, hold_ms=cfg.hold_ms)
    for name, ms in timed.items():
        row[f"{name}_ms"] = ms
        row[f"{name}_rounds_ms"] = per_round[name]
    # what the module's sparse path ran with (its own hot set and dense-row budget, from its last refresh call),
    # against the hot/cold column's: at 16384 tokens / 2 % the module read 1.34x where that column read 1.45x
    # (bench_results/h200/ffn_sweep_session27.json; 1.32x / 1.42x in session 22), the cause not yet known
    hot_set = mlp._hot_cold.set_for(m, fallback=False)
    sparse_ran = row["dispatch_sparse"] and hot_set is not None
    row["dispatch_n_hot"] = hot_set.n_hot if sparse_ran else None
    row["dispatch_dense_rows"] = hot_set.dense_rows(m) if sparse_ran else 0
    row["dispatch_overflow_row_frac"] = hot_set.overflow_fraction if sparse_ran else 0.0
    row["dispatch_severe_overflow_row_frac"] = hot_set.severe_overflow_fraction if sparse_ran else 0.0
    row["hotcold_speedup"] = row["dense_ms"] / row["hotcold_ms"]
    row["dispatch_speedup"] = row["dense_ms"] / row["dispatch_ms"]
    row["dispatch_vs_dense_module"] = row["dense_module_ms"] / row["dispatch_ms"]
    if decode:
        row["decode_ms"] = time_ms(lambda: ops.decode_gated_ffn(x, wg, wu, wd_t, backend=cfg.backend),
                                   device=device, rep_ms=cfg.rep_ms)
        row["decode_speedup"] = row["dense_ms"] / row["decode_ms"]
        # The module with the decode path switched on (off in the default policy until measured).
        policy = DispatchPolicy(table=DEFAULT_POLICY.table_for((d, f)), shapes=None,
                                decode_max_tokens=ops.DECODE_MAX_TOKENS)
        mlp_dec = SparseGatedMLP.from_weights(wg, wu, wd, backend=cfg.backend, policy=policy, eager_graphs=0).eval()
        with torch.no_grad():
            mlp_dec(x)
            row["decode_module_ms"] = time_ms(lambda: mlp_dec(x), device=device, rep_ms=cfg.rep_ms)
        row["decode_module_speedup"] = row["dense_ms"] / row["decode_module_ms"]
    if cfg.energy_seconds > 0:
        with torch.no_grad():
            row.update(energy_fields(EnergyMeter(device), {"dense": lambda: _dense_ffn(x, wg, wu, wd),
                                                           "dispatch": lambda: mlp(x)}, cfg.energy_seconds))
    row["method"] = "block-union" if m >= ops.inference.BLOCK_UNION_MIN_TOKENS else "row-gather"
    row["speedup"] = row["dense_ms"] / row["twell_ms"]
    row["ceiling"] = row["dense_ms"] / row["gate_cublas_ms"]
    row["gate_vs_cublas"] = row["gate_twell_ms"] / row["gate_cublas_ms"]
    sparse_ms = row["twell_ms"] - row["gate_twell_ms"]
    bytes_rows = row["l0"] * m * 2 * d * x.element_size()  # one Wu row + one Wd row per active pair
    row["weight_row_TBps"] = bytes_rows / (sparse_ms * 1e-3) / 1e12 if sparse_ms > 0 else math.nan
    row["ns_per_pair"] = sparse_ms * 1e6 / max(1.0, row["l0"] * m)
    return row


def energy_fields(meter: EnergyMeter, fns: dict, seconds: float) -> dict:
    """Per callable ``<name>_busy_ms`` (time per call back to back for ``seconds``) and ``<name>_j_per_call``
    (board energy per call), then ``busy_speedup`` and ``energy_ratio`` of ``dense`` over ``dispatch``; or
    ``energy_unavailable`` with the meter's reason."""
    if meter.method is None:
        return {"energy_unavailable": meter.reason}
    out: dict = {"energy_method": meter.method}
    for name, fn in fns.items():
        fn()  # warm: first-call work stays out of the window
        got = meter.measure(fn, min_seconds=seconds)
        out[f"{name}_busy_ms"] = got["seconds"] * 1e3 / got["calls"]
        out[f"{name}_j_per_call"] = got["joules"] / got["calls"]
        out[f"{name}_watts"] = got["mean_watts"]
    out["busy_speedup"] = out["dense_busy_ms"] / out["dispatch_busy_ms"]
    out["energy_ratio"] = out["dense_j_per_call"] / out["dispatch_j_per_call"]
    return out


def run_sweep(cfg: FfnSweep, device: torch.device, log=print, on_row=None) -> list[dict]:
    rows: list[dict] = []
    points: list[tuple[int, int, tuple[int, ...], float]] = []
    for d, f in cfg.shapes:
        for dens in cfg.densities:
            points.append((d, f, cfg.ms, dens))
    for d, f, m, dens in cfg.extra_points:
        points.append((d, f, (m,), dens))
    for d, f, ms, dens in points:
        gen = torch.Generator(device=device)
        gen.manual_seed(cfg.seed)
        profile = SparsityProfile(mean_l0=dens / 100 * f)
        m_max = max(ms)
        try:
            problem = synthetic_ffn_problem(m_max, d, f, profile, generator=gen, dtype=cfg.dtype, device=device)
        except torch.OutOfMemoryError as exc:  # report, do not hide
            log(f"d={d} f={f} M={m_max} density={dens}%: out of memory generating inputs ({exc})")
            rows.append({"d": d, "f": f, "m": m_max, "density_pct": dens, "error": "out of memory"})
            continue
        for m in ms:
            x = _rows_for(problem["x"], m, profile.seq_len, gen)
            try:
                row = run_point(problem, x, dens, cfg, device)
            except torch.OutOfMemoryError:
                row = {"d": d, "f": f, "m": m, "density_pct": dens, "error": "out of memory"}
            row.update(cfg.tags)
            record_row(rows, row, format_row(row), log=log, on_row=on_row, device=device)
        del problem
    return rows


def format_row(r: dict) -> str:
    if "error" in r:
        return f"d={r['d']:5d} f={r['f']:6d} M={r['m']:7d} dens={r['density_pct']:5.2f}%  ERROR {r['error']}"
    return (
        f"d={r['d']:5d} f={r['f']:6d} M={r['m']:7d} dens={r['density_pct']:5.2f}% l0={r['l0']:7.1f} "
        f"dense={r['dense_ms']:8.3f} gate(cuBLAS)={r['gate_cublas_ms']:7.3f} gate(twell)={r['gate_twell_ms']:7.3f} "
        f"twell={r['twell_ms']:8.3f} speedup={r['speedup']:5.2f}x err={r['rel_err']:.1e} "
        f"hot-cold(H={r['n_hot']})={r['hotcold_ms']:8.3f} {r['hotcold_speedup']:5.2f}x err={r['hotcold_rel_err']:.1e} "
        f"{'ok' if r['ok'] else 'WRONG'} dispatched={r['dispatch_speedup']:.2f}x "
        f"({'sparse' if r['dispatch_sparse'] else 'dense'})"
        + (f" module H={r['dispatch_n_hot']} dense rows={r['dispatch_dense_rows']}"
           if r.get("dispatch_n_hot") is not None else "")
        + (f" vs dense module {r['dispatch_vs_dense_module']:.2f}x" if "dispatch_vs_dense_module" in r else "")
        + (f" decode={r['decode_ms']:.3f} {r['decode_speedup']:.2f}x err={r['decode_rel_err']:.1e} "
           f"module+decode {r['decode_module_speedup']:.2f}x" if "decode_ms" in r else "")
        + (f" | back to back: dense {r['dense_busy_ms']:.3f} ms {r['dense_j_per_call']:.3f} J, dispatched "
           f"{r['dispatch_busy_ms']:.3f} ms {r['dispatch_j_per_call']:.3f} J: {r['busy_speedup']:.2f}x, energy "
           f"{r['energy_ratio']:.2f}x" if "energy_ratio" in r else "")
        + (f" | energy unavailable: {r['energy_unavailable']}" if "energy_unavailable" in r else "")
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="twell bench ffn", description=__doc__)
    p.add_argument("--ms", type=int, nargs="*", default=list(DEFAULT_MS), help="token counts M")
    p.add_argument("--densities", type=float, nargs="*", default=list(DEFAULT_DENSITIES), help="percent active")
    p.add_argument("--shape", type=parse_shape, nargs="*", default=list(DEFAULT_SHAPES),
                   help="hidden x FFN sizes, e.g. 2048x5632")
    p.add_argument("--extra", type=str, nargs="*", default=["2048x5632:524288:0.5"],
                   help="single points dxF:M:density_pct (default: the M=524288 point)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--backend", choices=["auto", "torch", "triton"], default="auto")
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--hold-ms", type=float, default=DEFAULT_HOLD_MS,
                   help="device hold before each interleaved call's start event (CUDA), so that host time of a "
                        "host-bound path in the cycle stays out of the other paths' intervals")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--stem", default="ffn")
    p.add_argument("--dispatch-table", type=_parse_table, default=None, metavar="M:DENSITY,...",
                   help="a candidate dispatch table for the module column, rows min_tokens:max_density "
                        "(density as a fraction, e.g. 4096:0.005,16384:0.05) for every layer shape; default: "
                        "the shipped policy")
    p.add_argument("--energy-seconds", type=float, default=0.0,
                   help="per point, run the dense FFN and the dispatched module back to back this long each and "
                        "report the board energy per call and the time per call there (NVML or nvidia-smi; "
                        "0: off)")
    p.add_argument("--fused-gate", action=argparse.BooleanOptionalAction, default=True,
                   help="the hot/cold split's GEMM, hot hidden state and cold pack in one kernel "
                        "(twell.ops.hot_cold_gate_kernel; hot-cold column and dispatched module; on by default)")
    a = p.parse_args(argv)
    if not a.energy_seconds >= 0:
        p.error(f"--energy-seconds must be a number of seconds >= 0 (0: off), got {a.energy_seconds}")
    hot_cold_plan.FUSED_GATE = a.fused_gate
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = FfnSweep(
        shapes=tuple(a.shape),
        ms=tuple(a.ms),
        densities=tuple(a.densities),
        extra_points=tuple(_parse_point(e) for e in a.extra),
        dtype=getattr(torch, a.dtype),
        backend=a.backend,
        rep_ms=a.rep_ms,
        dispatch_table=a.dispatch_table,
        hold_ms=a.hold_ms,
        energy_seconds=a.energy_seconds,
    )
    meta = environment(device)
    meta["sweep"] = {"ms": cfg.ms, "densities": cfg.densities, "shapes": cfg.shapes, "dtype": a.dtype,
                     "fused_gate": a.fused_gate, "hold_ms": a.hold_ms, "energy_seconds": a.energy_seconds,
                     "dispatch_table": "default" if a.dispatch_table is None else a.dispatch_table}
    rows = run_sweep(cfg, device, on_row=lambda rs: write_results(rs, meta, a.out, a.stem))
    paths = write_results(rows, meta, a.out, a.stem)
    good = [r for r in rows if "error" not in r]
    plot = plot_speedup([r for r in good if (r["d"], r["f"]) == cfg.shapes[0]], a.out / f"{a.stem}_speedup.png",
                        title=f"TwELL FFN speedup, {meta['device']}, d={cfg.shapes[0][0]} F={cfg.shapes[0][1]}")
    if plot:
        paths.append(plot)
    print("\n" + summary_table(good))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0 if all(r["ok"] for r in good) else 1


def _parse_table(text: str) -> tuple[tuple[int, float], ...]:
    """``"4096:0.005,16384:0.05"`` -> ``((4096, 0.005), (16384, 0.05))``, checked as a policy checks it."""
    try:
        rows = tuple((int(m), float(dens)) for m, dens in (row.split(":") for row in text.split(",")))
        DispatchPolicy(table=rows, shapes=None)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"--dispatch-table takes rows min_tokens:max_density separated by commas, min_tokens increasing, "
            f"densities in [0, 1] (e.g. 4096:0.005,16384:0.05); got {text!r} ({exc})") from None
    return rows


def _parse_point(text: str) -> tuple[int, int, int, float]:
    try:
        shape, m, dens = text.split(":")
        d, f = (int(v) for v in shape.lower().split("x"))
        return d, f, int(m), float(dens)
    except ValueError:
        raise SystemExit(f"--extra takes points like 2048x5632:524288:0.5, got {text!r}") from None


def summary_table(rows: list[dict]) -> str:
    lines = ["| d x F | M | density | l0 | dense ms | gate cuBLAS ms | twell ms | speedup | hot-cold ms (H) | "
             "hot-cold speedup | dispatched | rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | {r['l0']:.1f} | {r['dense_ms']:.3f} | "
            f"{r['gate_cublas_ms']:.3f} | {r['twell_ms']:.3f} | {r['speedup']:.2f}x | {r['hotcold_ms']:.3f} "
            f"({r['n_hot']}) | {r['hotcold_speedup']:.2f}x | "
            f"{r['dispatch_speedup']:.2f}x ({'sparse' if r['dispatch_sparse'] else 'dense'}) | "
            f"{max(r['rel_err'], r['hotcold_rel_err']):.1e} |"
        )
    return "\n".join(lines)
