"""The TwELL container: tile-wise ELL storage of a sparse [M, F] activation.

Layout (``n_tiles = ceil(F / tile)``, ``C = capacity``):

* ``values  [M, n_tiles, C]`` the non-zeros of each (row, tile), in ascending column order.
* ``indices [M, n_tiles, C]`` int16, the column of each value *inside its tile* (0 .. tile-1).  Local
  indices keep the format at 2 bytes per index whatever F is (tile <= 32768).
* Slots at or past ``min(count, C)`` are padding: :func:`pack_twell` writes zeros there, the gate
  kernel leaves them unwritten (writing them would cost a memset of the whole container, as much
  traffic as the non-zeros at 0.5 % density), so every reader masks slots by the count.
* ``counts  [M, n_tiles]`` int32, the true number of non-zeros of the row-tile.  ``count > C`` marks an
  **overflow**: the first C non-zeros are in ``values`` and the whole row-tile is kept exactly by one
  of two fallbacks:

  - *spill* (what :func:`pack_twell` writes): ``spill_slot[m, t]`` is the row of ``spill_values [S,
    tile]`` holding the dense, activated row-tile; ``-1`` where the row-tile does not overflow.
  - *recompute* (what the fused gate kernel writes, since it cannot size a spill area without a host
    synchronisation): ``spill_values`` is None and ``source = (x, w_gate)`` holds what is needed to
    recompute the row-tile densely; the fused FFN kernels recompute such row-tiles from x and Wg.

Either way nothing is dropped: :meth:`TwellTensor.to_dense` returns the activation exactly.

Column tile ``t`` covers columns ``[t * tile, min((t + 1) * tile, F))``; the last tile may be partial.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validation import FLOAT_DTYPES, check_finite, check_positive_int, check_tensor

#: Default tile width: the N-tile of the gate GEMM kernel.
DEFAULT_TILE = 128
#: Default capacity as a fraction of the tile: 1/8 (16 slots for a 128-wide tile) keeps the packed
#: activation at 4 bytes x 16 / 128 = 1/2 of a dense bf16 tile while at 0.5 % density a 128-wide tile
#: holds 0.64 non-zeros on average, so overflow stays rare except for the densest early positions.
DEFAULT_CAPACITY_FRACTION = 8
#: Local column indices are int16.
MAX_TILE = 2**15


def default_capacity(tile: int) -> int:
    return max(1, tile // DEFAULT_CAPACITY_FRACTION)


def live_slots(counts: torch.Tensor, capacity: int) -> torch.Tensor:
    """[..., capacity] bool: the slots of each row-tile that its count says hold a non-zero (the first
    min(count, capacity)); the others are never read, whatever a kernel left in them."""
    return torch.arange(capacity, device=counts.device) < counts.clamp(max=capacity).unsqueeze(-1)


@dataclass(frozen=True)
class TwellTensor:
    """A sparse activation in TwELL layout.  See the module docstring for the fields."""

    values: torch.Tensor
    indices: torch.Tensor
    counts: torch.Tensor
    spill_slot: torch.Tensor | None
    spill_values: torch.Tensor | None
    n_cols: int
    tile: int
    source: tuple[torch.Tensor, torch.Tensor] | None = None

    # ------------------------------------------------------------------ shape helpers
    @property
    def n_rows(self) -> int:
        return self.values.shape[0]

    @property
    def n_tiles(self) -> int:
        return self.values.shape[1]

    @property
    def capacity(self) -> int:
        return self.values.shape[2]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.n_cols)

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    # ------------------------------------------------------------------ statistics
    def row_nnz(self) -> torch.Tensor:
        """Non-zeros per row, [M] int64 (overflowing tiles counted in full)."""
        return self.counts.sum(dim=1, dtype=torch.int64)

    def overflow_mask(self) -> torch.Tensor:
        """[M, n_tiles] bool: row-tiles whose count exceeds the capacity."""
        return self.counts > self.capacity

    def overflow_tiles(self) -> torch.Tensor:
        """[K, 2] int64 (row, tile) of every overflowing row-tile, row-major order."""
        return self.overflow_mask().nonzero()

    def n_overflow(self) -> int:
        return int(self.overflow_mask().sum())

    def l0(self) -> float:
        """Mean non-zeros per row."""
        return float(self.counts.sum(dtype=torch.float64)) / max(1, self.n_rows)

    # ------------------------------------------------------------------ checks
    def validate(self) -> TwellTensor:
        """Check the structural invariants; raise ValueError naming the first that fails."""
        v = check_tensor(self.values, "TwellTensor.values", ndim=3, dtypes=FLOAT_DTYPES)
        m, nt, c = v.shape
        check_positive_int(self.tile, "TwellTensor.tile", maximum=MAX_TILE)
        if self.n_cols < 0 or nt != -(-self.n_cols // self.tile):
            raise ValueError(
                f"TwellTensor has {nt} tiles but n_cols={self.n_cols} with tile={self.tile} needs "
                f"{-(-self.n_cols // self.tile)}"
            )
        check_tensor(self.indices, "TwellTensor.indices", dtypes=(torch.int16,), device=v.device)
        if self.indices.shape != v.shape:
            raise ValueError(f"TwellTensor.indices has shape {tuple(self.indices.shape)}, expected {tuple(v.shape)}")
        check_tensor(self.counts, "TwellTensor.counts", dtypes=(torch.int32,), device=v.device)
        if self.counts.shape != (m, nt):
            raise ValueError(f"TwellTensor.counts has shape {tuple(self.counts.shape)}, expected {(m, nt)}")
        if self.spill_values is None:
            if self.source is None and m > 0 and bool((self.counts > c).any()):
                raise ValueError(
                    "TwellTensor has overflowing row-tiles but neither spill_values nor source: "
                    "their values beyond the capacity would be lost"
                )
        else:
            if self.spill_slot is None:
                raise ValueError("TwellTensor has spill_values but no spill_slot telling which row-tile owns each")
            check_tensor(self.spill_slot, "TwellTensor.spill_slot", dtypes=(torch.int32,), device=v.device)
            if self.spill_slot.shape != (m, nt):
                raise ValueError(
                    f"TwellTensor.spill_slot has shape {tuple(self.spill_slot.shape)}, expected {(m, nt)}"
                )
            check_tensor(self.spill_values, "TwellTensor.spill_values", ndim=2, dtypes=(v.dtype,), device=v.device)
            if self.spill_values.shape[1] != self.tile:
                raise ValueError(
                    f"TwellTensor.spill_values must have {self.tile} columns (one tile), "
                    f"got {tuple(self.spill_values.shape)}"
                )
            # A slot outside [0, S) would make to_dense index out of range or, for -1, silently
            # read the last spilled row instead of this row-tile's.
            slots = self.spill_slot[self.counts > c]
            if slots.numel() > 0 and (bool((slots < 0).any()) or bool((slots >= self.spill_values.shape[0]).any())):
                raise ValueError(
                    f"TwellTensor.spill_slot of an overflowing row-tile must lie in [0, {self.spill_values.shape[0]})"
                )
        if m > 0 and nt > 0:
            if bool((self.counts < 0).any()) or bool((self.counts > self.tile).any()):
                raise ValueError(f"TwellTensor.counts must lie in [0, {self.tile}]")
            live = torch.arange(c, device=v.device).view(1, 1, -1) < self.counts.unsqueeze(-1)
            # Widen before comparing: an int16 tensor compared with the Python int 32768 (tile = MAX_TILE)
            # casts the scalar to int16, where it wraps to -32768, and every index would fail.
            live_idx = self.indices[live].to(torch.int32)
            if bool((live_idx < 0).any()) or bool((live_idx >= self.tile).any()):
                raise ValueError(f"TwellTensor.indices of live slots must lie in [0, {self.tile})")
            last = self.n_cols - (nt - 1) * self.tile  # width of the last, possibly partial, tile
            if bool((self.counts[:, -1] > last).any()):
                raise ValueError(f"TwellTensor.counts of the last tile must not exceed its width {last}")
        return self

    def entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every non-zero as ``(rows, cols, values)``: int64, int64, the value dtype.

        Sorted by row, then column; overflowing row-tiles are read from the spill area (or
        recomputed from the source), so the list is complete.
        """
        m, nt, c = self.values.shape
        overflow = self.counts > c
        live = torch.arange(c, device=self.device).view(1, 1, -1) < self.counts.unsqueeze(-1)
        live = live & ~overflow.unsqueeze(-1)
        r, t, s = live.nonzero(as_tuple=True)
        rows = r
        cols = t * self.tile + self.indices[r, t, s].long()
        vals = self.values[r, t, s]
        if bool(overflow.any()):
            if self.spill_values is not None and self.spill_slot is not None:
                tiles = self.spill_values[self.spill_slot[overflow].long()]
            elif self.source is not None:
                tiles = _recompute_tiles(self, overflow)
            else:
                raise ValueError("TwellTensor overflows but carries neither spill values nor a source")
            orow, otile = overflow.nonzero(as_tuple=True)
            k, j = (tiles != 0).nonzero(as_tuple=True)
            rows = torch.cat([rows, orow[k]])
            cols = torch.cat([cols, otile[k] * self.tile + j])
            vals = torch.cat([vals, tiles[k, j]])
            order = torch.argsort(rows * max(1, nt * self.tile) + cols)
            rows, cols, vals = rows[order], cols[order], vals[order]
        return rows, cols, vals

    # ------------------------------------------------------------------ conversion
    def to_dense(self) -> torch.Tensor:
        """The activation as a dense [M, F] tensor, exact (bit-identical to what was packed)."""
        return unpack_twell(self)


def pack_twell(
    act: torch.Tensor,
    *,
    tile: int = DEFAULT_TILE,
    capacity: int | None = None,
    apply_relu: bool = True,
    nan_policy: str = "propagate",
) -> TwellTensor:
    """Pack an [M, F] activation into TwELL, exactly.

    ``apply_relu=True`` stores ``relu(act)`` (the gate activation of a ReLU-gated FFN); with False the
    input is stored as it is (any sign) and only exact zeros are left out.  Overflowing row-tiles are
    spilled densely, so ``unpack_twell(pack_twell(g)) == relu(g)`` bit for bit at every density.
    NaN follows ``nan_policy`` (see ``twell._validation``): under "propagate" a NaN is a non-zero.
    """
    check_tensor(act, "act", ndim=2, dtypes=FLOAT_DTYPES)
    check_positive_int(tile, "tile", maximum=MAX_TILE)
    if capacity is None:
        capacity = default_capacity(tile)
    check_positive_int(capacity, "capacity", maximum=tile)
    check_finite({"act": act}, nan_policy)

    m, f = act.shape
    n_tiles = -(-f // tile)
    a = torch.relu(act) if apply_relu else act
    padded = torch.zeros((m, n_tiles * tile), dtype=a.dtype, device=a.device)
    padded[:, :f] = a
    a3 = padded.view(m, n_tiles, tile)
    nz = a3 != 0  # NaN != 0 is True: NaN is kept as a non-zero
    counts = nz.sum(dim=-1, dtype=torch.int32)
    # Stable sort of the "is zero" flag puts the non-zero columns first, in ascending column order.
    order = torch.sort((~nz).to(torch.uint8), dim=-1, stable=True).indices[..., :capacity]
    vals = a3.gather(-1, order)
    live = live_slots(counts, capacity)
    vals = torch.where(live, vals, torch.zeros((), dtype=vals.dtype, device=vals.device))
    idx = torch.where(live, order, torch.zeros((), dtype=order.dtype, device=order.device)).to(torch.int16)

    overflow = counts > capacity
    spill_slot = torch.full((m, n_tiles), -1, dtype=torch.int32, device=a.device)
    n_spill = int(overflow.sum())
    spill_slot[overflow] = torch.arange(n_spill, dtype=torch.int32, device=a.device)
    spill_values = a3[overflow].clone()  # boolean indexing is row-major, matching the slot numbering

    return TwellTensor(
        values=vals.contiguous(),
        indices=idx.contiguous(),
        counts=counts.contiguous(),
        spill_slot=spill_slot,
        spill_values=spill_values,
        n_cols=f,
        tile=tile,
    )


def unpack_twell(t: TwellTensor) -> torch.Tensor:
    """Dense [M, F] activation from a TwELL container (exact)."""
    if not isinstance(t, TwellTensor):
        raise TypeError(f"expected a TwellTensor, got {type(t).__name__}")
    m, nt, c = t.values.shape
    dense = torch.zeros((m, nt, t.tile), dtype=t.values.dtype, device=t.device)
    live = torch.arange(c, device=t.device).view(1, 1, -1) < t.counts.clamp(max=c).unsqueeze(-1)
    # Live slots of one row-tile hold distinct columns, so plain index assignment is exact.
    flat_live = live.reshape(-1, c)
    rows = torch.arange(m * nt, device=t.device).unsqueeze(-1).expand(-1, c)[flat_live]
    dense.view(-1, t.tile)[rows, t.indices.reshape(-1, c).long()[flat_live]] = t.values.reshape(-1, c)[flat_live]

    overflow = t.counts > c
    if bool(overflow.any()):
        if t.spill_values is not None and t.spill_slot is not None:
            dense[overflow] = t.spill_values[t.spill_slot[overflow].long()]
        elif t.source is not None:
            dense[overflow] = _recompute_tiles(t, overflow)
        else:
            raise ValueError("TwellTensor overflows but carries neither spill values nor a source to recompute from")
    return dense.view(m, nt * t.tile)[:, : t.n_cols]


def _recompute_tiles(t: TwellTensor, overflow: torch.Tensor) -> torch.Tensor:
    """Dense activated row-tiles [K, tile] recomputed from ``source = (x, w_gate)``.

    Accumulates in float32 (float64 for float64 inputs) and rounds once to the stored dtype, as the
    gate kernel's epilogue does.
    """
    assert t.source is not None
    x, w_gate = t.source
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows, tiles = overflow.nonzero(as_tuple=True)
    f = t.n_cols
    w_pad = torch.zeros((t.n_tiles * t.tile, w_gate.shape[1]), dtype=acc, device=w_gate.device)
    w_pad[:f] = w_gate.to(acc)
    w_tiles = w_pad.view(t.n_tiles, t.tile, -1)[tiles]  # [K, tile, d]
    g = torch.einsum("kd,ktd->kt", x[rows].to(acc), w_tiles)
    return torch.relu(g).to(t.values.dtype)
