"""Writing a sweep's rows as JSON + CSV (+ a plot when matplotlib is installed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch


def record_row(rows: list[dict], row: dict, text: str, *, log, on_row, device: torch.device) -> None:
    """Append a sweep's new ``row``, log its ``text``, hand the rows so far to ``on_row`` (so that results
    survive a run cut short by a time limit) and give the point's cached device memory back."""
    rows.append(row)
    log(text)
    if on_row is not None:
        on_row(rows)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def write_results(rows: list[dict], meta: dict, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    jpath = out_dir / f"{stem}.json"
    jpath.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    paths.append(jpath)
    if rows:
        cpath = out_dir / f"{stem}.csv"
        keys: list[str] = []
        for r in rows:
            keys.extend(k for k in r if k not in keys)
        with cpath.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        paths.append(cpath)
    return paths


def plot_speedup(rows: list[dict], out_path: Path, *, title: str, x_key: str = "density_pct",
                 series_key: str = "m", y_key: str = "speedup") -> Path | None:
    """Speedup vs density, one line per token count; returns None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in sorted({r[series_key] for r in rows}):
        pts = sorted((r[x_key], r[y_key]) for r in rows if r[series_key] == s and r.get(y_key) is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{series_key}={s}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("density (% of FFN units active per token)")
    ax.set_ylabel("speedup over dense")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
