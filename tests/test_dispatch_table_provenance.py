"""The shipped H200 dispatch rows equal what ``twell tune-dispatch --from`` derives from the committed runs.

Each limit is the last winning point's density rounded up in its 7th decimal (``twell.nn.dispatch``), so the measured
point itself stays inside.  Guards against a typed table drifting from the runs it cites.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from twell.nn import H200_BF16_2048X5632_TABLE, H200_BF16_4096X14336_TABLE

RESULTS = Path(__file__).resolve().parents[1] / "bench_results" / "h200"


def _derived(name: str) -> list[tuple[int, float]]:
    table = json.loads((RESULTS / name).read_text())["table"]
    return [(int(m), math.ceil(float(d) * 1e7) / 1e7) for m, d in table]


@pytest.mark.parametrize(("policy_file", "shipped", "below"), [
    # session 30: both shapes' runs merged; 2048 x 5632 only below 1024 tokens (its rows above come from sessions 11-29)
    ("dispatch_4096x14336_session30_merged_policy.json", H200_BF16_4096X14336_TABLE, None),
    ("dispatch_2048x5632_session30_below1024_merged_policy.json", H200_BF16_2048X5632_TABLE, 1024),
])
def test_shipped_rows_follow_the_committed_runs(policy_file, shipped, below):
    rows = [r for r in shipped if below is None or r[0] < below]
    derived = _derived(policy_file)
    assert [m for m, _ in rows] == [m for m, _ in derived]
    for (m, limit), (_, want) in zip(rows, derived, strict=True):
        assert limit == pytest.approx(want, abs=1e-12), f"{m} tokens: shipped {limit}, the runs give {want}"
