"""The hot/cold split of the sparse gated FFN: frequent units densely, the rest through TwELL.

Unit firing frequencies are heavy-tailed: in the synthetic profile at l0 = 28 of 5632 the 384 most
frequent units carry ~70 % of the (token, unit) pairs.  A pair costs the row-gather kernel ~1.5 ns
(two 4 KB weight rows at d=2048), while a unit done densely for every token costs ~18 ps per token
(its share of a larger GEMM plus a small down GEMM; H200, bench_results/h200/hot_cold_probe.log).
So units firing on more than ~1 % of the tokens are cheaper dense.  With H hot units:

    gu    = x @ [Wg[hot]; Wg[cold]; Wu[hot]]^T        one cuBLAS GEMM, [M, F + H]
    h_hot = round(relu(gu[:, :H]) * gu[:, F:])        _hot_hidden_kernel, [M, H] (+ per-row counts)
    acc   = h_hot @ Wd[:, hot]^T                      cuBLAS, fp32 output (no intermediate rounding)
    list  = pack(gu[:, H:F])                          the cold units only: a bitmap per (row, tile)
                                                      (``ops.bitmap_kernels``) or TwELL slots
    out   = round(acc + sum over cold pairs)          gather kernel, cold column -> unit map

The result is the same function as the dense FFN at any density: every unit is either hot (computed
densely) or cold (all of its non-zeros are in the TwELL container, overflow included); the choice of
hot units only moves time.  Rounding matches a dense PyTorch FFN in the input dtype (u and h rounded,
the output accumulated in fp32 and rounded once).

The plan (``twell.ops.hot_cold_plan``) costs one extra copy of Wg (reordered) plus H rows of Wu and
Wd^T: about 1.3x the gate weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import hot_cold_gate_kernel
from ._runtime import cdiv, interpreting, pdl_supported
from .bitmap_kernels import launch_bitmap_ffn, launch_pack_bitmap
from .cold_down_kernel import down_cold_supported, launch_down_cold
from .gate_kernel import launch_pack_twell, relu_keep_nan, round_to
from .hot_cold_dense_rows import dense_rows_ffn, heavy_row_pairs, select_overflow_rows
from .hot_cold_gate_kernel import gate_row_block, launch_hot_cold_gate
from .hot_cold_plan import HotColdPlan
from .hot_down_kernel import hot_down_supported, launch_hot_down
from .twell_ffn_kernel import default_lists, launch_twell_ffn
from .twell_list_kernel import heavy_queue, launch_list_twell_rows

#: How the cold pairs are listed for the gather kernel (see ``launch_hot_cold_ffn``).
COLD_FORMATS = ("auto", "bitmap", "twell")


@triton.jit
def _hot_hidden_kernel(
    gu_ptr, h_ptr, cnt_ptr, M, H, F, stride_gm, n_hot_tiles,
    BLOCK_M: tl.constexpr, TILE: tl.constexpr,
):
    """h[:, tile] = round(relu(g_hot) * u_hot) and the per-row non-zero count of the tile."""
    pid_m = tl.program_id(0)
    pid_t = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_t * TILE + tl.arange(0, TILE)
    m_ok = rows < M
    c_ok = cols < H
    ok = m_ok[:, None] & c_ok[None, :]
    base = gu_ptr + rows.to(tl.int64)[:, None] * stride_gm + cols[None, :]
    g = tl.load(base, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(base + F, mask=ok, other=0.0).to(tl.float32)
    act = relu_keep_nan(g)
    h = round_to(act * u, h_ptr.dtype.element_ty)
    tl.store(h_ptr + rows.to(tl.int64)[:, None] * H + cols[None, :], h, mask=ok)
    nz = ((act != 0) & ok).to(tl.int32)
    tl.store(cnt_ptr + rows.to(tl.int64) * n_hot_tiles + pid_t, tl.sum(nz, axis=1), mask=m_ok)


#: The cold pack stores each pair's weight-row id (``plan.cold[column]``, int16: F < 2**15) instead of its
#: column, so the row-gather kernel's steps go index -> weight rows without the map lookup between them
#: (one dependent load fewer per step of a latency-bound loop: 7.09 cold pairs per token at l0=28 are two
#: steps of SB = 4, each index -> map -> rows).  Measured on the H200 with SB 4 on 4 warps as shipped
#: (bench_results/h200/cold_pack_gather_probe_session7.log): the cold gather 2.575 -> 2.147 ms at
#: M=131072, l0=28; 2.892 -> 2.420 ms at M=131072, l0=56; 0.388 -> 0.323 ms at M=16384, l0=28.  The pack
#: with ids cost 0.116 and 0.161 ms more at M=131072 (1.876 -> 1.992 and 1.661 -> 1.822 ms, both timed
#: with the since removed two-non-zero fast path), 0.015 ms at M=16384: a net gain of ~0.3 ms at M=131072
#: predicted, but the whole op did not move (9.501 vs 9.437 ms at M=131072, 0.5 %, against session 6;
#: ffn_session7_headline.json).  Kept on for the fused gate kernel, whose epilogue then wrote the ids for one
#: map load per tile, so there the gather's gain came without the pack's cost.  Since session 15 its PTX
#: epilogue loads the map once per non-zero, and since session 14 the gather reads per-row lists whose pass
#: could do the map instead: in session 16's ncu source counters (bench_results/h200/
#: ncu_fused_gate_session16_m131072_sass.csv.gz) the epilogue's id stores waiting on those loads held 22 % of
#: its stall samples.  To be timed with this off (docs/performance.md, next step 0).
#: A wider F (ids beyond int16) keeps the column indices and the map lookup.
COLD_UNIT_IDS = True


def stores_unit_ids(n_units: int) -> bool:
    """Whether the split's cold container holds weight-row ids rather than columns, for an FFN of ``n_units``
    units: :data:`COLD_UNIT_IDS` as it is set at the call, and ids that fit int16."""
    return COLD_UNIT_IDS and n_units < 2**15

#: The TwELL cold pairs added in the epilogue of a Triton hot down GEMM (``twell.ops.cold_down_kernel``)
#: instead of a cuBLAS down GEMM's fp32 output read back by the row-gather kernel.  Measured slower on the
#: H200 (the op 10.053 vs 8.576 ms at M=131072, l0=28; see the module's docstring): off.
COLD_IN_DOWN_GEMM = False
#: The fused gate as the Gluon ping-pong kernel (``pingpong_gate_kernel``: two consumer warpgroups, one's
#: epilogue beside the other's mainloop) where it takes the call (Hopper, bf16 / fp16, tile 128); the same
#: outputs bit for bit.  Measured (H200, session 17, shipped / ping-pong / shipped back to back at the power
#: cap, bench_results/h200/pingpong_gate_probe_session17.log): the gate 5.214 vs 5.307 / 5.312 ms at
#: M=131072, l0=28, but 3.85 vs 3.59 / 3.74 J; the op 7.288 vs 7.326 / 7.323 ms; at 16384 the gate 0.661 vs
#: 0.669 / 0.661 and the op 0.946 vs 0.947 / 0.954 ms.  Predicted the op -0.1 to -0.3 ms: missed.  The latency
#: it hides is not what the op pays at the cap, where time follows joules, and the gate's joules did not fall.
#: Off.
PINGPONG_GATE = False


#: The hot down GEMM (fp32 output) in Triton (``hot_down_kernel``) where it takes the operands, instead of
#: cuBLAS's ``torch.mm(..., out_dtype=torch.float32)``.  Measured slower (H200, session 21, interleaved): the
#: GEMM 0.0622 vs 0.0504 ms at M=16384, H=256 (its fp32 write alone 0.0326), the op 0.8289 vs 0.8157 /
#: 0.8158 ms at M=16384, l0=28 (bench_results/h200/hot_down_probe_session21.log): off.
HOT_DOWN_TRITON = False


#: The residual added by the TwELL gather as it writes each row (``launch_hot_cold_ffn(residual=...)``) rather than
#: by ``out.add_(residual)`` after it.  The add is a pass over three [M, d] tensors (1.5 GB at M=131072, d=2048 in
#: bf16; the 1.5B forward's 56 residual adds took 20.4 ms in session 15's profile, ~0.36 ms each); fused, it is one
#: more read of the residual in a kernel bound by its dependent loads.  Same bits either way.  Measured on the H200
#: at M=131072, l0=28, 576 hot units (interleaved, bench_results/h200/residual_probe_session24.log): the op then the
#: add 6.900 ms, the residual in the gather 6.702.
FUSE_RESIDUAL = True

#: The list pass and the gather launched as programmatic dependents (``launch_twell_ffn``'s ``pdl``; sm_90 on),
#: where a kernel that does not touch the cold container runs between the gate and them (the hot down GEMM, or the
#: dense rows' selection): the list pass may run beside that kernel, and the gather's launch waits behind the list
#: pass instead of after it.  Same bits.  Predicted at M=16384, l0=28: the op -0.003 ms (two launches' latency) up to
#: -0.015 (the list pass wholly beside the hot down GEMM; 0.015 and 0.045 ms in session 21's profile,
#: bench_results/h200/infer_op_profile_session21.log).  Measured (H200, session 25, interleaved, the module's hot set,
#: bench_results/h200/tail_probe_session25.log): 0.8059 -> 0.8029 ms at 16384 (dense 1.5995), 6.2585 -> 6.2589 at
#: 131072; back to back at the power cap 0.897 -> 0.895 and 7.049 -> 7.052.  The low end: cuBLAS's GEMM lets its
#: dependents launch only as it ends, so the list pass does not run beside it; the launch latency goes.  On.
LIST_PDL = True
#: The list pass launched right after the fused gate, beside it (programmatic dependent launch, sm_90): the gate
#: counts each row block's finished cold output tiles, and each list program waits for its row block's count, then
#: lists its rows while the gate goes on with other row blocks (``launch_list_twell_rows``'s ``after_gate``); the
#: hot down GEMM and the gather follow.  Same bits.  Why: at M=16384, l0=28 the list pass took 0.015 ms of the op's
#: ~0.80 ms after the hot down GEMM, and the gate's persistent grid leaves most SMs idle in its last round of tiles
#: (2944 output tiles over 132 programs: 40 programs take a 23rd tile, 92 idle); the gate's registers and shared
#: memory leave room for list programs beside it (202 registers x 256 threads of 65,536; ~147 KB of 228 KB).
#: Predicted: the op -0.010 to -0.015 ms at 16384 (the list pass hidden, a zero fill of the counters added),
#: -0.05 to -0.09 ms at 131072.  Measured (H200, session 25, interleaved, bench_results/h200/
#: tail_probe_beside_session25.log): far slower, the same bits: 1.7069 against 0.8184 ms at 16384, 13.115 against
#: 6.338 at 131072 (the headline run: 0.95x of dense): the gate itself took 1.441 against 0.533 ms.  Session 26 found
#: why offline: the ``tl.debug_barrier()`` before each release stopped the software pipeliner (the gate's PTX held 2
#: TMA loads against 6), so that gate ran its k steps one TMA round trip at a time.  The barrier and release are now
#: one piece of inline PTX (``hot_cold_gate_kernel._RELEASE_AFTER_BARRIER``; the loop stays pipelined, 196 registers)
#: and the list programs may launch only from the gate's last :data:`LIST_BESIDE_ROUNDS` rounds of tiles.  Measured
#: again (H200, session 26, three calls, bench_results/h200/session26_runs.md): with each count released a mainloop
#: late the op tied the shipped launches (0.8030-0.8035 against 0.8035 ms at 16384; 6.2994 against 6.2817 at
#: 131072), because the pass still ran after the gate (its span 0.036-0.047 ms, ending ~0.014 ms after the gate).
#: Read from those spans: each list program's closing ``griddepcontrol.wait`` held its SM until the gate ended
#: (``twell_list_kernel.LIST_ONE_WAITS``).  With only the last list program waiting (H200, session 27, interleaved,
#: bench_results/h200/tail_probe_call1_session27.log): 0.8075 against 0.8128 ms at 16384 (dense 1.6190; 2.005x against
#: 1.992x), the pass spanning 0.028 ms against 0.036-0.047; at 131072 6.3918 against 6.3881 (a tie; launched from the
#: gate's start 6.3288).  The predicted -0.008 to -0.013 ms came out -0.005: the pass likely still ends after the
#: gate.  The headline with both on (ffn_headline_beside_onewait_session27.json): 2.001x at 16384 / 0.5 %, 2.02x at
#: 131072; the whole sweep 2.01x at both (ffn_sweep_session27.json).  On.
LIST_BESIDE_GATE = True
#: With :data:`LIST_BESIDE_GATE`: the list programs launch once every gate program has begun one of its last this many
#: rounds of output tiles (None: as the gate starts, the programs then waiting beside the whole GEMM).  At M=16384
#: the gate's 2944 tiles make 22.3 rounds of its 132 programs and the list pass took 0.015 ms (~0.7 of a round's
#: ~0.023 ms); at 131072, 178.4 rounds and 0.088 ms (~3.5 rounds).  Measured (session 26): from the start, the last
#: round, 2 or 4 rounds within 0.001 ms of each other at 16384 (0.8030-0.8035 ms in call 2): the pass's programs took
#: SMs only as the gate's programs ended, whenever they were let launch.
LIST_BESIDE_ROUNDS: int | None = 1
#: With :data:`LIST_BESIDE_GATE`: the gate's output tiles ordered cold first, hot last (``launch_hot_cold_gate``'s
#: ``hot_last``), so that the list pass, which reads only the cold container, finds every row block ready once the
#: gate's programs begin to end.  Why (session 26's call 2, bench_results/h200/tail_probe_call2_session26.log): the
#: list programs never ran beside the gate's programs (with or without the largest shared-memory carveout) but began
#: as gate programs ended, in the gate's last round, where the last row blocks' cold tiles were still being written:
#: the pass then ended ~0.014 ms after the gate, as after the hot down GEMM.  At M=16384 the hot tiles (2 per row block,
#: 256) make the last ~1.9 of 22.3 rounds.  Measured (session 26's call 3): no change (0.8137 against 0.8115 ms in the
#: grouped order at 16384, the pass's span 0.037 ms in both), which the list programs' closing waits explain (above).
LIST_BESIDE_HOT_LAST = True


def _hot_partial(h_hot: torch.Tensor, w_down_hot_t: torch.Tensor) -> torch.Tensor:
    """h_hot @ Wd_hot^T accumulated and returned in fp32 (the output is rounded once, later)."""
    if HOT_DOWN_TRITON and hot_down_supported(h_hot, w_down_hot_t):
        return launch_hot_down(h_hot, w_down_hot_t)
    if h_hot.is_cuda and h_hot.dtype in (torch.float16, torch.bfloat16):
        return torch.mm(h_hot, w_down_hot_t, out_dtype=torch.float32)
    return h_hot.float() @ w_down_hot_t.float()


def launch_hot_hidden(gu: torch.Tensor, n_hot: int, n_units: int, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h_hot [M, H], hot_counts [M, cdiv(H, tile)])`` from the split's GEMM output gu [M, F + H] (columns
    ``Wg[hot]``, ``Wg[cold]``, ``Wu[hot]``; F = ``n_units``) through :func:`_hot_hidden_kernel`."""
    m = gu.shape[0]
    n_hot_tiles = cdiv(n_hot, tile)
    h_hot = torch.empty((m, n_hot), dtype=gu.dtype, device=gu.device)
    hot_counts = torch.empty((m, n_hot_tiles), dtype=torch.int32, device=gu.device)
    if n_hot and m:
        block_m = 32
        _hot_hidden_kernel[(cdiv(m, block_m), n_hot_tiles)](
            gu, h_hot, hot_counts, m, n_hot, n_units, gu.stride(0), n_hot_tiles, BLOCK_M=block_m, TILE=tile,
            num_warps=4,
        )
    return h_hot, hot_counts


def launch_hot_cold_ffn(
    x: torch.Tensor,
    plan: HotColdPlan,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    *,
    tile: int,
    capacity: int,
    cold_format: str = "auto",
    dense_rows: int = 0,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [M, d], counts [M, n_cold_tiles + n_hot_tiles]) for validated, contiguous inputs.

    A plan with ``fused_tile`` (its ``w_gemm`` in the fused layout) runs the GEMM, the hot hidden state and
    the cold TwELL pack in one kernel (``hot_cold_gate_kernel``): TwELL cold format, ``tile`` equal to the
    plan's, d * itemsize a multiple of 16 bytes.

    ``cold_format``: how the cold pairs are listed (``COLD_FORMATS``): "twell" (TwELL slots of
    ``capacity``; "auto" picks it) or "bitmap" (``ops.bitmap_kernels``, tiles that are multiples of 32).

    ``dense_rows``: up to this many rows with an overflowing cold tile (the first in row order) are computed
    whole by dense GEMMs instead of the row kernel's per-token dense pass (``hot_cold_dense_rows``; TwELL cold
    format; 0: none), and in the slots they leave, in calls under ``HEAVY_ROWS_MAX_TOKENS`` tokens, the rows with
    more cold pairs than the call's ``hot_cold_dense_rows.heavy_row_pairs`` bound (``HEAVY_ROW_PAIRS``,
    ``HEAVY_ROW_PAIRS_LARGE`` from ``HEAVY_ROWS_LARGE_TOKENS`` tokens).  The others keep the row kernel: the result is
    exact at any budget.

    ``residual`` ([M, d], x's dtype, contiguous): the output is ``residual + FFN(x)`` with the bits of that sum in
    the input dtype (the FFN rounded, then the sum rounded).  The TwELL gather adds it as it writes each row
    (:data:`FUSE_RESIDUAL`), so the decoder layer's separate pass over the residual goes; the other paths add it
    after.

    ``out`` ([M, d], x's dtype and device, contiguous; None: a fresh tensor): where the output is written, every
    element of it (a CUDA graph of the call records a fixed address: ``twell.nn.call_graphs``).

    ``counts`` holds the non-zeros per (row, tile of cold columns) then per (row, tile of hot units):
    each row sums to its l0.
    """
    m, d = x.shape
    f, n_hot = plan.n_units, plan.n_hot
    n_cold = f - n_hot
    if plan.fused_tile:
        _check_fused_gate(x, plan, tile, cold_format)
    if cold_format == "auto":
        # TwELL slots: on the H200 the bitmap's pack was 2x faster (0.90 vs 1.63 ms at M=131072, l0=28)
        # but its gather paid more for finding each pair (a longer chain of dependent loads per step):
        # the whole op took 9.93 vs 9.24 ms there and 1.31 vs 1.23 ms at M=16384
        # (bench_results/h200/cold_format_probe.log).
        cold_format = "twell"
    if cold_format not in ("bitmap", "twell"):
        raise ValueError(f"cold_format must be one of {', '.join(COLD_FORMATS)}; got {cold_format!r}")
    unit_ids = stores_unit_ids(f)
    heavy = lists = None
    if plan.fused_tile:
        gate, extra = launch_hot_cold_gate, {}
        if PINGPONG_GATE:
            from .pingpong_gate_kernel import launch_pingpong_gate, pingpong_supported

            gate = launch_pingpong_gate if pingpong_supported(x, tile) else gate
        ours = gate is launch_hot_cold_gate
        listed, heavy_first = default_lists(x, w_down_t, n_cold, gated=True) if ours else (False, False)
        beside = _lists_beside_gate(x, n_cold) if listed else None
        if beside is not None:  # the list pass beside the gate: its row-block counters and the queue's, zeroed
            flags = torch.zeros(beside + 1, dtype=torch.int32, device=x.device)
            heavy = (heavy_queue(m, x.device, zeroed=False)[0], flags[beside:]) if heavy_first else None
            extra = {"done": flags[:beside], "trigger_rounds": LIST_BESIDE_ROUNDS, "hot_last": LIST_BESIDE_HOT_LAST}
        elif heavy_first:  # the gather's heavy queue, its counter zeroed by the gate kernel
            heavy = heavy_queue(m, x.device, zeroed=False)
            extra = {"zero": heavy[1]}
        h_hot, hot_counts, *cold = gate(x, plan.w_gemm, n_hot, n_cold, plan.cold, tile=tile, capacity=capacity,
                                        unit_ids=unit_ids, **extra)
        if beside is not None:
            target = cdiv(cdiv(n_cold, tile), 2)  # the cold output tiles of a row block
            lists = launch_list_twell_rows(*cold, tile=tile, unit_map=plan.cold, idx_is_unit=unit_ids, heavy=heavy,
                                           after_gate=(extra["done"], target, gate_row_block()))
    else:
        gu = torch.nn.functional.linear(x, plan.w_gemm)
        h_hot, hot_counts = launch_hot_hidden(gu, n_hot, f, tile)
        g_cold = gu[:, n_hot:f]
        if cold_format == "bitmap":
            cold = launch_pack_bitmap(g_cold, tile)
        else:
            cold = launch_pack_twell(g_cold, tile, capacity, unit_map=plan.cold if unit_ids else None)
    if out is None:
        out = torch.empty((m, d), dtype=x.dtype, device=x.device)
    elif out.shape != (m, d) or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{m}, {d}] {x.dtype} tensor on {x.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device} (contiguous: {out.is_contiguous()})")
    taken = None
    if COLD_IN_DOWN_GEMM and cold_format == "twell" and n_cold and m and down_cold_supported(x, n_hot):
        # out written for the tokens with a cold list; the row kernel below does the others (an overflowing
        # tile, or more than cold_down_kernel.LIST pairs) from their fp32 hot partial sums in init
        init, taken = launch_down_cold(x, h_hot, plan.w_down_hot_t, *cold, w_up, w_down_t, tile=tile,
                                       unit_map=plan.cold, idx_is_unit=unit_ids, out=out)
    else:
        init = _hot_partial(h_hot, plan.w_down_hot_t) if n_hot and m else None
    if n_cold == 0:  # every unit hot: the output is the hot partial sum alone
        if init is not None:
            out.copy_(init)
        else:
            out.zero_()
    elif cold_format == "bitmap":
        launch_bitmap_ffn(x, g_cold, *cold, plan.cold, w_up, w_down_t, tile=tile, out=out, init=init)
    else:
        skip = rows = None
        heavy_pairs = heavy_row_pairs(m)
        if dense_rows > 0 and taken is None and m:
            skip, rows = select_overflow_rows(cold[-1], capacity, min(dense_rows, m), heavy_pairs)
        fuse = residual if FUSE_RESIDUAL and taken is None else None
        # a kernel between the gate and the list pass that does not touch the container: the hot down GEMM
        # (taken is None: cuBLAS's) or the dense rows' selection
        between = (init is not None and taken is None) or skip is not None
        launch_twell_ffn(x, *cold, None, None, w_gate, w_up, w_down_t, n_cols=n_cold, tile=tile, round_hidden=True,
                         out=out, unit_map=plan.cold, init=init, idx_is_unit=unit_ids, taken=taken,
                         skip_overflow_rows=skip, skip_flagged=skip is not None and heavy_pairs > 0,
                         residual=fuse, heavy=heavy, lists=lists,
                         pdl=LIST_PDL and (between or lists is not None))
        if rows is not None:
            dense_rows_ffn(x, rows, w_gate, w_up, w_down_t, out, residual=fuse)
        if fuse is not None:
            residual = None  # added by the gather and the dense rows
    if residual is not None:
        out.add_(residual)  # the FFN's rounded output plus the residual, rounded: the same bits as the fused add
    return out, joined_counts(cold[-1], hot_counts)


def _lists_beside_gate(x: torch.Tensor, n_cold: int) -> int | None:
    """The gate's row blocks where its list pass runs beside it (:data:`LIST_BESIDE_GATE`; the caller has checked that
    the gather walks lists by default), else None: cold units and tokens exist, the cold-down path is off, and the
    device launches programmatic dependents (or the interpreter runs the grids in order)."""
    m = x.shape[0]
    if not (LIST_BESIDE_GATE and m and n_cold and not COLD_IN_DOWN_GEMM and not hot_cold_gate_kernel.FUSED_TMA_SLOTS):
        return None
    if not (pdl_supported(x.device) or interpreting()):
        return None
    return cdiv(m, gate_row_block())


def joined_counts(cold_counts: torch.Tensor, hot_counts: torch.Tensor) -> torch.Tensor:
    """The op's counts [M, n_cold_tiles + n_hot_tiles] (int32, contiguous): the buffer that the fused gate writes
    both into (``launch_hot_cold_gate``: cold then hot columns of one tensor) as it is, else the two concatenated.
    The concatenation cost a kernel of 0.004 ms at M=16384 and 0.020 ms at 131072 (H200, session 21's profile,
    bench_results/h200/infer_op_profile_session21.log) plus its launch."""
    m, n_c = cold_counts.shape
    n = n_c + hot_counts.shape[1]
    joined = (m > 0 and hot_counts.shape[0] == m and cold_counts.stride() == (n, 1)
              and (hot_counts.shape[1] == 0 or hot_counts.stride() == (n, 1))
              and hot_counts.data_ptr() == cold_counts.data_ptr() + n_c * cold_counts.element_size()
              and cold_counts.untyped_storage().data_ptr() == hot_counts.untyped_storage().data_ptr())
    if joined:
        return cold_counts.as_strided((m, n), (n, 1))
    return torch.cat([cold_counts, hot_counts], 1)


def _check_fused_gate(x: torch.Tensor, plan: HotColdPlan, tile: int, cold_format: str) -> None:
    """What the fused gate kernel needs from a call of :func:`launch_hot_cold_ffn`."""
    if tile != plan.fused_tile:
        raise ValueError(f"the plan's gate weight is laid out for the fused kernel at tile {plan.fused_tile}; the "
                         f"call asks for tile {tile} (build the plan with fused_tile={tile}, or 0)")
    if cold_format not in ("auto", "twell"):
        raise ValueError(f"the fused hot/cold gate writes TwELL; cold_format must be 'auto' or 'twell', got "
                         f"{cold_format!r}")
    if (x.shape[1] * x.element_size()) % 16:
        raise ValueError(f"the fused hot/cold gate reads rows through TMA: d * itemsize must be a multiple of 16 "
                         f"bytes, got d={x.shape[1]} in {x.dtype}")
