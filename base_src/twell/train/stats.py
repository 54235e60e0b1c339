"""Sparsity analytics of a trained model, saved as JSON and plots, and activation-pattern capture.

What is measured per sparse layer (the quantities the paper reports and that kernel speed depends on):

* ``l0_mean`` / ``l0_max``: mean and maximum active units per token (paper, 1.5B: mean 29 of 5632, the
  per-layer maximum often > 10x the mean);
* ``l0_by_position``: mean l0 at each position of the sequence (the first tokens fire far more units,
  decaying roughly exponentially);
* the unit firing-frequency histogram (heavy-tailed), ``top10_share`` (share of all firings carried by
  the 10 % most frequent units) and ``dead_fraction`` (units that never fired on the analysed tokens);
* optionally the activation patterns themselves for the first ``capture_tokens`` tokens of each layer, as
  CSR index lists (``indptr``, ``indices``), which benchmarks replay with :func:`load_patterns`.

All of it is computed from the gate pattern recovered by a :class:`~twell.train.hooks.GateMonitor`, in
eval mode under ``no_grad``, so it works for any model containing ``SparseGatedMLP`` layers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .hooks import GateMonitor
from .hooks import active as gate_active

__all__ = [
    "SCHEMA",
    "ActivationPatterns",
    "SparsityRecorder",
    "collect_sparsity",
    "load_patterns",
    "plot_history",
    "save_patterns",
    "save_sparsity",
]

#: Schema tag of the JSON written by :func:`save_sparsity`.
SCHEMA = "twell.sparsity/1"

#: Log-spaced bins of the firing-frequency histogram: 10^-6 .. 1, 4 bins per decade (24 bins);
#: never-firing units are counted apart (``zero_units``) since log bins cannot hold 0.
_FREQ_BIN_EDGES = np.logspace(-6, 0, 25)


@dataclass
class ActivationPatterns:
    """Which units fire for each of ``n_tokens`` tokens of one layer, in CSR form.

    ``indices[indptr[t]:indptr[t + 1]]`` are the active unit indices of token ``t`` (sorted, int32).
    ``seq_len`` is the length of the sequences the tokens came from (position of token t: ``t % seq_len``).
    """

    layer: int
    n_units: int
    seq_len: int | None
    indptr: np.ndarray
    indices: np.ndarray

    @property
    def n_tokens(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @classmethod
    def from_mask(cls, layer: int, mask: torch.Tensor, seq_len: int | None) -> ActivationPatterns:
        rows, cols = mask.cpu().nonzero(as_tuple=True)
        counts = torch.bincount(rows, minlength=mask.shape[0])
        indptr = np.zeros(mask.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts.numpy(), out=indptr[1:])
        return cls(layer, int(mask.shape[1]), seq_len, indptr, cols.numpy().astype(np.int32))

    def to_mask(self) -> torch.Tensor:
        """``[n_tokens, n_units]`` bool tensor (CPU)."""
        mask = torch.zeros((self.n_tokens, self.n_units), dtype=torch.bool)
        rows = np.repeat(np.arange(self.n_tokens), np.diff(self.indptr))
        mask[torch.from_numpy(rows), torch.from_numpy(self.indices.astype(np.int64))] = True
        return mask


@dataclass
class _LayerAcc:
    n_units: int
    tokens: int = 0
    active: int = 0
    l0_max: int = 0
    unit_counts: torch.Tensor | None = None
    pos_sum: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    pos_count: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    captured: list[torch.Tensor] = field(default_factory=list)
    captured_tokens: int = 0
    seq_len: int | None = None


class SparsityRecorder:
    """A :class:`GateMonitor` consumer that accumulates the statistics listed in the module docs."""

    def __init__(self, n_units: Sequence[int], capture_tokens: int = 0) -> None:
        self.acc = [_LayerAcc(int(f)) for f in n_units]
        self.capture_tokens = int(capture_tokens)

    def observe(self, layer_index: int, gate: torch.Tensor, seq_len: int | None) -> None:
        a = self.acc[layer_index]
        active = gate_active(gate)
        per_token = active.sum(dim=1, dtype=torch.int64).cpu()
        units = active.sum(dim=0, dtype=torch.int64).cpu()
        a.unit_counts = units if a.unit_counts is None else a.unit_counts + units
        a.tokens += int(per_token.numel())
        a.active += int(per_token.sum())
        a.l0_max = max(a.l0_max, int(per_token.max()) if per_token.numel() else 0)
        if seq_len is not None and per_token.numel() % seq_len == 0:
            a.seq_len = seq_len
            by_pos = per_token.view(-1, seq_len)
            if a.pos_sum.numel() < seq_len:
                a.pos_sum = torch.cat([a.pos_sum, torch.zeros(seq_len - a.pos_sum.numel(), dtype=torch.int64)])
                a.pos_count = torch.cat(
                    [a.pos_count, torch.zeros(seq_len - a.pos_count.numel(), dtype=torch.int64)]
                )
            a.pos_sum[:seq_len] += by_pos.sum(0)
            a.pos_count[:seq_len] += by_pos.shape[0]
        if a.captured_tokens < self.capture_tokens:
            take = min(self.capture_tokens - a.captured_tokens, active.shape[0])
            a.captured.append(active[:take].cpu())
            a.captured_tokens += take

    def report(self) -> dict[str, Any]:
        """The JSON-ready statistics (schema :data:`SCHEMA`)."""
        layers = []
        for i, a in enumerate(self.acc):
            counts = a.unit_counts if a.unit_counts is not None else torch.zeros(a.n_units, dtype=torch.int64)
            freq = counts.double() / max(1, a.tokens)
            total = float(counts.sum())
            k = math.ceil(0.1 * a.n_units)
            top = float(torch.topk(counts.double(), k).values.sum()) if a.n_units else 0.0
            hist, _ = np.histogram(freq[freq > 0].numpy(), bins=_FREQ_BIN_EDGES)
            l0_mean = a.active / max(1, a.tokens)
            pos = (a.pos_sum.double() / a.pos_count.clamp(min=1).double()).tolist()
            layers.append(
                {
                    "index": i,
                    "n_units": a.n_units,
                    "tokens": a.tokens,
                    "l0_mean": l0_mean,
                    "l0_max": a.l0_max,
                    "l0_max_over_mean": a.l0_max / l0_mean if l0_mean > 0 else None,
                    "density": l0_mean / max(1, a.n_units),
                    "dead_fraction": float((counts == 0).double().mean()) if a.n_units else 0.0,
                    "top10_share": top / total if total > 0 else 0.0,
                    "l0_by_position": pos,
                    "firing_frequency_hist": {
                        "bin_edges": _FREQ_BIN_EDGES.tolist(),
                        "counts": hist.astype(int).tolist(),
                        "zero_units": int((counts == 0).sum()),
                    },
                }
            )
        l0s = [lay["l0_mean"] for lay in layers]
        return {
            "schema": SCHEMA,
            "n_layers": len(layers),
            "tokens": self.acc[0].tokens if self.acc else 0,
            "l0_mean": sum(l0s) / len(l0s) if l0s else 0.0,
            "dead_fraction": (
                sum(lay["dead_fraction"] * lay["n_units"] for lay in layers) / max(1, sum(a.n_units for a in self.acc))
            ),
            "layers": layers,
        }

    def patterns(self) -> list[ActivationPatterns]:
        return [
            ActivationPatterns.from_mask(i, torch.cat(a.captured) if a.captured else torch.zeros(0, a.n_units,
                                                                                               dtype=torch.bool),
                                         a.seq_len)
            for i, a in enumerate(self.acc)
        ]


def collect_sparsity(
    model: nn.Module,
    batches: Iterable[torch.Tensor],
    *,
    capture_tokens: int = 0,
    forward: Callable[[nn.Module, torch.Tensor], Any] | None = None,
) -> tuple[dict[str, Any], list[ActivationPatterns]]:
    """Run ``model`` in eval mode under ``no_grad`` over ``batches`` (token id tensors ``[B, T]``) and return
    ``(report, patterns)``: the statistics dict (:data:`SCHEMA`) and, per layer, the patterns of the first
    ``capture_tokens`` tokens.  ``forward(model, ids)`` defaults to ``model(ids)``.  The model's
    train/eval mode is restored afterwards.
    """
    monitor = GateMonitor(model)
    rec = SparsityRecorder([m.intermediate_size for m in monitor.layers], capture_tokens)
    monitor.add(rec, eval_consumer=True)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for ids in batches:
                (forward or (lambda mod, b: mod(b)))(model, ids)
    finally:
        monitor.close()
        model.train(was_training)
    return rec.report(), rec.patterns()


def save_patterns(path: str | Path, patterns: Sequence[ActivationPatterns]) -> Path:
    """Write patterns as one ``.npz`` (per layer ``layer{i}_indptr`` int64, ``layer{i}_indices`` int32, and a
    JSON ``meta`` string with ``n_units``/``seq_len``); ~4 bytes per active (token, unit) pair."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    meta = []
    for p in patterns:
        arrays[f"layer{p.layer}_indptr"] = p.indptr
        arrays[f"layer{p.layer}_indices"] = p.indices
        meta.append({"layer": p.layer, "n_units": p.n_units, "seq_len": p.seq_len})
    arrays["meta"] = np.array(json.dumps({"schema": "twell.patterns/1", "layers": meta}))
    np.savez_compressed(path, **arrays)
    return path


def load_patterns(path: str | Path) -> list[ActivationPatterns]:
    """Read what :func:`save_patterns` wrote; ``p.to_mask()`` gives each layer's ``[tokens, F]`` bool mask."""
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        return [
            ActivationPatterns(m["layer"], m["n_units"], m["seq_len"], z[f"layer{m['layer']}_indptr"],
                               z[f"layer{m['layer']}_indices"])
            for m in meta["layers"]
        ]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def save_sparsity(report: dict[str, Any], out_dir: str | Path, *, prefix: str = "sparsity") -> list[Path]:
    """Write ``{prefix}.json`` and three plots (per-layer l0 and dead fraction, l0 by position, firing
    frequency histogram) into ``out_dir``; returns the written paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{prefix}.json"]
    paths[0].write_text(json.dumps(report, indent=1))
    plt = _plt()
    layers = report["layers"]

    fig, ax = plt.subplots(figsize=(6, 3.5))
    idx = [lay["index"] for lay in layers]
    ax.bar(idx, [lay["l0_mean"] for lay in layers], color="tab:blue", label="mean l0")
    ax.set_xlabel("layer")
    ax.set_ylabel("active units per token (l0)")
    ax2 = ax.twinx()
    ax2.plot(idx, [lay["dead_fraction"] for lay in layers], "o-", color="tab:red", label="dead fraction")
    ax2.set_ylabel("dead fraction", color="tab:red")
    ax2.set_ylim(0, 1)
    ax.set_title(f"per-layer sparsity ({report['tokens']} tokens)")
    paths.append(_save(fig, out / f"{prefix}_layers.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for lay in layers:
        if lay["l0_by_position"]:
            ax.plot(lay["l0_by_position"], label=f"layer {lay['index']}", lw=1)
    ax.set_xlabel("position in sequence")
    ax.set_ylabel("mean l0")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.legend(fontsize=7)
    ax.set_title("l0 by position")
    paths.append(_save(fig, out / f"{prefix}_positions.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for lay in layers:
        h = lay["firing_frequency_hist"]
        centers = np.sqrt(np.array(h["bin_edges"][:-1]) * np.array(h["bin_edges"][1:]))
        ax.step(centers, h["counts"], where="mid", label=f"layer {lay['index']} ({h['zero_units']} never)", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("unit firing frequency (fraction of tokens)")
    ax.set_ylabel("units")
    ax.legend(fontsize=7)
    ax.set_title("firing-frequency histogram")
    paths.append(_save(fig, out / f"{prefix}_frequency.png"))
    return paths


def plot_history(runs: dict[str, Sequence[dict[str, Any]]], path: str | Path) -> Path:
    """Plot training logs (``{run name: [per-step log dicts]}``) as four panels over the step: loss,
    mean l0, dead fraction, held-out loss (where logged).  Keys used: ``step``, ``lm_loss``, ``l0``,
    ``dead_fraction``, ``eval_loss``."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    panels = [("lm_loss", "train LM loss"), ("l0", "mean l0 (active units / token)"),
              ("dead_fraction", "dead fraction"), ("eval_loss", "held-out loss")]
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for name, logs in runs.items():
            pts = [(r["step"], r[key]) for r in logs if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, label=name, marker="o" if key == "eval_loss" else None, lw=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path)
