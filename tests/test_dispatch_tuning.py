"""``derive_table`` and ``derive_decode_table``: the dispatch rows a set of timed points supports, by the
conservative rules of its module."""

from __future__ import annotations

import pytest

from twell.nn import DispatchPolicy
from twell.nn.dispatch_tuning import (
    DEFAULT_MIN_SPEEDUP,
    TuningPoint,
    derive_decode_table,
    derive_eager_floor,
    derive_table,
)


def _pt(tokens: int, density: float, speedup: float, ok: bool = True) -> TuningPoint:
    return TuningPoint(tokens=tokens, density=density, dense_ms=1.0, sparse_ms=1.0 / speedup, ok=ok)


def test_rows_follow_the_winning_prefix_of_each_token_count():
    pts = [
        _pt(1024, 0.005, 0.90), _pt(1024, 0.01, 0.80),                      # never wins: no row
        _pt(4096, 0.005, 1.20), _pt(4096, 0.01, 1.02), _pt(4096, 0.02, 1.3),  # 1 % misses the margin
        _pt(16384, 0.005, 1.5), _pt(16384, 0.01, 1.4), _pt(16384, 0.05, 1.1),
        _pt(131072, 0.005, 1.6), _pt(131072, 0.01, 1.4), _pt(131072, 0.05, 1.2),  # same limit: merged
    ]
    # at 4096 the 2 % win above the 1 % miss is not taken (no islands of sparse above a dense point)
    assert derive_table(pts) == ((4096, 0.005), (16384, 0.05))
    assert derive_table(pts, min_speedup=1.0) == ((4096, 0.02), (16384, 0.05))  # without the margin 1 % counts


def test_a_wrong_output_is_a_loss_and_a_later_loss_turns_sparse_off():
    pts = [_pt(4096, 0.005, 1.3), _pt(16384, 0.005, 1.5, ok=False), _pt(65536, 0.005, 1.6)]
    # 16384 lost inside 4096's row, so the calls between take its answer (dense) from 4097 tokens
    assert derive_table(pts) == ((4096, 0.005), (4097, 0.0), (65536, 0.005))
    policy = DispatchPolicy(table=derive_table(pts), shapes=None)
    assert policy.use_sparse(4096, 0.004) and not policy.use_sparse(8192, 0.004)
    assert policy.use_sparse(65536, 0.004) and not policy.use_sparse(65535, 0.004)
    assert not policy.use_sparse(2048, 0.001)  # below the first row: dense
    assert policy.use_sparse(16384, 0.0)  # an all-zero activation only (documented)


def test_calls_between_counts_take_the_larger_counts_limit_where_it_lost_inside_the_smaller_ones_row():
    pts = [_pt(1, 0.01, 1.2), _pt(1, 0.1, 1.15),     # one token: to 10 %
           _pt(16, 0.01, 1.1), _pt(16, 0.1, 0.9),    # 16 lost at 10 %, inside 1's row: 2-15 tokens get 16's 1 %
           _pt(64, 0.01, 1.1), _pt(64, 0.1, 1.1),    # 64 won everything 16 allows: 17-63 keep 16's 1 %
           _pt(256, 0.01, 1.0),                      # nothing won: 65-255 dense too
           _pt(1024, 0.01, 1.3), _pt(1024, 0.1, 1.3),
           _pt(2048, 0.01, 1.4), _pt(2048, 0.05, 1.0)]  # lost at 5 % inside 1024's 10 %: 1025-2047 to 1 %
    assert derive_table(pts) == ((1, 0.1), (2, 0.01), (64, 0.1), (65, 0.0), (1024, 0.1), (1025, 0.01))
    # consecutive counts (no call between them) and a larger count that lost only above the smaller one's limit
    assert derive_table([_pt(1, 0.1, 1.2), _pt(2, 0.01, 1.2), _pt(2, 0.1, 0.9)]) == ((1, 0.1), (2, 0.01))
    assert derive_table([_pt(16, 0.01, 1.2), _pt(16, 0.02, 0.9),
                         _pt(64, 0.01, 1.2), _pt(64, 0.05, 0.9)]) == ((16, 0.01),)
    # nothing won at the smaller count: no leading dense row, whatever the larger one did
    assert derive_table([_pt(1, 0.01, 0.9), _pt(16, 0.01, 1.2), _pt(16, 0.05, 0.9)]) == ((16, 0.01),)


def test_repeated_runs_the_worse_decides_and_order_does_not_matter():
    pts = [_pt(8192, 0.01, 1.4), _pt(8192, 0.005, 1.3), _pt(8192, 0.01, 1.01)]
    assert derive_table(pts) == ((8192, 0.005),)
    assert derive_table(list(reversed(pts))) == ((8192, 0.005),)


def test_nothing_won_gives_an_empty_table_and_bad_input_is_refused():
    assert derive_table([_pt(4096, 0.01, 0.7)]) == ()
    assert DEFAULT_MIN_SPEEDUP >= 1.0
    with pytest.raises(ValueError, match="min_speedup must be a number >= 1"):
        derive_table([_pt(4096, 0.01, 1.2)], min_speedup=0.9)
    with pytest.raises(ValueError, match="no points"):
        derive_table([])
    with pytest.raises(TypeError, match="TuningPoint"):
        derive_table([(4096, 0.01, 1.0, 0.5)])  # type: ignore[list-item]
    for kwargs, msg in (({"tokens": 0}, "tokens must be an int >= 1"), ({"density": 1.5}, "density must lie"),
                        ({"sparse_ms": 0.0}, "sparse_ms must be a finite time"),
                        ({"dense_ms": float("nan")}, "dense_ms must be a finite time")):
        args = {"tokens": 16, "density": 0.01, "dense_ms": 1.0, "sparse_ms": 1.0, **kwargs}
        with pytest.raises(ValueError, match=msg):
            TuningPoint(**args)
    with pytest.raises(TypeError, match="ok must be a bool"):
        TuningPoint(tokens=16, density=0.01, dense_ms=1.0, sparse_ms=1.0, ok=1)  # type: ignore[arg-type]


def test_a_decode_table_gives_calls_between_measured_counts_the_larger_counts_limit():
    pts = [_pt(1, 0.02, 2.0), _pt(1, 0.1, 1.7),
           _pt(2, 0.02, 1.3), _pt(2, 0.1, 1.0),
           _pt(8, 0.02, 1.2), _pt(8, 0.1, 1.0),
           _pt(32, 0.02, 1.0)]
    # 1 token: to 10 %; 2 tokens: to 2 %; 3-8 tokens (8's limit): 2 % (merged with 2's row); 9-32: dense; above 32:
    # dense (not measured)
    assert derive_decode_table(pts) == ((1, 0.1), (2, 0.02), (9, 0.0))
    assert derive_decode_table(pts, max_tokens=64) == ((1, 0.1), (2, 0.02), (9, 0.0))
    # the largest measured count won: the calls above it, unmeasured, are dense when max_tokens is given
    won = [_pt(1, 0.05, 1.5), _pt(4, 0.05, 1.2)]
    assert derive_decode_table(won) == ((1, 0.05),)
    assert derive_decode_table(won, max_tokens=64) == ((1, 0.05), (5, 0.0))
    # nothing won at the smallest count: no leading dense row; a wrong output counts as a loss
    assert derive_decode_table([_pt(1, 0.01, 1.0), _pt(2, 0.01, 1.5)]) == ((2, 0.01),)
    assert derive_decode_table([_pt(1, 0.01, 1.5, ok=False)], max_tokens=64) == ()
    assert derive_decode_table([_pt(2, 0.01, 1.5)], min_speedup=1.6) == ()
    with pytest.raises(ValueError, match="no points"):
        derive_decode_table([])
    with pytest.raises(ValueError, match="min_speedup"):
        derive_decode_table(won, min_speedup=0.9)


def test_the_eager_floor_is_the_next_measured_count_above_the_largest_loss():
    # 1024 lost at one density of two, 2048 won: counts 1025-2047 were never timed, so they run dense too
    outcomes = [(256, False), (1024, False), (1024, True), (2048, False), (16384, False), (512, True)]
    assert derive_eager_floor(outcomes) == 2048
    assert derive_eager_floor(reversed(outcomes)) == 2048  # order does not matter
    assert derive_eager_floor([(256, False), (1024, False)]) == 0  # nothing lost: no floor
    assert derive_eager_floor([]) == 0
    assert derive_eager_floor([(512, False), (4096, True)]) == 4097  # a loss at the largest count: one past it
    policy = DispatchPolicy(table=((1, 0.05),), force=True, eager_min_tokens=derive_eager_floor(outcomes))
    assert not policy.use_sparse(1024, 0.005, eager=True) and policy.use_sparse(2048, 0.005, eager=True)


def test_the_eager_floor_refuses_bad_outcomes():
    with pytest.raises(ValueError, match="tokens must be an int >= 1"):
        derive_eager_floor([(0, False)])
    with pytest.raises(ValueError, match="tokens must be an int >= 1"):
        derive_eager_floor([(True, False)])
    with pytest.raises(TypeError, match="lost must be a bool"):
        derive_eager_floor([(64, 0.9)])
