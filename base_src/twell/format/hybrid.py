"""The hybrid container used by sparse training: row-wise ELL of fixed width plus a dense tail.

Layout of an [M, F] activation with ELL width ``W``:

* ``values [M, W]`` the non-zeros of each row in ascending column order, padded with 0.
* ``cols   [M, W]`` int32, the *global* column of each value; padded slots hold column 0.  Global
  (not tile-local) indices because training kernels walk a row across all of F, and int32 because
  F is far below 2**31 for any FFN while int64 would double the index traffic.
* ``row_nnz [M]`` int32, the true number of non-zeros of the row.  It may exceed W: such a row is a
  **tail row**.
* ``tail_rows [R]`` int64, the ascending ids of the tail rows (``row_nnz > W``), and
  ``tail_values [R, F]`` their dense activated values.  A tail row keeps *all* of its non-zeros in
  the tail and none in the ELL part: its ELL slots are all zero (values 0, cols 0), so that a kernel
  summing "ELL part + tail" never counts a value twice and never has to know where a row was cut.

Training sees a few very dense rows (early positions, special tokens) among many sparse ones; a
fixed-width ELL sized for the typical row plus a dense tail for the outliers keeps the memory of
the common case bounded by ``M * W`` while staying exact for every row.

Equality: :func:`pack_hybrid` followed by :meth:`HybridTensor.to_dense` returns ``relu(act)``
exactly, bit for bit (NaN included), with one deliberate exception shared with TwELL: zeros are not
stored, so a ``-0.0`` reads back as ``+0.0`` (the two compare equal and act identically as FFN
gate values).

The unit-major transpose (:class:`UnitMajor`) regroups the ELL entries by column (FFN unit), which
is the order the weight-gradient kernels need (``dW[f] = sum over tokens of act[t, f] * ...``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validation import FLOAT_DTYPES, check_finite, check_positive_int, check_tensor

#: Largest index an int32 column / row id / flat ELL offset can hold.
INDEX_LIMIT = 2**31 - 1


def check_hybrid_bounds(m: int, f: int, width: int) -> None:
    """Refuse sizes whose indices would not fit the container's int32 fields.

    * ``F <= 2**31 - 1``: ``cols`` and ``row_nnz`` are int32 (a column id is at most F - 1 and a
      row count at most F).
    * ``M <= 2**31 - 1``: the unit-major transpose stores token ids as int32.
    * ``M * W <= 2**31 - 1``: training kernels address the ELL arrays with the flat offset
      ``row * W + slot``; Triton computes program-id arithmetic in int32, so a larger product would
      wrap silently to a wrong (possibly valid-looking) address.  Refusing up front is cheaper than
      debugging corrupted gradients.  (``src_pos`` of the transpose is int64 regardless.)

    Raises ValueError naming the quantity that is too large.  Takes plain sizes so that the check
    can be exercised without allocating huge tensors.
    """
    for name, value in (("M (rows)", m), ("F (n_cols)", f), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
    if f > INDEX_LIMIT:
        raise ValueError(
            f"F (n_cols) = {f} does not fit the int32 column indices of the hybrid format (max {INDEX_LIMIT})"
        )
    if m > INDEX_LIMIT:
        raise ValueError(f"M (rows) = {m} does not fit the int32 token ids of the hybrid format (max {INDEX_LIMIT})")
    if m * width > INDEX_LIMIT:
        raise ValueError(
            f"M * width = {m} * {width} = {m * width} exceeds the int32 addressing limit {INDEX_LIMIT} "
            "of the ELL arrays; split the batch or lower the width"
        )


@dataclass(frozen=True)
class UnitMajor:
    """The ELL entries of a :class:`HybridTensor` regrouped by column (unit), CSC style.

    * ``unit_ptr [F + 1]`` int64: the entries of unit ``f`` are ``[unit_ptr[f], unit_ptr[f + 1])``.
    * ``rows [nnz]`` int32: token id of each entry, ascending within a unit.
    * ``values [nnz]``: the activation value.
    * ``src_pos [nnz]`` int64: flat position of the entry in ``hybrid.values.reshape(-1)`` (also
      valid for ``hybrid.cols``), so a gradient computed per entry in unit-major order can be
      scattered back to the row-major ELL layout with one index_put, no search.

    Only the ELL part is covered: rows in the hybrid's dense tail have no entry here (training
    handles those rows with dense matmuls).
    """

    unit_ptr: torch.Tensor
    rows: torch.Tensor
    values: torch.Tensor
    src_pos: torch.Tensor
    n_rows: int
    n_cols: int

    @property
    def nnz(self) -> int:
        return int(self.rows.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.n_cols)

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def unit_ids(self) -> torch.Tensor:
        """Unit (column) of every entry, [nnz] int64: the CSC pointer expanded."""
        counts = self.unit_ptr[1:] - self.unit_ptr[:-1]
        return torch.repeat_interleave(torch.arange(self.n_cols, device=self.device), counts, output_size=self.nnz)

    def to_dense(self) -> torch.Tensor:
        """Dense [M, F] tensor of the covered (ELL) entries; tail rows read as zero."""
        dense = torch.zeros((self.n_rows, self.n_cols), dtype=self.values.dtype, device=self.device)
        # (row, unit) pairs are distinct, so plain index assignment is exact and order-free.
        dense[self.rows.long(), self.unit_ids()] = self.values
        return dense


@dataclass(frozen=True)
class HybridTensor:
    """A sparse activation as fixed-width ELL plus a dense tail.  See the module docstring."""

    values: torch.Tensor
    cols: torch.Tensor
    row_nnz: torch.Tensor
    tail_rows: torch.Tensor
    tail_values: torch.Tensor
    n_cols: int

    # ------------------------------------------------------------------ shape helpers
    @property
    def n_rows(self) -> int:
        return self.values.shape[0]

    @property
    def width(self) -> int:
        return self.values.shape[1]

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
    def l0(self) -> float:
        """Mean non-zeros per row (tail rows counted in full)."""
        return float(self.row_nnz.sum(dtype=torch.float64)) / max(1, self.n_rows)

    def n_tail(self) -> int:
        """Number of rows stored in the dense tail."""
        return int(self.tail_rows.shape[0])

    def ell_live_mask(self) -> torch.Tensor:
        """[M, W] bool: the ELL slots that hold a stored non-zero (never true on a tail row)."""
        slot = torch.arange(self.width, device=self.device).view(1, -1)
        nnz = self.row_nnz.view(-1, 1)
        return (slot < nnz) & (nnz <= self.width)

    # ------------------------------------------------------------------ checks
    def validate(self) -> HybridTensor:
        """Check the structural invariants; raise ValueError (TypeError for dtypes) naming the first that fails.

        Costs a few device-to-host synchronisations: meant for tests and debugging.
        """
        v = check_tensor(self.values, "HybridTensor.values", ndim=2, dtypes=FLOAT_DTYPES)
        m, w = v.shape
        f = self.n_cols
        if isinstance(f, bool) or not isinstance(f, int) or f < 0:
            raise ValueError(f"HybridTensor.n_cols must be a non-negative int, got {f!r}")
        check_hybrid_bounds(m, f, w)
        check_tensor(self.cols, "HybridTensor.cols", dtypes=(torch.int32,), device=v.device)
        if self.cols.shape != v.shape:
            raise ValueError(f"HybridTensor.cols has shape {tuple(self.cols.shape)}, expected {tuple(v.shape)}")
        check_tensor(self.row_nnz, "HybridTensor.row_nnz", dtypes=(torch.int32,), device=v.device)
        if self.row_nnz.shape != (m,):
            raise ValueError(f"HybridTensor.row_nnz has shape {tuple(self.row_nnz.shape)}, expected {(m,)}")
        check_tensor(self.tail_rows, "HybridTensor.tail_rows", ndim=1, dtypes=(torch.int64,), device=v.device)
        r = self.tail_rows.shape[0]
        check_tensor(self.tail_values, "HybridTensor.tail_values", dtypes=(v.dtype,), device=v.device)
        if self.tail_values.shape != (r, f):
            raise ValueError(f"HybridTensor.tail_values has shape {tuple(self.tail_values.shape)}, expected {(r, f)}")
        if m == 0:
            if r != 0:
                raise ValueError(f"HybridTensor has no rows but {r} tail rows")
            return self

        nnz = self.row_nnz
        if bool((nnz < 0).any()) or bool((nnz > f).any()):
            raise ValueError(f"HybridTensor.row_nnz must lie in [0, {f}]")
        expected_tail = (nnz > w).nonzero().squeeze(1)
        if r > 1 and not bool((self.tail_rows[1:] > self.tail_rows[:-1]).all()):
            raise ValueError("HybridTensor.tail_rows must be strictly ascending")
        if not torch.equal(self.tail_rows, expected_tail):
            raise ValueError(
                f"HybridTensor.tail_rows must list exactly the rows with row_nnz > width={w} "
                f"({expected_tail.numel()} such rows, tail has {r})"
            )
        if w > 0:
            if bool((self.cols < 0).any()) or bool((self.cols >= max(f, 1)).any()):
                raise ValueError(f"HybridTensor.cols must lie in [0, {f})")
            live = self.ell_live_mask()
            dead_nonzero = (~live) & ((v != 0) | (self.cols != 0))
            if bool(dead_nonzero.any()):
                raise ValueError(
                    "HybridTensor has a non-zero value or column in a padded ELL slot or in a tail row's "
                    "ELL slots (those must hold value 0 and column 0)"
                )
            if bool((live & (v == 0)).any()):
                raise ValueError("HybridTensor stores an explicit zero in a live ELL slot (row_nnz counts it)")
            both_live = live[:, 1:] & live[:, :-1]
            if bool((both_live & (self.cols[:, 1:] <= self.cols[:, :-1])).any()):
                raise ValueError("HybridTensor.cols must be strictly ascending within the live slots of a row")
        if r > 0:
            tail_nnz = (self.tail_values != 0).sum(dim=1, dtype=torch.int32)
            if not torch.equal(tail_nnz, nnz[self.tail_rows]):
                raise ValueError("HybridTensor.tail_values non-zero counts disagree with row_nnz of the tail rows")
        return self

    # ------------------------------------------------------------------ conversion
    def entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every non-zero as ``(rows, cols, values)``: int64, int64, the value dtype.

        Sorted by row, then column; tail rows are read from the dense tail, so the list is complete.
        """
        r, s = self.ell_live_mask().nonzero(as_tuple=True)  # row-major, so already sorted
        rows = r
        cols = self.cols[r, s].long()
        vals = self.values[r, s]
        if self.n_tail() > 0:
            k, j = (self.tail_values != 0).nonzero(as_tuple=True)  # NaN != 0: NaN is a non-zero
            rows = torch.cat([rows, self.tail_rows[k]])
            cols = torch.cat([cols, j])
            vals = torch.cat([vals, self.tail_values[k, j]])
            # Keys are distinct and below M * F <= 2**62, so the sort is exact.
            order = torch.sort(rows * max(1, self.n_cols) + cols, stable=True).indices
            rows, cols, vals = rows[order], cols[order], vals[order]
        return rows, cols, vals

    def to_dense(self) -> torch.Tensor:
        """The activation as a dense [M, F] tensor, exact (bit-identical to what was packed)."""
        dense = torch.zeros((self.n_rows, self.n_cols), dtype=self.dtype, device=self.device)
        r, s = self.ell_live_mask().nonzero(as_tuple=True)
        # Live slots of a row hold distinct columns, so plain index assignment is exact.
        dense[r, self.cols[r, s].long()] = self.values[r, s]
        if self.n_tail() > 0:
            dense[self.tail_rows] = self.tail_values
        return dense

    def to_unit_major(self) -> UnitMajor:
        """Transpose the ELL part to unit-major (CSC) order; see :class:`UnitMajor`.

        A counting sort over the F units: a histogram of the columns (bincount) gives the entry count
        per unit, its exclusive prefix sum gives ``unit_ptr``, and the entries are placed by a
        *stable* sort on the column of the row-major entry list.  Stability keeps the tokens of a unit
        in ascending order and makes the result a pure function of the input (no atomics deciding
        the order), so the same container always yields bitwise the same transpose and weight
        gradients reduced in this order are run-to-run reproducible.

        Tail rows are not included (their ELL slots are empty by construction); training handles
        them with dense matmuls on ``tail_values``.
        """
        w, f = self.width, self.n_cols
        live = self.ell_live_mask().reshape(-1)
        pos = live.nonzero().squeeze(1)  # flat row-major positions, ascending
        col = self.cols.reshape(-1)[pos].long()
        counts = torch.bincount(col, minlength=f)
        unit_ptr = torch.zeros(f + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(counts, dim=0, out=unit_ptr[1:])
        order = torch.sort(col, stable=True).indices
        src_pos = pos[order]
        return UnitMajor(
            unit_ptr=unit_ptr,
            rows=torch.div(src_pos, max(1, w), rounding_mode="floor").to(torch.int32),
            values=self.values.reshape(-1)[src_pos],
            src_pos=src_pos,
            n_rows=self.n_rows,
            n_cols=f,
        )


def pack_hybrid(
    act: torch.Tensor,
    *,
    width: int,
    apply_relu: bool = True,
    nan_policy: str = "propagate",
) -> HybridTensor:
    """Pack an [M, F] activation into the hybrid ELL + dense-tail format, exactly.

    ``apply_relu=True`` stores ``relu(act)``; with False the input is stored as it is and only exact
    zeros are left out.  Rows with at most ``width`` non-zeros go to the ELL part (ascending
    columns); rows with more go whole to the dense tail.  NaN follows ``nan_policy`` (see
    ``twell._validation``): under "propagate" a NaN counts as a non-zero and is stored.
    """
    check_tensor(act, "act", ndim=2, dtypes=FLOAT_DTYPES)
    check_positive_int(width, "width")
    m, f = act.shape
    check_hybrid_bounds(m, f, width)
    check_finite({"act": act}, nan_policy)

    a = torch.relu(act) if apply_relu else act
    nz = a != 0  # NaN != 0 is True: NaN is kept as a non-zero
    row_nnz = nz.sum(dim=1, dtype=torch.int32)
    in_ell = row_nnz <= width

    values = torch.zeros((m, width), dtype=a.dtype, device=a.device)
    cols = torch.zeros((m, width), dtype=torch.int32, device=a.device)
    # Only the non-zeros of ELL rows are placed; nonzero() is row-major, so within a row the columns
    # come out ascending and the rank of an entry in its row is its slot.  Targets are distinct, so
    # the scatter is deterministic without atomics.
    r, c = (nz & in_ell.unsqueeze(1)).nonzero(as_tuple=True)
    if r.numel() > 0:
        ell_nnz = torch.where(in_ell, row_nnz, torch.zeros_like(row_nnz)).long()
        row_start = torch.cumsum(ell_nnz, dim=0) - ell_nnz
        slot = torch.arange(r.numel(), device=a.device) - row_start[r]
        values[r, slot] = a[r, c]
        cols[r, slot] = c.to(torch.int32)

    tail_rows = (~in_ell).nonzero().squeeze(1)
    tail_values = a[tail_rows]  # advanced indexing copies
    return HybridTensor(
        values=values,
        cols=cols,
        row_nnz=row_nnz,
        tail_rows=tail_rows,
        tail_values=tail_values,
        n_cols=f,
    )
