"""The printed summary and the per-layer plot of ``twell bench model`` (from the per-part records)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .model_decode import decode_rows
from .model_forward import forward_rows
from .model_train import train_rows

__all__ = ["part_rows", "plot_layers", "summary_table"]


def part_rows(parts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Flat rows (CSV, table) of every part's result, plus one error row per part that did not finish."""
    makers = {"forward": forward_rows, "decode": decode_rows, "train": train_rows}
    rows: list[dict[str, Any]] = []
    for part, record in parts.items():
        if record.get("result"):
            rows.extend(makers[part](record["result"]))
        if record.get("status") != "ok":
            rows.append({"part": part, "variant": "(part)", "error": str(record.get("error", "")).split("\n")[0]})
    return rows


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _sparsity_line(parts: dict[str, dict[str, Any]]) -> str | None:
    forward = (parts.get("forward") or {}).get("result") or {}
    layers = forward.get("layers")
    setup = next((r["setup"] for r in parts.values() if r.get("setup")), None)
    if not layers or not setup:
        return None
    l0 = [r["l0_mean"] for r in layers]
    early = [r["early_ratio"] for r in layers if r.get("early_ratio") is not None]
    overlap = [r["union64_vs_independent"] for r in layers if r.get("union64_vs_independent") is not None]
    return (
        f"sparsity: target mean l0 {setup['target']['mean_l0']:.1f} of {setup['shape']['intermediate_size']}; "
        f"achieved on the forward batch {sum(l0) / len(l0):.1f} (layers {min(l0):.1f}..{max(l0):.1f}), "
        f"dead units {100 * sum(r['dead_fraction'] for r in layers) / len(layers):.0f} %, "
        f"max/mean per token {max(r['l0_max_over_mean'] for r in layers):.1f}x"
        + (f", first 8 positions / rest {sum(early) / len(early):.1f}x" if early else "")
        + (f", 64-token unions / independent tokens' {min(overlap):.2f}..{max(overlap):.2f}" if overlap else "")
    )


def _decode_check(row: dict[str, Any]) -> str:
    """Identical fraction plus the divergence diagnostic: for a sparse variant its divergences and their
    largest dense logit gap next to the batch's 1st-percentile dense top-2 gap (a flip at a gap far above
    that is no near tie), for dense the batch's top-2 gap distribution."""
    text = f"{100 * row['identical_fraction']:.0f} % identical"
    if row.get("divergence_error"):
        return f"{text}; divergence check failed: {str(row['divergence_error'])[:40]}"
    p01 = row.get("dense_top2_gap_p01")
    if row["variant"] == "dense" and p01 is not None:
        return (f"{text}; top-2 gap min {row['dense_top2_gap_min']:.2g}, p01 {p01:.2g}, "
                f"median {row['dense_top2_gap_median']:.2g}")
    n = row.get("divergences")
    if n:
        gap = ("gap" if n == 1 else "max gap") + f" {row['max_divergence_gap']:.2g}"
        reference = "" if p01 is None else f" (dense top-2 gap p01 {p01:.2g})"
        text += f"; {n} divergence{'' if n == 1 else 's'}, {gap}{reference}"
    return text


def _check(row: dict[str, Any]) -> str:
    if row.get("error"):
        return "ERROR " + str(row["error"])[:60]
    if row["part"] == "forward" and row.get("rel_err_vs_fp32") is not None:
        verdict = {True: "ok", False: "WRONG", None: ""}[row.get("ok")]
        text = f"err {row['rel_err_vs_fp32']:.1e} vs fp32 {verdict}".strip()
        if row.get("recorded_layers") is not None:
            # session 58: a +graphs set that recorded nothing timed as the unrecorded one, unseen in the table
            text += f", {row['recorded_layers']} layers recorded"
        return text
    if row["part"] == "decode" and row.get("identical_fraction") is not None:
        return _decode_check(row)
    if row["part"] == "train":
        notes = []
        if row.get("grad_rel_err_vs_fp32_max") is not None:
            verdict = {True: " ok", False: " WRONG", None: ""}[row.get("ok")]
            notes.append(f"grad err {row['grad_rel_err_vs_fp32_max']:.1e} vs fp32{verdict}")
        if row.get("peak_memory_reduction") is not None:
            notes.append(f"peak memory {-100 * row['peak_memory_reduction']:+.0f} %")
        if row.get("spilled_tokens_last_step"):
            # session 55's first compiled step: 0.068x of dense with tokens spilled, and the table did not say why
            notes.append(f"{row['spilled_tokens_last_step']} tokens recomputed densely (spilled) in the last step")
        if row.get("compiled"):
            notes.append("compiled")
        return ", ".join(notes)
    return ""


def summary_table(parts: dict[str, dict[str, Any]], preset: str, device: str) -> str:
    """A markdown table, one line per part / variant / batch, plus the sparsity line and part failures."""
    lines = [f"twell bench model --preset {preset} on {device}"]
    sparsity = _sparsity_line(parts)
    if sparsity:
        lines.append(sparsity)
    lines += ["", "| part | variant | batch | throughput | speedup | peak GB | mJ/token | l0 | check |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in part_rows(parts):
        if r.get("variant") == "(part)":
            lines.append(f"| {r['part']} | (whole part) | | | | | | | FAILED: {str(r.get('error'))[:80]} |")
            continue
        if r["part"] == "decode":
            speed = _fmt(r.get("tokens_per_s"), ".1f", " tok/s")
        else:
            speed = _fmt(r.get("tokens_per_ms"), ".1f", " tok/ms")
        lines.append(
            f"| {r['part']} | {r['variant']} | {r.get('batch', '')} | {speed} | "
            f"{_fmt(r.get('speedup'), '.3f', 'x')} | {_fmt(r.get('peak_gb'), '.1f')} | "
            f"{_fmt(r.get('mJ_per_token'), '.3f')} | {_fmt(r.get('l0_mean'), '.1f')} | {_check(r)} |"
        )
    return "\n".join(lines)


def plot_layers(parts: dict[str, dict[str, Any]], path: Path) -> Path | None:
    """Per-layer target and achieved l0 (forward batch; training batch when run); None without data or matplotlib."""
    forward = (parts.get("forward") or {}).get("result") or {}
    setup = next((r["setup"] for r in parts.values() if r.get("setup")), None)
    layers = forward.get("layers")
    if not layers or not setup:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - optional
        return None
    x = list(range(len(layers)))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [c["target_l0"] for c in setup["calibration"]], "k--", label="target")
    ax.plot(x, [r["l0_mean"] for r in layers], "o-", label="achieved (forward batch, mean)")
    nan = float("nan")
    ax.plot(x, [nan if r.get("l0_first8") is None else r["l0_first8"] for r in layers], ".:",
            label="first 8 positions")
    train = ((parts.get("train") or {}).get("result") or {}).get("variants", {})
    for name, v in train.items():
        if v.get("layer_l0"):
            ax.plot(x, v["layer_l0"], "s-", ms=3, label=f"training batch ({name})")
    ax.set_xlabel("layer")
    ax.set_ylabel("active units per token (l0)")
    ax.set_title(f"{setup['preset']}: per-layer l0 of {setup['shape']['intermediate_size']} units")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
