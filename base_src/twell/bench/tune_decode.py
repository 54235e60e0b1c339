"""``twell tune-decode``: where the small-batch kernels beat the dense FFN inside a CUDA graph, as a decode table.

A decode step of 1-64 tokens is a few tens of microseconds per layer, and run eagerly its launches cost more host
time than the dense chain's cuBLAS calls (0.60x at one token, 2048 x 5632; bench_results/h200/
launch_overhead_session6.log), so the small-batch kernels pay only inside a recorded step
(:class:`twell.generation.GreedyDecoder`).  This command measures them that way: for one layer shape, over token
counts 1-64 and densities of the realistic synthetic activations (:mod:`twell.synthetic`), it records in one CUDA
graph the calls of :class:`~twell.nn.SparseGatedMLP` held on its small-batch path over copies of the weights
(~200 MB in all, 4x an H200's L2, so every call reads its weights from DRAM as a step through the model's layers
does), and in another the same calls of the dense module, and times the two replays interleaved after an L2 flush
(:func:`twell.bench.timing.time_ms_interleaved`).  Every sparse output is checked against an fp32 reference.  The
points become a decode table (:func:`twell.nn.dispatch_tuning.derive_decode_table`: a win needs ``--min-speedup``, as
in ``twell tune-dispatch``, and a call between two measured token counts takes the larger one's limit), written
with the points as ``<out>/decode_<shape>.json`` / ``.csv`` and as a policy file ``decode_<shape>_policy.json``:
:data:`twell.nn.DEFAULT_POLICY` with this shape's decode table replaced, which :func:`twell.nn.load_policy` reads::

    twell tune-decode --shape 2048x5632 --out tuned
    twell.models.set_dispatch_policy(model, twell.nn.load_policy("tuned/decode_2048x5632_policy.json"))

``GreedyDecoder`` applies the decode tables to its recorded steps (``small_batch_kernels``, on by default there).
Without a GPU the calls are timed eagerly (a smoke test of the command, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..generation import record_cuda_graph
from ..nn import DEFAULT_POLICY, DispatchPolicy, SparseGatedMLP, static_dispatch
from ..nn.dispatch_file import save_policy
from ..nn.dispatch_tuning import TuningPoint, derive_decode_table
from ..ops.active_count import mean_active_per_token
from ..ops.decode_kernels import DECODE_MAX_TOKENS
from ..reference.inference import dense_gated_ffn
from ..tolerances import rel_error, within_tolerance
from . import tune_dispatch
from .environment import environment
from .results import write_results
from .shape_arg import parse_shape
from .timing import time_ms_interleaved

DEFAULT_MS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_DENSITIES = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
#: Weights cycled per recorded graph: about 4x the H200's 50 MB L2, so each call reads its weights from DRAM.
FLUSH_BYTES = 200 * 2**20
#: At most this many weight copies (a small shape's 16 copies already exceed FLUSH_BYTES).
MAX_COPIES = 16
#: The device's wait before each timed replay (time_ms_interleaved's ``hold_ms``): a replay is one launch from the
#: host, queued well within 0.1 ms, where the default 2 ms covers an eager call's many launches and would add ~2 ms to
#: each of up to 2 x 1000 timed replays a point.  With it a shape's 56 points took 29-39 s on the H200
#: (bench_results/h200/session34_runs.md, call 1).
REPLAY_HOLD_MS = 0.1


@dataclass
class DecodeTuneConfig(tune_dispatch.TuneConfig):
    """``twell tune-dispatch``'s configuration with the decode sweep's token counts and densities (``backend`` is
    not used: the small-batch path runs on the layer's own)."""

    ms: tuple[int, ...] = DEFAULT_MS
    densities: tuple[float, ...] = DEFAULT_DENSITIES


def _small_batch_policy() -> DispatchPolicy:
    """Every call of up to DECODE_MAX_TOKENS tokens on the small-batch kernels, on any device and shape."""
    return DispatchPolicy(table=(), force=True, decode_max_tokens=DECODE_MAX_TOKENS)


def copies_for(weight_bytes: int, device: torch.device) -> int:
    """How many copies of a layer's weights the recorded calls cycle over (one off CUDA)."""
    if device.type != "cuda":
        return 1
    return max(1, min(MAX_COPIES, math.ceil(FLUSH_BYTES / weight_bytes)))


def measure_point(problem: dict[str, torch.Tensor], x: torch.Tensor, density_pct: float, cfg: DecodeTuneConfig,
                  device: torch.device) -> dict:
    """One point: the recorded small-batch calls and the recorded dense calls, timed interleaved; the output checked."""
    wg, wu, wd = problem["w_gate"], problem["w_up"], problem["w_down"]
    m = x.shape[0]
    n = copies_for(sum(t.numel() * t.element_size() for t in (wg, wu, wd)), device)
    sparse = [SparseGatedMLP.from_weights(wg, wu, wd, policy=_small_batch_policy()).eval() for _ in range(n)]
    dense = [layer.to_dense().eval() for layer in sparse]
    for layer in sparse:
        layer.w_down_unit_major()  # the copy a recorded step reads (static_dispatch(unit_major_down=True))
    row: dict = {"d": cfg.d, "f": cfg.f, "m": m, "density_pct": density_pct, "copies": n}
    with torch.no_grad():
        act = torch.relu(F.linear(x, wg))
        row["l0"] = float(mean_active_per_token(act))
        row["density"] = row["l0"] / cfg.f
        row["union"] = int((act > 0).any(dim=0).sum())  # units the step's tokens fire together
        ref = dense_gated_ffn(x.float(), wg.float(), wu.float(), wd.float(), precision="fp32")
        with static_dispatch(unit_major_down=True):
            out = sparse[0](x)
        row["path"] = sparse[0]._path(m, device.type)
        row["rel_err"] = rel_error(out, ref)
        row["dense_rel_err"] = rel_error(dense[0](x), ref)
        row["ok"] = within_tolerance(row["rel_err"], cfg.dtype, row["dense_rel_err"]) and row["path"] == "decode"
        del out, ref

        def run_sparse() -> None:
            with static_dispatch(unit_major_down=True):
                for layer in sparse:
                    layer(x)

        def run_dense() -> None:
            for layer in dense:
                layer(x)

        if device.type == "cuda":
            fns = {"dense": record_cuda_graph(run_dense), "sparse": record_cuda_graph(run_sparse)}
            row["timing"] = "cuda graph"
        else:
            fns = {"dense": run_dense, "sparse": run_sparse}
            row["timing"] = "eager"
        groups: dict[str, list[float]] = {}
        ms = time_ms_interleaved(fns, device=device, rep_ms=cfg.rep_ms, samples_out=groups, hold_ms=REPLAY_HOLD_MS)
    for name in ("dense", "sparse"):
        row[f"{name}_ms"] = ms[name] / n
        row[f"{name}_rounds_ms"] = [v / n for v in groups[name]]
    row["speedup"] = ms["dense"] / ms["sparse"]
    return row


def run_tuning(cfg: DecodeTuneConfig, device: torch.device, log=print, on_row=None) -> list[dict]:
    """Every (token count, density) point of ``cfg``, drawn as ``twell tune-dispatch`` draws them (a whole synthetic
    sequence per density, each point's tokens at random positions of it: a decode step's tokens come from different
    sequences, none of them at the first, densest positions); rows as :func:`measure_point` returns them."""
    return tune_dispatch.run_tuning(cfg, device, log, on_row, measure=measure_point, fmt=format_row)


def format_row(r: dict) -> str:
    head = f"{r['d']}x{r['f']} M={r['m']:3d} density {r['density_pct']:5.2f}%"
    if "error" in r:
        return f"{head}  ERROR {r['error']}"
    return (f"{head} l0={r['l0']:7.1f} union {r['union']:5d} dense {r['dense_ms'] * 1e3:7.1f} us, small-batch "
            f"{r['sparse_ms'] * 1e3:7.1f} us ({r['timing']}): {r['speedup']:5.2f}x  err {r['rel_err']:.1e} "
            f"{'ok' if r['ok'] else 'WRONG'}")


def points_of(rows: list[dict]) -> list[TuningPoint]:
    """The timed rows as :class:`TuningPoint` (rows with an error measured nothing and are left out)."""
    return [TuningPoint(tokens=int(r["m"]), density=float(r["density"]), dense_ms=float(r["dense_ms"]),
                        sparse_ms=float(r["sparse_ms"]), ok=bool(r["ok"])) for r in rows if "error" not in r]


def decode_policy(table: tuple[tuple[int, float], ...], *, d: int, f: int,
                  base: DispatchPolicy = DEFAULT_POLICY) -> DispatchPolicy:
    """``base`` with the decode table of ``d x f`` replaced by ``table`` (the other shapes' kept)."""
    others = tuple((s, t) for s, t in base.decode_tables if s != (d, f))
    return dataclasses.replace(base, decode_tables=(*others, ((d, f), table)))


def table_text(table: tuple[tuple[int, float], ...]) -> str:
    if not any(limit > 0 for _, limit in table):
        return "  dense at every measured point (the small-batch kernels never won by the margin)"
    return "\n".join(tune_dispatch.table_lines(table, "small-batch kernels", end=DECODE_MAX_TOKENS + 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="twell tune-decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", type=parse_shape, required=True, help="HIDDENxFFN of the layer, e.g. 2048x5632")
    p.add_argument("--ms", type=int, nargs="+", default=list(DEFAULT_MS),
                   help=f"tokens per call (1 to {DECODE_MAX_TOKENS})")
    p.add_argument("--densities", type=float, nargs="+", default=list(DEFAULT_DENSITIES), help="percent active")
    tune_dispatch.add_run_args(p, "decode")
    a = p.parse_args(argv)
    if any(not 1 <= m <= DECODE_MAX_TOKENS for m in a.ms):
        p.error(f"--ms must lie in [1, {DECODE_MAX_TOKENS}] (the small-batch kernels' range), got {a.ms}")
    if any(not 0 < x <= 100 for x in a.densities):
        p.error(f"--densities must lie in (0, 100] percent, got {a.densities}")
    tune_dispatch.check_run_args(p, a)
    d, f = a.shape
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = DecodeTuneConfig(d=d, f=f, ms=tuple(sorted(set(a.ms))), densities=tuple(sorted(set(a.densities))),
                           dtype=getattr(torch, a.dtype), rep_ms=a.rep_ms, seed=a.seed)
    meta = environment(device)
    meta.update({"shape": [d, f], "device_type": device.type, "dtype": a.dtype, "ms": list(cfg.ms),
                 "densities": list(cfg.densities), "min_speedup": a.min_speedup,
                 "timing": "cuda graph" if device.type == "cuda" else "eager"})
    stem = a.stem or f"decode_{d}x{f}"
    rows = run_tuning(cfg, device, on_row=lambda rs: write_results(rs, meta, a.out, stem))
    table = derive_decode_table(points_of(rows), min_speedup=a.min_speedup, max_tokens=DECODE_MAX_TOKENS)
    paths = write_results(rows, meta, a.out, stem)
    measured = {k: meta.get(k) for k in ("device", "torch", "triton", "commit", "date_utc", "dtype", "min_speedup",
                                         "timing")}
    measured["decode_table_of"] = [d, f]
    measured["points"] = [{k: r.get(k) for k in ("m", "density", "dense_ms", "sparse_ms", "speedup", "ok")}
                          for r in rows if "error" not in r]
    paths.append(save_policy(decode_policy(table, d=d, f=f), a.out / f"{stem}_policy.json", measured=measured))
    print(f"\ndecode table for {d}x{f} on {meta.get('device', device.type)} ({a.dtype}, {meta['timing']}), "
          f"small-batch kernels where they won by >= {a.min_speedup}x:\n{table_text(table)}")
    print("python: " + repr(table))
    print("wrote " + ", ".join(str(x) for x in paths))
    return 0 if all(r.get("ok", False) for r in rows if "error" not in r) else 1
