"""``twell bench train-ffn``: forward+backward of the ReLU-gated FFN with L1, dense autograd vs the Triton op.

Per point (token count M, target density) it runs three paths on the same inputs, in one process:

* ``dense``: dense autograd with ``F.linear`` in the input dtype, ReLU gate and the published L1 term
  ``sum |h| / M`` (:func:`twell.nn.train_dispatch.dense_train_ffn_l1`, without the l0 count): what
  ordinary bf16 training runs, the baseline of every ratio;
* ``sparse``: the Triton training op :func:`twell.ops.twell_gated_ffn_l1`;
* ``auto``: what ``SparseGatedMLP(train_impl="auto")`` runs, its per-layer switch included (one
  warm-up call first, as a layer's first call measures l0; ``auto_path`` says what it chose);
* ``hotcold`` (with ``--sparse-impl hot-cold`` or ``both``): the hot/cold training op
  :func:`twell.ops.hot_cold_training.twell_gated_ffn_l1_hot_cold`, its hot set chosen once per point
  from a 4096-token sample as a layer would cache it (``hotcold_n_hot``, ``hotcold_width``,
  ``hotcold_cold_l0``); the per-call hot-row gathers are timed.  ``--sparse-impl hot-cold`` leaves the
  v1 op out (it takes seconds per call at 5 % and above).  With either, the sweep also writes
  ``<stem>_train_policy.json``: the training dispatch table the hot/cold column supports on this GPU
  (:mod:`twell.bench.train_ffn_policy`), which :func:`twell.nn.load_train_policy` reads and
  :func:`twell.models.set_train_dispatch_policy` gives a model's layers.

For each: forward+backward median ms (``triton.testing.do_bench``, the paths of a point in interleaved
rounds: :func:`_time_paths`; calls slower than :data:`SLOW_CALL_MS` are timed from a few single calls
instead), the speedup over dense, the peak
extra memory (``max_memory_allocated`` during one forward+backward minus ``memory_allocated`` before
it: inputs, weights and the upstream gradient excluded, outputs and gradients included; MB = 2**20
bytes) and its reduction vs dense in %, the relative errors of out, dX, dWg, dWu, dWd and l1 against a
float64 dense autograd reference computed on the same device, bitwise determinism (a second run
compared with the first, every output and gradient) and an ``ok`` flag (errors within
:mod:`twell.tolerances` and deterministic).  The l0 reported is the sparse op's own l0 output.

The backward gets ``grad_out ~ N(0, 1)`` and ``grad_l1 = L1_GRAD_SCALE * M``: the L1 term of dh is
then ``0.5 * sign(h)``, the size of the ``grad_out Wd`` term (~sqrt(d / F)), so the check covers both.

A point (or one path of it) that raises — out of memory, a kernel error — is recorded with its error
message and the sweep goes on.  Rows are written (JSON + CSV) after every point.  Two guards keep the
run bounded when the sparse path is slow (at high density most rows overflow the row-ELL width and
take the exact dense fallback): the sparse path of a point is skipped when the previous M of the same
density projects one call above ``--max-call-s``, and a point is skipped when the sweep's elapsed
time plus its projected time would pass ``--budget-s``.  Skips are recorded as such.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..nn import SparseGatedMLP
from ..nn.dispatch_tuning import DEFAULT_MIN_SPEEDUP
from ..nn.train_dispatch import TrainDispatchPolicy, dense_train_ffn_l1
from ..nn.train_dispatch_file import save_train_policy
from ..ops._runtime import cuda_capability
from ..ops.hot_cold_training import HotUnits, choose_training_hot_units, default_width, twell_gated_ffn_l1_hot_cold
from ..ops.training import DEFAULT_WIDTH, default_token_splits, twell_gated_ffn_l1
from ..reference.training import dense_gated_ffn_l1
from ..synthetic import SparsityProfile, synthetic_ffn_problem
from ..tolerances import REL_TOL, REL_TOL_GRAD
from .environment import environment
from .ffn import _rows_for
from .results import plot_speedup, write_results
from .shape_arg import parse_shape
from .timing import time_ms, time_ms_interleaved
from .train_ffn_policy import train_policy_of, train_table_text

DEFAULT_MS = (4096, 16384, 65536, 131072)
DEFAULT_DENSITIES = (0.5, 1.0, 2.0, 5.0, 10.0)
DEFAULT_SHAPE = (2048, 5632)
QUICK_MS = (4096, 16384)
QUICK_DENSITIES = (0.5, 2.0)
PATHS = ("dense", "sparse", "auto", "hotcold")
#: ``--sparse-impl`` choices: which sparse op(s) a point measures besides dense and auto.
SPARSE_IMPLS = ("v1", "hot-cold", "both")
#: Compared against the float64 reference: the output, the L1 term and the four input gradients.
CHECKED = ("out", "l1", "dx", "dwg", "dwu", "dwd")
#: ``grad_l1 = L1_GRAD_SCALE * M`` (module docstring).
L1_GRAD_SCALE = 0.5
#: A forward+backward slower than this (ms) is timed from single calls, not the interleaved timing (which
#: runs each path at least 3 + TIMING_ROUNDS times); at M=131072 the dense path takes ~40 ms, so only
#: slow sparse points take this branch.
SLOW_CALL_MS = 250.0
#: Groups the interleaved per-call times of a point are reported in (``*_rounds_ms``, see :func:`_time_paths`).
TIMING_ROUNDS = 3

Result = dict[str, torch.Tensor | None]
Step = Callable[[], Result]


@dataclass
class TrainFfnSweep:
    shapes: tuple[tuple[int, int], ...] = (DEFAULT_SHAPE,)
    ms: tuple[int, ...] = DEFAULT_MS
    densities: tuple[float, ...] = DEFAULT_DENSITIES
    dtype: torch.dtype = torch.bfloat16
    seed: int = 0
    rep_ms: float = 100.0
    warmup_ms: float = 25.0
    width: int | None = None
    token_splits: int | None = None
    budget_s: float = 180.0
    max_call_s: float = 10.0
    train_policy: TrainDispatchPolicy | None = None  # of the "auto" path; None: the library default
    sparse_impl: str = "v1"  # SPARSE_IMPLS
    compiled: bool = False  # also time dense and hot/cold under torch.compile (CUDA graphs on CUDA)
    tags: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------- one path
def _result(out: torch.Tensor, l1: torch.Tensor, l0: torch.Tensor | None, grads: tuple) -> Result:
    res: Result = {"out": out.detach(), "l1": l1.detach(), "l0": None if l0 is None else l0.detach()}
    res.update(zip(("dx", "dwg", "dwu", "dwd"), grads, strict=True))
    return res


def _dense_step(x: torch.Tensor, ws: tuple, gout: torch.Tensor, gl1: torch.Tensor) -> Result:
    out, l1, _ = dense_train_ffn_l1(x, *ws, with_l0=False)
    return _result(out, l1, None, torch.autograd.grad((out, l1), (x, *ws), (gout, gl1)))


def _sparse_step(x: torch.Tensor, ws: tuple, gout: torch.Tensor, gl1: torch.Tensor, cfg: TrainFfnSweep) -> Result:
    out, l1, l0 = twell_gated_ffn_l1(x, *ws, width=cfg.width, token_splits=cfg.token_splits)
    return _result(out, l1, l0, torch.autograd.grad((out, l1), (x, *ws), (gout, gl1)))


def _hotcold_step(x: torch.Tensor, ws: tuple, gout: torch.Tensor, gl1: torch.Tensor, hot: HotUnits) -> Result:
    out, l1, l0 = twell_gated_ffn_l1_hot_cold(x, *ws, hot)
    return _result(out, l1, l0, torch.autograd.grad((out, l1), (x, *ws), (gout, gl1)))


def _auto_step(mlp: SparseGatedMLP, x: torch.Tensor, gout: torch.Tensor, gl1: torch.Tensor) -> Result:
    out = mlp(x)
    l1 = mlp.l1_loss()
    return _result(out, l1, mlp.last_l0, torch.autograd.grad((out, l1), (x, *mlp.parameters()), (gout, gl1)))


def _reference(x: torch.Tensor, ws: tuple, gout: torch.Tensor, grad_l1: float) -> Result:
    """float64 dense autograd of the oracle's dense twin on the same (rounded) inputs, on their device."""
    x64, *w64 = (t.detach().double().requires_grad_(True) for t in (x, *ws))
    out, l1, l0 = dense_gated_ffn_l1(x64, *w64)
    gl1 = torch.tensor(grad_l1, dtype=torch.float64, device=x.device)
    return _result(out, l1, l0, torch.autograd.grad((out, l1), (x64, *w64), (gout.double(), gl1)))


def _run_once(fn: Step, device: torch.device) -> tuple[Result, float, float | None]:
    """One call: its result, its ms and its peak extra memory in MB (None off CUDA)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        res = fn()
        return res, (time.perf_counter() - t0) * 1e3, None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    res = fn()
    end.record()
    torch.cuda.synchronize(device)
    return res, start.elapsed_time(end), (torch.cuda.max_memory_allocated(device) - base) / 2**20


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64 on the tensors' device (no 2 GB copies to the host at
    M=131072, unlike :func:`twell.tolerances.rel_error`); NaN in ``out`` gives inf."""
    r = ref.detach().to(torch.float64)
    num = float(torch.linalg.vector_norm(out.detach().to(torch.float64) - r))
    den = float(torch.linalg.vector_norm(r))
    if math.isnan(num):
        return math.inf
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bitwise_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        view = _INT_VIEW[a.element_size()]
        a, b = a.contiguous().view(view), b.contiguous().view(view)
    return bool(torch.equal(a, b))


def _time_paths(timed: dict[str, tuple[Step, float]], row: dict, cfg: TrainFfnSweep, device: torch.device) -> None:
    """``row[name + "_ms"]`` (median ms per call) and ``row[name + "_timing"]`` for every measured path.

    The fast paths are timed interleaved call by call (:func:`time_ms_interleaved`; the per-call times
    also kept as the medians of :data:`TIMING_ROUNDS` consecutive groups), so that a drift of the GPU's
    clocks over the point (the power-limited H200 warms up under the float64 reference and the paths
    before) lands on every path alike: timed one after the other, the last path could read slow against
    the first (in bench_results/h200/train_ffn_hotcold_sweep*.json, timed one after the other, the
    switch's dense path, last, read 0.82-0.93x of dense, first, though it adds only an l0 count).
    Calls slower than :data:`SLOW_CALL_MS` are timed from a few single calls instead.
    """
    fast = {name: fn for name, (fn, call_ms) in timed.items() if call_ms <= SLOW_CALL_MS}
    n_rounds = TIMING_ROUNDS if len(fast) > 1 else 1
    how = "CUDA events after an L2 flush" if device.type == "cuda" else "host clock"
    per_round: dict[str, list[float]] = {}
    for name, ms in time_ms_interleaved(fast, device=device, warmup_ms=cfg.warmup_ms, rep_ms=cfg.rep_ms,
                                        rounds=TIMING_ROUNDS, samples_out=per_round).items():
        row[f"{name}_ms"] = ms
        row[f"{name}_rounds_ms"] = per_round[name]
        row[f"{name}_timing"] = how if n_rounds == 1 else f"{how}, calls interleaved with {len(fast) - 1} other paths"
    for name, (fn, call_ms) in timed.items():
        if name in fast:
            continue
        samples = [call_ms]
        while sum(samples) < cfg.rep_ms and len(samples) < 3:
            samples.append(_run_once(fn, device)[1])
        row[f"{name}_ms"] = statistics.median(samples)
        row[f"{name}_timing"] = f"{len(samples)} call{'s' if len(samples) > 1 else ''}"


def _time_compiled(x: torch.Tensor, ws: tuple, gout: torch.Tensor, gl1: torch.Tensor, hot: HotUnits | None,
                   row: dict, cfg: TrainFfnSweep, device: torch.device) -> None:
    """``row["dense_compiled_ms"]`` and ``row["hotcold_compiled_ms"]``: the same forward+backward with the
    forward under torch.compile, ``mode="reduce-overhead"`` on CUDA (inductor with CUDA graphs: the host's
    per-call launch and Python time leave the step, for dense and sparse alike; the hot/cold op is a
    custom op there), ``backend="aot_eager"`` elsewhere (tests)."""
    options: dict = {"mode": "reduce-overhead"} if device.type == "cuda" else {"backend": "aot_eager"}
    forwards: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
        "dense": lambda xi, *wi: dense_train_ffn_l1(xi, *wi, with_l0=False)[:2]}
    if hot is not None:
        forwards["hotcold"] = lambda xi, *wi: twell_gated_ffn_l1_hot_cold(xi, *wi, hot)[:2]
    for name, forward in forwards.items():
        torch._dynamo.reset()  # shapes change per point: without a reset the recompilations hit dynamo's limit
        compiled = torch.compile(forward, **options)

        def step(compiled: Callable[..., tuple[torch.Tensor, torch.Tensor]] = compiled) -> None:
            out, l1 = compiled(x, *ws)
            torch.autograd.grad((out, l1), (x, *ws), (gout, gl1))

        for _ in range(3):  # compilation, then the CUDA graphs' recording
            step()
        row[f"{name}_compiled_ms"] = time_ms(step, device=device, warmup_ms=cfg.warmup_ms, rep_ms=cfg.rep_ms)
    if "hotcold_compiled_ms" in row:
        row["hotcold_compiled_speedup"] = row["dense_compiled_ms"] / row["hotcold_compiled_ms"]


def _measure(name: str, fn: Step, ref: Result | None, row: dict, cfg: TrainFfnSweep, device: torch.device,
             timed: dict[str, tuple[Step, float]]) -> None:
    """Memory, errors and determinism (two runs): fills ``row[name + "_*"]`` and queues ``fn`` in ``timed``
    for :func:`_time_paths`.

    ``{name}_first_call_ms`` (the first run: Triton compilation, allocator growth) and ``{name}_call_ms``
    (the second) let the sweep project the next point's time without the one-off costs.
    """
    res1, row[f"{name}_first_call_ms"], mem = _run_once(fn, device)
    row[f"{name}_mem_mb"] = mem
    if name != "dense" and res1["l0"] is not None:
        row[f"{name}_l0"] = float(res1["l0"])
    ok: bool | None = None
    if ref is not None:
        ok = True
        for key in CHECKED:
            err = _rel_err(res1[key], ref[key])  # type: ignore[arg-type]
            row[f"{name}_err_{key}"] = err
            tol = (REL_TOL if key in ("out", "l1") else REL_TOL_GRAD)[cfg.dtype]
            ok = ok and err <= tol
    res2, call_ms, _ = _run_once(fn, device)
    row[f"{name}_call_ms"] = call_ms
    det = all(_bitwise_equal(res1[k], res2[k]) for k in res1)
    row[f"{name}_deterministic"] = det
    row[f"{name}_ok"] = None if ok is None else bool(ok and det)
    del res1, res2
    timed[name] = (fn, call_ms)


def _guard(row: dict, key: str, device: torch.device, log: Callable[[str], None], fn: Callable[[], object]) -> object:
    """Run ``fn``; an exception (OOM, kernel or launch error) is recorded as ``row[key + "_error"]``."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - recorded, and the sweep goes on
        row[f"{key}_error"] = _describe(exc)
        log(f"  {key} failed: {row[f'{key}_error']}")
    _free(device)  # after an OOM, hand the failed run's blocks back before the next path
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"


# ---------------------------------------------------------------------------------------- one point
def run_point(
    x_rows: torch.Tensor,
    gout_rows: torch.Tensor,
    problem: dict[str, torch.Tensor],
    density_pct: float,
    cfg: TrainFfnSweep,
    device: torch.device,
    *,
    skip_sparse: str | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    m, d = x_rows.shape
    f = problem["w_gate"].shape[0]
    width = min(f, cfg.width or DEFAULT_WIDTH)
    row: dict = {"d": d, "f": f, "m": m, "density_pct": density_pct, "target_l0": density_pct / 100 * f,
                 "dtype": str(cfg.dtype).replace("torch.", ""), "width": width,
                 "token_splits": cfg.token_splits or default_token_splits(m)}
    x = x_rows.detach().requires_grad_(True)
    ws = tuple(problem[k].detach().requires_grad_(True) for k in ("w_gate", "w_up", "w_down"))
    gl1_value = L1_GRAD_SCALE * m
    gl1 = torch.tensor(gl1_value, dtype=torch.float32, device=device)

    with torch.no_grad():  # the activation pattern, as the op's gate sees it
        counts = (F.linear(x, ws[0]) > 0).sum(1)
        row["gate_l0"] = float(counts.float().mean())
        row["max_row_l0"] = int(counts.max())
        row["overflow_row_frac"] = float((counts > width).float().mean())
        del counts

    ref = _guard(row, "ref", device, log, lambda: _reference(x, ws, gout_rows, gl1_value))
    if ref is not None:
        row["ref_l0"] = float(ref["l0"])  # type: ignore[arg-type]
    timed: dict[str, tuple[Step, float]] = {}
    _guard(row, "dense", device, log, lambda: _measure("dense", lambda: _dense_step(x, ws, gout_rows, gl1),
                                               ref, row, cfg, device, timed))  # type: ignore[arg-type]
    if cfg.sparse_impl == "hot-cold":
        pass
    elif skip_sparse:
        row["sparse_skipped"] = skip_sparse
    else:
        _guard(row, "sparse", device, log, lambda: _measure("sparse", lambda: _sparse_step(x, ws, gout_rows, gl1, cfg),
                                                    ref, row, cfg, device, timed))  # type: ignore[arg-type]
    hot_set: dict[str, HotUnits] = {}
    if cfg.sparse_impl != "v1":
        def hotcold() -> None:
            hot = hot_set["hot"] = choose_training_hot_units(x, ws[0])  # once per point, as a layer caches it
            row.update(hotcold_n_hot=hot.n_hot, hotcold_cold_l0=hot.cold_l0, hotcold_width=default_width(hot))
            _measure("hotcold", lambda: _hotcold_step(x, ws, gout_rows, gl1, hot), ref, row, cfg, device, timed)

        _guard(row, "hotcold", device, log, hotcold)
    row["l0"] = row.get("sparse_l0", row.get("hotcold_l0", row["gate_l0"]))

    def auto() -> None:
        mlp = SparseGatedMLP.from_weights(*(w.detach() for w in ws), train_impl="auto", train_policy=cfg.train_policy)
        mlp.train()
        _auto_step(mlp, x, gout_rows, gl1)  # a layer's first call: l0 unknown, dense, measures it
        shape = (d, f)
        may_sparse = mlp.train_policy.may_use_sparse(device_type=device.type, shape=shape, dtype=cfg.dtype)
        if skip_sparse and may_sparse:
            row["auto_skipped"] = skip_sparse
            return
        _measure("auto", lambda: _auto_step(mlp, x, gout_rows, gl1), ref, row, cfg, device, timed)
        row["auto_path"] = "sparse" if mlp._train_switch.last_sparse else "dense"

    _guard(row, "auto", device, log, auto)
    ref = None  # the float64 tensors go before the timing (not `del`: the closures above capture it)
    _free(device)
    _guard(row, "timing", device, log, lambda: _time_paths(timed, row, cfg, device))
    if cfg.compiled:
        _guard(row, "compiled", device, log,
               lambda: _time_compiled(x, ws, gout_rows, gl1, hot_set.get("hot"), row, cfg, device))
    dense_ms, dense_mb = row.get("dense_ms"), row.get("dense_mem_mb")
    for name in ("sparse", "auto", "hotcold"):
        if dense_ms is not None and row.get(f"{name}_ms"):
            row[f"{name}_speedup"] = dense_ms / row[f"{name}_ms"]
        if dense_mb and row.get(f"{name}_mem_mb") is not None:
            row[f"{name}_mem_reduction_pct"] = 100.0 * (1.0 - row[f"{name}_mem_mb"] / dense_mb)
    oks = [row[f"{p}_ok"] for p in ("sparse", "hotcold") if row.get(f"{p}_ok") is not None]
    row["ok"] = all(oks) if oks else None
    return row


# ---------------------------------------------------------------------------------------- the sweep
def _steady_s(row: dict) -> float:
    """The point's seconds without its first calls' one-off excess (compilation, allocator growth)."""
    excess = sum(max(0.0, row.get(f"{p}_first_call_ms", 0.0) - row.get(f"{p}_call_ms", 0.0)) for p in PATHS)
    return max(0.0, row["point_s"] - excess / 1e3)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a sticky CUDA error: the next point records it
            pass


def run_sweep(
    cfg: TrainFfnSweep, device: torch.device, log: Callable[[str], None] = print,
    on_row: Callable[[list[dict]], object] | None = None,
) -> list[dict]:
    """Every (shape, density, M) point, densities outer and M ascending (slow points come last)."""
    t_start = time.monotonic()
    rows: list[dict] = []

    def emit(row: dict) -> None:
        row.update(cfg.tags)
        rows.append(row)
        log(format_row(row))
        if on_row is not None:  # results survive a run cut short
            on_row(rows)

    ms = tuple(sorted(cfg.ms))
    for d, f in cfg.shapes:
        for dens in cfg.densities:
            problem = gout_all = None
            last: tuple[int, float, float | None] | None = None  # (M, point seconds, sparse ms) of the last point
            for m in ms:
                base = {"d": d, "f": f, "m": m, "density_pct": dens}
                projected = 0.0 if last is None else last[1] * m / last[0]
                elapsed = time.monotonic() - t_start
                if elapsed + projected > cfg.budget_s:
                    emit({**base, "skipped": f"time budget: {elapsed:.0f} s spent + ~{projected:.0f} s projected "
                                             f"> --budget-s {cfg.budget_s:.0f}"})
                    continue
                skip_sparse = None
                if last is not None and last[2] is not None and last[2] * m / last[0] > cfg.max_call_s * 1e3:
                    skip_sparse = (f"projected {last[2] * m / last[0] / 1e3:.1f} s per call (from {last[2]:.0f} ms at "
                                   f"M={last[0]}) > --max-call-s {cfg.max_call_s:g}")
                t0 = time.monotonic()
                try:
                    if problem is None:
                        gen = torch.Generator(device=device)
                        gen.manual_seed(cfg.seed)
                        profile = SparsityProfile(mean_l0=dens / 100 * f)
                        problem = synthetic_ffn_problem(max(ms), d, f, profile, generator=gen, dtype=cfg.dtype,
                                                        device=device)
                        gout_all = torch.randn(max(ms), d, generator=gen, device=device).to(cfg.dtype)
                    x = _rows_for(problem["x"], m, profile.seq_len, gen)
                    row = run_point(x, gout_all[:m], problem, dens, cfg, device, skip_sparse=skip_sparse, log=log)
                    del x
                except Exception as exc:  # noqa: BLE001 - recorded, and the sweep goes on
                    row = {**base, "error": _describe(exc)}
                row["point_s"] = time.monotonic() - t0
                sparse_ms = row.get("sparse_ms") if skip_sparse is None else (last[2] * m / last[0])  # type: ignore[index]
                last = (m, _steady_s(row), sparse_ms)
                emit(row)
                _free(device)
            del problem, gout_all
            _free(device)
    return rows


# ---------------------------------------------------------------------------------------- reporting
def _fmt(v: object, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def _max_err(r: dict, name: str) -> float | None:
    errs = [r[k] for k in (f"{name}_err_{c}" for c in CHECKED) if k in r]
    return max(errs) if errs else None


def _problem(r: dict) -> str | None:
    for key in ("error", "skipped", "ref_error", "dense_error", "sparse_error", "sparse_skipped", "auto_error",
                "hotcold_error"):
        if key in r:
            return f"{key.replace('_', ' ')}: {r[key]}"
    return None


def format_row(r: dict) -> str:
    head = f"d={r['d']} f={r['f']} M={r['m']:7d} dens={r['density_pct']:5.2f}%"
    if "error" in r or "skipped" in r:
        return f"{head}  {_problem(r)}"
    ok = {True: "ok", False: "WRONG", None: "unchecked"}[r.get("ok")]
    hotcold = ""
    if "hotcold_ms" in r:
        hotcold = (f"hot/cold={r['hotcold_ms']:8.3f} ms ({_fmt(r.get('hotcold_speedup'), '.2f', 'x')}, "
                   f"H={r['hotcold_n_hot']}, mem {_fmt(r.get('hotcold_mem_reduction_pct'), '+.0f', ' %')}, "
                   f"err={_fmt(_max_err(r, 'hotcold'), '.1e')} det={r.get('hotcold_deterministic', '-')}) ")
    text = (
        f"{head} l0={r['l0']:7.1f} dense={_fmt(r.get('dense_ms'), '8.3f', ' ms')} "
        f"sparse={_fmt(r.get('sparse_ms'), '8.3f', ' ms')} ({_fmt(r.get('sparse_speedup'), '.2f', 'x')}, "
        f"mem {_fmt(r.get('sparse_mem_reduction_pct'), '+.0f', ' %')}) "
        f"auto={_fmt(r.get('auto_speedup'), '.2f', 'x')} ({r.get('auto_path', '-')}) {hotcold}"
        f"max err={_fmt(_max_err(r, 'sparse'), '.1e')} det={r.get('sparse_deterministic', '-')} {ok}"
    )
    problem = _problem(r)
    return text + (f"  [{problem}]" if problem else "")


def summary_table(rows: list[dict]) -> str:
    lines = [
        "| d x F | M | density | l0 | dense ms | sparse ms | speedup | auto | dense MB | sparse MB | mem | "
        "max rel err | bitwise | ok | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lead = f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% |"
        note = (_problem(r) or "").replace("|", "/")
        if "error" in r or "skipped" in r:
            lines.append(f"{lead}" + " - |" * 11 + f" {note} |")
            continue
        auto = f"{_fmt(r.get('auto_speedup'), '.2f', 'x')} ({r.get('auto_path', '-')})"
        ok = {True: "yes", False: "NO", None: "-"}[r.get("sparse_ok")]
        lines.append(
            f"{lead} {r['l0']:.1f} | {_fmt(r.get('dense_ms'), '.3f')} | {_fmt(r.get('sparse_ms'), '.3f')} | "
            f"{_fmt(r.get('sparse_speedup'), '.2f', 'x')} | {auto} | {_fmt(r.get('dense_mem_mb'), '.0f')} | "
            f"{_fmt(r.get('sparse_mem_mb'), '.0f')} | {_fmt(r.get('sparse_mem_reduction_pct'), '+.0f', ' %')} | "
            f"{_fmt(_max_err(r, 'sparse'), '.1e')} | {r.get('sparse_deterministic', '-')} | {ok} | {note} |"
        )
    hot = [r for r in rows if "hotcold_ms" in r or "hotcold_error" in r]
    return "\n".join(lines + ([""] + _hotcold_table(hot) if hot else []))


def _hotcold_table(rows: list[dict]) -> list[str]:
    lines = [
        "| d x F | M | density | l0 | hot units | W | dense ms | hot/cold ms | speedup | hot/cold MB | mem saved | "
        "max rel err | bitwise | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    compiled = any("hotcold_compiled_ms" in r for r in rows)
    if compiled:
        lines[0] += " compiled dense ms | compiled hot/cold ms | compiled speedup |"
        lines[1] += "---|---|---|"
    for r in rows:
        ok = {True: "yes", False: "NO", None: "-"}[r.get("hotcold_ok")]
        tail = (f" {_fmt(r.get('dense_compiled_ms'), '.3f')} | {_fmt(r.get('hotcold_compiled_ms'), '.3f')} | "
                f"{_fmt(r.get('hotcold_compiled_speedup'), '.2f', 'x')} |") if compiled else ""
        lines.append(
            f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | {r['l0']:.1f} | {r.get('hotcold_n_hot', '-')} | "
            f"{r.get('hotcold_width', '-')} | {_fmt(r.get('dense_ms'), '.3f')} | {_fmt(r.get('hotcold_ms'), '.3f')} | "
            f"{_fmt(r.get('hotcold_speedup'), '.2f', 'x')} | {_fmt(r.get('hotcold_mem_mb'), '.0f')} | "
            f"{_fmt(r.get('hotcold_mem_reduction_pct'), '+.0f', ' %')} | {_fmt(_max_err(r, 'hotcold'), '.1e')} | "
            f"{r.get('hotcold_deterministic', '-')} | {ok} |" + tail
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="twell bench train-ffn", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", type=int, nargs="+", default=None, help=f"token counts M (default {DEFAULT_MS})")
    p.add_argument("--densities", type=float, nargs="+", default=None,
                   help=f"percent of FFN units active per token (default {DEFAULT_DENSITIES})")
    p.add_argument("--shape", type=parse_shape, nargs="+", default=[DEFAULT_SHAPE],
                   help="hidden x FFN sizes, e.g. 2048x5632")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--quick", action="store_true", help=f"M in {QUICK_MS}, densities {QUICK_DENSITIES} %% "
                   "(unless --ms / --densities are given)")
    p.add_argument("--width", type=int, default=None,
                   help=f"row-ELL width W of the sparse op (default {DEFAULT_WIDTH})")
    p.add_argument("--token-splits", type=int, default=None, help="K of the sparse op's weight-gradient kernel")
    p.add_argument("--sparse-impl", choices=SPARSE_IMPLS, default="v1",
                   help="sparse op(s) measured: the v1 Triton op, the hot/cold split (hotcold_* columns), or both")
    p.add_argument("--compiled", action="store_true",
                   help="also time dense and hot/cold with the forward under torch.compile (mode reduce-overhead: "
                        "CUDA graphs) -- compiles twice per point")
    p.add_argument("--rep-ms", type=float, default=100.0, help="do_bench measuring time per timing")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--budget-s", type=float, default=180.0, help="skip the remaining points past this sweep time")
    p.add_argument("--max-call-s", type=float, default=10.0,
                   help="skip a point's sparse path when one call projects above this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-speedup", type=float, default=DEFAULT_MIN_SPEEDUP,
                   help="with --sparse-impl hot-cold / both: the margin a point must win by to enter the training "
                        "dispatch table written as <stem>_train_policy.json (default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--stem", default="train_ffn")
    a = p.parse_args(argv)
    if not a.min_speedup >= 1.0:
        p.error(f"--min-speedup must be >= 1 (the hot/cold op is never chosen where it is slower), got {a.min_speedup}")
    for name in ("width", "token_splits"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = TrainFfnSweep(
        shapes=tuple(a.shape),
        ms=tuple(a.ms or (QUICK_MS if a.quick else DEFAULT_MS)),
        densities=tuple(a.densities or (QUICK_DENSITIES if a.quick else DEFAULT_DENSITIES)),
        dtype=getattr(torch, a.dtype), seed=a.seed, rep_ms=a.rep_ms, warmup_ms=a.warmup_ms, width=a.width,
        token_splits=a.token_splits, budget_s=a.budget_s, max_call_s=a.max_call_s, sparse_impl=a.sparse_impl,
        compiled=a.compiled,
    )
    meta = environment(device)
    meta["sweep"] = {"ms": cfg.ms, "densities": cfg.densities, "shapes": cfg.shapes, "dtype": a.dtype,
                     "width": a.width, "token_splits": a.token_splits, "sparse_impl": a.sparse_impl,
                     "l1_grad_scale": L1_GRAD_SCALE,
                     "rep_ms": a.rep_ms, "budget_s": a.budget_s, "max_call_s": a.max_call_s}
    rows = run_sweep(cfg, device, on_row=lambda rs: write_results(rs, meta, a.out, a.stem))
    paths = write_results(rows, meta, a.out, a.stem)
    d, f = cfg.shapes[0]
    for key, suffix, what in (("sparse", "", "Triton training FFN"), ("hotcold", "_hotcold", "hot/cold training FFN")):
        points = [r for r in rows if (r["d"], r["f"]) == (d, f) and f"{key}_speedup" in r]
        plot = points and plot_speedup(points, a.out / f"{a.stem}{suffix}_speedup.png", y_key=f"{key}_speedup",
                                       title=f"{what} fwd+bwd vs dense autograd, {meta['device']}, d={d} F={f}")
        if plot:
            paths.append(plot)
    print("\n" + summary_table(rows))
    if cfg.sparse_impl != "v1":  # the hot/cold column decides train_impl="auto"'s table
        policy = train_policy_of(rows, cfg.shapes, device=device, dtype=cfg.dtype, capability=cuda_capability(device),
                                 min_speedup=a.min_speedup)
        measured = {key: meta.get(key) for key in ("device", "capability", "torch", "triton", "commit", "date_utc")}
        measured.update(dtype=a.dtype, min_speedup=a.min_speedup, source=f"{a.stem}.json")
        paths.append(save_train_policy(policy, a.out / f"{a.stem}_train_policy.json", measured=measured))
        print(f"\ntraining dispatch table (hot/cold against dense, >= {a.min_speedup:g}x, {a.dtype}):\n"
              + train_table_text(policy))
    print("wrote " + ", ".join(str(p) for p in paths))
    failed = [r for r in rows if "error" in r or r.get("ok") is False or "sparse_error" in r or "hotcold_error" in r]
    return 1 if failed else 0
