"""``twell.tolerances.within_tolerance``: the bar, and the dense module's own error as the fallback bar."""

from __future__ import annotations

import pytest
import torch

from twell.tolerances import DENSE_ERROR_FACTOR, REL_TOL, REL_TOL_GRAD, within_tolerance


def test_within_the_dtype_bar_passes_without_a_dense_error() -> None:
    assert within_tolerance(REL_TOL[torch.bfloat16], torch.bfloat16)
    assert not within_tolerance(REL_TOL[torch.bfloat16] * 1.01, torch.bfloat16)


def test_over_the_bar_passes_only_as_close_as_the_dense_module() -> None:
    dense_err = 6.0e-3  # a bf16 FFN on one token can miss 5e-3 itself
    assert within_tolerance(dense_err, torch.bfloat16, dense_err)
    assert within_tolerance(dense_err * DENSE_ERROR_FACTOR, torch.bfloat16, dense_err)
    assert not within_tolerance(dense_err * DENSE_ERROR_FACTOR * 1.01, torch.bfloat16, dense_err)
    assert not within_tolerance(float("inf"), torch.bfloat16, dense_err)
    assert not within_tolerance(float("nan"), torch.bfloat16, dense_err)


def test_gradient_table_and_factor() -> None:
    bar = REL_TOL_GRAD[torch.bfloat16]
    assert within_tolerance(bar, torch.bfloat16, table=REL_TOL_GRAD)
    assert not within_tolerance(bar, torch.bfloat16)  # the forward bar is tighter
    assert within_tolerance(1.4 * bar, torch.bfloat16, bar, 1.5, REL_TOL_GRAD)


def test_unknown_dtype_is_refused_with_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="no tolerance for dtype torch.int8; accepted: torch.float64"):
        within_tolerance(0.0, torch.int8)
