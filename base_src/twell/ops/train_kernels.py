"""Triton kernels of the sparse training path (issue 4, v1: the "unit-major gather" design).

Notation: x [M, d], Wg, Wu [F, d], Wd^T [F, d] (unit-major), g = x Wg^T rounded to the input dtype,
a = relu(g), u = x . Wu[j], h = a * u.  All products are accumulated in fp32 with ``tl.sum`` over a
[SB, D_PAD] register tile (no ``tl.dot``: every product here is a gather of single rows, and plain
fp32 sums run unchanged under the interpreter).  Four kernels:

* :func:`launch_pack_rows` (one program per token): the row-ELL of the gate.  The first W active units
  of the row (unit order) go to ``ids [M, W]`` (int32) and their gate values to ``vals [M, W]`` (input
  dtype); ``counts [M]`` gets the true number of active units.  Slots that hold no pair get the
  sentinel id F (and value 0), and a row with count > W ("overflowing") gets F in *all* its slots:
  the ids array is then directly the sort key of the backward's unit-major transpose, with every
  non-pair after every real pair.
* :func:`launch_forward_rows` (one program per token): u, h, the output row and the row's L1 sum.
  ELL rows gather one Wu and one Wd^T row per active unit, SB units per step, and store u [M, W] fp32
  for the backward.  Overflowing rows are done densely over all F units in the same program, the gate
  being *recomputed* from x and Wg (see "consistent recomputation" below); nothing is dropped.
* :func:`launch_backward_rows` (one program per token): dh = dOut . Wd^T[j] + grad_l1 sign(h) / M,
  du = dh a, dg = dh u [a > 0] per pair (stored [M, W] fp32 for the weight gradients) and
  dX_t = sum_j dg Wg[j] + du Wu[j]; overflowing rows again densely with the recomputed gate.
* :func:`launch_unit_grads` (one program per (unit j, token split k)): the weight-gradient rows
  dWd^T[j] = sum_t h dOut_t, dWg[j] = sum_t dg x_t, dWu[j] = sum_t du x_t over the tokens of unit j.
  Its ELL pairs come from a device-side transpose (a stable sort of the ids, done by the caller), and
  the overflowing rows (a device-side list whose length is read *inside* the kernel, so no host
  synchronisation) are recomputed densely for this one unit.  The segment of unit j (and the
  overflow list) is cut into K equal slices; program (j, k) writes its fp32 partial rows to
  ``partials[:, k, j]`` and the caller sums over k in a fixed order.  Every sum has a fixed order:
  the results are bitwise reproducible (no atomics anywhere).

Consistent recomputation.  The gate of an overflowing row is recomputed three times (forward row,
backward row, unit kernel) by :func:`_gate_of`, always as ``tl.sum(p * q, axis=1)`` over a
[SB, D_PAD] tile with the same SB, D_PAD and num_warps (the product of two fp32 values is commutative,
so a tile of Wg rows times x and a tile of x rows times one Wg row hold the same numbers): the three
see the same rounded gate, so forward and backward agree on which pairs are active.  The recomputed
gate may differ from the cuBLAS gate (used for the ELL rows, ``counts`` and l0) in its last bit; that
only moves a gate within one rounding of 0 across the ReLU, which is within any tolerance.

Addressing: tokens and slots are int64 inside the kernels (M up to 1M+ with W up to a few thousand),
unit ids are int32 in memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._runtime import interpreting, next_pow2
from .gate_kernel import relu_keep_nan, round_to

#: Sentinel-padded row-ELL chunk read per step of the pack kernel (units).
_PACK_BLOCK = 1024
#: num_warps of the row and unit kernels.  One value for all three kernels that recompute the gate:
#: the reduction tree of ``_gate_of`` must be the same in all of them (module docstring).
_NUM_WARPS = 4


def default_block(d: int) -> int:
    """Rows gathered per step (SB): two or three [SB, D_PAD] fp32 tiles live at once, so SB * D_PAD
    <= 8192 keeps them at <= 64 registers a thread at 4 warps (the inference row kernel measured SB=4
    best at d=2048 on an H200).  The interpreter takes the same rule: it only affects speed."""
    return max(1, min(16, 8192 // next_pow2(d)))


@triton.jit
def _sign(v):
    return tl.where(v > 0, 1.0, tl.where(v < 0, -1.0, 0.0))


@triton.jit
def _gate_of(p, q, dtype: tl.constexpr):
    """Rounded gate of an [SB, D_PAD] tile ``p`` times a broadcastable ``q``: ``round(sum(p * q, 1))``.

    The only place a gate is recomputed, so every kernel reduces it with the same code (module
    docstring)."""
    return round_to(tl.sum(p * q, axis=1), dtype).to(tl.float32)


# ------------------------------------------------------------------------------------------- pack
@triton.jit
def _ell_slots(row, s0, n_ell, W, ids_ptr, val_ptr, offs_d, d_ok, D, SB: tl.constexpr):
    """Slots s0 .. s0+SB of a row's ELL: which are live, their flat slot, gate value a, and the
    offsets/mask of their units' weight rows."""
    s = s0 + tl.arange(0, SB)
    live = s < n_ell
    slot = row * W + s
    unit = tl.load(ids_ptr + slot, mask=live, other=0).to(tl.int64)
    a = tl.load(val_ptr + slot, mask=live, other=0.0).to(tl.float32)
    w_off = unit[:, None] * D + offs_d[None, :]
    w_ok = live[:, None] & d_ok[None, :]
    return live, slot, a, w_off, w_ok


@triton.jit
def _dense_units(j0, x, offs_d, d_ok, wg_ptr, wu_ptr, F, D, dtype: tl.constexpr, SB: tl.constexpr):
    """Units j0 .. j0+SB of an overflowing row, done densely: the gate is recomputed from x and Wg.

    Returns the weight-row offsets and mask, the live units, their gate values a, u = x . Wu[j] and
    the loaded Wg and Wu rows (the backward reuses them for dX)."""
    unit = (j0 + tl.arange(0, SB)).to(tl.int64)
    u_ok = unit < F
    w_off = unit[:, None] * D + offs_d[None, :]
    w_ok = u_ok[:, None] & d_ok[None, :]
    wg = tl.load(wg_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
    a = relu_keep_nan(_gate_of(wg, x[None, :], dtype))
    live = u_ok & (a != 0)
    wu = tl.load(wu_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
    u = tl.sum(wu * x[None, :], axis=1)
    return w_off, w_ok, live, a, u, wg, wu


@triton.jit
def _pair_grads(wd, go, a, u, live, gl1, M):
    """dh = dOut . Wd[:, j] + grad_l1 * sign(h) / M;  du = dh * a;  dg = dh * u where the gate is > 0.

    ``wd`` is [SB, D_PAD] and ``go`` [D_PAD] (SB units of one token), or the other way round (SB tokens
    of one unit in the weight-gradient kernel)."""
    dh = tl.sum(wd * go[None, :], axis=1) + gl1 * _sign(a * u) / M
    du = tl.where(live, dh * a, 0.0)
    dg = tl.where(live & (a > 0), dh * u, 0.0)
    return du, dg


@triton.jit
def _pack_rows_kernel(g_ptr, ids_ptr, val_ptr, cnt_ptr, F, W, stride_gm, BF: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * W
    total = tl.sum(tl.zeros((BF,), dtype=tl.int32), axis=0)
    for f0 in range(0, F, BF):
        offs = f0 + tl.arange(0, BF)
        ok = offs < F
        g = tl.load(g_ptr + row * stride_gm + offs, mask=ok, other=0.0)
        nz = (relu_keep_nan(g) != 0) & ok
        nz_i = nz.to(tl.int32)
        pos = total + tl.cumsum(nz_i, axis=0) - nz_i  # exclusive prefix count over the whole row
        keep = nz & (pos < W)
        tl.store(ids_ptr + base + pos, offs, mask=keep)
        tl.store(val_ptr + base + pos, g, mask=keep)
        total += tl.sum(nz_i, axis=0)
    tl.store(cnt_ptr + row, total)
    # Sentinel F in every slot that holds no pair; an overflowing row holds none (it is done densely).
    n_ell = tl.where(total <= W, total, 0)
    for s0 in range(0, W, BF):
        s = s0 + tl.arange(0, BF)
        pad = (s >= n_ell) & (s < W)
        tl.store(ids_ptr + base + s, tl.zeros((BF,), dtype=tl.int32) + F, mask=pad)
        tl.store(val_ptr + base + s, tl.zeros((BF,), dtype=val_ptr.dtype.element_ty), mask=pad)


def launch_pack_rows(g: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row-ELL of ``relu(g)`` for a dense gate g [M, F] (rows contiguous): ``(ids, vals, counts)``.

    ``ids [M, W]`` int32 (sentinel F where no pair), ``vals [M, W]`` in g's dtype, ``counts [M]`` int32.
    """
    m, f = g.shape
    ids = torch.empty((m, width), dtype=torch.int32, device=g.device)
    vals = torch.empty((m, width), dtype=g.dtype, device=g.device)
    counts = torch.empty((m,), dtype=torch.int32, device=g.device)
    if m == 0:
        return ids, vals, counts
    bf = min(next_pow2(max(f, width)), 128 if interpreting() else _PACK_BLOCK)
    _pack_rows_kernel[(m,)](g, ids, vals, counts, f, width, g.stride(0), BF=bf, num_warps=4)
    return ids, vals, counts


# ---------------------------------------------------------------------------------------- forward
@triton.jit
def _ell_row_forward(erow, n, W, x, acc, l1, ids_ptr, val_ptr, u_ptr, wu_ptr, wdt_ptr, offs_d, d_ok, D,
                     SB: tl.constexpr):
    """Adds the first n pairs of ELL row ``erow`` to the output row ``acc`` and ``l1``; stores their u."""
    for s0 in range(0, n, SB):
        live, slot, a, w_off, w_ok = _ell_slots(erow, s0, n, W, ids_ptr, val_ptr, offs_d, d_ok, D, SB)
        wu = tl.load(wu_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
        u = tl.sum(wu * x[None, :], axis=1)
        tl.store(u_ptr + slot, u, mask=live)
        h = tl.where(live, a * u, 0.0)
        wd = tl.load(wdt_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
        acc += tl.sum(h[:, None] * wd, axis=0)
        l1 += tl.abs(h)
    return acc, l1


@triton.jit
def _forward_rows_kernel(
    x_ptr, wg_ptr, wu_ptr, wdt_ptr, ids_ptr, val_ptr, cnt_ptr, u_ptr, out_ptr, l1_ptr,
    F, D, W, stride_xm, stride_om,
    D_PAD: tl.constexpr, SB: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    x = tl.load(x_ptr + row * stride_xm + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    out = tl.zeros((D_PAD,), dtype=tl.float32)
    l1 = tl.zeros((SB,), dtype=tl.float32)
    cnt = tl.load(cnt_ptr + row)
    n_ell = tl.where(cnt <= W, cnt, 0)
    out, l1 = _ell_row_forward(row, n_ell, W, x, out, l1, ids_ptr, val_ptr, u_ptr, wu_ptr, wdt_ptr, offs_d, d_ok, D,
                               SB)
    if cnt > W:
        for j0 in range(0, F, SB):
            w_off, w_ok, live, a, u, wg, wu = _dense_units(j0, x, offs_d, d_ok, wg_ptr, wu_ptr, F, D, dtype, SB)
            h = tl.where(live, a * u, 0.0)
            wd = tl.load(wdt_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
            out += tl.sum(h[:, None] * wd, axis=0)
            l1 += tl.abs(h)
    tl.store(out_ptr + row * stride_om + offs_d, round_to(out, out_ptr.dtype.element_ty), mask=d_ok)
    tl.store(l1_ptr + row, tl.sum(l1, axis=0))


def launch_forward_rows(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    ids: torch.Tensor,
    vals: torch.Tensor,
    counts: torch.Tensor,
    *,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out [M, d] in x's dtype, u [M, W] fp32, row_l1 [M] fp32)``; all inputs contiguous.

    ``u`` is written only in the live ELL slots of non-overflowing rows (the rest is never read).
    """
    m, d = x.shape
    f, width = w_gate.shape[0], ids.shape[1]
    out = torch.empty((m, d), dtype=x.dtype, device=x.device)
    u = torch.empty((m, width), dtype=torch.float32, device=x.device)
    row_l1 = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return out, u, row_l1
    _forward_rows_kernel[(m,)](
        x, w_gate, w_up, w_down_t, ids, vals, counts, u, out, row_l1,
        f, d, width, x.stride(0), out.stride(0),
        D_PAD=next_pow2(d), SB=block or default_block(d), num_warps=_NUM_WARPS,
    )
    return out, u, row_l1


# --------------------------------------------------------------------------------------- backward
@triton.jit
def _ell_row_backward(erow, n, W, M, x, go, gl1, dx, ids_ptr, val_ptr, u_ptr, dg_ptr, du_ptr,
                      wg_ptr, wu_ptr, wdt_ptr, offs_d, d_ok, D, SB: tl.constexpr):
    """dX contributions of the first n pairs of ELL row ``erow``; stores their dg and du (fp32)."""
    for s0 in range(0, n, SB):
        live, slot, a, w_off, w_ok = _ell_slots(erow, s0, n, W, ids_ptr, val_ptr, offs_d, d_ok, D, SB)
        u = tl.load(u_ptr + slot, mask=live, other=0.0)
        wd = tl.load(wdt_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
        du, dg = _pair_grads(wd, go, a, u, live, gl1, M)
        tl.store(dg_ptr + slot, dg, mask=live)
        tl.store(du_ptr + slot, du, mask=live)
        wg = tl.load(wg_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
        wu = tl.load(wu_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
        dx += tl.sum(dg[:, None] * wg + du[:, None] * wu, axis=0)
    return dx


@triton.jit
def _backward_rows_kernel(
    x_ptr, go_ptr, wg_ptr, wu_ptr, wdt_ptr, ids_ptr, val_ptr, cnt_ptr, u_ptr, gl1_ptr,
    dg_ptr, du_ptr, dx_ptr,
    M, F, D, W, stride_xm, stride_gm, stride_dxm,
    D_PAD: tl.constexpr, SB: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    x = tl.load(x_ptr + row * stride_xm + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    go = tl.load(go_ptr + row * stride_gm + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    gl1 = tl.load(gl1_ptr).to(tl.float32)
    dx = tl.zeros((D_PAD,), dtype=tl.float32)
    cnt = tl.load(cnt_ptr + row)
    n_ell = tl.where(cnt <= W, cnt, 0)
    dx = _ell_row_backward(row, n_ell, W, M, x, go, gl1, dx, ids_ptr, val_ptr, u_ptr, dg_ptr, du_ptr,
                           wg_ptr, wu_ptr, wdt_ptr, offs_d, d_ok, D, SB)
    if cnt > W:
        for j0 in range(0, F, SB):
            w_off, w_ok, live, a, u, wg, wu = _dense_units(j0, x, offs_d, d_ok, wg_ptr, wu_ptr, F, D, dtype, SB)
            wd = tl.load(wdt_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
            du, dg = _pair_grads(wd, go, a, u, live, gl1, M)
            dx += tl.sum(dg[:, None] * wg + du[:, None] * wu, axis=0)
    tl.store(dx_ptr + row * stride_dxm + offs_d, round_to(dx, dx_ptr.dtype.element_ty), mask=d_ok)


def launch_backward_rows(
    x: torch.Tensor,
    grad_out: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    ids: torch.Tensor,
    vals: torch.Tensor,
    counts: torch.Tensor,
    u: torch.Tensor,
    grad_l1: torch.Tensor,
    *,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx [M, d] in x's dtype, dg [M, W] fp32, du [M, W] fp32)``; ``grad_l1`` a 1-element fp32 tensor.

    ``dg``/``du`` are written only in the live ELL slots of non-overflowing rows.
    """
    m, d = x.shape
    f, width = w_gate.shape[0], ids.shape[1]
    dx = torch.empty((m, d), dtype=x.dtype, device=x.device)
    dg = torch.empty((m, width), dtype=torch.float32, device=x.device)
    du = torch.empty((m, width), dtype=torch.float32, device=x.device)
    if m == 0:
        return dx, dg, du
    _backward_rows_kernel[(m,)](
        x, grad_out, w_gate, w_up, w_down_t, ids, vals, counts, u, grad_l1, dg, du, dx,
        m, f, d, width, x.stride(0), grad_out.stride(0), dx.stride(0),
        D_PAD=next_pow2(d), SB=block or default_block(d), num_warps=_NUM_WARPS,
    )
    return dx, dg, du


# ------------------------------------------------------------------------------ weight gradients
@triton.jit
def _unit_grads_kernel(
    x_ptr, go_ptr, wg_ptr, wu_ptr, wdt_ptr,
    perm_ptr, start_ptr, val_ptr, u_ptr, dg_ptr, du_ptr,
    ovl_ptr, nover_ptr, gl1_ptr,
    pwd_ptr, pwg_ptr, pwu_ptr,
    M, F, D, W, K, stride_xm, stride_gm,
    D_PAD: tl.constexpr, SB: tl.constexpr,
):
    j = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    acc_wd = tl.zeros((D_PAD,), dtype=tl.float32)
    acc_wg = tl.zeros((D_PAD,), dtype=tl.float32)
    acc_wu = tl.zeros((D_PAD,), dtype=tl.float32)

    # ELL pairs of unit j: its segment of the (unit, token)-sorted slot list, slice k of K.
    lo = tl.load(start_ptr + j)
    hi = tl.load(start_ptr + j + 1)
    per = (hi - lo + K - 1) // K
    b = lo + k * per
    e = tl.minimum(b + per, hi)
    for p0 in range(b, e, SB):
        p = p0 + tl.arange(0, SB)
        live = p < e
        slot = tl.load(perm_ptr + p, mask=live, other=0)
        tok = slot // W
        a = tl.load(val_ptr + slot, mask=live, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + slot, mask=live, other=0.0)
        dg = tl.load(dg_ptr + slot, mask=live, other=0.0)
        du = tl.load(du_ptr + slot, mask=live, other=0.0)
        h = tl.where(live, a * u, 0.0)
        r_ok = live[:, None] & d_ok[None, :]
        xr = tl.load(x_ptr + tok[:, None] * stride_xm + offs_d[None, :], mask=r_ok, other=0.0).to(tl.float32)
        gr = tl.load(go_ptr + tok[:, None] * stride_gm + offs_d[None, :], mask=r_ok, other=0.0).to(tl.float32)
        acc_wd += tl.sum(h[:, None] * gr, axis=0)
        acc_wg += tl.sum(dg[:, None] * xr, axis=0)
        acc_wu += tl.sum(du[:, None] * xr, axis=0)

    # Overflowing rows: recompute this unit's gate, u and dh for them (dense over those rows only).
    n_over = tl.load(nover_ptr)
    if n_over > 0:
        wg_j = tl.load(wg_ptr + j * D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        wu_j = tl.load(wu_ptr + j * D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        wd_j = tl.load(wdt_ptr + j * D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        gl1 = tl.load(gl1_ptr).to(tl.float32)
        per_o = (n_over + K - 1) // K
        bo = k * per_o
        eo = tl.minimum(bo + per_o, n_over)
        for q0 in range(bo, eo, SB):
            q = q0 + tl.arange(0, SB)
            live = q < eo
            tok = tl.load(ovl_ptr + q, mask=live, other=0)
            r_ok = live[:, None] & d_ok[None, :]
            xr = tl.load(x_ptr + tok[:, None] * stride_xm + offs_d[None, :], mask=r_ok, other=0.0).to(tl.float32)
            gr = tl.load(go_ptr + tok[:, None] * stride_gm + offs_d[None, :], mask=r_ok, other=0.0).to(tl.float32)
            a = relu_keep_nan(_gate_of(xr, wg_j[None, :], dtype))
            act = live & (a != 0)
            u = tl.sum(xr * wu_j[None, :], axis=1)
            h = tl.where(act, a * u, 0.0)
            du, dg = _pair_grads(gr, wd_j, a, u, act, gl1, M)
            acc_wd += tl.sum(h[:, None] * gr, axis=0)
            acc_wg += tl.sum(dg[:, None] * xr, axis=0)
            acc_wu += tl.sum(du[:, None] * xr, axis=0)

    out = (k * F + j) * D + offs_d
    tl.store(pwd_ptr + out, acc_wd, mask=d_ok)
    tl.store(pwg_ptr + out, acc_wg, mask=d_ok)
    tl.store(pwu_ptr + out, acc_wu, mask=d_ok)


def launch_unit_grads(
    x: torch.Tensor,
    grad_out: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    perm: torch.Tensor,
    starts: torch.Tensor,
    vals: torch.Tensor,
    u: torch.Tensor,
    dg: torch.Tensor,
    du: torch.Tensor,
    overflow_rows: torch.Tensor,
    n_overflow: torch.Tensor,
    grad_l1: torch.Tensor,
    *,
    splits: int,
    block: int | None = None,
) -> torch.Tensor:
    """fp32 partial weight-gradient rows ``[3, K, F, d]`` (dWd^T, dWg, dWu), K = ``splits``.

    ``perm`` (int64) lists the flat ELL slots sorted by (unit, token); unit j's slots are
    ``perm[starts[j]:starts[j + 1]]`` (``starts`` int64 [F + 1]).  ``overflow_rows`` (int64 [M]) starts
    with the ``n_overflow`` (int64 1-element tensor, read on the device) overflowing tokens in order.
    """
    m, d = x.shape
    f, width = w_gate.shape[0], vals.shape[1]
    partials = torch.empty((3, splits, f, d), dtype=torch.float32, device=x.device)
    if f == 0:
        return partials
    _unit_grads_kernel[(f, splits)](
        x, grad_out, w_gate, w_up, w_down_t, perm, starts, vals, u, dg, du,
        overflow_rows, n_overflow, grad_l1, partials[0], partials[1], partials[2],
        m, f, d, width, splits, x.stride(0), grad_out.stride(0),
        D_PAD=next_pow2(d), SB=block or default_block(d), num_warps=_NUM_WARPS,
    )
    return partials
