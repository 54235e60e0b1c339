"""A README table from ``twell tune-dispatch`` runs: per layer shape, the module held sparse against the dense module
at a few token counts and density targets, every run's speedup side by side, and what the shipped policy runs there.

    python scripts/dispatch_runs_table.py --runs bench_results/h200/dispatch_4096x11008_session31_{a,b}.json \
        --runs bench_results/h200/dispatch_896x4864_session31_{a,b2}.json --ms 1 1024 16384 131072 --densities 0.5 2

Each ``--runs`` names the runs of one shape.  A cell reads "a / b (path)": the runs' speedups at that target, and
the path :data:`twell.nn.DEFAULT_POLICY` takes at the highest density the runs drew there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from twell.nn import DEFAULT_POLICY


def cell(rows: list[dict], shape: tuple[int, int]) -> str:
    if not rows:
        return "-"
    speedups = " / ".join(f"{r['speedup']:.2f}x" for r in rows)
    density = max(float(r["density"]) for r in rows)
    sparse = DEFAULT_POLICY.use_sparse(int(rows[0]["m"]), min(1.0, density), shape=shape)
    return f"{speedups} ({'sparse' if sparse else 'dense'})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, nargs="+", action="append", required=True, help="the runs of one shape")
    p.add_argument("--ms", type=int, nargs="+", required=True)
    p.add_argument("--densities", type=float, nargs="+", required=True, help="targets in percent")
    a = p.parse_args()
    cols = [(m, pct) for pct in a.densities for m in a.ms]
    print("| d x F | " + " | ".join(f"{m} token{'' if m == 1 else 's'}, {pct:g} %" for m, pct in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for paths in a.runs:
        runs = [json.loads(path.read_text()) for path in paths]
        d, f = (int(v) for v in runs[0]["meta"]["shape"])
        cells = []
        for m, pct in cols:
            rows = [r for run in runs for r in run["rows"]
                    if "error" not in r and r["m"] == m and abs(r["density_pct"] - pct) < 1e-9]
            cells.append(cell(rows, (d, f)))
        print(f"| {d}x{f} | " + " | ".join(cells) + " |")
    commits = sorted({str(run["meta"].get("commit")) for paths in a.runs for run in map(
        lambda q: json.loads(q.read_text()), paths)})
    print(f"\n(runs at commits {', '.join(commits)})")


if __name__ == "__main__":
    main()
