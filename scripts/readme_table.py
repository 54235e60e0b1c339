"""Print the README's benchmark table from a committed sweep JSON (never type a figure by hand)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

path = Path(sys.argv[1] if len(sys.argv) > 1 else "bench_results/h200/ffn_sweep.json")
data = json.loads(path.read_text())
meta = data["meta"]
print(f"{meta['device']}, torch {meta['torch']}, Triton {meta['triton']}, CUDA {meta['cuda']}, "
      f"commit {meta['commit'][:10]}, {meta['date_utc']} ({path})\n")
print("| d x F | tokens M | density | l0 | dense ms | cuBLAS gate ms | twell ms | twell speedup "
      "| with dispatch | rel. error |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in data["rows"]:
    if "error" in r:
        print(f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | | | | | {r['error']} | | |")
        continue
    print(f"| {r['d']}x{r['f']} | {r['m']} | {r['density_pct']}% | {r['l0']:.1f} | {r['dense_ms']:.3f} | "
          f"{r['gate_cublas_ms']:.3f} | {r['twell_ms']:.3f} | {r['speedup']:.2f}x | "
          f"{r['dispatch_speedup']:.2f}x ({'sparse' if r['dispatch_sparse'] else 'dense'}) | {r['rel_err']:.1e} |")
