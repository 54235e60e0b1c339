"""Print a README benchmark table from a committed sweep JSON (never type a figure by hand).

    python scripts/readme_table.py [bench_results/h200/ffn_hotcold.json]            # twell bench ffn
    python scripts/readme_table.py bench_results/h200/train_ffn_hotcold_sweep_final.json   # bench train-ffn

Inference sweeps made before the hot/cold split existed have no hot/cold columns; they print as "-".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _header(meta: dict, path: Path) -> None:
    print(f"{meta['device']}, torch {meta['torch']}, Triton {meta['triton']}, CUDA {meta['cuda']}, "
          f"commit {meta['commit'][:10]}, {meta['date_utc']} ({path})\n")


def ffn_table(rows: list[dict]) -> None:
    decode = any("decode_ms" in r for r in rows)  # sweeps from when the small-batch kernels existed
    print("| d x F | tokens M | density | l0 | dense ms | cuBLAS gate ms | hot/cold ms (hot units) | hot/cold speedup "
          "| row-gather / block-union speedup | with dispatch | rel. error |"
          + (" decode kernels | module + decode | dispatch vs dense module |" if decode else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if decode else ""))
    for r in rows:
        if "error" in r:
            print(f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | | | | | {r['error']} | | | |")
            continue
        hc = f"{r['hotcold_ms']:.3f} ({r['n_hot']})" if "hotcold_ms" in r else "-"
        hcs = f"{r['hotcold_speedup']:.2f}x" if "hotcold_speedup" in r else "-"
        err = max(r["rel_err"], r.get("hotcold_rel_err", 0.0))
        extra = ""
        if decode:
            dk = f"{r['decode_ms']:.3f} ({r['decode_speedup']:.2f}x)" if "decode_ms" in r else "-"
            dm = f"{r['decode_module_speedup']:.2f}x" if "decode_module_speedup" in r else "-"
            vm = f"{r['dispatch_vs_dense_module']:.2f}x" if "dispatch_vs_dense_module" in r else "-"
            extra = f" {dk} | {dm} | {vm} |"
        print(f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | {r['l0']:.1f} | {r['dense_ms']:.3f} | "
              f"{r['gate_cublas_ms']:.3f} | {hc} | {hcs} | {r['speedup']:.2f}x | "
              f"{r['dispatch_speedup']:.2f}x ({'sparse' if r['dispatch_sparse'] else 'dense'}) | {err:.1e} |" + extra)


def train_table(rows: list[dict]) -> None:
    """Hot/cold training op vs dense autograd (forward + backward with L1); the switch column is what
    ``train_impl="auto"`` ran with the table of that commit."""
    print("| d x F | tokens M | density | l0 | dense ms | hot/cold ms (hot units) | speedup | extra memory "
          "dense / hot/cold MB | max rel. grad error | bitwise | auto switch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "hotcold_ms" not in r:
            print(f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | | | {r.get('hotcold_error', '-')} "
                  "| | | | | |")
            continue
        err = max(v for k, v in r.items() if k.startswith("hotcold_err_"))
        auto = f"{r['auto_speedup']:.2f}x ({r['auto_path']})" if "auto_speedup" in r else "-"
        print(f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | {r['hotcold_l0']:.1f} | {r['dense_ms']:.3f} | "
              f"{r['hotcold_ms']:.3f} ({r['hotcold_n_hot']}) | {r['hotcold_speedup']:.2f}x | "
              f"{r['dense_mem_mb']:.0f} / {r['hotcold_mem_mb']:.0f} | {err:.1e} | {r['hotcold_deterministic']} | "
              f"{auto} |")


def main(argv: list[str]) -> None:
    path = Path(argv[0] if argv else "bench_results/h200/ffn_hotcold.json")
    data = json.loads(path.read_text())
    _header(data["meta"], path)
    rows = data["rows"]
    (train_table if rows and "hotcold_call_ms" in rows[0] or "sparse_impl" in data["meta"].get("sweep", {})
     else ffn_table)(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
