"""``twell tune-dispatch``: where the sparse layer beats the dense one on this GPU, as a dispatch policy file.

The shipped :data:`twell.nn.DEFAULT_POLICY` holds tables measured on an H200 for twelve layer shapes
(:data:`twell.nn.H200_BF16_SHAPE_TABLES`); a shape between measured ones follows the envelope of the nearest of them
(:func:`twell.nn.bracketing_shapes`), any other GPU, dtype or shape gets the dense path until it is measured.  This
command measures it (and prints how ``DEFAULT_POLICY`` fares on the points it timed): for one layer shape it times
:class:`~twell.nn.SparseGatedMLP` held on its sparse path against the dense module (the same weights,
``DenseReluGatedMLP``), call by call interleaved, over token counts and densities of the realistic synthetic
activations (:mod:`twell.synthetic`), checks every sparse output against an fp32 reference, and derives the table
with :func:`twell.nn.dispatch_tuning.derive_table`.  It writes ``<stem>.json`` / ``.csv`` (every point) and
``<stem>_policy.json``, which :func:`twell.nn.load_policy` reads::

    twell tune-dispatch --shape 5120x13824 --out tuned
    # then, in Python:
    twell.models.set_dispatch_policy(model, twell.nn.load_policy("tuned/dispatch_5120x13824_policy.json"))

``--from`` re-derives the policy from earlier runs' ``<stem>.json`` files (another ``--min-speedup``) without
timing anything.  Given several runs of one shape, a point joins the table only where every run that measured it
won: the way to demand that a second run agree, as the shipped small-call rows do (session 30 re-derived
``H200_BF16_2048X5632_TABLE``'s rows below 1024 tokens this way from two runs)::

    twell tune-dispatch --from run_a/dispatch_2048x5632.json run_b/dispatch_2048x5632.json --out merged

``--eager`` also times every point as eager code runs it (calls issued back to back from Python, the wall clock
stopped after a synchronisation: the slower of the host's issuing and the GPU's work, where the table's timing holds
the GPU and counts its work alone) and sets the policy's ``eager_min_tokens`` to the smallest token count from which
no eager call the table sends sparse lost to dense by more than ``--eager-bar``
(:func:`twell.nn.dispatch_tuning.derive_eager_floor`).  The floor depends on the host CPU as much as on the GPU, so
it is the figure to measure on the machine that serves::

    twell tune-dispatch --shape 2048x5632 --ms 256 512 1024 2048 4096 8192 16384 --eager --out tuned
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..nn import DEFAULT_POLICY, DispatchPolicy, SparseGatedMLP
from ..nn.dispatch import dense_ffn_flops
from ..nn.dispatch_file import save_policy
from ..nn.dispatch_tuning import DEFAULT_MIN_SPEEDUP, TuningPoint, derive_eager_floor, derive_table
from ..ops.active_count import mean_active_per_token
from ..reference.inference import dense_gated_ffn
from ..synthetic import SparsityProfile, synthetic_ffn_problem
from ..tolerances import rel_error, within_tolerance
from .environment import environment
from .ffn import _rows_for
from .results import record_row, write_results
from .shape_arg import parse_shape
from .timing import eager_ms_interleaved, time_ms_interleaved

#: From one token: every shipped table starts there, since small calls win at some shapes and lose at others (session
#: 31: 16-64 tokens sparse to 1-2 % at 2048 x 8192 and 1536 x 8960, dense at 2048 x 5632).  Session 31's runs of 13
#: token counts (these without 2, 4 and 8) at 6 densities took 65-107 s each on the H200 (the largest shape,
#: 4096 x 11008, 86 / 97 s), so the default 9 densities should take about half as long again.  2, 4 and 8 tokens since
#: session 35: where one token wins and 16 lose, the calls between take 16's answer (dispatch_tuning's rule) unless
#: they were timed, and their points are the cheapest of the run.
DEFAULT_MS = (1, 2, 4, 8, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_DENSITIES = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0)
#: Tokens of a point whose outputs are checked against the fp32 reference (its fp32 hidden state for all
#: 131072 tokens at 4096 x 14336 alone would take 7.5 GB).
CHECK_TOKENS = 4096


@dataclass
class TuneConfig:
    d: int
    f: int
    ms: tuple[int, ...] = DEFAULT_MS
    densities: tuple[float, ...] = DEFAULT_DENSITIES
    dtype: torch.dtype = torch.bfloat16
    backend: str = "auto"
    rep_ms: float = 100.0
    seed: int = 0
    eager: bool = False  # also time each point's eager calls (eager_ms_interleaved)
    # the position profile of the synthetic activations (SparsityProfile's defaults: 4x at position 0, decaying
    # over 32 positions); the 1.5B benchmark model's layers fire 360-830 units at their first 8 positions against a
    # mean of 14-42 (bench_results/h100/model_forward_recorded_b2_session48.json, ``layers``), a steeper and shorter
    # head: --early-boost 40 --early-decay 4 gives ~17x at 0.5 % (the first 8 positions over the rest)
    early_boost: float = SparsityProfile.early_boost
    early_decay: float = SparsityProfile.early_decay


def measure_point(problem: dict[str, torch.Tensor], x: torch.Tensor, density_pct: float, cfg: TuneConfig,
                  device: torch.device) -> dict:
    """One point: the sparse and the dense module on ``x``, timed interleaved; the sparse output checked."""
    wg, wu, wd = problem["w_gate"], problem["w_up"], problem["w_down"]
    m = x.shape[0]
    # eager_graphs=0: the tables are measured on the kernels, not on replays of recorded calls
    sparse = SparseGatedMLP.from_weights(wg, wu, wd, backend=cfg.backend, policy=DispatchPolicy.always_sparse(),
                                         eager_graphs=0).eval()
    dense = sparse.to_dense().eval()
    row: dict = {"d": cfg.d, "f": cfg.f, "m": m, "density_pct": density_pct}
    with torch.no_grad():
        row["l0"] = float(mean_active_per_token(torch.relu(F.linear(x, wg))))  # the layer's own l0 measure
        row["density"] = row["l0"] / cfg.f
        out = sparse(x)
        n = min(m, CHECK_TOKENS)
        ref = dense_gated_ffn(x[:n].float(), wg.float(), wu.float(), wd.float(), precision="fp32")
        row["rel_err"] = rel_error(out[:n], ref)
        row["dense_rel_err"] = rel_error(dense(x[:n]), ref)  # the dense module's own rounding, same tokens
        row["ok"] = within_tolerance(row["rel_err"], cfg.dtype, row["dense_rel_err"])
        row["sparse_path"] = sparse._path(m, device.type)  # "sparse" unless the layer refused the policy
        del out, ref
        groups: dict[str, list[float]] = {}
        ms = time_ms_interleaved({"dense": lambda: dense(x), "sparse": lambda: sparse(x)}, device=device,
                                 rep_ms=cfg.rep_ms, samples_out=groups)
    for name in ("dense", "sparse"):
        row[f"{name}_ms"] = ms[name]
        row[f"{name}_rounds_ms"] = groups[name]
    row["speedup"] = ms["dense"] / ms["sparse"]
    if cfg.eager:
        with torch.no_grad():
            eager = eager_ms_interleaved({"dense": lambda: dense(x), "sparse": lambda: sparse(x)}, device=device,
                                         rep_ms=cfg.rep_ms)
        row["eager_dense_ms"], row["eager_sparse_ms"] = eager["dense"], eager["sparse"]
        row["eager_speedup"] = eager["dense"] / eager["sparse"]
    return row


def run_tuning(cfg: TuneConfig, device: torch.device, log=print, on_row=None, *, measure=None, fmt=None) -> list[dict]:
    """Every (token count, density) point of ``cfg``; rows as ``measure`` (default :func:`measure_point`) returns
    them, each logged as ``fmt`` (default :func:`format_row`) writes it.  ``twell tune-decode`` runs its own."""
    measure, fmt = measure or measure_point, fmt or format_row
    rows: list[dict] = []
    for dens in cfg.densities:
        gen = torch.Generator(device=device)
        gen.manual_seed(cfg.seed)
        profile = SparsityProfile(mean_l0=dens / 100 * cfg.f, early_boost=cfg.early_boost, early_decay=cfg.early_decay)
        # at least one whole sequence, so that a call of fewer tokens samples every position, not the
        # first ones (which fire several times more units: SparsityProfile.early_boost)
        n_tokens = max(max(cfg.ms), profile.seq_len)
        try:
            problem = synthetic_ffn_problem(n_tokens, cfg.d, cfg.f, profile, generator=gen, dtype=cfg.dtype,
                                            device=device)
        except ValueError as exc:  # a density the profile cannot reach (e.g. a boost above the live units): said
            for m in cfg.ms:
                row = {"d": cfg.d, "f": cfg.f, "m": m, "density_pct": dens, "error": f"profile: {exc}"}
                record_row(rows, row, fmt(row), log=log, on_row=on_row, device=device)
            continue
        for m in cfg.ms:
            try:
                x = _rows_for(problem["x"], m, profile.seq_len, gen)  # random positions below a sequence
                row = measure(problem, x, dens, cfg, device)
            except torch.OutOfMemoryError:
                row = {"d": cfg.d, "f": cfg.f, "m": m, "density_pct": dens, "error": "out of memory"}
            record_row(rows, row, fmt(row), log=log, on_row=on_row, device=device)
        del problem
    return rows


def format_row(r: dict) -> str:
    head = f"{r['d']}x{r['f']} M={r['m']:7d} density {r['density_pct']:5.2f}%"
    if "error" in r:
        return f"{head}  ERROR {r['error']}"
    eager = (f"; eager {r['eager_dense_ms']:8.3f} / {r['eager_sparse_ms']:8.3f} ms: {r['eager_speedup']:5.2f}x"
             if "eager_speedup" in r else "")
    return (f"{head} l0={r['l0']:7.1f} dense {r['dense_ms']:8.3f} ms, sparse ({r['sparse_path']}) "
            f"{r['sparse_ms']:8.3f} ms: {r['speedup']:5.2f}x  err {r['rel_err']:.1e} {'ok' if r['ok'] else 'WRONG'}"
            f"{eager}")


def points_of(rows: list[dict]) -> list[TuningPoint]:
    """The timed rows as :class:`TuningPoint`, one per (token count, target density): where several runs (``--from``)
    measured a point, it wins only if every run's row won there.  Each run draws its own activations, so their
    densities at one target differ a little (at 16 tokens and 5 %: 5.12 % in one of session 31's runs, more in the
    other); the point takes the highest of them and the lowest speedup, and counts as wrong if any run's output was.
    Rows with an error (out of memory) measured nothing and are left out."""
    groups: dict[tuple[int, float], list[dict]] = {}
    for r in rows:
        if "error" in r:
            continue
        target = float(r["density_pct"]) if "density_pct" in r else float(r["density"]) * 100
        groups.setdefault((int(r["m"]), target), []).append(r)
    pts = []
    for (m, _), group in sorted(groups.items()):
        worst = min(group, key=lambda r: float(r["dense_ms"]) / float(r["sparse_ms"]))
        pts.append(TuningPoint(tokens=m, density=max(float(r["density"]) for r in group),
                               dense_ms=float(worst["dense_ms"]), sparse_ms=float(worst["sparse_ms"]),
                               ok=all(bool(r["ok"]) and r.get("sparse_path") == "sparse" for r in group)))
    return pts


def policy_of(rows: list[dict], *, d: int, f: int, device_type: str, min_speedup: float,
              capability: str | None = None) -> DispatchPolicy:
    """The dispatch policy the rows support for a ``d x f`` layer on ``device_type``; ``capability`` (the CUDA
    device's, ``"major.minor"`` as the run's meta holds it) limits it to GPUs of that compute capability."""
    table = derive_table(points_of(rows), min_speedup=min_speedup)
    caps = None if capability is None else (tuple(int(v) for v in capability.split(".")),)
    return DispatchPolicy(table=table, device_types=(device_type,), shapes=((d, f),), capabilities=caps)


def eager_outcomes(rows: list[dict], policy: DispatchPolicy, *, d: int, f: int, bar: float
                   ) -> list[tuple[int, bool]] | None:
    """``(tokens, lost)`` for every row of a ``d x f`` layer timed eagerly: lost where ``policy``'s table (on its
    device type, whatever floor the policy holds) sends the point sparse and its eager speedup fell below ``bar``.
    None when no row was timed eagerly (a run without ``--eager``)."""
    timed = [r for r in rows if "error" not in r and "eager_dense_ms" in r]
    if not timed:
        return None
    device_type = policy.device_types[0] if policy.device_types else "cuda"
    return [  # use_sparse's default eager=False: the table alone, whatever floor the policy holds
        (int(r["m"]), policy.use_sparse(int(r["m"]), min(1.0, float(r["density"])), shape=(d, f),
                                        device_type=device_type)
         and float(r["eager_dense_ms"]) < bar * float(r["eager_sparse_ms"]))
        for r in timed]


def eager_floor_of(rows: list[dict], policy: DispatchPolicy, *, d: int, f: int, bar: float) -> int | None:
    """The ``eager_min_tokens`` the rows' eager timings support for ``policy`` at a ``d x f`` layer
    (:func:`eager_outcomes`, :func:`twell.nn.dispatch_tuning.derive_eager_floor`; with several runs, a count loses if
    any run's point did).  None when no row was timed eagerly."""
    outcomes = eager_outcomes(rows, policy, d=d, f=f, bar=bar)
    return None if outcomes is None else derive_eager_floor(outcomes)


def policy_check(rows: list[dict], policy: DispatchPolicy, *, d: int, f: int) -> dict:
    """How ``policy`` fares on these rows of a ``d x f`` layer (on CUDA): the points (:func:`points_of`: with several
    runs, each point's worst speedup at its highest drawn density), how many of them it sends sparse, the lowest
    speedup among those, and every one of them that lost (speedup < 1) or was wrong."""
    pts = points_of(rows)
    sparse = [p for p in pts if policy.use_sparse(p.tokens, min(1.0, p.density), shape=(d, f))]
    worst = min(sparse, key=lambda p: p.dense_ms / p.sparse_ms, default=None)
    return {
        "points": len(pts), "sparse_points": len(sparse),
        "won_points": sum(p.ok and p.dense_ms >= DEFAULT_MIN_SPEEDUP * p.sparse_ms for p in pts),
        "lowest_speedup": None if worst is None else worst.dense_ms / worst.sparse_ms,
        "lowest_at": None if worst is None else {"m": worst.tokens, "density": worst.density},
        "losses": [{"m": p.tokens, "density": p.density, "speedup": p.dense_ms / p.sparse_ms, "ok": p.ok}
                   for p in sparse if p.dense_ms < p.sparse_ms or not p.ok],
    }


def default_policy_check(rows: list[dict], *, d: int, f: int) -> dict:
    """:func:`policy_check` of the shipped policy (:data:`twell.nn.DEFAULT_POLICY`, H200 tables), with the rule it
    applies to the shape: ``"own table"``, ``"envelope"`` of the measured shapes around it (named under ``"bracket"``),
    or ``"dense"``.  A held-out shape's runs check the envelope this way."""
    shape = (d, f)
    rule = ("own table" if DEFAULT_POLICY.shapes is not None and shape in DEFAULT_POLICY.shapes
            else "envelope" if DEFAULT_POLICY.follows_envelope(shape) else "dense")
    bracket = [list(s) for s in DEFAULT_POLICY.envelope_shapes(shape)]
    return {"rule": rule, "bracket": bracket, **policy_check(rows, DEFAULT_POLICY, d=d, f=f)}


def default_policy_text(check: dict, *, d: int, f: int) -> str:
    around = ", ".join(f"{bh}x{bf}" for bh, bf in check["bracket"])
    rule = {"own table": "its own measured table",
            "envelope": f"the envelope of the measured shapes around it ({around})",
            "dense": "dense (no measured shapes around it)"}[check["rule"]]
    head = (f"DEFAULT_POLICY (H200 tables) at {d}x{f}: {rule}; {check['sparse_points']} of {check['points']} points "
            "sparse")
    if check["lowest_speedup"] is not None:
        at = check["lowest_at"]
        head += f", lowest {check['lowest_speedup']:.2f}x (M={at['m']}, density {at['density'] * 100:.2f} %)"
    losses = ", ".join(f"M={x['m']} {x['density'] * 100:.2f} %: {x['speedup']:.2f}x{'' if x['ok'] else ' WRONG'}"
                       for x in check["losses"])
    return f"{head}; losses: {losses or 'none'}"


def table_lines(table: tuple[tuple[int, float], ...], what: str, *, prefix: str = "",
                end: int | None = None) -> list[str]:
    """One line per row of a dispatch table, ``"  {prefix}{span}: {what} when density <= x %"`` (or ``": dense"``); the
    last row's span runs up to ``end`` (exclusive) when given, else without bound.  The tuning commands print these."""
    bounds = [m for m, _ in table[1:]] + [end]
    lines = []
    for (m, dens), nxt in zip(table, bounds, strict=True):
        span = f"{m} <= M < {nxt}" if nxt is not None else f"M >= {m}"
        lines.append(f"  {prefix}{span}: {what} when density <= {dens * 100:.3g} %" if dens > 0
                     else f"  {prefix}{span}: dense")
    return lines


def eager_floor_text(floor: int, bar: float, *, d: int, f: int) -> str:
    """The measured eager floor in words, with the shipped default's at this shape (``DEFAULT_POLICY``'s
    ``eager_min_flops``, in tokens) and the measured one in the same work units, so that the two compare."""
    if floor == 0:
        head = f"eager calls: none the table sends sparse fell below {bar:g}x of dense; no floor (eager_min_tokens=0)"
    else:
        head = (f"eager calls: one the table sends sparse fell below {bar:g}x of dense under {floor} tokens; "
                f"eager_min_tokens={floor} (eager calls of fewer tokens run dense, and calls compiled outside "
                f"static_dispatch; graphed calls and calls inside static_dispatch keep the "
                f"table); in dense FFN work 6 x {floor} x {d} x {f} = {dense_ffn_flops(floor, (d, f)):.3g} FLOPs")
    shipped = DEFAULT_POLICY.eager_floor_tokens((d, f))
    return (f"{head}\nthe default policy's eager floor at {d}x{f}: {shipped} tokens "
            f"(eager_min_flops {DEFAULT_POLICY.eager_min_flops:.3g}, from layer and model runs on the H100 and H200 "
            "machines' hosts)")


def table_text(policy: DispatchPolicy) -> str:
    if not policy.table:
        return "dense at every measured point (the sparse path never won by the margin)"
    return "\n".join(table_lines(policy.table, "sparse"))


def _load_runs(paths: list[Path], parser: argparse.ArgumentParser) -> tuple[list[dict], dict, tuple[int, int], str]:
    """The rows of earlier runs (``--from``) together, the first run's meta (with every run's file and commit under
    ``runs``, and the compute capability of those that name one), their shape and device type; a file that is not a run,
    or runs of different shapes, device types or compute capabilities, end the command with the reason."""
    rows: list[dict] = []
    meta: dict = {}
    runs = []
    first: tuple[tuple[int, int], str, Path] | None = None
    for path in paths:
        try:
            data = json.loads(path.read_text())
            run_rows, run_meta = list(data["rows"]), dict(data["meta"])
            d, f = (int(v) for v in run_meta["shape"])  # a shape of other than two sizes: ValueError
            shape, device_type = (d, f), str(run_meta["device_type"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"--from {path}: not a twell tune-dispatch run ({type(exc).__name__}: {exc}); it must be "
                         "the <stem>.json an earlier run wrote, with rows and meta.shape / meta.device_type")
        if first is None:
            meta, first = run_meta, (shape, device_type, path)
        elif (shape, device_type) != first[:2]:
            parser.error(f"--from: {path} measured {shape[0]}x{shape[1]} on {device_type}, {first[2]} "
                         f"{first[0][0]}x{first[0][1]} on {first[1]}; one policy needs runs of one shape and device")
        cap = run_meta.get("capability")  # older runs may not say
        if cap is not None:
            if meta.get("capability") not in (None, cap):
                parser.error(f"--from: {path} ran on compute capability {cap}, an earlier run on "
                             f"{meta['capability']}; one policy needs runs of one kind of GPU")
            meta["capability"] = cap
        rows += run_rows
        runs.append({"file": str(path), "commit": run_meta.get("commit"), "date_utc": run_meta.get("date_utc")})
    assert first is not None  # argparse's nargs="+" gives at least one path
    meta["runs"] = runs
    return rows, meta, first[0], first[1]


def add_run_args(p: argparse.ArgumentParser, stem: str) -> None:
    """The options ``twell tune-dispatch`` and ``twell tune-decode`` share: dtype, timing, margin, seed, output."""
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--rep-ms", type=float, default=100.0, help="timed ms per path and point")
    p.add_argument("--min-speedup", type=float, default=DEFAULT_MIN_SPEEDUP,
                   help="a point counts as a win from this speedup over dense (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("twell-tuning"))
    p.add_argument("--stem", default=None, help=f"file name stem (default: {stem}_<shape>)")


def check_run_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """End the command with the reason where :func:`add_run_args`' options are out of range."""
    if a.min_speedup < 1.0:
        p.error(f"--min-speedup must be >= 1 (got {a.min_speedup}): a path is never chosen where it is slower")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="twell tune-dispatch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", type=parse_shape, default=None, help="HIDDENxFFN of the layer, e.g. 5120x13824")
    p.add_argument("--ms", type=int, nargs="+", default=list(DEFAULT_MS), help="token counts per call")
    p.add_argument("--densities", type=float, nargs="+", default=list(DEFAULT_DENSITIES), help="percent active")
    p.add_argument("--backend", choices=["auto", "torch", "triton"], default="auto")
    p.add_argument("--eager", action="store_true",
                   help="also time each point's eager calls (back to back, wall clock) and set the policy's "
                        "eager_min_tokens from them")
    p.add_argument("--eager-bar", type=float, default=1.0,
                   help="an eager call sent sparse loses below this speedup over dense (default %(default)s)")
    p.add_argument("--early-boost", type=float, default=SparsityProfile.early_boost,
                   help="position 0's non-zeros over the sequence mean (default %(default)s; 1: no position effect)")
    p.add_argument("--early-decay", type=float, default=SparsityProfile.early_decay,
                   help="positions over which that boost decays by a factor e (default %(default)s)")
    add_run_args(p, "dispatch")
    p.add_argument("--from", dest="from_json", type=Path, nargs="+", default=None,
                   help="derive the policy from these earlier runs' JSON instead of timing (several runs of one "
                        "shape: a point counts only where every run that measured it won)")
    a = p.parse_args(argv)
    check_run_args(p, a)
    if not 0 < a.eager_bar <= 2:
        p.error(f"--eager-bar must lie in (0, 2] (a speedup over dense; 1: never slower), got {a.eager_bar}")
    if a.from_json is not None:
        rows, meta, (d, f), device_type = _load_runs(a.from_json, p)
    else:
        if a.shape is None:
            p.error("--shape is required (unless --from names an earlier run)")
        if any(m < 1 for m in a.ms) or any(not 0 < x <= 100 for x in a.densities):
            p.error("--ms must be >= 1 and --densities in (0, 100]")
        d, f = a.shape
        try:  # the profile's own checks, before any GPU time: e.g. a boost the sequence cannot carry
            SparsityProfile(mean_l0=1.0, early_boost=a.early_boost, early_decay=a.early_decay)
        except ValueError as exc:
            p.error(f"--early-boost / --early-decay: {exc}")
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device_type = device.type
        cfg = TuneConfig(d=d, f=f, ms=tuple(sorted(set(a.ms))), densities=tuple(sorted(set(a.densities))),
                         dtype=getattr(torch, a.dtype), backend=a.backend, rep_ms=a.rep_ms, seed=a.seed,
                         eager=a.eager, early_boost=a.early_boost, early_decay=a.early_decay)
        meta = environment(device)
        meta.update({"shape": [d, f], "device_type": device_type, "dtype": a.dtype, "ms": list(cfg.ms),
                     "densities": list(cfg.densities), "early_boost": cfg.early_boost, "early_decay": cfg.early_decay})
    stem = a.stem or f"dispatch_{d}x{f}"
    if a.from_json is None:
        rows = run_tuning(cfg, device, on_row=lambda rs: write_results(rs, meta, a.out, stem))
    meta["min_speedup"] = a.min_speedup
    # held to the compute capability it was measured on (runs written before session 37 may not say: any)
    policy = policy_of(rows, d=d, f=f, device_type=device_type, min_speedup=a.min_speedup,
                       capability=meta.get("capability") if device_type == "cuda" else None)
    floor = eager_floor_of(rows, policy, d=d, f=f, bar=a.eager_bar)
    if floor is not None:
        meta["eager_bar"] = a.eager_bar
        policy = dataclasses.replace(policy, eager_min_tokens=floor)
    paths = write_results(rows, meta, a.out, stem) if a.from_json is None else []
    measured = {k: meta.get(k) for k in ("device", "torch", "triton", "commit", "date_utc", "dtype", "min_speedup")}
    if "eager_bar" in meta:
        measured["eager_bar"] = meta["eager_bar"]
    if "runs" in meta:  # --from: which runs the points came from
        measured["runs"] = meta["runs"]
    keys = ("m", "density", "dense_ms", "sparse_ms", "speedup", "ok", "eager_dense_ms", "eager_sparse_ms")
    measured["points"] = [{k: r[k] for k in keys if k in r} for r in rows if "error" not in r]
    check = default_policy_check(rows, d=d, f=f)
    measured["default_policy"] = check
    paths.append(save_policy(policy, a.out / f"{stem}_policy.json", measured=measured))
    print(f"\ndispatch for {d}x{f} on {meta.get('device', device_type)} ({meta.get('dtype')}), "
          f"sparse where it won by >= {a.min_speedup}x:\n{table_text(policy)}")
    if floor is not None:
        print(eager_floor_text(floor, a.eager_bar, d=d, f=f))
    print(default_policy_text(check, d=d, f=f))
    print("wrote " + ", ".join(str(x) for x in paths))
    return 0 if all(r.get("ok", False) for r in rows if "error" not in r) else 1
