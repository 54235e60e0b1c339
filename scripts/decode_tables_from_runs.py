"""Print ``H200_BF16_DECODE_TABLES`` entries (``twell.nn.dispatch``) from committed ``twell tune-decode`` runs.

Each limit is rounded up in its 7th decimal, as the inference tables' are, so that the measured point stays inside.
Usage: ``PYTHONPATH=src python3 scripts/decode_tables_from_runs.py bench_results/h200/decode_*_session3[45]_a.json``;
with ``--markdown``, each run's speedups (dense / small-batch) as a table of target density by token count instead
(the README's decode section).
"""

from __future__ import annotations

import json
import math
import sys

from twell.bench.tune_decode import points_of
from twell.nn.dispatch_tuning import derive_decode_table
from twell.ops.decode_kernels import DECODE_MAX_TOKENS


def rounded_table(path: str) -> tuple[tuple[int, int], tuple[tuple[int, float], ...]]:
    run = json.loads(open(path).read())
    d, f = run["meta"]["shape"]
    table = derive_decode_table(points_of(run["rows"]), min_speedup=run["meta"]["min_speedup"],
                                max_tokens=DECODE_MAX_TOKENS)
    return (d, f), tuple((m, math.ceil(x * 1e7) / 1e7) for m, x in table)


def markdown(path: str) -> str:
    run = json.loads(open(path).read())
    rows = [r for r in run["rows"] if "error" not in r]
    ms = sorted({r["m"] for r in rows})
    lines = [f"{run['meta']['shape'][0]}x{run['meta']['shape'][1]} ({run['meta']['device']}, commit "
             f"{run['meta']['commit']}, {path.split('/')[-1]}):", "",
             "| density (target) | " + " | ".join(f"{m} tok" for m in ms) + " |",
             "|---" * (len(ms) + 1) + "|"]
    for dens in sorted({r["density_pct"] for r in rows}):
        by_m = {r["m"]: r for r in rows if r["density_pct"] == dens}
        lines.append(f"| {dens:g} % | " + " | ".join(f"{by_m[m]['speedup']:.2f}x" if m in by_m else "-" for m in ms)
                     + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if "--markdown" in sys.argv[1:]:
        print("\n\n".join(markdown(p) for p in sys.argv[1:] if p != "--markdown"))
        raise SystemExit(0)
    for p in sys.argv[1:]:
        (d, f), table = rounded_table(p)
        print(f"    (({d}, {f}), ({', '.join(f'({m}, {x:.7f})' for m, x in table)},)),  # {p.split('/')[-1]}")
