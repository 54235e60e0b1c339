"""Print ``H200_BF16_DECODE_TABLES`` entries (``twell.nn.dispatch``) from committed ``twell tune-decode`` runs.

Each limit is rounded up in its 7th decimal, as the inference tables' are, so that the measured point stays inside.
Usage: ``PYTHONPATH=src python3 scripts/decode_tables_from_runs.py bench_results/h200/decode_*_session34_a.json``
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


if __name__ == "__main__":
    for p in sys.argv[1:]:
        (d, f), table = rounded_table(p)
        print(f"    (({d}, {f}), ({', '.join(f'({m}, {x:.7f})' for m, x in table)},)),  # {p.split('/')[-1]}")
