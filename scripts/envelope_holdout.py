"""Leave one shape out: would the envelope rule have dispatched a measured layer shape safely without its own table?

For every shape that has ``twell tune-dispatch`` runs on file, a :class:`twell.nn.DispatchPolicy` is built from the
tables of all the other measured shapes with ``other_shapes="envelope"``, and its decisions are checked against the
held-out shape's runs (``tune_dispatch.default_policy_check``'s pairing: each point's worst speedup over the runs, at
the highest density drawn): how many points it sends sparse, the lowest speedup among them, and every loss.  The
tables are the shipped ones (:data:`twell.nn.H200_BF16_SHAPE_TABLES`) and any ``--tables`` policy files (what
``twell tune-dispatch --from`` wrote) of other shapes.  On the CPU, from committed results::

    python scripts/envelope_holdout.py \\
        --runs bench_results/h200/dispatch_*_session31_{a,b2}.json ... \\
        --tables bench_results/h200/dispatch_*_session32_merged_policy.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from twell.bench.tune_dispatch import policy_check
from twell.nn import H200_BF16_SHAPE_TABLES, DispatchPolicy, envelope_table, load_policy


def _runs_by_shape(paths: list[Path]) -> dict[tuple[int, int], list[dict]]:
    rows: dict[tuple[int, int], list[dict]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        d, f = (int(v) for v in data["meta"]["shape"])
        rows.setdefault((d, f), []).extend(r for r in data["rows"] if "error" not in r)
    return rows


def _tables(paths: list[Path]) -> dict[tuple[int, int], tuple]:
    tables = dict(H200_BF16_SHAPE_TABLES)
    for path in paths:
        policy = load_policy(path)
        if policy.shapes is None or len(policy.shapes) != 1:
            raise SystemExit(f"{path}: a policy of one measured shape is needed, got shapes {policy.shapes}")
        tables.setdefault(policy.shapes[0], policy.table)  # a shipped table wins over a file of the same shape
    return tables


def holdout(shape: tuple[int, int], rows: list[dict], tables: dict[tuple[int, int], tuple], rule: str) -> dict:
    """The envelope rule at ``shape`` from the other shapes' tables, checked on ``rows`` (that shape's runs).

    ``rule``: ``"bracket"`` (DispatchPolicy's: the nearest measured shapes below and above), or ``"box"``: every other
    measured shape, where the held-out one lies within their hidden and intermediate sizes' ranges (compared with it).
    """
    others = tuple((s, t) for s, t in sorted(tables.items()) if s != shape)
    policy = DispatchPolicy(shape_tables=others, shapes=tuple(s for s, _ in others), other_shapes="envelope")
    bracket = policy.envelope_shapes(shape)
    if rule == "box":
        hs, fs = [s[0] for s, _ in others], [s[1] for s, _ in others]
        inside = min(hs) <= shape[0] <= max(hs) and min(fs) <= shape[1] <= max(fs)
        bracket = tuple(s for s, _ in others) if inside else ()
        table = envelope_table(t for _, t in others) if inside else ()
        policy = DispatchPolicy(table=table, shapes=None)
    return {"bracket": bracket, **policy_check(rows, policy, d=shape[0], f=shape[1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, nargs="+", required=True, help="tune-dispatch run JSONs (<stem>.json)")
    ap.add_argument("--tables", type=Path, nargs="*", default=[], help="policy files of further measured shapes")
    ap.add_argument("--rule", choices=["bracket", "box"], default="bracket")
    a = ap.parse_args()
    tables = _tables(a.tables)
    print("| held-out shape | bracketing shapes | points sparse (won by 1.05x in every run) | lowest speedup | "
          "losses |\n|---|---|---|---|---|")
    bad = 0
    for shape, rows in sorted(_runs_by_shape(a.runs).items()):
        r = holdout(shape, rows, tables, a.rule)
        bracket = ("all others" if a.rule == "box" and r["bracket"] else
                   ", ".join(f"{h}x{f}" for h, f in r["bracket"]) or "none: dense")
        lowest = "-" if r["lowest_speedup"] is None else f"{r['lowest_speedup']:.2f}x"
        losses = "; ".join(f"M={x['m']} {x['density'] * 100:.2f} %: {x['speedup']:.2f}x{'' if x['ok'] else ' WRONG'}"
                           for x in r["losses"]) or "none"
        bad += len(r["losses"])
        print(f"| {shape[0]}x{shape[1]} | {bracket} | {r['sparse_points']} of {r['points']} ({r['won_points']}) | "
              f"{lowest} | {losses} |")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
