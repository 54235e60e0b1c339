"""The dispatch of unmeasured layer shapes: the envelope of the measured tables and where DispatchPolicy applies it."""

from __future__ import annotations

import pytest

from twell.nn import DEFAULT_POLICY, H200_BF16_SHAPE_TABLES, DispatchPolicy, envelope_table

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


def test_a_shape_between_the_measured_ones_follows_their_envelope():
    p = _policy(other_shapes="envelope")
    inside = (96, 384)
    assert p.follows_envelope(inside) and p.table_for(inside) == envelope_table([A, B])
    assert p.use_sparse(1, 0.05, shape=inside) and not p.use_sparse(1, 0.051, shape=inside)
    assert not p.use_sparse(512, 0.001, shape=inside)  # A dense there
    assert p.use_sparse(2048, 0.08, shape=inside) and not p.use_sparse(2048, 0.081, shape=inside)
    # the box's edges are inside; the measured shapes keep their own tables
    assert p.follows_envelope((64, 512)) and p.follows_envelope((128, 256))
    assert not p.follows_envelope((64, 256)) and p.table_for((64, 256)) == A
    assert p.use_sparse(1, 0.10, shape=(64, 256))


@pytest.mark.parametrize("shape", [(32, 384), (256, 384), (96, 128), (96, 1024), None])
def test_a_shape_outside_the_measured_ranges_runs_dense(shape):
    p = _policy(other_shapes="envelope")
    assert not p.follows_envelope(shape)
    assert not p.use_sparse(8192, 0.0, shape=shape)


def test_the_envelope_is_off_by_default_and_on_other_devices():
    assert not _policy().follows_envelope((96, 384))
    assert not _policy().use_sparse(8192, 0.0, shape=(96, 384))
    p = _policy(other_shapes="envelope")
    assert not p.use_sparse(8192, 0.0, shape=(96, 384), device_type="cpu")
    # shapes=None: ``table`` already holds for every shape, so no envelope is built
    anyshape = DispatchPolicy(table=((0, 0.5),), shapes=None, shape_tables=(((64, 256), A),), other_shapes="envelope")
    assert not anyshape.follows_envelope((96, 384)) and anyshape.table_for((96, 384)) == ((0, 0.5),)
    # a shape_tables entry outside ``shapes`` is not a measured shape of the policy's, so not in its envelope
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


def test_the_default_policy_sends_unmeasured_h200_shapes_between_the_six_to_their_envelope():
    env = envelope_table(t for _, t in H200_BF16_SHAPE_TABLES)
    shape = (3072, 8192)  # Llama-3.2-3B's FFN: not measured, within hidden 896-4096 and intermediate 4864-14336
    assert DEFAULT_POLICY.follows_envelope(shape) and DEFAULT_POLICY.table_for(shape) == env
    # every one of the six runs one token sparse to at least 2048 x 5632's 5.59 %, and from 2048 tokens (896 x 4864's
    # first sparse row) every density to ~9.8 %; 16-2047 tokens are dense in at least one table
    assert DEFAULT_POLICY.use_sparse(1, 0.0559, shape=shape) and not DEFAULT_POLICY.use_sparse(1, 0.06, shape=shape)
    for m in (16, 64, 256, 512, 1024, 2047):
        assert not DEFAULT_POLICY.use_sparse(m, 0.0025, shape=shape)
    for m in (2048, 4096, 16384, 131072, 10**7):
        assert DEFAULT_POLICY.use_sparse(m, 0.098, shape=shape) and not DEFAULT_POLICY.use_sparse(m, 0.1, shape=shape)
    for outside in ((768, 3072), (5120, 13824), (3584, 18944)):
        assert not DEFAULT_POLICY.follows_envelope(outside)
        assert not DEFAULT_POLICY.use_sparse(16384, 0.005, shape=outside)
