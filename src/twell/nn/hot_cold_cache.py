"""A layer's hot/cold plan (``twell.ops.hot_cold``), kept current by ``SparseGatedMLP``.

The hot units are re-chosen from a sample of the call's tokens on the layer's l0-refresh calls (the
only calls that may synchronise with the host: the hot count sets tensor sizes; a new set that
differs from the current one in under 10 % of its units is ignored); the plan's weight
copies are rebuilt when a parameter changes (its version counter or storage moves), so an optimizer
step or a ``load_state_dict`` between inference calls never leaves stale copies in use.

Everything the cache holds is built with inference mode off (and grad mode off): a refresh or a
rebuild that happens inside ``torch.inference_mode()`` would otherwise store inference tensors, which
outlive that block and make a later in-place update or autograd use of them fail ("Inference tensors
cannot be saved for backward").
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops.hot_cold_plan import (
    HOT_MAX_COLD_L0,
    HOT_MIN_FREQUENCY,
    HotColdPlan,
    build_hot_cold_plan,
    check_max_cold_l0,
    choose_hot_units,
    unit_frequency,
)


def _weights_key(*weights: torch.Tensor) -> tuple:
    return tuple((w.data_ptr(), w._version, tuple(w.shape), w.dtype, w.device) for w in weights)


class HotColdCache:
    """Holds the current plan of one layer (None: no unit fires often enough to be worth a dense pass)."""

    def __init__(self, min_frequency: float = HOT_MIN_FREQUENCY, max_cold_l0: float | None = HOT_MAX_COLD_L0) -> None:
        """``min_frequency`` and ``max_cold_l0``: :func:`twell.ops.choose_hot_units`'s (None: no bound)."""
        if not 0.0 < min_frequency <= 1.0:
            raise ValueError(f"min_frequency must be in (0, 1], got {min_frequency}")
        check_max_cold_l0(max_cold_l0)
        self.min_frequency = min_frequency
        self.max_cold_l0 = max_cold_l0
        self._hot: torch.Tensor | None = None
        self._plan: HotColdPlan | None = None
        self._key: Any = None

    @property
    def chosen(self) -> bool:
        """Whether the hot units have been chosen at least once (since the last :meth:`clear`)."""
        return self._hot is not None

    def refresh(self, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> None:
        """Re-choose the hot units from (a sample of) the tokens ``x``; synchronises with the host once."""
        with torch.inference_mode(False), torch.no_grad():
            hot = choose_hot_units(unit_frequency(x, w_gate), min_frequency=self.min_frequency,
                                   max_cold_l0=self.max_cold_l0)
        if self._hot is not None and self._hot.device == hot.device and self._close_enough(self._hot, hot):
            return
        self._hot = hot
        self._plan = None
        self._key = None

    #: A re-chosen hot set that shares at least this fraction of units with the current one (and has the
    #: same size) is ignored: units near the frequency threshold flip in and out of a 4096-token sample,
    #: and each change would rebuild the plan (a reordered copy of Wg and host syncs) for no speed gain.
    KEEP_OVERLAP = 0.9

    @classmethod
    def _close_enough(cls, old: torch.Tensor, new: torch.Tensor) -> bool:
        if old.numel() != new.numel():
            return False
        if old.numel() == 0:
            return True
        return int(torch.isin(new, old).sum()) >= cls.KEEP_OVERLAP * old.numel()

    def plan(
        self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *, key: Any = None,
        fused_tile: int = 0,
    ) -> HotColdPlan | None:
        """The plan for the current weights (rebuilt if they changed), or None when there is no hot unit.

        ``key``: a fingerprint of the three weights that the caller has already computed (anything
        that compares equal exactly while the weights are unchanged; ``SparseGatedMLP`` passes its
        own, identity included), which saves building one here per call; None: this cache's own
        (storage pointer, version, shape, dtype, device of each weight).  ``fused_tile``: the plan's
        gate weight layout (see ``HotColdPlan``); a change rebuilds the plan.
        """
        if self._hot is None or self._hot.numel() == 0:
            return None
        if key is None:
            key = _weights_key(w_gate, w_up, w_down)
        if self._plan is None or key != self._key or self._plan.fused_tile != fused_tile:
            with torch.inference_mode(False), torch.no_grad():
                self._plan = build_hot_cold_plan(w_gate.detach(), w_up.detach(), w_down.detach(), self._hot,
                                                 fused_tile=fused_tile)
            self._key = key
        return self._plan

    def clear(self) -> None:
        self._hot = None
        self._plan = None
        self._key = None
