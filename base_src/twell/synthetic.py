"""Synthetic ReLU-gate activations with the statistics of L1-trained sparse FFNs.

Benchmarks and tests of the sparse kernels need activations that look like the real ones, because
kernel speed depends on *how* the non-zeros are spread, not only on how many there are.  The
numbers below come from the Sakana/NVIDIA paper "Sparser, Faster, Lighter Transformer Language
Models" (2026), 1.5B model, L1 coefficient 2e-5:

* on average ~29 of 5632 hidden units are non-zero per token and layer (0.5 %);
* over 30 % of hidden units are dead (never fire) -> ``dead_fraction=0.3``;
* unit firing frequencies are heavy-tailed -> Zipf ranks, ``tail_exponent``;
* the first tokens of a sequence fire far more units, decaying roughly exponentially with the
  position -> ``early_boost`` / ``early_decay``;
* the per-layer maximum per token is often > 10x the mean -> ``token_correlation`` (a shared
  per-token latent that makes whole tokens dense or sparse);
* early-middle layers are densest -> :func:`layer_profiles`.

Two generators are provided.  :func:`synthetic_gate_logits` draws the gate pre-activation directly
(exact control over every per-token/per-unit probability).  :func:`synthetic_ffn_problem` builds
``x, w_gate, w_up, w_down`` such that the *real* product ``relu(x @ w_gate.T)`` has the profile,
which is what a fused gate-GEMM benchmark needs (the sparsity has to come out of the matmul).

Random draws are made on the generator's device (the CPU when it is a CPU generator) and then moved
to ``device``, so one seeded CPU generator gives the same tensors on every device.  Without a
generator the draws are made on ``device`` directly (fast for big GPU problems).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch

from ._validation import FLOAT_DTYPES, check_positive_int, check_tensor

__all__ = [
    "UNION_BLOCK",
    "SparsityProfile",
    "block_unions",
    "independent_union",
    "layer_profiles",
    "measure_sparsity",
    "position_scale",
    "synthetic_ffn_problem",
    "synthetic_gate_logits",
    "unit_frequencies",
]

#: Threshold of dead units in :func:`synthetic_ffn_problem`, in standard deviations of the gate
#: noise above the largest per-token shift.  A float32 N(0,1) never exceeds ~6.5 sigma even in
#: 10^10 draws, so 40 sigma keeps dead units at exactly zero with a wide bf16 rounding margin.
_DEAD_MARGIN = 40.0

#: Grids for inverting ``delta -> sum_j Phi(delta - thr_j)`` in :func:`synthetic_ffn_problem` (see
#: :func:`_solve_shifts`): a coarse bracket over +-10 sigma, then a fine grid inside the bracket.
_DELTA_LO, _DELTA_HI, _DELTA_COARSE, _DELTA_FINE = -10.0, 10.0, 81, 513


def _check_real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


@dataclass(frozen=True)
class SparsityProfile:
    """Target statistics of a ReLU gate ``relu(x @ w_gate.T)`` of one layer.

    Attributes:
        mean_l0: target mean number of non-zero hidden units per token, averaged over **all**
            positions of a sequence.  The early-position boost is normalised (see
            :func:`position_scale`) so that it redistributes non-zeros along the sequence without
            changing this mean.  Paper value: ~29 of 5632 at L1 coefficient 2e-5.
        dead_fraction: fraction of hidden units that never fire, in [0, 1).  Paper: > 30 %.
        tail_exponent: Zipf exponent ``a >= 0`` of the live units' firing frequencies:
            the unit of frequency rank ``r`` (1 = most frequent) fires with probability
            proportional to ``r ** -a`` (then capped at ``max_probability``, see
            :func:`unit_frequencies`).  ``a = 0`` is uniform; the default ``a = 1.0`` (classic Zipf)
            makes the top 10 % of all units carry ~75 % of the firings at the paper's operating
            point (29 of 5632, 30 % dead), a clearly heavy tail that still leaves thousands of
            rarely-firing units, as observed.
        seq_len: tokens of a batch are laid out as consecutive sequences of this length; the
            position of token ``t`` is ``t % seq_len``.
        early_boost: how many times denser (in mean non-zeros) position 0 is than the sequence mean.
            ``1.0`` disables the position effect.  Default 4.0.
        early_decay: number of positions over which the boost decays by a factor e (exponential
            decay).  Default 32.0.
        max_probability: no unit fires with probability above this at an average position
            (default 0.9: even the most frequent unit is silent on some tokens).
        token_correlation: correlation, within one token, of the latent Gaussian gate values of two
            units, in [0, 1).  It leaves every unit's firing probability unchanged but makes whole
            tokens dense or sparse together.  The default 0.1 gives a per-token maximum of
            ~10-12x the mean l0 on 4096-token batches at 29 of 5632 (paper: "often > 10x"; measured
            4.5x at 0.0 -- mostly the 4x early boost --, 13x at 0.15, 17x at 0.2).
    """

    mean_l0: float
    dead_fraction: float = 0.3
    tail_exponent: float = 1.0
    seq_len: int = 2048
    early_boost: float = 4.0
    early_decay: float = 32.0
    max_probability: float = 0.9
    token_correlation: float = 0.1

    def __post_init__(self) -> None:
        mean_l0 = _check_real(self.mean_l0, "mean_l0")
        if mean_l0 <= 0:
            raise ValueError(f"mean_l0 must be > 0 (mean active units per token), got {mean_l0}")
        dead = _check_real(self.dead_fraction, "dead_fraction")
        if not 0.0 <= dead < 1.0:
            raise ValueError(f"dead_fraction must be in [0, 1), got {dead}")
        tail = _check_real(self.tail_exponent, "tail_exponent")
        if tail < 0:
            raise ValueError(f"tail_exponent must be >= 0 (0 = uniform frequencies), got {tail}")
        check_positive_int(self.seq_len, "seq_len")
        boost = _check_real(self.early_boost, "early_boost")
        if boost < 1.0:
            raise ValueError(f"early_boost must be >= 1 (1 = no position effect), got {boost}")
        decay = _check_real(self.early_decay, "early_decay")
        if decay <= 0:
            raise ValueError(f"early_decay must be > 0 positions, got {decay}")
        cap = _check_real(self.max_probability, "max_probability")
        if not 0.0 < cap <= 1.0:
            raise ValueError(f"max_probability must be in (0, 1], got {cap}")
        rho = _check_real(self.token_correlation, "token_correlation")
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"token_correlation must be in [0, 1), got {rho}")
        if boost > 1.0:
            geo = _decay_sum(self.seq_len, decay)
            if boost * geo > self.seq_len:
                raise ValueError(
                    f"early_boost={boost} with early_decay={decay} cannot keep a mean of 1 over "
                    f"seq_len={self.seq_len}: the boosted head alone would carry {boost * geo:.1f} "
                    f"position-units (> seq_len); lower early_boost or early_decay, or raise seq_len"
                )


def _decay_sum(seq_len: int, decay: float) -> float:
    """``sum_{t < seq_len} exp(-t / decay)`` (closed-form geometric series)."""
    r = math.exp(-1.0 / decay)
    return (1.0 - r**seq_len) / (1.0 - r)


def _check_profile(profile: object) -> SparsityProfile:
    if not isinstance(profile, SparsityProfile):
        raise TypeError(f"profile must be a SparsityProfile, got {type(profile).__name__}")
    return profile


def _check_generator(generator: object) -> torch.Generator | None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator


def _check_dtype(dtype: object) -> torch.dtype:
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {', '.join(str(d) for d in FLOAT_DTYPES)}, got {dtype!r}")
    return dtype  # type: ignore[return-value]


def _sample_device(generator: torch.Generator | None, device: torch.device) -> torch.device:
    return generator.device if generator is not None else device


def unit_frequencies(
    n_units: int, profile: SparsityProfile, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Per-unit firing probabilities at an average position, shape ``[n_units]``, float64, CPU.

    Exactly ``round(dead_fraction * n_units)`` units (chosen at random) get probability 0.  The
    others get Zipf weights ``r ** -tail_exponent`` over a random rank permutation, scaled so the
    probabilities sum to ``mean_l0``.  Probabilities above ``max_probability`` are clipped and the
    excess is water-filled onto the unclipped units (the scale is solved exactly, so the sum stays
    ``mean_l0`` and the ordering is preserved).  If even all live units at the cap cannot reach
    ``mean_l0`` a ValueError explains it.
    """
    n_units = check_positive_int(n_units, "n_units")
    profile = _check_profile(profile)
    generator = _check_generator(generator)
    gdev = generator.device if generator is not None else torch.device("cpu")
    n_dead = round(profile.dead_fraction * n_units)
    n_alive = n_units - n_dead
    cap = profile.max_probability
    if profile.mean_l0 > cap * n_alive * (1 + 1e-12):
        raise ValueError(
            f"mean_l0={profile.mean_l0} is unreachable with n_units={n_units}: only {n_alive} units are alive "
            f"(dead_fraction={profile.dead_fraction}) and none may fire with probability above "
            f"max_probability={cap}, so at most {cap * n_alive:.6g} units per token can be active"
        )
    ranks = torch.arange(1, n_alive + 1, dtype=torch.float64)
    w = ranks.pow(-profile.tail_exponent)  # descending
    p_sorted = _water_fill(w, torch.tensor([profile.mean_l0], dtype=torch.float64), cap)[0]
    perm = torch.randperm(n_units, generator=generator, device=gdev).cpu()
    p = torch.zeros(n_units, dtype=torch.float64)
    p[perm[:n_alive]] = p_sorted
    return p


def _water_fill(w: torch.Tensor, targets: torch.Tensor, cap: float) -> torch.Tensor:
    """For each target ``T``: ``min(c * w, cap)`` with ``c`` solved so the row sums to ``T``.

    ``w`` must be sorted descending and positive, targets <= ``cap * len(w)``.  If the ``k`` largest
    entries are clipped the scale is ``c_k = (T - k cap) / S_k`` with ``S_k = sum_{j>=k} w_j``; the
    right ``k`` is the smallest one with ``c_k w_k <= cap``, i.e. ``T <= tau_k := k cap + cap S_k / w_k``.
    ``tau_k`` is non-decreasing in ``k``, so ``k = searchsorted(tau, T)`` solves all targets at once
    (exact, no iteration).  Returns ``[len(targets), len(w)]``.
    """
    n = w.numel()
    tail = torch.flip(torch.cumsum(torch.flip(w, [0]), 0), [0])  # S_k
    k_idx = torch.arange(n, dtype=torch.float64)
    tau = k_idx * cap + cap * tail / w
    k = torch.searchsorted(tau, targets, side="left").clamp(max=n - 1)
    scale = (targets - k.to(torch.float64) * cap) / tail[k]
    return torch.minimum(scale[:, None] * w[None, :], torch.tensor(cap, dtype=torch.float64))


def _position_table(profile: SparsityProfile) -> torch.Tensor:
    """``s_pos`` for ``pos in range(seq_len)``, float64: ``b + (early_boost - b) exp(-pos / early_decay)``."""
    seq_len, boost, decay = profile.seq_len, profile.early_boost, profile.early_decay
    if boost == 1.0:
        return torch.ones(seq_len, dtype=torch.float64)
    geo = _decay_sum(seq_len, decay)
    base = (seq_len - boost * geo) / (seq_len - geo)
    pos = torch.arange(seq_len, dtype=torch.float64)
    return base + (boost - base) * torch.exp(-pos / decay)


def position_scale(n_tokens: int, profile: SparsityProfile) -> torch.Tensor:
    """Per-token density multiplier ``s_t``, shape ``[n_tokens]``, float64.

    ``s_t = b + (early_boost - b) * exp(-(t % seq_len) / early_decay)``: position 0 is exactly
    ``early_boost`` times the mean and the boost decays exponentially.  The floor ``b`` is solved so
    that the mean over one full sequence is exactly 1 (this is what keeps ``mean_l0`` the mean over
    all positions; e.g. seq_len=2048, boost 4, decay 32 gives b = 0.952).  A trailing partial
    sequence (``n_tokens`` not a multiple of ``seq_len``) is denser than 1 on average.
    """
    n_tokens = check_positive_int(n_tokens, "n_tokens")
    profile = _check_profile(profile)
    table = _position_table(profile)
    return table[torch.arange(n_tokens) % profile.seq_len]


def _position_targets(n_tokens: int, profile: SparsityProfile, n_alive: int) -> torch.Tensor:
    """Expected l0 of every position that occurs in a batch of ``n_tokens``; checks reachability."""
    n_pos = min(n_tokens, profile.seq_len)
    targets = profile.mean_l0 * _position_table(profile)[:n_pos]
    peak = float(targets.max())
    if peak >= n_alive:
        raise ValueError(
            f"mean_l0={profile.mean_l0} with early_boost={profile.early_boost} asks for {peak:.6g} active units "
            f"at the densest position but only {n_alive} units are alive; lower mean_l0 or early_boost"
        )
    return targets


def synthetic_gate_logits(
    n_tokens: int,
    n_units: int,
    profile: SparsityProfile,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Gate pre-activation ``[n_tokens, n_units]`` whose ReLU has the requested profile.

    Unit ``j`` fires at token ``t`` with probability ``q_tj = min(1, p_j * c_pos)``, where ``p`` comes
    from :func:`unit_frequencies` and ``c_pos`` is ``s_pos`` (from :func:`position_scale`) raised
    just enough to make up for the clipping at 1 (solved exactly by water-filling), so the expected
    l0 at each position is exactly ``mean_l0 * s_pos``.  Firing is drawn through a Gaussian copula,
    ``sqrt(rho) eta_t + sqrt(1 - rho) e_tj > Phi^-1(1 - q_tj)``, so each entry keeps its marginal
    probability while ``rho = token_correlation`` correlates units within a token.  Positive values
    are ``|N(0,1)|`` magnitudes (floored at the dtype's smallest normal so that they never round to
    0), non-firing entries are ``-|N(0,1)|``.  Fully vectorised; memory ~4 float32 ``[M, F]`` arrays.
    """
    n_tokens = check_positive_int(n_tokens, "n_tokens")
    n_units = check_positive_int(n_units, "n_units")
    profile = _check_profile(profile)
    generator = _check_generator(generator)
    dtype = _check_dtype(dtype)
    device = torch.device(device)
    p = unit_frequencies(n_units, profile, generator=generator)
    alive = p > 0
    n_alive = int(alive.sum())
    targets = _position_targets(n_tokens, profile, n_alive)
    p_alive_sorted, order = torch.sort(p[alive], descending=True)
    q_alive = torch.empty(targets.numel(), n_alive, dtype=torch.float64)
    q_alive[:, order] = _water_fill(p_alive_sorted, targets, 1.0)
    q_pos = torch.zeros(targets.numel(), n_units, dtype=torch.float64)
    q_pos[:, alive] = q_alive
    # threshold on the latent N(0,1): fire iff latent > -ndtri(q)   (q=0 -> +inf, q=1 -> -inf)
    thr_pos = (-torch.special.ndtri(q_pos)).to(torch.float32)

    sdev = _sample_device(generator, device)
    pos = torch.arange(n_tokens, device=sdev) % profile.seq_len
    thr = thr_pos.to(sdev)[pos]
    rho = profile.token_correlation
    latent = torch.randn(n_tokens, n_units, generator=generator, device=sdev).mul_(math.sqrt(1.0 - rho))
    latent += math.sqrt(rho) * torch.randn(n_tokens, 1, generator=generator, device=sdev)
    fire = latent > thr
    del latent, thr
    mag = torch.randn(n_tokens, n_units, generator=generator, device=sdev).abs_()
    mag.clamp_(min=torch.finfo(dtype).tiny)
    out = torch.where(fire, mag, -mag)
    return out.to(device=device, dtype=dtype)


def _solve_shifts(thr: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Solve ``sum_j Phi(delta - thr_j) = T`` for every target ``T`` (the sum is increasing in delta).

    Two grids: a coarse one over [-10, 10] sigma brackets all targets, then a fine one of 513
    points over that bracket (typically ~3 sigma wide, step ~0.006) is inverted by linear
    interpolation: relative error ~1e-5, at ~2.5M ``ndtr`` evaluations instead of ~16M for one fine
    grid over the full range (1 s -> ~0.1 s for F = 5632).
    """
    coarse = torch.linspace(_DELTA_LO, _DELTA_HI, _DELTA_COARSE, dtype=torch.float64)
    fc = torch.special.ndtr(coarse[:, None] - thr[None, :]).sum(1)
    t_lo, t_hi = float(targets.min()), float(targets.max())
    if t_hi > float(fc[-1]) or t_lo < float(fc[0]):
        raise ValueError(
            f"the per-position targets ({t_lo:.6g}..{t_hi:.6g} active units) cannot be reached by shifting "
            f"the gate thresholds within [{_DELTA_LO}, {_DELTA_HI}] sigma; lower mean_l0 or early_boost"
        )
    i_lo = max(int(torch.searchsorted(fc, torch.tensor(t_lo, dtype=torch.float64))) - 1, 0)
    i_hi = min(int(torch.searchsorted(fc, torch.tensor(t_hi, dtype=torch.float64))), _DELTA_COARSE - 1)
    grid = torch.linspace(float(coarse[i_lo]), float(coarse[i_hi]), _DELTA_FINE, dtype=torch.float64)
    f = torch.special.ndtr(grid[:, None] - thr[None, :]).sum(1)
    i = torch.searchsorted(f, targets).clamp(1, _DELTA_FINE - 1)
    f0, f1 = f[i - 1], f[i]
    frac = torch.where(f1 > f0, (targets - f0) / (f1 - f0), torch.zeros_like(targets)).clamp(0.0, 1.0)
    return grid[i - 1] + frac * (grid[i] - grid[i - 1])


def synthetic_ffn_problem(
    n_tokens: int,
    d_model: int,
    n_units: int,
    profile: SparsityProfile,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """FFN inputs ``x [M, d], w_gate [F, d], w_up [F, d], w_down [d, F]`` whose REAL gate is sparse.

    Construction (so that ``relu(x @ w_gate.T)`` itself has the profile):

    * feature 0 is a bias channel: ``x[:, 0] = 1``, ``w_gate[:, 0] = -thr_j`` with
      ``thr_j = -Phi^-1(p_j)`` (``torch.special.ndtri``), so unit ``j`` fires with probability ``p_j``
      when the rest of the product is N(0, 1).  Dead units get ``thr_j = max(delta) + 40`` (never fire);
    * feature 1 carries a per-position shift: ``x[:, 1] = delta_pos``, ``w_gate[:, 1] = 1``, so
      ``P(fire) = Phi(delta_pos - thr_j)``.  ``delta_pos`` is solved per position so that the expected
      l0 is exactly ``mean_l0 * s_pos`` (probit shift: unlike the clipped ``p_j * s`` of
      :func:`synthetic_gate_logits`, it boosts rare units relatively more, but it is what a rank-2
      bias can express inside a matmul; the mean over all positions is still ``mean_l0``);
    * features ``2..d-1`` are N(0, 1) noise and each gate row's noise part has unit norm exactly
      (entries ~ 1/sqrt(d-2), i.e. the usual N(0, 1/d) scale), so the noise is N(0, 1) for every
      unit.  Rows share a common direction with weight chosen so that two units' noise correlates by
      ~``token_correlation`` (dense/sparse tokens).  With ``d_model == 2`` there is no separate noise
      feature: ``x[:, 1] = delta_pos + N(0, 1)`` and the correlation is necessarily 1; with
      ``d_model == 3`` the single noise feature also gives correlation 1.
    * ``w_up ~ N(0, 1/d)``, ``w_down ~ N(0, 1/F)`` (unit-variance outputs for unit-variance inputs).

    Rounding to bf16 perturbs thresholds by ~0.4 % relative, which moves l0 by a few percent at most.
    """
    n_tokens = check_positive_int(n_tokens, "n_tokens")
    d_model = check_positive_int(d_model, "d_model")
    if d_model < 2:
        raise ValueError(f"d_model must be >= 2 (one bias and one shift/noise feature), got {d_model}")
    n_units = check_positive_int(n_units, "n_units")
    profile = _check_profile(profile)
    generator = _check_generator(generator)
    dtype = _check_dtype(dtype)
    device = torch.device(device)

    p = unit_frequencies(n_units, profile, generator=generator)
    alive = p > 0
    targets = _position_targets(n_tokens, profile, int(alive.sum()))
    thr_alive = -torch.special.ndtri(p[alive])
    delta_pos = _solve_shifts(thr_alive, targets)
    thr = torch.full((n_units,), float(delta_pos.max().clamp(min=0)) + _DEAD_MARGIN, dtype=torch.float64)
    thr[alive] = thr_alive

    sdev = _sample_device(generator, device)
    pos = torch.arange(n_tokens, device=sdev) % profile.seq_len
    delta = delta_pos.to(device=sdev, dtype=torch.float32)[pos]
    n_noise = d_model - 2

    x = torch.empty(n_tokens, d_model, device=sdev)
    w_gate = torch.empty(n_units, d_model, device=sdev)
    x[:, 0] = 1.0
    w_gate[:, 0] = (-thr).to(device=sdev, dtype=torch.float32)
    w_gate[:, 1] = 1.0
    if n_noise == 0:
        x[:, 1] = delta + torch.randn(n_tokens, generator=generator, device=sdev)
    else:
        x[:, 1] = delta
        x[:, 2:] = torch.randn(n_tokens, n_noise, generator=generator, device=sdev)
        if n_noise == 1:
            w_gate[:, 2] = 1.0
        else:
            # row = a*u + v/sqrt(n) normalised, u = common unit direction: corr ~ a^2/(a^2+1) = rho
            rho = profile.token_correlation
            a = math.sqrt(rho / (1.0 - rho))
            u = torch.full((n_noise,), 1.0 / math.sqrt(n_noise), device=sdev)
            v = torch.randn(n_units, n_noise, generator=generator, device=sdev) / math.sqrt(n_noise)
            rows = a * u + v
            w_gate[:, 2:] = rows / rows.norm(dim=1, keepdim=True)
    w_up = torch.randn(n_units, d_model, generator=generator, device=sdev) / math.sqrt(d_model)
    w_down = torch.randn(d_model, n_units, generator=generator, device=sdev) / math.sqrt(n_units)
    out = {"x": x, "w_gate": w_gate, "w_up": w_up, "w_down": w_down}
    return {k: v.to(device=device, dtype=dtype) for k, v in out.items()}


def layer_profiles(
    n_layers: int,
    mean_l0: float,
    *,
    peak_depth: float = 1.0 / 3.0,
    peak_ratio: float = 3.0,
    **profile_kwargs: Any,
) -> list[SparsityProfile]:
    """One profile per layer, densest in the early-middle layers, averaging to ``mean_l0``.

    Layer ``l`` (relative depth ``z = (l + 0.5) / n_layers``) gets weight
    ``1 + (peak_ratio - 1) * exp(-(z - peak_depth)^2 / (2 * 0.2^2))``: a Gaussian bump of width
    0.2 of the depth at ``peak_depth`` (default 1/3, the early-middle layers the paper finds
    densest), with the densest layer ~``peak_ratio`` (default 3) times the sparsest-possible one.
    Weights are rescaled so the mean over layers is exactly ``mean_l0``; because per-layer speedup
    tracks the layer's mean non-zeros, benchmarks over these profiles reproduce the spread of
    per-layer speedups.  ``profile_kwargs`` are passed to every :class:`SparsityProfile`.
    """
    n_layers = check_positive_int(n_layers, "n_layers")
    mean_l0 = _check_real(mean_l0, "mean_l0")
    if mean_l0 <= 0:
        raise ValueError(f"mean_l0 must be > 0, got {mean_l0}")
    peak_depth = _check_real(peak_depth, "peak_depth")
    if not 0.0 <= peak_depth <= 1.0:
        raise ValueError(f"peak_depth must be in [0, 1] (fraction of depth), got {peak_depth}")
    peak_ratio = _check_real(peak_ratio, "peak_ratio")
    if peak_ratio < 1.0:
        raise ValueError(f"peak_ratio must be >= 1, got {peak_ratio}")
    z = (torch.arange(n_layers, dtype=torch.float64) + 0.5) / n_layers
    weight = 1.0 + (peak_ratio - 1.0) * torch.exp(-((z - peak_depth) ** 2) / (2 * 0.2**2))
    l0 = weight / weight.mean() * mean_l0
    return [SparsityProfile(mean_l0=float(v), **profile_kwargs) for v in l0]


#: Block of consecutive tokens whose union of active units :func:`measure_sparsity` reports: the block-union
#: method's block (``ops.block_union_kernel``), whose work per token is 4 d |union| FLOPs.  Why it is measured
#: (session 23): in ``twell bench model``'s 1.5B forward 64 consecutive tokens' units unioned to 1.6-1.9 l0 in
#: layers 5-27, against 23-31 l0 for independent tokens with the same frequencies (bench_results/h200/
#: forward_unions_session23.log), so a method that reuses weights across a block reads that model as far
#: cheaper than independent tokens; every model benchmark now records it.
UNION_BLOCK = 64


def block_unions(active: torch.Tensor, *, block: int = UNION_BLOCK, seq_len: int | None = None) -> torch.Tensor:
    """Union size (float64) of each full block of ``block`` consecutive rows of a bool ``[tokens, units]`` tensor;
    with ``seq_len`` the blocks stay within each sequence of ``seq_len`` rows (its last partial block left out),
    without it within the whole tensor."""
    n_units = active.shape[-1]
    seqs = active.reshape(-1, seq_len or active.shape[0], n_units)
    n_blocks = seqs.shape[1] // block
    blocks = seqs[:, : n_blocks * block].reshape(-1, block, n_units)
    return blocks.any(1).sum(1, dtype=torch.float64)


def independent_union(frequency: torch.Tensor, block: int = UNION_BLOCK) -> float:
    """Expected union size of ``block`` independent tokens whose units fire with ``frequency``:
    ``sum_j 1 - (1 - p_j)^block``."""
    return float((1 - (1 - frequency.double()) ** block).sum())


def measure_sparsity(act: torch.Tensor, *, seq_len: int | None = None) -> dict[str, float]:
    """Statistics of a dense activation tensor ``[..., F]`` (leading dims are flattened to tokens).

    An entry counts as active when it is non-zero (NaN counts as active, as in the kernels).
    Returns ``l0_mean``, ``l0_max`` (max active units over tokens), ``l0_max_over_mean``,
    ``dead_fraction`` (units never active), ``top10_share`` (share of all activations carried by the
    ``ceil(0.1 F)`` most frequently active units; 0.1 for perfectly uniform units), and, when
    ``seq_len`` is given, ``l0_first8`` / ``l0_rest`` (mean l0 of positions ``t % seq_len < 8`` and of
    the others; NaN when there are none) and their ratio ``early_ratio``; with ``seq_len >=`` :data:`UNION_BLOCK`
    also the token overlap: ``union64`` (mean number of units active on at least one of
    :data:`UNION_BLOCK` consecutive tokens of a sequence, over each sequence's full blocks),
    ``union64_independent`` (the same expected of independent tokens with these unit frequencies:
    ``sum_j 1 - (1 - p_j)^64``) and their ratio ``union64_vs_independent`` (1 for independent tokens, ``l0 /
    union64_independent`` when the tokens of a block share every unit).
    """
    act = check_tensor(act, "act", dtypes=FLOAT_DTYPES)
    if act.dim() < 2:
        raise ValueError(f"act must have at least 2 dimensions [tokens, units], got shape {tuple(act.shape)}")
    if act.numel() == 0:
        raise ValueError(f"act must not be empty, got shape {tuple(act.shape)}")
    if seq_len is not None:
        seq_len = check_positive_int(seq_len, "seq_len")
    nz = (act != 0).reshape(-1, act.shape[-1])
    n_tokens, n_units = nz.shape
    per_token = nz.sum(1, dtype=torch.float64)
    per_unit = nz.sum(0, dtype=torch.float64)
    total = float(per_unit.sum())
    k = math.ceil(0.1 * n_units)
    top = float(torch.topk(per_unit, k).values.sum())
    mean = float(per_token.mean())
    stats = {
        "l0_mean": mean,
        "l0_max": float(per_token.max()),
        "l0_max_over_mean": float(per_token.max()) / mean if mean > 0 else float("nan"),
        "dead_fraction": float((per_unit == 0).sum()) / n_units,
        "top10_share": top / total if total > 0 else 0.0,
    }
    if seq_len is not None:
        early = (torch.arange(n_tokens, device=per_token.device) % seq_len) < 8
        first = float(per_token[early].mean()) if bool(early.any()) else float("nan")
        rest = float(per_token[~early].mean()) if bool((~early).any()) else float("nan")
        stats["l0_first8"] = first
        stats["l0_rest"] = rest
        stats["early_ratio"] = first / rest if rest > 0 else float("nan")
        if seq_len >= UNION_BLOCK and n_tokens % seq_len == 0:
            union = float(block_unions(nz, seq_len=seq_len).mean())
            independent = independent_union(per_unit / n_tokens)
            stats["union64"] = union
            stats["union64_independent"] = independent
            stats["union64_vs_independent"] = union / independent if independent > 0 else float("nan")
    return stats
