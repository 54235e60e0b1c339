"""Print the README's benchmark table from a committed sweep JSON (never type a figure by hand).

Sweeps made before the hot/cold split existed have no hot/cold columns; they print as "-".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

path = Path(sys.argv[1] if len(sys.argv) > 1 else "bench_results/h200/ffn_hotcold.json")
data = json.loads(path.read_text())
meta = data["meta"]
print(f"{meta['device']}, torch {meta['torch']}, Triton {meta['triton']}, CUDA {meta['cuda']}, "
      f"commit {meta['commit'][:10]}, {meta['date_utc']} ({path})\n")
print("| d x F | tokens M | density | l0 | dense ms | cuBLAS gate ms | hot/cold ms (hot units) | hot/cold speedup "
      "| row-gather / block-union speedup | with dispatch | rel. error |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in data["rows"]:
    if "error" in r:
        print(f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | | | | | {r['error']} | | | |")
        continue
    hc = f"{r['hotcold_ms']:.3f} ({r['n_hot']})" if "hotcold_ms" in r else "-"
    hcs = f"{r['hotcold_speedup']:.2f}x" if "hotcold_speedup" in r else "-"
    err = max(r["rel_err"], r.get("hotcold_rel_err", 0.0))
    print(f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | {r['l0']:.1f} | {r['dense_ms']:.3f} | "
          f"{r['gate_cublas_ms']:.3f} | {hc} | {hcs} | {r['speedup']:.2f}x | "
          f"{r['dispatch_speedup']:.2f}x ({'sparse' if r['dispatch_sparse'] else 'dense'}) | {err:.1e} |")
