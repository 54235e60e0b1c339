"""The hot/cold training op (twell.ops.hot_cold_training) against the dense float64 oracle.

Interpreter problems are the exact-grid ones of test_ops_training (every gate exact in fp32 and at
least 1/16 away from 0), so the active pattern and l0 match the reference exactly; outputs and the four
gradients must be within the dtype's tolerances.  Every case states which cold-overflow path it
exercises (continuation rows, spilled tokens) and the helper checks that the path really is taken.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_ops_training import (
    F32,
    F64,
    assert_same_run,
    check_close,
    make_problem,
    make_random_problem,
    reference,
    run,
)

from twell.bench import train_ffn
from twell.ops.compile_check import SHARED_MEMORY_LIMIT_BYTES
from twell.ops.hot_cold_plan import build_hot_cold_plan
from twell.ops.hot_cold_train_kernels import launch_overflow_layout
from twell.ops.hot_cold_training import (
    HotColdGatedFFNL1,
    HotUnits,
    choose_training_hot_units,
    default_cont_rows,
    default_width,
    hot_units,
    hot_units_from_frequency,
    overflow_layout_reference,
    twell_gated_ffn_l1_hot_cold,
)
from twell.reference.training import dense_gated_ffn_l1
from twell.synthetic import SparsityProfile, synthetic_ffn_problem
from twell.tolerances import FP32_ROUNDING_TOL, L0_REL_TOL_GATE_FLIPS, REL_TOL, rel_error

BF16 = torch.bfloat16


def top_units(inputs, n_hot: int) -> torch.Tensor:
    """The n_hot most frequently active units of the (float64) problem."""
    freq = ((inputs[0] @ inputs[1].T) > 0).double().mean(0)
    return torch.argsort(freq, descending=True, stable=True)[:n_hot]


def overflow_stats(inputs, hot: torch.Tensor, width: int) -> tuple[int, int]:
    """(tokens with more than ``width`` cold pairs, continuation rows they need) in float64."""
    is_hot = torch.zeros(inputs[1].shape[0], dtype=torch.bool)
    is_hot[hot] = True
    cold = ((inputs[0] @ inputs[1].T) > 0)[:, ~is_hot].sum(1)
    over = cold > width
    return int(over.sum()), int(((cold[over] - 1) // width).sum())


CASES = [
    # m, d, f, frac_pos, n_hot, width, cont_rows, path
    (16, 32, 128, 0.0, 16, None, None, "none active"),
    (37, 32, 128, 0.05, 16, None, None, "ELL only"),
    (37, 32, 128, 0.05, 16, 4, 40, "continuation"),  # 24 tokens overflow W = 4, 31 continuation rows
    (24, 24, 96, 0.3, 16, 4, 50, "spill"),  # d not a power of two; 108 rows needed: later tokens spill
    (12, 24, 96, 0.3, 32, 4, 0, "spill"),  # no capacity: every overflowing token spills
    (12, 16, 64, 0.5, 0, 8, 20, "spill"),  # no hot unit (v1's setting) with both overflow paths
    (12, 16, 64, 1.0, 0, None, 12, "continuation"),  # 100 %, H = 0: W = 32 < 64 cold pairs per token
    (12, 16, 64, 1.0, 64, None, None, "no cold unit"),  # 100 %, H = F
    (1, 32, 128, 0.3, 16, 4, None, "spill"),  # M = 1: C = M = 1 row, fewer than the token needs
]


@pytest.mark.parametrize("case", CASES, ids=[f"m{c[0]}-f{c[2]}-h{c[4]}-{c[7]}" for c in CASES])
def test_matches_dense_reference_fp32(case, device):
    m, d, f, frac, n_hot, width, cont_rows, path = case
    inputs = make_problem(m, d, f, frac, seed=11 + m + f + n_hot)
    hot = top_units(inputs, n_hot)
    units = hot_units(hot, f)
    w = width or default_width(units)
    n_over, rows = overflow_stats(inputs, hot, w)
    capacity = default_cont_rows(m) if cont_rows is None else cont_rows
    if path == "continuation":
        assert 0 < rows <= capacity
    elif path == "spill":
        assert n_over > 0 and rows > capacity
    elif path != "no cold unit":
        assert n_over == 0
    stats: dict = {}
    got = run(twell_gated_ffn_l1_hot_cold, inputs, device=device, hot=hot.to(device), width=width,
              cont_rows=cont_rows, stats=stats)
    check_close(got, reference(inputs))
    # the op's spill count: the tokens whose cold pairs did not fit, as the layout's PyTorch twin counts them
    x, wg = inputs[0].float(), inputs[1].float()
    cold = (x @ wg.T > 0) & (units.slot < 0)
    want_spill = overflow_layout_reference(cold.sum(1).to(torch.int32), w, capacity)[3]
    assert int(stats["spilled_tokens"]) == int(want_spill)
    assert (int(want_spill) > 0) == (path == "spill")
    if frac == 0.0:
        assert torch.count_nonzero(got[0]) == 0 and float(got[1]) == 0.0


@pytest.mark.parametrize(("dtype", "cont_rows"), [(BF16, 20), (BF16, 40), (torch.float16, 40)],
                         ids=["bf16-spill", "bf16-continuation", "fp16-continuation"])
def test_half_precision(dtype, cont_rows, device):
    inputs = make_problem(12, 32, 128, 0.15, seed=5)
    hot = top_units(inputs, 24)
    assert 20 < overflow_stats(inputs, hot, 4)[1] <= 40  # 39 continuation rows needed
    got = run(twell_gated_ffn_l1_hot_cold, inputs, dtype=dtype, device=device, hot=hot.to(device), width=4,
              cont_rows=cont_rows)
    check_close(got, reference(inputs, dtype=dtype), dtype=dtype)


@pytest.mark.parametrize("weights", [(1.0, 0.0), (0.0, 2.0)])
def test_loss_through_one_output_only(weights, device):
    """grad_l1 = 0 (l1 unused) and grad_out = 0 (only the penalty): autograd materialises zeros."""
    inputs = make_problem(9, 16, 64, 0.2, seed=7)
    ow, lw = weights
    got = run(twell_gated_ffn_l1_hot_cold, inputs, device=device, hot=top_units(inputs, 8).to(device), width=4,
              out_weight=ow, l1_weight=lw)
    check_close(got, reference(inputs, out_weight=ow, l1_weight=lw))


def test_empty_rows_and_zero_tokens(device):
    inputs = make_problem(6, 16, 64, 0.2, seed=3)
    inputs[0][2] = 0.0  # all-zero token: every gate is exactly 0 -> no hot and no cold pair
    hot = top_units(inputs, 8).to(device)
    got = run(twell_gated_ffn_l1_hot_cold, inputs, device=device, hot=hot, width=4)
    check_close(got, reference(inputs))
    assert torch.count_nonzero(got[0][2]) == 0 and torch.count_nonzero(got[3][0][2]) == 0

    leaves = [t.to(F32).to(device).requires_grad_() for t in make_problem(0, 16, 64, 0.2, seed=3)]
    out, l1, l0 = twell_gated_ffn_l1_hot_cold(*leaves, hot=hot)
    assert out.shape == (0, 16) and float(l1.detach()) == 0.0 and float(l0) == 0.0
    (out.sum() + l1).backward()
    assert all(t.grad is not None and t.grad.shape == t.shape and not t.grad.any() for t in leaves)


def test_deterministic_bitwise(device):
    inputs = make_problem(12, 32, 96, 0.3, seed=13)
    kw = {"device": device, "hot": top_units(inputs, 16).to(device), "width": 4, "cont_rows": 40}
    assert overflow_stats(inputs, kw["hot"].cpu(), 4)[1] > 40  # continuation rows and spilled tokens
    a = run(twell_gated_ffn_l1_hot_cold, inputs, **kw)
    b = run(twell_gated_ffn_l1_hot_cold, inputs, **kw)
    assert_same_run(a, b)


def test_saves_no_dense_tensor_partial_grads_and_down_layout(device):
    m, f = 10, 64
    inputs = make_problem(m, 16, f, 0.2, seed=17)
    x, wg, wu, wd = (t.to(F32).to(device) for t in inputs)
    wg.requires_grad_()
    wd_t = wd.t().contiguous().requires_grad_()  # Wd stored unit-major: w_down is a view
    out, l1, l0 = twell_gated_ffn_l1_hot_cold(x, wg, wu, wd_t.t(), hot=top_units(inputs, 8).to(device), width=4)
    assert l0.requires_grad is False and type(out.grad_fn).__name__ == HotColdGatedFFNL1.__name__ + "Backward"
    assert not any(t is not None and t.shape[-1] == f and t.dim() == 2 for t in out.grad_fn.saved_tensors)
    (out.sum() + l1).backward()
    assert wu.grad is None and x.grad is None
    assert wg.grad.shape == wg.shape and wd_t.grad.shape == wd_t.shape and wd_t.grad.is_contiguous()


def test_hot_set_forms_agree_and_are_chosen_from_x(device):
    inputs = make_problem(16, 32, 128, 0.1, seed=19)
    x, wg, wu, wd = (t.to(F32).to(device) for t in inputs)
    freq = ((x @ wg.T) > 0).float().mean(0)
    units = hot_units_from_frequency(freq, min_frequency=0.2, multiple=8)
    assert units.n_hot > 0 and units.n_hot % 8 == 0 and bool((freq[units.ids] >= 0.2).all())
    assert units.cold_l0 == pytest.approx(float(freq.sum() - freq[units.ids].sum()), rel=FP32_ROUNDING_TOL)
    assert int(units.slot[units.ids].min()) == 0 and int((units.slot >= 0).sum()) == units.n_hot
    plan = build_hot_cold_plan(wg, wu, wd, units.ids)
    results = [twell_gated_ffn_l1_hot_cold(x, wg, wu, wd, hot) for hot in (units, plan, units.ids.flip(0))]
    for out, l1, l0 in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(l1, results[0][1]) and torch.equal(l0, results[0][2])
    with torch.no_grad():  # hot set chosen from x inside the call
        out, l1, l0 = twell_gated_ffn_l1_hot_cold(x, wg, wu, wd)
    ref_out, ref_l1, ref_l0, _ = reference(inputs, out_weight=0.0, l1_weight=0.0)
    assert rel_error(out, ref_out) <= REL_TOL[F32] and rel_error(l1, ref_l1) <= REL_TOL[F32]
    assert float(l0) == float(ref_l0)


@pytest.mark.parametrize(("m", "width", "cont_rows"), [(1, 4, 0), (700, 4, 10**6), (700, 4, 90), (700, 16, 0),
                                                     (513, 1, 300)])
def test_overflow_layout_kernel_matches_its_twin(m, width, cont_rows, device):
    """The one-program scan against the PyTorch ops: several blocks (the interpreter's block is 256),
    no overflow, overflow that fits, overflow that spills part way, and no capacity at all."""
    gen = torch.Generator().manual_seed(m + width)
    counts = torch.randint(0, 3 * width, (m,), generator=gen, dtype=torch.int32)
    counts[::37] = 20 * width  # a few long rows
    hot_nz = torch.randint(0, 50, (m,), generator=gen, dtype=torch.int32)
    counts, hot_nz = counts.to(device), hot_nz.to(device)
    got = launch_overflow_layout(counts, hot_nz, width, cont_rows)
    want = overflow_layout_reference(counts, width, cont_rows)
    for name, a, b in zip(("lo", "hi", "ocum", "n_spill"), got[:4], want, strict=True):
        assert a.dtype == torch.int32 and torch.equal(a, b.to(torch.int32)), name
    l0 = (counts.double().sum() + hot_nz.double().sum()) / m
    assert got[4].dtype == torch.float32 and float(got[4]) == float(l0.float())
    if cont_rows == 90:
        assert 0 < int(got[3]) < int((counts > width).sum())  # the capacity ran out part way


def test_default_width():
    f = 64
    assert default_width(hot_units(torch.arange(8), f)) == 32  # no estimate
    assert default_width(hot_units(torch.arange(8), f, cold_l0=7.1)) == 16  # next pow2 of 14.2
    assert default_width(hot_units(torch.arange(8), f, cold_l0=0.1)) == 8
    assert default_width(hot_units(torch.arange(8), f, cold_l0=300.0)) == 56  # capped at the 56 cold units
    assert default_width(hot_units(torch.arange(f), f)) == 1


def test_bad_inputs_are_refused(device):
    x, wg, wu, wd = (t.to(F32).to(device) for t in make_problem(4, 16, 64, 0.2, seed=4))
    hot = torch.arange(8, device=device)
    with pytest.raises(TypeError, match="float64"):
        twell_gated_ffn_l1_hot_cold(x.double(), wg.double(), wu.double(), wd.double(), hot)
    with pytest.raises(ValueError, match="w_down"):
        twell_gated_ffn_l1_hot_cold(x, wg, wu, wd[:, :10], hot)
    with pytest.raises(ValueError, match=r"range \[60, 64\]"):
        twell_gated_ffn_l1_hot_cold(x, wg, wu, wd, torch.arange(60, 65, device=device))
    with pytest.raises(ValueError, match="unique"):
        twell_gated_ffn_l1_hot_cold(x, wg, wu, wd, torch.tensor([1, 1], device=device))
    with pytest.raises(TypeError, match="int32, int64"):
        twell_gated_ffn_l1_hot_cold(x, wg, wu, wd, hot.float())
    with pytest.raises(ValueError, match="built for 128 units but w_gate has F = 64"):
        twell_gated_ffn_l1_hot_cold(x, wg, wu, wd, hot_units(hot, 128))
    with pytest.raises(TypeError, match="got list"):
        twell_gated_ffn_l1_hot_cold(x, wg, wu, wd, [0, 1])
    with pytest.raises(ValueError, match="width must be positive, got 0"):
        twell_gated_ffn_l1_hot_cold(x, wg, wu, wd, hot, width=0)
    with pytest.raises(ValueError, match="cont_rows must be an int >= 0, got -1"):
        twell_gated_ffn_l1_hot_cold(x, wg, wu, wd, hot, cont_rows=-1)
    with pytest.raises(ValueError, match="cold_l0"):
        hot_units(hot, 64, cold_l0=float("nan"))
    assert isinstance(hot_units(hot, 64), HotUnits)


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("mode", ["continuation", "spill"])
def test_gpu_small_random_problem(dtype, mode):
    inputs = make_random_problem(4096, 256, 1024, 0.05, seed=21)
    hot = top_units(inputs, 128)
    rows = overflow_stats(inputs, hot, 16)[1]  # ~45 cold pairs per token at W = 16
    assert rows > 16
    cont_rows = rows + 64 if mode == "continuation" else 16  # 16: most overflowing tokens spill
    got = run(twell_gated_ffn_l1_hot_cold, inputs, dtype=dtype, device="cuda", hot=hot.cuda(), width=16,
              cont_rows=cont_rows)
    want = reference([t.cuda() for t in inputs], dtype=dtype)
    # Gates within fp32 accumulation noise of 0 may fall on different sides of the ReLU: l0 up to 0.1 %.
    check_close(got, want, dtype=dtype, l0_exact=False)


@pytest.mark.gpu
def test_gpu_realistic_size_matches_reference_and_is_deterministic():
    """d=2048, F=5632, M=16384, bf16, the synthetic 0.5 % profile, hot set chosen as a module would."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    p = synthetic_ffn_problem(16384, 2048, 5632, SparsityProfile(mean_l0=28.16), generator=gen, dtype=BF16,
                              device="cuda")
    units = choose_training_hot_units(p["x"], p["w_gate"])
    assert 256 <= units.n_hot <= 1024 and units.cold_l0 is not None
    inputs = [p[k].to(F64) for k in ("x", "w_gate", "w_up", "w_down")]  # run() makes fresh bf16 leaves per call
    del p
    a = run(twell_gated_ffn_l1_hot_cold, inputs, dtype=BF16, device="cuda", hot=units)
    b = run(twell_gated_ffn_l1_hot_cold, inputs, dtype=BF16, device="cuda", hot=units)
    assert_same_run(a, b)
    want = run(dense_gated_ffn_l1, [t.to(F64) for t in inputs], dtype=F64, device="cuda")
    check_close(a, want, dtype=BF16, l0_exact=False)


def test_bench_train_ffn_times_and_checks_the_hot_cold_op(tmp_path, capsys):
    code = train_ffn.main(["--ms", "16", "--densities", "5", "--shape", "32x128", "--dtype", "float32",
                           "--rep-ms", "1", "--warmup-ms", "1", "--sparse-impl", "hot-cold", "--out", str(tmp_path),
                           "--stem", "t"])
    assert code == 0
    (r,) = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert "sparse_ms" not in r and r["hotcold_ms"] > 0 and r["ok"] is True
    assert r["hotcold_ok"] is True and r["hotcold_deterministic"] is True
    assert r["hotcold_l0"] == r["l0"] == pytest.approx(r["ref_l0"], rel=L0_REL_TOL_GATE_FLIPS)
    assert r["hotcold_n_hot"] % 64 == 0 and r["hotcold_width"] >= 8
    assert r["hotcold_err_dwd"] <= REL_TOL[F32]
    assert "| hot units | W |" in capsys.readouterr().out


def test_bench_train_ffn_compiled_columns(tmp_path, capsys):
    """--compiled: dense and hot/cold timed again with the forward under torch.compile (aot_eager here)."""
    code = train_ffn.main(["--ms", "16", "--densities", "5", "--shape", "32x128", "--dtype", "float32",
                           "--rep-ms", "1", "--warmup-ms", "1", "--sparse-impl", "hot-cold", "--compiled",
                           "--out", str(tmp_path), "--stem", "t"])
    assert code == 0
    (r,) = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert "compiled_error" not in r, r.get("compiled_error")
    assert r["dense_compiled_ms"] > 0 and r["hotcold_compiled_ms"] > 0
    assert r["hotcold_compiled_speedup"] == pytest.approx(r["dense_compiled_ms"] / r["hotcold_compiled_ms"])
    assert "| compiled speedup |" in capsys.readouterr().out


# Tier 3 (docs/design section 5): build the kernels for sm_90 and sm_80 without a GPU, in a subprocess because this
# session interprets Triton.  Catches compile errors the interpreter cannot see, local memory in the PTX and
# programs that take more shared memory than the card gives.
_COMPILE_SCRIPT = r'''
import json
import sys
from triton.backends.compiler import GPUTarget
from twell.ops.compile_check import _compiled
from twell.ops import hot_cold_train_kernels as k

def sig(text):
    return dict(item.split(":") for item in text.split())

ROWS = {"D_PAD": 2048, "SB": 4, "HAS_HOT": True}
X = "x_ptr:*bf16 wg_ptr:*bf16 wu_ptr:*bf16 wdt_ptr:*bf16 slot_ptr:*i32 "
ELL = "ids_ptr:*i32 val_ptr:*bf16 cnt_ptr:*i32 lo_ptr:*i32 hi_ptr:*i32 order_ptr:*i32 "
KERNELS = {
    "hot_pack": (k._hot_pack_kernel, "g_ptr:*bf16 uh_ptr:*fp32 ah_ptr:*bf16 hh_ptr:*bf16 hl1_ptr:*fp32 "
                 "hnz_ptr:*i32 M:i32 H:i32 stride_gm:i32", {"BM": k._HOT_PACK_BM, "BH": k._HOT_PACK_BH}),
    "cold_pack": (k._cold_pack_kernel, "g_ptr:*bf16 unit_ptr:*i64 ids_ptr:*i32 val_ptr:*bf16 cnt_ptr:*i32 M:i32 "
                  "NC:i32 H:i32 W:i32 stride_gm:i32", {"BM": k._PACK_BM, "BF": k._PACK_BF, "WP": 16}),
    "overflow_layout": (k._overflow_layout_kernel, "cnt_ptr:*i32 hnz_ptr:*i32 lo_ptr:*i32 hi_ptr:*i32 "
                        "ocum_ptr:*i32 nspill_ptr:*i32 l0_ptr:*fp32 M:i32 W:i32 C:i32", {"BLOCK": k._LAYOUT_BLOCK}),
    "pack_cont": (k._pack_cont_kernel, "g_ptr:*bf16 unit_ptr:*i64 ids_ptr:*i32 val_ptr:*bf16 owner_ptr:*i32 "
                  "order_ptr:*i32 cnt_ptr:*i32 lo_ptr:*i32 hi_ptr:*i32 ocum_ptr:*i32 M:i32 NC:i32 H:i32 W:i32 "
                  "stride_gm:i32", {"BF": 1024}),
    "forward_rows": (k._forward_rows_kernel, X + ELL + "init_ptr:*fp32 hl1_ptr:*fp32 u_ptr:*fp32 out_ptr:*bf16 "
                     "l1_ptr:*fp32 M:i32 F:i32 D:i32 W:i32 stride_xm:i32 stride_om:i32", ROWS),
    "hot_backward": (k._hot_backward_kernel, "dh_ptr:*fp32 ah_ptr:*bf16 uh_ptr:*fp32 gl1_ptr:*fp32 dgu_ptr:*bf16 "
                     "hh_ptr:*bf16 M:i32 H:i32", {"BM": 32, "BH": 64}),
    "backward_rows": (k._backward_rows_kernel, "x_ptr:*bf16 go_ptr:*bf16 wg_ptr:*bf16 wu_ptr:*bf16 wdt_ptr:*bf16 "
                      "slot_ptr:*i32 " + ELL + "u_ptr:*fp32 gl1_ptr:*fp32 init_ptr:*fp32 dg_ptr:*fp32 du_ptr:*fp32 "
                      "dx_ptr:*bf16 M:i32 F:i32 D:i32 W:i32 stride_xm:i32 stride_gm:i32 stride_dxm:i32", ROWS),
    "unit_grads": (k._unit_grads_kernel, "x_ptr:*bf16 go_ptr:*bf16 wg_ptr:*bf16 wu_ptr:*bf16 wdt_ptr:*bf16 "
                   "slot_ptr:*i32 perm_ptr:*i64 start_ptr:*i64 owner_ptr:*i32 val_ptr:*bf16 u_ptr:*fp32 dg_ptr:*fp32 "
                   "du_ptr:*fp32 order_ptr:*i32 ocum_ptr:*i32 nspill_ptr:*i32 gl1_ptr:*fp32 hgu_ptr:*bf16 "
                   "hwd_ptr:*bf16 dwg_ptr:*bf16 dwu_ptr:*bf16 dwdt_ptr:*bf16 M:i32 F:i32 D:i32 W:i32 H:i32 "
                   "stride_xm:i32 stride_gm:i32", ROWS),
}
arch = int(sys.argv[1])
out = {}
for name, (fn, s, c) in KERNELS.items():
    kernel = _compiled(fn, sig(s), c, GPUTarget("cuda", arch, 32), num_warps=4)
    out[name] = {"local_memory": ".local" in kernel.asm["ptx"], "shared_bytes": kernel.metadata.shared}
print(json.dumps(out))
'''


@pytest.mark.parametrize("arch", [90, 80])
def test_kernels_compile_without_local_memory_within_shared_memory(arch):
    """Hopper, and sm_80 (A100) held to the 99 KB a program gets on the 8.6 / 8.9 cards that share its lowering."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, str(arch)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(built) == {"hot_pack", "cold_pack", "overflow_layout", "pack_cont", "forward_rows", "hot_backward",
                          "backward_rows", "unit_grads"}
    assert [name for name, r in built.items() if r["local_memory"]] == []
    limit = SHARED_MEMORY_LIMIT_BYTES[90 if arch == 90 else 86]
    assert {name: r["shared_bytes"] for name, r in built.items() if r["shared_bytes"] > limit} == {}


@pytest.mark.gpu
def test_gpu_forward_backward_captured_in_one_cuda_graph():
    """The whole training step of the op (forward and backward through autograd) replays from one CUDA
    graph with the eager results: no host synchronisation and nothing graph capture refuses, the way to
    take its ~0.7 ms of host time per call at M=16384 out of the step."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    p = synthetic_ffn_problem(4096, 2048, 5632, SparsityProfile(mean_l0=28.16), generator=gen, dtype=BF16,
                              device="cuda")
    units = choose_training_hot_units(p["x"], p["w_gate"])
    x = p["x"].detach().requires_grad_(True)
    ws = [p[k].detach().requires_grad_(True) for k in ("w_gate", "w_up", "w_down")]
    gout = torch.randn(x.shape, generator=gen, device="cuda", dtype=BF16)
    gl1 = torch.tensor(0.5 * x.shape[0], device="cuda")

    def step():
        out, l1, l0 = twell_gated_ffn_l1_hot_cold(x, *ws, units)
        return (out, l1, l0, *torch.autograd.grad((out, l1), (x, *ws), (gout, gl1)))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager = step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager, strict=True):
        assert torch.equal(a, b)
