"""The dispatch of unmeasured layer shapes: the envelope of the measured tables and where DispatchPolicy applies it."""

from __future__ import annotations

import pytest

from twell.nn import DEFAULT_POLICY, DispatchPolicy, bracketing_shapes, envelope_table

A = ((1, 0.10), (16, 0.0), (1024, 0.08), (8192, 0.09))
B = ((1, 0.05), (512, 0.01), (2048, 0.10))


def test_the_envelope_takes_the_lowest_limit_at_every_row_start_of_any_table():
    # 1: min(0.10, 0.05); 16: A dense (0.0); 512: A still 0.0; 1024: min(0.08, 0.01); 2048: min(0.08, 0.10);
    # 8192: min(0.09, 0.10).  Rows that repeat the limit before them are merged.
    assert envelope_table([A, B]) == ((1, 0.05), (16, 0.0), (1024, 0.01), (2048, 0.08), (8192, 0.09))
    assert envelope_table([A, B]) == envelope_table([B, A])
    assert envelope_table([A]) == A
    assert envelope_table([]) == ()


def test_the_envelope_is_dense_until_every_table_has_begun():
    late = ((4096, 0.2),)
    assert envelope_table([A, late]) == ((4096, 0.08), (8192, 0.09))
    # a table with no rows at all is dense everywhere, and so is the envelope
    assert envelope_table([A, ()]) == ()


def test_the_envelope_refuses_a_malformed_table_by_its_row():
    with pytest.raises(ValueError, match="strictly increasing min_tokens"):
        envelope_table([A, ((16, 0.1), (8, 0.1))])


def _policy(**kw) -> DispatchPolicy:
    return DispatchPolicy(shape_tables=(((64, 256), A), ((128, 512), B)), shapes=((64, 256), (128, 512)), **kw)


def test_bracketing_shapes_are_the_nearest_measured_shapes_below_and_above():
    measured = [(896, 4864), (1024, 3072), (2048, 5632), (2048, 8192), (4096, 11008), (4096, 14336), (3584, 18944)]
    # below 3072 x 8192: 2048 x 8192 exceeds 2048 x 5632, 896 x 4864 and 1024 x 3072 in both sizes, so only it counts;
    # above: 4096 x 11008 and 3584 x 18944 (neither undercuts the other in both), not 4096 x 14336 (4096 x 11008 does)
    assert bracketing_shapes((3072, 8192), measured) == ((2048, 8192), (3584, 18944), (4096, 11008))
    # two incomparable shapes below: both count (and above, 4096 x 11008 and 3584 x 18944 again)
    assert bracketing_shapes((1536, 8960), measured) == ((896, 4864), (1024, 3072), (3584, 18944), (4096, 11008))
    # a measured shape brackets itself alone; nothing above or nothing below: no bracket
    assert bracketing_shapes((2048, 8192), measured) == ((2048, 8192),)
    assert bracketing_shapes((5120, 13824), measured) == ()
    assert bracketing_shapes((768, 2048), measured) == ()
    assert bracketing_shapes((4096, 20000), measured) == ()


def test_a_shape_between_the_measured_ones_follows_the_envelope_of_both_tables():
    p = _policy(other_shapes="envelope")
    inside = (96, 384)
    assert p.envelope_shapes(inside) == ((64, 256), (128, 512))
    assert p.follows_envelope(inside) and p.table_for(inside) == envelope_table([A, B])
    assert p.use_sparse(1, 0.05, shape=inside) and not p.use_sparse(1, 0.051, shape=inside)
    assert not p.use_sparse(512, 0.001, shape=inside)  # A dense there
    assert p.use_sparse(2048, 0.08, shape=inside) and not p.use_sparse(2048, 0.081, shape=inside)
    # the bracket's edges are inside; the measured shapes keep their own tables
    assert p.follows_envelope((64, 512)) and p.follows_envelope((128, 256))
    assert not p.follows_envelope((64, 256)) and p.table_for((64, 256)) == A
    assert p.use_sparse(1, 0.10, shape=(64, 256))


def test_below_1024_tokens_every_measured_table_counts_from_there_the_bracketing_ones():
    """Three measured shapes: ``weak`` (small, dense at 16-1023 and at 8192 above 0.5 %), ``mid`` and ``big``.  A layer
    between ``mid`` and ``big`` follows their envelope from ENVELOPE_BRACKET_MIN_TOKENS (1024) tokens, where ``weak``
    is not among its nearest; below, ``weak``'s dense rows hold it back too."""
    weak = ((1, 0.05), (16, 0.0), (1024, 0.01), (4096, 0.1), (8192, 0.005), (16384, 0.1))
    mid = ((1, 0.08), (16, 0.02), (256, 0.0), (1024, 0.1))
    big = ((1, 0.14), (16, 0.1), (1024, 0.1))
    p = DispatchPolicy(shape_tables=(((32, 128), weak), ((64, 256), mid), ((128, 512), big)),
                       shapes=((32, 128), (64, 256), (128, 512)), other_shapes="envelope")
    shape = (96, 384)
    assert p.envelope_shapes(shape) == ((64, 256), (128, 512))
    assert p.table_for(shape) == ((1, 0.05), (16, 0.0), (1024, 0.1))
    assert p.use_sparse(8192, 0.05, shape=shape)  # weak's dip at 8192 does not apply: it does not bracket the shape
    assert not p.use_sparse(16, 0.01, shape=shape)  # mid and big win at 16 tokens, weak does not


def test_the_envelope_is_dense_until_the_bracketing_tables_begin():
    early = ((1, 0.05), (16, 0.0), (512, 0.01), (1024, 0.1))  # a measured shape outside the bracket, sparse from 512
    late = ((2048, 0.1),)  # the bracketing shapes: dense below 2048 tokens
    p = DispatchPolicy(shape_tables=(((32, 128), early), ((64, 256), late), ((128, 512), late)),
                       shapes=((32, 128), (64, 256), (128, 512)), other_shapes="envelope")
    shape = (96, 384)
    assert p.envelope_shapes(shape) == ((64, 256), (128, 512))
    assert p.table_for(shape) == ((2048, 0.1),)
    assert not p.use_sparse(1, 0.0, shape=shape) and not p.use_sparse(1500, 0.001, shape=shape)
    # the second call reads the cached bracket and table: the same answer
    assert p.table_for(shape) == ((2048, 0.1),) and p.use_sparse(2048, 0.1, shape=shape)


@pytest.mark.parametrize("shape", [(32, 384), (256, 384), (96, 128), (96, 1024), None])
def test_a_shape_no_measured_shapes_bracket_runs_dense(shape):
    p = _policy(other_shapes="envelope")
    assert not p.follows_envelope(shape) and p.envelope_shapes(shape) == ()
    assert not p.use_sparse(8192, 0.0, shape=shape)


def test_the_envelope_is_off_by_default_and_on_other_devices():
    assert not _policy().follows_envelope((96, 384))
    assert not _policy().use_sparse(8192, 0.0, shape=(96, 384))
    p = _policy(other_shapes="envelope")
    assert not p.use_sparse(8192, 0.0, shape=(96, 384), device_type="cpu")
    # shapes=None: ``table`` already holds for every shape, so no envelope applies
    anyshape = DispatchPolicy(table=((0, 0.5),), shapes=None, shape_tables=(((64, 256), A),), other_shapes="envelope")
    assert not anyshape.follows_envelope((96, 384)) and anyshape.table_for((96, 384)) == ((0, 0.5),)
    # a shape_tables entry outside ``shapes`` is not a measured shape of the policy's, so it brackets nothing
    narrow = DispatchPolicy(shape_tables=(((64, 256), A), ((128, 512), B)), shapes=((64, 256),),
                            other_shapes="envelope")
    assert not narrow.follows_envelope((96, 384))


def test_the_envelope_never_takes_the_small_batch_kernels():
    p = _policy(other_shapes="envelope", decode_max_tokens=1)
    assert p.use_decode(1, shape=(64, 256)) and not p.use_decode(1, shape=(96, 384))


def test_other_shapes_is_checked_and_part_of_the_value():
    with pytest.raises(ValueError, match="other_shapes must be one of \\('dense', 'envelope'\\), got 'nearest'"):
        DispatchPolicy(other_shapes="nearest")
    assert _policy(other_shapes="envelope") != _policy()
    assert hash(_policy(other_shapes="envelope")) == hash(_policy(other_shapes="envelope"))


def test_the_default_policy_sends_unmeasured_h200_shapes_between_measured_ones_to_their_envelope():
    shape = (4096, 12288)  # Qwen3-8B's FFN: not measured; 4096 x 11008 below it, 4096 x 14336 and 5120 x 13824 above
    bracket = ((4096, 11008), (4096, 14336), (5120, 13824))
    assert DEFAULT_POLICY.envelope_shapes(shape) == bracket
    # one token: the lowest one-token limit of all twelve (1024 x 3072's 5.08 %); 16-1023 tokens: dense in some table
    assert DEFAULT_POLICY.use_sparse(1, 0.0507, shape=shape) and not DEFAULT_POLICY.use_sparse(1, 0.051, shape=shape)
    for m in (16, 64, 256, 512, 1023):
        assert not DEFAULT_POLICY.use_sparse(m, 0.0025, shape=shape)
    # from 1024 tokens the three bracketing tables run sparse to ~10 % (the lowest of their limits)
    for m in (1024, 2048, 8192, 16384, 131072, 10**7):
        limit = min(DEFAULT_POLICY.max_density(m, s) for s in bracket)
        assert limit > 0.099
        assert DEFAULT_POLICY.use_sparse(m, limit, shape=shape) and not DEFAULT_POLICY.use_sparse(m, 0.102, shape=shape)
    for outside in ((768, 3072), (6144, 16384), (4096, 20480), (8192, 28672)):
        assert not DEFAULT_POLICY.follows_envelope(outside)
        assert not DEFAULT_POLICY.use_sparse(16384, 0.005, shape=outside)


def test_left_out_in_turn_no_measured_shape_loses_where_the_rule_sends_it_sparse():
    """scripts/envelope_holdout.py on the committed two-run tuning sets (sessions 31-32): each measured shape,
    dispatched by the envelope rule from the other tables, loses at no point the rule sends sparse (the script exits 1
    on one)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = root / "bench_results" / "h200"
    runs = [res / f"dispatch_{s}_session31_{r}.json" for s in ("4096x11008", "2048x8192", "1536x8960") for r in "ab"]
    runs += [res / "dispatch_896x4864_session31_a.json", res / "dispatch_896x4864_session31_b2.json"]
    runs += [res / f"dispatch_{s}_session32_{r}.json" for s in ("3072x8192", "2304x9216", "2560x9728", "1024x3072",
                                                                 "5120x13824", "3584x18944") for r in "ab"]
    out = subprocess.run([sys.executable, str(root / "scripts" / "envelope_holdout.py"), "--runs", *map(str, runs)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "x" in line.split("|")[1]
            and "held-out" not in line]
    assert len(rows) == 10 and all(line.rstrip().endswith("| none |") for line in rows)
    # the six shapes with measured shapes on both sides follow an envelope and run some points sparse
    bracketed = [line for line in rows if "none: dense" not in line]
    assert len(bracketed) == 6 and all(" 0 of " not in line for line in bracketed)
