"""The training dispatch policy a ``twell bench train-ffn --sparse-impl hot-cold`` sweep supports.

``train_impl="auto"`` runs the hot/cold training op where its :class:`~twell.nn.train_dispatch.TrainDispatchPolicy`
table allows, so the table comes from the ``hotcold`` column against ``dense``, by the inference tables' rules
(:func:`twell.nn.dispatch_tuning.derive_table`: a win needs a correct, deterministic output and at least
``min_speedup``; one loss ends a token count's densities).  A point whose hot/cold path raised or was skipped counts as
a loss; one whose dense path did not run is left out (nothing to compare).
"""

from __future__ import annotations

import torch

from ..nn.dispatch_tuning import DEFAULT_MIN_SPEEDUP, TuningPoint, derive_table
from ..nn.train_dispatch import TrainDispatchPolicy
from .tune_dispatch import table_lines


def train_points(rows: list[dict], d: int, f: int) -> list[TuningPoint]:
    """The hot/cold-against-dense points of the ``d x f`` rows (density: the measured l0 / F, else the target)."""
    pts = []
    for r in rows:
        if (r.get("d"), r.get("f")) != (d, f) or not r.get("dense_ms"):
            continue
        l0 = r.get("hotcold_l0", r.get("gate_l0"))
        density = min(1.0, (l0 if l0 is not None else r["density_pct"] / 100 * f) / f)
        ms = r.get("hotcold_ms")
        ok = bool(ms) and r.get("hotcold_ok") is True
        # a failed or skipped hot/cold path: a loss at the dense time (TuningPoint needs a finite time)
        pts.append(TuningPoint(tokens=int(r["m"]), density=float(density), dense_ms=float(r["dense_ms"]),
                               sparse_ms=float(ms) if ms else float(r["dense_ms"]), ok=ok))
    return pts


def train_policy_of(rows: list[dict], shapes: tuple[tuple[int, int], ...], *, device: torch.device,
                    dtype: torch.dtype, capability: tuple[int, int] | None,
                    min_speedup: float = DEFAULT_MIN_SPEEDUP) -> TrainDispatchPolicy:
    """The policy the rows support: per shape with hot/cold points, the table :func:`derive_table` gives; held to
    ``device``'s type, ``dtype`` and (on CUDA) ``capability``."""
    tables = {}
    for d, f in shapes:
        pts = train_points(rows, d, f)
        if pts:
            tables[(d, f)] = derive_table(pts, min_speedup=min_speedup)
    return TrainDispatchPolicy(tables=tables, device_types=(device.type,), dtypes=(dtype,),
                               capabilities=None if capability is None else (capability,))


def train_table_text(policy: TrainDispatchPolicy) -> str:
    """One line per shape: where its table sends training calls to the hot/cold op."""
    lines = []
    for (d, f), table in sorted(policy.tables.items()):
        if not any(dens > 0 for _, dens in table):
            lines.append(f"  {d}x{f}: dense at every measured point (the hot/cold op never won by the margin)")
            continue
        lines += table_lines(table, "hot/cold", prefix=f"{d}x{f} ")
    return "\n".join(lines)
