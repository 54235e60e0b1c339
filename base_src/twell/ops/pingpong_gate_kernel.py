"""The fused hot/cold gate as a ping-pong kernel in Gluon (Hopper), off by default (``hot_cold.PINGPONG_GATE``).

What it computes is ``hot_cold_gate_kernel.launch_hot_cold_gate``'s output, bit for bit (the GPU test compares
them): the hot hidden state h = round(relu(round(g)) round(u)) with its per-row counts, and the cold TwELL
container (counts, values, weight-row ids).  How it runs differs: two consumer warpgroups take a program's
[128, 128] output tiles in turn, a producer warp issues every TMA load into one ring of shared-memory stages,
and an order barrier starts a consumer's mainloop only when the other has issued its last step, so that one
consumer's epilogue runs beside the other's wgmma (a ping-pong schedule; Triton 3.6's ``warp_specialize``
builds no such thing on sm_90).

Why: the flattened fused gate runs 0.435 ms above its mainloop alone at M=131072, l0=28 (5.337 vs 4.902 ms,
bench_results/h200/epilogue_ablation_probe_session17.log), and that gap is its epilogues' latency at least in
part.  The plain ping-pong GEMM kept up with the fused gate's mainloop (4.926 vs 4.983 / 4.976 ms without
output, the same joules; bench_results/h200/pingpong_gemm_probe_session17.log).  Its bf16 output cost it as
much as the Triton GEMM's (5.301 vs 5.317 ms): at the power cap what an epilogue writes costs energy in either
schedule, so only the latency part of the 0.435 ms can go.  Measured (H200, session 17, back to back at the
power cap, bench_results/h200/pingpong_gate_probe_session17.log): the gate 5.214 vs 5.307 / 5.312 ms at
M=131072, l0=28, at 3.85 vs 3.59 / 3.74 J, and the op 7.288 vs 7.326 / 7.323 ms (-0.5 %); at 16384 both within
their spread.  The op is at the cap, where its time follows its joules, and those did not fall: off.

Tiles: a [128, 128] consumer tile is one TwELL tile of the cold part or half a hot tile (64 units' gate and up
rows, interleaved as ``hot_cold_plan.fused_gate_weight`` lays them out), so each half writes its own counts
and the launcher adds the two halves of a 128-unit tile (one small kernel: plain stores of per-row sums need
no atomics, whose lowering for values that four lanes of a quad hold alike would have to be trusted).  The
cold epilogue is ``cold_slots_ptx``'s PTX, one call per pair of rows a thread holds (its [128, 128]
accumulator on 4 warps holds rows r, r + 8 and r + 64, r + 72: the register order puts the second pair after
the first, ``gl.to_linear_layout``'s last register basis being [64, 0]).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._runtime import sm_count
from .cold_slots_ptx import cold_slots_asm
from .hot_cold_gate_kernel import PTX_SLOTS_TRITON, _hot_pair_asm, ptx_slots_supported

__all__ = ["alloc_ring", "launch_pingpong_gate", "load_ring", "mainloop", "pingpong_supported", "program_tiles",
           "wait_turn"]

#: a consumer's output tile (rows, columns), the K step and the ring's stages: 4 x 32 KB of shared memory.
#: 6 stages (196,920 B, no spill) measured slower on the H200 (session 19, pingpong_gate_probe_stages6_session19.log,
#: M=131072, l0=28): the gate 5.482 vs 5.303 / 5.281 ms and 3.94 vs 3.62 / 3.75 J against the shipped fused gate
#: (4 stages: 5.214 vs 5.307 / 5.312 ms in session 17), the op 7.651 vs 7.250 / 7.277 ms.
BM, BN, BK, STAGES = 128, 128, 64, 4
#: the same as constexprs, for the kernels
TILE_M, TILE_N, STEP_K = gl.constexpr(BM), gl.constexpr(BN), gl.constexpr(BK)
#: row blocks per group of the tile order (the fused gate's GROUP_M)
GROUP_M = gl.constexpr(8)
#: registers a thread for the second consumer and the producer warp (setmaxnreg); the first consumer, the
#: default partition, gets what 3 x MAXNREG leaves (232)
CONSUMER_REGS, PRODUCER_REGS, MAXNREG = 232, 40, 168
#: the PTX the epilogues share with the fused gate: h and firing flags per two units' (g, u) pairs, and ReLU
#: with rounding per two elements (``hot_cold_gate_kernel._hot_hidden_ptx`` / ``round_relu``)
_HOT_BF16 = gl.constexpr(_hot_pair_asm("bf16"))
_HOT_F16 = gl.constexpr(_hot_pair_asm("f16"))
_RELU_BF16 = gl.constexpr("cvt.rn.relu.bf16x2.f32 $0, $2, $1;")
_RELU_F16 = gl.constexpr("cvt.rn.relu.f16x2.f32 $0, $2, $1;")


def pingpong_supported(x: torch.Tensor, tile: int) -> bool:
    """Whether this kernel takes the call: CUDA with compute capability 9.x (wgmma, setmaxnreg), a Triton release
    whose accumulator layout the cold-slot PTX was checked against (``ptx_slots_supported``), bf16 or fp16,
    TwELL tiles of 128 columns (one consumer tile), rows of a multiple of 16 bytes (TMA)."""
    return (x.is_cuda and torch.cuda.get_device_capability(x.device)[0] == 9 and tile == BN
            and ptx_slots_supported(triton.__version__) and x.dtype in (torch.bfloat16, torch.float16)
            and (x.shape[1] * x.element_size()) % 16 == 0)


@gluon.jit
def _tile(i, pid, n_programs, num_pid_m, n_col_tiles):
    """(pid_m, pid_n) of this program's i-th output tile, grouped as the fused gate orders them."""
    tile_id = pid + i * n_programs
    in_group = GROUP_M * n_col_tiles
    first_m = (tile_id // in_group) * GROUP_M
    group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile_id % in_group) % group_m, (tile_id % in_group) // group_m


@gluon.jit
def program_tiles(M, n_col_tiles, K, n_programs):
    """``(pid, num_pid_m, mine, k_steps)`` of this program in the persistent loop over ``n_col_tiles`` column tiles
    a row block: its id, the row blocks, how many output tiles it takes (pid, pid + n_programs, ...) and the K
    steps of each; what the producer and both consumers each work out."""
    pid = gl.program_id(0)
    num_pid_m = gl.cdiv(M, TILE_M)
    mine = gl.cdiv(num_pid_m * n_col_tiles - pid, n_programs)
    k_steps = gl.cdiv(K, STEP_K)
    return pid, num_pid_m, mine, k_steps


@gluon.jit
def alloc_ring(x_desc, w_desc, NUM_STAGES: gl.constexpr):
    """``(x_bufs, w_bufs, ready, empty, order)``: the ring's NUM_STAGES operand slots, a ready and an empty
    barrier per slot (TMA bytes landed / the slot's wgmma done) and the two consumers' order barriers."""
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [NUM_STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [NUM_STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    for s in gl.static_range(2):
        mbarrier.init(order.index(s), count=1)
    return x_bufs, w_bufs, ready, empty, order


@gluon.jit
def load_ring(x_desc, w_desc, x_bufs, w_bufs, ready, empty, M, n_col_tiles, K, n_programs):
    """A producer's work: every TMA load of the program's tiles (``n_col_tiles`` column tiles a row block), in
    order, into the ring (slot = load count % stages)."""
    NS: gl.constexpr = x_bufs.type.shape[0]
    pid, num_pid_m, mine, k_steps = program_tiles(M, n_col_tiles, K, n_programs)
    for i in range(mine):
        pm, pn = _tile(i, pid, n_programs, num_pid_m, n_col_tiles)
        for kk in range(k_steps):
            c = i * k_steps + kk
            s = c % NS
            mbarrier.wait(empty.index(s), ((c // NS) & 1) ^ 1)  # a fresh barrier passes phase 1
            mbarrier.expect(ready.index(s), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(x_desc, [pm * TILE_M, kk * STEP_K], ready.index(s), x_bufs.index(s))
            tma.async_copy_global_to_shared(w_desc, [pn * TILE_N, kk * STEP_K], ready.index(s), w_bufs.index(s))


@gluon.jit
def wait_turn(order, i, WHO: gl.constexpr):
    """Before consumer WHO's mainloop of the program's tile i: the other consumer has issued the last step of
    its tile i - 1 (order[WHO])."""
    j = i // 2
    if WHO == 0:
        mbarrier.wait(order.index(0), (j - 1) & 1, pred=j > 0)
    else:
        mbarrier.wait(order.index(1), j & 1)


@gluon.jit
def mainloop(x_bufs, w_bufs, ready, empty, order, i, k_steps, layout: gl.constexpr, WHO: gl.constexpr):
    """A consumer's mainloop of the program's tile i, after :func:`wait_turn`: one wgmma in flight, a slot
    released when the wgmma reading it has completed, order[1 - WHO] signalled once the last step is issued.
    Returns the fp32 accumulator."""
    NS: gl.constexpr = x_bufs.type.shape[0]
    acc = gl.zeros((TILE_M, TILE_N), gl.float32, layout)
    prev = 0
    for kk in range(k_steps):
        c = i * k_steps + kk
        s = c % NS
        mbarrier.wait(ready.index(s), (c // NS) & 1)
        acc = warpgroup_mma(x_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(1, deps=(acc, x_bufs.index(s), w_bufs.index(s)))
        mbarrier.arrive(empty.index(prev), pred=kk > 0)  # the wgmma of step kk - 1 is done
        prev = s
    mbarrier.arrive(order.index(1 - WHO))
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(empty.index(prev))
    return acc


@gluon.jit
def _producer(x_desc, w_desc, x_bufs, w_bufs, ready, empty, order, h_ptr, hcnt_ptr, val_ptr, idx_ptr, ccnt_ptr,
              map_ptr, M, H, N_COLD, K, n_hot_tiles, n_cold_tiles, n_programs, TILE: gl.constexpr, CAP: gl.constexpr,
              ASM_TEXT: gl.constexpr, ASM_CONSTRAINTS: gl.constexpr, HALF: gl.constexpr):
    """One warp: :func:`load_ring` over the hot half tiles and the cold TwELL tiles."""
    load_ring(x_desc, w_desc, x_bufs, w_bufs, ready, empty, M, 2 * n_hot_tiles + n_cold_tiles, K, n_programs)


@gluon.jit
def _hot_half(acc, pm, pn, M, H, h_ptr, hcnt_ptr, n_hot_tiles, layout: gl.constexpr, TILE: gl.constexpr,
              HALF: gl.constexpr):
    """Half a hot tile: the 64 units of its (g, u) column pairs; h at each pair's even column, each row's firing
    count into the half's own column of the [M, 2 * n_hot_tiles] counts (the launcher adds the halves)."""
    if HALF == "bf16":
        h2, fires2 = gl.inline_asm_elementwise(_HOT_BF16, "=r,=r,=r,r,r,r,r", [acc],
                                               dtype=(gl.bfloat16, gl.int8), is_pure=True, pack=4)
    else:
        h2, fires2 = gl.inline_asm_elementwise(_HOT_F16, "=r,=r,=r,r,r,r,r", [acc],
                                               dtype=(gl.float16, gl.int8), is_pure=True, pack=4)
    rows = pm * TILE_M + gl.arange(0, TILE_M, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, TILE_N, layout=gl.SliceLayout(0, layout))
    hot_tile = pn // 2
    units = hot_tile * TILE + (pn % 2) * (TILE_N // 2) + cols // 2
    m_ok = rows < M
    col_ok = ((cols % 2) == 0) & (units < H)  # a padding unit of the last hot tile fires on a NaN x: not counted
    ok = m_ok[:, None] & col_ok[None, :]
    gl.store(h_ptr + rows.to(gl.int64)[:, None] * H + units[None, :], h2, mask=ok)
    fires = gl.where(col_ok[None, :], fires2.to(gl.int32), 0)
    gl.store(hcnt_ptr + rows.to(gl.int64) * (2 * n_hot_tiles) + pn, gl.sum(fires, axis=1), mask=m_ok)


@gluon.jit
def _cold_tile(acc, pm, t, M, N_COLD, map_ptr, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles, layout: gl.constexpr,
               TILE: gl.constexpr, CAP: gl.constexpr, ASM_TEXT: gl.constexpr, ASM_CONSTRAINTS: gl.constexpr,
               HALF: gl.constexpr):
    """TwELL tile ``t`` of the cold container through ``cold_slots_ptx``'s PTX, two rows of a thread a call."""
    if HALF == "bf16":
        act = gl.inline_asm_elementwise(_RELU_BF16, "=r,r,r", [acc], dtype=gl.bfloat16, is_pure=True, pack=2)
    else:
        act = gl.inline_asm_elementwise(_RELU_F16, "=r,r,r", [acc], dtype=gl.float16, is_pure=True, pack=2)
    rows = pm * TILE_M + gl.arange(0, TILE_M, layout=gl.SliceLayout(1, layout))
    lim = gl.where(rows < M, N_COLD - t * TILE, 0)  # valid columns of the tile; 0 past M
    base = rows.to(gl.int64) * n_cold_tiles + t
    vrow = (val_ptr + base * CAP).to(gl.int64)
    irow = (idx_ptr + base * CAP).to(gl.int64)
    crow = (ccnt_ptr + base).to(gl.int64)
    mbase = (map_ptr + t * TILE).to(gl.int64) + gl.zeros((TILE_M, ), gl.int64, gl.SliceLayout(1, layout))
    lim2, _ = gl.broadcast(lim[:, None], act)
    vrow2, _ = gl.broadcast(vrow[:, None], act)
    irow2, _ = gl.broadcast(irow[:, None], act)
    crow2, _ = gl.broadcast(crow[:, None], act)
    mbase2, _ = gl.broadcast(mbase[:, None], act)
    gl.inline_asm_elementwise(ASM_TEXT, ASM_CONSTRAINTS, [act, lim2, vrow2, irow2, crow2, mbase2], dtype=gl.int8,
                              is_pure=False, pack=TILE_N // 2)


@gluon.jit
def _consumer(x_desc, w_desc, x_bufs, w_bufs, ready, empty, order, h_ptr, hcnt_ptr, val_ptr, idx_ptr, ccnt_ptr,
              map_ptr, M, H, N_COLD, K, n_hot_tiles, n_cold_tiles, n_programs, TILE: gl.constexpr, CAP: gl.constexpr,
              ASM_TEXT: gl.constexpr, ASM_CONSTRAINTS: gl.constexpr, HALF: gl.constexpr, WHO: gl.constexpr):
    """One warpgroup: the program's tiles WHO, WHO + 2, ..., each :func:`wait_turn`, :func:`mainloop`, then its
    epilogue (hot half tile or cold TwELL tile)."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, TILE_N, 16])
    n_col_tiles = 2 * n_hot_tiles + n_cold_tiles
    pid, num_pid_m, mine, k_steps = program_tiles(M, n_col_tiles, K, n_programs)
    for i in range(WHO, mine, 2):
        wait_turn(order, i, WHO)
        pm, pn = _tile(i, pid, n_programs, num_pid_m, n_col_tiles)
        acc = mainloop(x_bufs, w_bufs, ready, empty, order, i, k_steps, layout, WHO)
        if pn < 2 * n_hot_tiles:
            _hot_half(acc, pm, pn, M, H, h_ptr, hcnt_ptr, n_hot_tiles, layout, TILE, HALF)
        else:
            _cold_tile(acc, pm, pn - 2 * n_hot_tiles, M, N_COLD, map_ptr, val_ptr, idx_ptr, ccnt_ptr, n_cold_tiles,
                       layout, TILE, CAP, ASM_TEXT, ASM_CONSTRAINTS, HALF)


@gluon.jit
def _pingpong_gate_kernel(x_desc, w_desc, h_ptr, hcnt_ptr, val_ptr, idx_ptr, ccnt_ptr, map_ptr, M, H, N_COLD, K,
                          n_hot_tiles, n_cold_tiles, n_programs, TILE: gl.constexpr, CAP: gl.constexpr,
                          ASM_TEXT: gl.constexpr, ASM_CONSTRAINTS: gl.constexpr, HALF: gl.constexpr,
                          NUM_STAGES: gl.constexpr, CONSUMER_NREG: gl.constexpr, PRODUCER_NREG: gl.constexpr):
    """The persistent ping-pong loop over [TILE_M, TILE_N] output tiles of x @ w_fused^T, one program a SM."""
    x_bufs, w_bufs, ready, empty, order = alloc_ring(x_desc, w_desc, NUM_STAGES)
    # the argument tuples written out in the call: a tuple assigned to a name first turns its constexprs into
    # tensors (the asm text cannot become one)
    gl.warp_specialize([
        (_consumer, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, order, h_ptr, hcnt_ptr, val_ptr, idx_ptr,
                     ccnt_ptr, map_ptr, M, H, N_COLD, K, n_hot_tiles, n_cold_tiles, n_programs, TILE, CAP, ASM_TEXT,
                     ASM_CONSTRAINTS, HALF, 0)),
        (_consumer, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, order, h_ptr, hcnt_ptr, val_ptr, idx_ptr,
                     ccnt_ptr, map_ptr, M, H, N_COLD, K, n_hot_tiles, n_cold_tiles, n_programs, TILE, CAP, ASM_TEXT,
                     ASM_CONSTRAINTS, HALF, 1)),
        (_producer, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, order, h_ptr, hcnt_ptr, val_ptr, idx_ptr, ccnt_ptr,
                     map_ptr, M, H, N_COLD, K, n_hot_tiles, n_cold_tiles, n_programs, TILE, CAP, ASM_TEXT,
                     ASM_CONSTRAINTS, HALF)),
    ], [4, 1], [CONSUMER_NREG, PRODUCER_NREG])


def _operand_layout(dtype: torch.dtype) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


def kernel_args(x: torch.Tensor, w_fused: torch.Tensor, n_hot: int, n_cold: int, cold_map: torch.Tensor, *,
                tile: int, capacity: int, unit_ids: bool) -> tuple[tuple, dict, tuple]:
    """``(positional arguments, constexpr keywords, outputs)`` of one launch; the outputs as
    ``launch_hot_cold_gate`` returns them but for the hot counts, one column per half hot tile."""
    m, d = x.shape
    n_hot_tiles = triton.cdiv(n_hot, tile)
    n_cold_tiles = triton.cdiv(n_cold, tile)
    dev = x.device
    h_hot = torch.empty((m, n_hot), dtype=x.dtype, device=dev)
    half_counts = torch.empty((m, 2 * n_hot_tiles), dtype=torch.int32, device=dev)
    values = torch.empty((m, n_cold_tiles, capacity), dtype=x.dtype, device=dev)
    indices = torch.empty((m, n_cold_tiles, capacity), dtype=torch.int16, device=dev)
    cold_counts = torch.empty((m, n_cold_tiles), dtype=torch.int32, device=dev)
    half = "bf16" if x.dtype == torch.bfloat16 else "f16"
    text, constraints = cold_slots_asm(tile, tile, capacity, BN // 2, unit_ids, half)
    layout = _operand_layout(x.dtype)
    x_desc = TensorDescriptor.from_tensor(x, [BM, BK], layout)
    w_desc = TensorDescriptor.from_tensor(w_fused, [BN, BK], layout)
    tiles = triton.cdiv(m, BM) * (2 * n_hot_tiles + n_cold_tiles)
    programs = min(tiles, sm_count(dev.index)) if dev.type == "cuda" else tiles
    args = (x_desc, w_desc, h_hot, half_counts, values, indices, cold_counts, cold_map, m, n_hot, n_cold, d,
            n_hot_tiles, n_cold_tiles, programs)
    consts = {"TILE": tile, "CAP": capacity, "ASM_TEXT": text, "ASM_CONSTRAINTS": constraints, "HALF": half,
              "NUM_STAGES": STAGES, "CONSUMER_NREG": CONSUMER_REGS, "PRODUCER_NREG": PRODUCER_REGS}
    return args, consts, (h_hot, half_counts, values, indices, cold_counts)


def launch_pingpong_gate(x: torch.Tensor, w_fused: torch.Tensor, n_hot: int, n_cold: int, cold_map: torch.Tensor, *,
                         tile: int, capacity: int, unit_ids: bool) -> tuple[torch.Tensor, ...]:
    """``(h_hot, hot_counts, values, indices, cold_counts)`` as ``launch_hot_cold_gate`` returns them, for the
    inputs it takes (``pingpong_supported`` true; ``w_fused`` from ``hot_cold_plan.fused_gate_weight``)."""
    if not pingpong_supported(x, tile):
        raise ValueError(f"the ping-pong gate takes bf16 / fp16 CUDA inputs on compute capability 9.x, tile {BN}, "
                         f"rows of a multiple of 16 bytes and Triton {' / '.join(PTX_SLOTS_TRITON)}x; got {x.dtype} "
                         f"on {x.device}, tile {tile}, d={x.shape[1]}, Triton {triton.__version__}")
    n_hot_tiles = triton.cdiv(n_hot, tile)
    if w_fused.shape != (2 * tile * n_hot_tiles + n_cold, x.shape[1]):
        raise ValueError(f"w_fused has shape {tuple(w_fused.shape)}; for {n_hot} hot and {n_cold} cold units at tile "
                         f"{tile} and d={x.shape[1]} it needs ({2 * tile * n_hot_tiles + n_cold}, {x.shape[1]})")
    m = x.shape[0]
    if m == 0 or n_hot + n_cold == 0:  # nothing to launch (a TMA descriptor takes no empty tensor)
        n_cold_tiles = triton.cdiv(n_cold, tile)
        return (torch.empty((m, n_hot), dtype=x.dtype, device=x.device),
                torch.zeros((m, n_hot_tiles), dtype=torch.int32, device=x.device),
                torch.empty((m, n_cold_tiles, capacity), dtype=x.dtype, device=x.device),
                torch.empty((m, n_cold_tiles, capacity), dtype=torch.int16, device=x.device),
                torch.zeros((m, n_cold_tiles), dtype=torch.int32, device=x.device))
    # TMA reads from 16-byte aligned addresses: a view starting mid-way (a flat buffer's slice) is copied
    x, w_fused = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (x, w_fused))
    args, consts, (h_hot, half_counts, *cold) = kernel_args(x, w_fused, n_hot, n_cold, cold_map, tile=tile,
                                                             capacity=capacity, unit_ids=unit_ids)
    _pingpong_gate_kernel[(args[-1],)](*args, **consts, num_warps=4, maxnreg=MAXNREG)
    hot_counts = half_counts.view(m, n_hot_tiles, 2).sum(-1, dtype=torch.int32)
    return (h_hot, hot_counts, *cold)


def build_sm90(kernel, signature: dict, constexprs: dict) -> dict[str, int]:
    """A Gluon ``kernel`` of this module's kind built for sm_90a without a GPU (needs TRITON_INTERPRET unset; 4
    warps, MAXNREG): ptxas's registers and spilled bytes, shared memory, the PTX's setmaxnreg and wgmma counts.
    ``signature``: the runtime arguments' types (pointers taken 16-byte aligned, as launches pass them)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource

    from .compile_check import _usage

    names = kernel.arg_names
    src = GluonASTSource(kernel, {**signature, **{k: "constexpr" for k in constexprs}},
                         constexprs={(names.index(k),): v for k, v in constexprs.items()},
                         attrs={(names.index(k),): [["tt.divisibility", 16]] for k, t in signature.items()
                                if t.startswith("*")})
    built = triton_compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": MAXNREG})
    ptx = built.asm["ptx"]
    return {**_usage(ptx, 90), "shared": built.metadata.shared, "setmaxnreg": ptx.count("setmaxnreg"),
            "wgmma": ptx.count("wgmma.mma_async")}


def offline_build(unit_ids: bool) -> dict[str, int]:
    """:func:`build_sm90` of the gate kernel as launched at tile 128, capacity 16, bf16."""
    from triton.runtime.jit import mangle_type

    layout = _operand_layout(torch.bfloat16)
    x = torch.empty((256, 2048), dtype=torch.bfloat16)
    sig = {"x_desc": mangle_type(TensorDescriptor.from_tensor(x, [BM, BK], layout)),
           "w_desc": mangle_type(TensorDescriptor.from_tensor(x, [BN, BK], layout)), "h_ptr": "*bf16",
           "hcnt_ptr": "*i32", "val_ptr": "*bf16", "idx_ptr": "*i16", "ccnt_ptr": "*i32", "map_ptr": "*i32",
           **{n: "i32" for n in ("M", "H", "N_COLD", "K", "n_hot_tiles", "n_cold_tiles", "n_programs")}}
    text, constraints = cold_slots_asm(BN, BN, 16, BN // 2, unit_ids, "bf16")
    consts = {"TILE": BN, "CAP": 16, "ASM_TEXT": text, "ASM_CONSTRAINTS": constraints, "HALF": "bf16",
              "NUM_STAGES": STAGES, "CONSUMER_NREG": CONSUMER_REGS, "PRODUCER_NREG": PRODUCER_REGS}
    return build_sm90(_pingpong_gate_kernel, sig, consts)

if __name__ == "__main__":
    import json

    print(json.dumps({"ids": offline_build(True), "columns": offline_build(False)}))
