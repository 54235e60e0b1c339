"""The one-pass small-batch kernel (gate, up and down in one kernel, then a column sum) against the dense
reference.

Triton under TRITON_INTERPRET=1 on the CPU (CI), natively on the GPU; inputs from
test_ops_kernels.make_problem (exact-grid values, a bias channel setting the density).
"""

from __future__ import annotations

import pytest
import torch
from test_ops_kernels import make_problem

from twell.ops import decode as decode_mod
from twell.ops import decode_onepass_kernel as onepass_mod
from twell.ops.decode import decode_gated_ffn, launch_decode_ffn
from twell.ops.decode_kernels import decode_blocks, launch_decode_hidden
from twell.ops.decode_onepass_kernel import ONEPASS_MAX_TOKENS, launch_decode_onepass
from twell.reference import inference as ref
from twell.tolerances import REL_TOL, rel_error

CASES = [
    # m, d, f, frac_pos
    (1, 32, 128, 0.05),  # one token, a few firing units
    (3, 48, 200, 0.10),  # F not a multiple of the unit blocks, d not a power of two, M not one either
    (8, 32, 96, 0.0),  # nothing fires: zero output, no partial written
    (8, 64, 160, 1.0),  # the largest M, every unit fires
    (2, 32, 700, 0.02),  # several blocks, most without a firing unit
]


def _check(out, counts, x, wg, wu, wd, precision):
    m, d = x.shape
    want = ref.dense_gated_ffn(x, wg, wu, wd, precision=precision)
    assert out.dtype == x.dtype and out.shape == (m, d)
    if bool((want != 0).any()):
        assert rel_error(out, want) <= REL_TOL[x.dtype]
    else:
        assert torch.count_nonzero(out) == 0
    # per-token active units per block of 16 units: the two-kernel path's l0 statistics, exactly
    assert counts.shape == (m, decode_blocks(wg.shape[0]))
    assert torch.equal(counts, launch_decode_hidden(x, wg, wu, match=True)[2])


@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-p{c[3]}" for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("precision", ["match", "fp32"])
def test_matches_dense_reference_and_the_two_kernel_counts(case, dtype, precision, device):
    m, d, f, frac = case
    p = make_problem(m, d, f, frac_pos=frac, seed=5 * m + f, dtype=dtype, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    out, counts = launch_decode_onepass(x, wg, wu, wd.t(), match=precision == "match")
    _check(out, counts, x, wg, wu, wd, precision)
    again = launch_decode_onepass(x, wg, wu, wd.t(), match=precision == "match")
    assert torch.equal(again[0], out) and torch.equal(again[1], counts)  # bitwise reproducible


def test_chunked_loops_over_k_columns_and_partial_rows(device, monkeypatch):
    """Small BK, BD and BP: the weight rows and the output in several chunks, the flags in several steps."""
    p = make_problem(5, 72, 600, frac_pos=0.08, seed=11, dtype=torch.bfloat16, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    try:
        for unrolled in (False, True):  # the gate's K loop as a loop, and unrolled
            monkeypatch.setattr(onepass_mod, "_ONEPASS_CONFIG", (16, 4, 16, 16, 4, unrolled, 2))
            onepass_mod._meta.cache_clear()
            # BK = 16: 72 columns in 5 chunks, the last one partial; the up/down chunks in a loop
            assert onepass_mod._meta(5, 72, 600)[1:4] == (16, 5 if unrolled else 0, 0)
            out, counts = launch_decode_onepass(x, wg, wu, wd.t(), match=True)
            _check(out, counts, x, wg, wu, wd, "match")
    finally:
        onepass_mod._meta.cache_clear()


@pytest.mark.parametrize(("bk", "d", "nud"), [(64, 72, 2), (64, 128, 2), (128, 72, 1)])
def test_firing_rows_in_one_or_two_chunks_at_once(bk, d, nud, device, monkeypatch):
    """Up/down with every chunk of the firing rows requested together: d in two chunks (the second
    partial, or full) and in one."""
    p = make_problem(3, d, 400, frac_pos=0.1, seed=d + bk, dtype=torch.bfloat16, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    try:
        monkeypatch.setattr(onepass_mod, "_ONEPASS_CONFIG", (bk, 4, 16, 16, 4, False, 2))
        onepass_mod._meta.cache_clear()
        assert onepass_mod._meta(3, d, 400)[3] == nud
        out, counts = launch_decode_onepass(x, wg, wu, wd.t(), match=True)
        _check(out, counts, x, wg, wu, wd, "match")
        assert torch.equal(out, launch_decode_onepass(x, wg, wu, wd.t().contiguous(), match=True)[0])
    finally:
        onepass_mod._meta.cache_clear()


def test_unit_major_copy_of_wd_gives_the_same_bits(device):
    p = make_problem(3, 32, 300, frac_pos=0.1, seed=9, dtype=torch.bfloat16, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    view = launch_decode_onepass(x, wg, wu, wd.t(), match=True)[0]
    copy = launch_decode_onepass(x, wg, wu, wd.t().contiguous(), match=True)[0]
    assert torch.equal(view, copy)


UNIT_CASES = [
    # d, f, frac_pos: one token with a unit-major Wd^T goes through the firing units row by row
    (32, 128, 0.05),  # a few firing units
    (48, 200, 0.10),  # d not a power of two (masked row tails), F not a multiple of the 16-unit blocks
    (32, 96, 0.0),  # nothing fires: no partial written, zero output
    (64, 160, 1.0),  # every unit of every block fires (16 rows in sequence per program)
    (32, 700, 0.02),  # several blocks, most without a firing unit
]


@pytest.mark.parametrize("case", UNIT_CASES, ids=[f"d{c[0]}-f{c[1]}-p{c[2]}" for c in UNIT_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("precision", ["match", "fp32"])
def test_one_token_unit_by_unit_path_matches_the_reference_and_the_tile_path(case, dtype, precision, device,
                                                                             monkeypatch):
    d, f, frac = case
    p = make_problem(1, d, f, frac_pos=frac, seed=3 * d + f, dtype=dtype, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    wd_um = wd.t().contiguous()
    assert onepass_mod.fire_units_width(1, d, unit_major=True) > 0
    out, counts = launch_decode_onepass(x, wg, wu, wd_um, match=precision == "match")
    _check(out, counts, x, wg, wu, wd, precision)
    assert torch.equal(launch_decode_onepass(x, wg, wu, wd_um, match=precision == "match")[0], out)
    monkeypatch.setattr(onepass_mod, "FIRE_UNITS_MAX_D", False)  # the [BU, BK] tile path on the same call
    assert onepass_mod.fire_units_width(1, d, unit_major=True) == 0
    tiles, tile_counts = launch_decode_onepass(x, wg, wu, wd_um, match=precision == "match")
    assert torch.equal(tile_counts, counts)
    if bool((tiles != 0).any()):
        assert rel_error(out, tiles) <= REL_TOL[dtype]
    else:
        assert torch.count_nonzero(out) == 0


def test_unit_by_unit_path_only_for_one_token_unit_major_rows_and_bounded_width():
    assert onepass_mod.fire_units_width(1, 2048, unit_major=True) == 2048
    assert onepass_mod.fire_units_width(1, 1000, unit_major=True) == 1024
    assert onepass_mod.fire_units_width(2, 2048, unit_major=True) == 0  # tokens: the tile path
    assert onepass_mod.fire_units_width(1, 2048, unit_major=False) == 0  # strided Wd^T rows: uncoalesced
    assert onepass_mod.fire_units_width(1, 2 * onepass_mod.FIRE_UNITS_MAX_D, unit_major=True) == 0


@pytest.mark.parametrize("unit_major", [False, True], ids=["wd-view", "wd-unit-major"])
def test_nan_gate_reaches_the_output_at_one_token(unit_major, device):
    p = make_problem(1, 32, 64, frac_pos=0.2, seed=7, dtype=torch.float32, device=device)
    p["w_gate"][5, 3] = float("nan")  # unit 5's gate is NaN: it fires, and its NaN reaches every column
    wd_t = p["w_down"].t().contiguous() if unit_major else p["w_down"].t()
    out = launch_decode_onepass(p["x"], p["w_gate"], p["w_up"], wd_t, match=True)[0]
    want = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    assert bool(torch.isnan(want).all())
    assert torch.equal(torch.isnan(out).cpu(), torch.isnan(want).cpu())


def test_nan_gate_reaches_the_output_like_the_dense_ffn(device):
    p = make_problem(2, 32, 64, frac_pos=0.2, seed=5, dtype=torch.float32, device=device)
    p["x"][1, 3] = float("nan")
    out = launch_decode_onepass(p["x"], p["w_gate"], p["w_up"], p["w_down"].t(), match=True)[0]
    want = ref.dense_gated_ffn(p["x"], p["w_gate"], p["w_up"], p["w_down"])
    assert torch.equal(torch.isnan(out).cpu(), torch.isnan(want).cpu())


def test_decode_entry_point_routes_small_calls_through_the_one_pass_kernel(device, monkeypatch):
    p = make_problem(4, 32, 128, frac_pos=0.1, seed=2, dtype=torch.bfloat16, device=device)
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    monkeypatch.setattr(decode_mod, "ONEPASS_TOKENS", 4)
    routed = launch_decode_ffn(x, wg, wu, wd.t())
    assert torch.equal(routed[0], launch_decode_onepass(x, wg, wu, wd.t(), match=True)[0])
    monkeypatch.setattr(decode_mod, "ONEPASS_TOKENS", 3)  # 4 tokens now go through the two kernels
    two_kernels = launch_decode_ffn(x, wg, wu, wd.t())
    assert torch.equal(routed[1], two_kernels[1])  # same counts: same l0 for SparseGatedMLP
    for out in (routed[0], two_kernels[0], decode_gated_ffn(x, wg, wu, wd, backend="triton")):
        assert rel_error(out, ref.dense_gated_ffn(x, wg, wu, wd)) <= REL_TOL[torch.bfloat16]


@pytest.mark.parametrize("m", [0, ONEPASS_MAX_TOKENS + 1])
def test_token_count_outside_the_kernel_is_refused(m, device):
    p = make_problem(max(m, 1), 32, 64, frac_pos=0.1, seed=1, dtype=torch.float32, device=device)
    x = p["x"][:m]
    with pytest.raises(ValueError, match=f"1 to {ONEPASS_MAX_TOKENS} tokens"):
        launch_decode_onepass(x, p["w_gate"], p["w_up"], p["w_down"].t(), match=True)


@pytest.mark.gpu
@pytest.mark.parametrize(("d", "f"), [(2048, 5632), (4096, 14336)])
@pytest.mark.parametrize("m", [1, ONEPASS_MAX_TOKENS])
def test_gpu_bf16_real_shape_with_poisoned_scratch(d, f, m):
    """Real shapes on random data; the caching allocator's blocks are filled with NaN first, so the
    output, the flags and the partial rows of blocks without a firing unit start as garbage: a row read
    without its flag, or an output element not written, shows as NaN."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from twell.synthetic import SparsityProfile, synthetic_ffn_problem

    gen = torch.Generator(device="cuda").manual_seed(d + m)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=0.005 * f), generator=gen, device="cuda")
    x, wg, wu, wd = p["x"], p["w_gate"], p["w_up"], p["w_down"]
    scratch_bytes = m * (f // 16 + 1) * d * 4  # the fp32 partial rows
    poison = torch.full((scratch_bytes,), float("nan"), device="cuda")  # 4x that: room for every buffer
    del poison  # its blocks go back to the cache, NaN-filled
    out, counts = launch_decode_onepass(x, wg, wu, wd.t(), match=True)
    # unit-major Wd^T as SparseGatedMLP passes it (at one token: the firing units row by row)
    out_um, counts_um = launch_decode_onepass(x, wg, wu, wd.t().contiguous(), match=True)
    assert torch.equal(counts_um, counts)
    want = ref.dense_gated_ffn(*(t.float() for t in (x, wg, wu, wd))).to(torch.bfloat16)
    assert not bool(torch.isnan(out_um).any())
    assert rel_error(out_um, want) <= REL_TOL[torch.bfloat16]
    assert not bool(torch.isnan(out).any())
    assert rel_error(out, want) <= REL_TOL[torch.bfloat16]
    # l0 per token against the fp32 gate's: a gate within rounding of 0 may fall on either side
    l0_fp32 = (x.float() @ wg.float().T > 0).sum(1)
    assert int((counts.sum(1) - l0_fp32).abs().max()) <= 2

