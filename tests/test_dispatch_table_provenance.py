"""The shipped H200 dispatch rows equal what ``twell tune-dispatch --from`` derives from the committed runs.

Each limit is the last winning point's density rounded up in its 7th decimal (``twell.nn.dispatch``), so the measured
point itself stays inside.  Guards against a typed table drifting from the runs it cites.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from twell.bench.tune_decode import points_of
from twell.bench.tune_dispatch import points_of as dispatch_points_of
from twell.nn import (
    DEFAULT_POLICY,
    H200_BF16_896X4864_TABLE,
    H200_BF16_1024X3072_TABLE,
    H200_BF16_1536X8960_TABLE,
    H200_BF16_2048X5632_TABLE,
    H200_BF16_2048X8192_TABLE,
    H200_BF16_2304X9216_TABLE,
    H200_BF16_2560X9728_TABLE,
    H200_BF16_3072X8192_TABLE,
    H200_BF16_3584X18944_TABLE,
    H200_BF16_4096X11008_TABLE,
    H200_BF16_4096X14336_TABLE,
    H200_BF16_5120X13824_TABLE,
    H200_BF16_DECODE_TABLES,
    H200_BF16_SHAPE_TABLES,
)
from twell.nn.dispatch_tuning import derive_decode_table, derive_table
from twell.ops.decode_kernels import DECODE_MAX_TOKENS
from twell.tolerances import ABS_TOL_DENSITY_LIMIT

RESULTS = Path(__file__).resolve().parents[1] / "bench_results" / "h200"


def _derived(name: str) -> list[tuple[int, float]]:
    table = json.loads((RESULTS / name).read_text())["table"]
    return [(int(m), math.ceil(float(d) * 1e7) / 1e7) for m, d in table]


@pytest.mark.parametrize(("policy_file", "shipped", "below"), [
    # session 30: 4096 x 14336's runs merged
    ("dispatch_4096x14336_session30_merged_policy.json", H200_BF16_4096X14336_TABLE, None),
    # 2048 x 5632 below 1024 tokens: session 30's two runs and session 35's two at 1-16 tokens (its rows above come
    # from sessions 11-29)
    ("dispatch_2048x5632_session35_below1024_merged_policy.json", H200_BF16_2048X5632_TABLE, 1024),
    # session 31: four more shapes, two runs each
    ("dispatch_4096x11008_session31_merged_policy.json", H200_BF16_4096X11008_TABLE, None),
    ("dispatch_2048x8192_session31_merged_policy.json", H200_BF16_2048X8192_TABLE, None),
    ("dispatch_1536x8960_session31_merged_policy.json", H200_BF16_1536X8960_TABLE, None),
    ("dispatch_896x4864_session31_merged_policy.json", H200_BF16_896X4864_TABLE, None),
    # session 32: six more
    ("dispatch_3072x8192_session32_merged_policy.json", H200_BF16_3072X8192_TABLE, None),
    ("dispatch_2304x9216_session32_merged_policy.json", H200_BF16_2304X9216_TABLE, None),
    ("dispatch_2560x9728_session32_merged_policy.json", H200_BF16_2560X9728_TABLE, None),
    ("dispatch_1024x3072_session32_merged_policy.json", H200_BF16_1024X3072_TABLE, None),
    ("dispatch_5120x13824_session32_merged_policy.json", H200_BF16_5120X13824_TABLE, None),
    ("dispatch_3584x18944_session32_merged_policy.json", H200_BF16_3584X18944_TABLE, None),
])
def test_shipped_rows_follow_the_committed_runs(policy_file, shipped, below):
    rows = [r for r in shipped if below is None or r[0] < below]
    derived = _derived(policy_file)
    assert [m for m, _ in rows] == [m for m, _ in derived]
    for (m, limit), (_, want) in zip(rows, derived, strict=True):
        assert limit == pytest.approx(want, abs=ABS_TOL_DENSITY_LIMIT), \
            f"{m} tokens: shipped {limit}, the runs give {want}"


@pytest.mark.parametrize("policy_file", sorted(p.name for p in RESULTS.glob("dispatch_*_merged_policy.json")))
def test_each_merged_policy_file_is_what_derive_table_gives_its_runs(policy_file):
    """The committed merged policy files hold the table today's rules (``derive_table``) derive from the runs they
    name, so a change of the rules cannot leave a stale file behind the shipped rows above."""
    data = json.loads((RESULTS / policy_file).read_text())
    runs = data["measured"]["runs"]
    assert len(runs) >= 2, f"{policy_file}: a shipped row needs two runs that agree"
    rows = [r for run in runs for r in json.loads((RESULTS / Path(run["file"]).name).read_text())["rows"]]
    derived = derive_table(dispatch_points_of(rows), min_speedup=data["measured"]["min_speedup"])
    assert [(int(m), float(x)) for m, x in data["table"]] == list(derived)


def test_the_default_policy_applies_every_shipped_table_to_its_shape():
    for (d, f), table in H200_BF16_SHAPE_TABLES:
        assert DEFAULT_POLICY.table_for((d, f)) == table
        for session in (31, 32):
            merged = RESULTS / f"dispatch_{d}x{f}_session{session}_merged_policy.json"
            if merged.exists():  # the session 31-32 shapes: the runs' shape is the table's
                assert json.loads(merged.read_text())["shapes"] == [[d, f]]
        # sparse at the last row's own limit, dense just above it
        m, limit = table[-1]
        assert DEFAULT_POLICY.use_sparse(m, limit, shape=(d, f))
        assert not DEFAULT_POLICY.use_sparse(m, min(1.0, limit + 1e-6), shape=(d, f))
    # unmeasured between measured shapes: their envelope (tests/test_dispatch_envelope.py); elsewhere dense
    assert DEFAULT_POLICY.follows_envelope((4096, 11264))
    assert not DEFAULT_POLICY.use_sparse(131072, 0.005, shape=(6144, 16384))


def test_shipped_decode_tables_follow_the_committed_tune_decode_runs():
    """Each decode table is ``derive_decode_table`` of its shape's newest committed run (``twell tune-decode``,
    ``decode_<shape>_session<N>_a.json``: session 44's since 9b6a7be), limits rounded up in the 7th decimal, so a
    newer run committed without its table fails here."""
    assert DEFAULT_POLICY.decode_tables == H200_BF16_DECODE_TABLES and H200_BF16_DECODE_TABLES
    for (d, f), shipped in H200_BF16_DECODE_TABLES:
        runs = {int(r.name.removesuffix("_a.json").rsplit("_session", 1)[1]): r
                for r in RESULTS.glob(f"decode_{d}x{f}_session*_a.json")}
        assert runs, f"{d}x{f}: no committed tune-decode run"
        run = json.loads(runs[max(runs)].read_text())
        assert run["meta"]["shape"] == [d, f]
        derived = derive_decode_table(points_of(run["rows"]), min_speedup=run["meta"]["min_speedup"],
                                      max_tokens=DECODE_MAX_TOKENS)
        assert [m for m, _ in shipped] == [m for m, _ in derived]
        for (m, limit), (_, want) in zip(shipped, derived, strict=True):
            assert limit == pytest.approx(math.ceil(want * 1e7) / 1e7, abs=ABS_TOL_DENSITY_LIMIT), \
                f"{d}x{f}, {m} tokens"
