"""The fused hot/cold gate as a Gluon ping-pong kernel (twell.ops.pingpong_gate_kernel, off by default:
hot_cold.PINGPONG_GATE) against the shipped fused gate, bit for bit on the GPU; on the CPU its sm_90a build
(Gluon runs on no interpreter), the one-TwELL-tile form of the cold-slot PTX it uses, and its refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from twell.bench.probe import gate_outputs_agree
from twell.ops import hot_cold
from twell.ops.cold_slots_ptx import cold_slots_asm
from twell.ops.hot_cold_gate_kernel import launch_hot_cold_gate
from twell.ops.hot_cold_plan import build_hot_cold_plan, unit_frequency
from twell.synthetic import SparsityProfile, synthetic_ffn_problem


def test_cold_slot_ptx_for_one_twell_tile_per_call():
    """bn = tile: one TwELL tile a call (two rows of a thread), its loops and count store for that tile only;
    the fused gate's two-tile text keeps its four loops."""
    text, constraints = cold_slots_asm(128, 128, 16, 64, True, "bf16")
    assert "LOOP00:" in text and "LOOP10:" in text and "LOOP01:" not in text and "LOOP11:" not in text
    assert "c01" not in text.split(".reg .b32 q1_00")[1].split("DONE10:")[0].replace(".reg", "")
    # outputs (64 int8, 4 a register), 32 packed act registers, then lim and four 64-bit operands per element
    assert constraints.count("=r") == 16 and constraints.count(",") + 1 == 16 + 32 + 64 + 4 * 64
    two, _ = cold_slots_asm(256, 128, 16, 128, True, "bf16")
    assert all(f"LOOP{rh}{t}:" in two for rh in range(2) for t in range(2))


@pytest.mark.parametrize(("bn", "tile", "pack"), [(384, 128, 192), (64, 128, 32), (128, 128, 128)])
def test_cold_slot_ptx_refuses_other_widths_and_packs(bn, tile, pack):
    with pytest.raises(ValueError, match="bn = tile or 2 \\* tile|elements"):
        cold_slots_asm(bn, tile, 16, pack, True, "bf16")


@pytest.fixture(scope="module")
def offline_builds() -> dict:
    """``pingpong_gate_kernel.offline_build`` for unit ids and columns, in a subprocess: this test session sets
    TRITON_INTERPRET=1, under which the kernels are Python functions."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-m", "twell.ops.pingpong_gate_kernel"], env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("unit_ids", ["ids", "columns"])
def test_sm90_build_has_no_spill_and_fits_shared_memory(offline_builds, unit_ids):
    """The kernel as launched builds for sm_90a: no spill under its register split (setmaxnreg per partition),
    its ring within the 227 KB of shared memory a block may take, the consumers' wgmma."""
    b = offline_builds[unit_ids]
    assert b["spill_bytes"] == 0, b
    assert 0 < b["shared"] <= 227 * 1024
    assert b["setmaxnreg"] >= 3 and b["wgmma"] > 0


def test_launcher_refuses_what_it_does_not_take():
    from twell.ops.pingpong_gate_kernel import launch_pingpong_gate

    x, w = torch.zeros((4, 64), dtype=torch.bfloat16), torch.zeros((256, 64), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="compute capability 9.x, tile 128"):
        launch_pingpong_gate(x, w, 64, 64, torch.zeros(64, dtype=torch.int32), tile=128, capacity=16, unit_ids=True)


#: m, d, f, n_hot, capacity, density: awkward sizes (M under a row block and across several; d not a multiple
#: of the K step; a hot count not a multiple of a half tile; the last cold tile partly used), capacity 4,
#: where rows overflow their tiles, no hot unit, and every unit hot
GPU_CASES = [(1, 200, 700, 100, 16, 0.02), (7, 256, 1000, 64, 16, 0.02), (300, 2048, 5632, 576, 16, 0.005),
             (4097, 512, 1500, 200, 4, 0.05), (33, 128, 600, 0, 16, 0.03), (20, 128, 384, 384, 16, 0.03)]


def _problem(m, d, f, n_hot, density, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    p = synthetic_ffn_problem(m, d, f, SparsityProfile(mean_l0=density * f), generator=gen, device="cuda",
                              dtype=dtype)
    hot = torch.argsort(unit_frequency(p["x"], p["w_gate"]), descending=True)[:n_hot]
    return p, build_hot_cold_plan(p["w_gate"], p["w_up"], p["w_down"], hot, fused_tile=128)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"m{c[0]}-d{c[1]}-f{c[2]}-h{c[3]}-c{c[4]}" for c in GPU_CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("unit_ids", [True, False], ids=["ids", "columns"])
def test_gpu_equals_the_shipped_fused_gate(case, dtype, unit_ids):
    """h, both counts and the used slots bit for bit, with a NaN row (every unit fires, the last hot tile's
    padding not counted) and outputs poisoned before the launch by the caching allocator's reuse."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a CUDA GPU of compute capability 9.x")
    from twell.ops.pingpong_gate_kernel import launch_pingpong_gate

    m, d, f, n_hot, cap, density = case
    p, plan = _problem(m, d, f, n_hot, density, dtype, seed=3)
    x = p["x"].clone()
    x[m // 2] = float("nan")
    torch.empty(64 << 20, dtype=torch.uint8, device="cuda").fill_(0xFF)  # freed blocks hold NaN bits
    args = (x, plan.w_gemm, n_hot, f - n_hot, plan.cold)
    kw = {"tile": 128, "capacity": cap, "unit_ids": unit_ids}
    same = gate_outputs_agree(launch_hot_cold_gate(*args, **kw), launch_pingpong_gate(*args, **kw))
    assert all(same.values()), same


@pytest.mark.gpu
def test_gpu_no_rows_and_a_misshapen_weight():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a CUDA GPU of compute capability 9.x")
    from twell.ops.pingpong_gate_kernel import launch_pingpong_gate

    p, plan = _problem(8, 256, 1000, 64, 0.02, torch.bfloat16, seed=7)
    args = (plan.w_gemm, 64, 1000 - 64, plan.cold)
    kw = {"tile": 128, "capacity": 16, "unit_ids": True}
    empty = launch_pingpong_gate(p["x"][:0], *args, **kw)
    assert [t.shape[0] for t in empty] == [0] * 5
    assert gate_outputs_agree(empty, launch_hot_cold_gate(p["x"][:0], *args, **kw)) == dict.fromkeys(
        ("h", "hot counts", "cold counts", "values", "ids"), True)
    with pytest.raises(ValueError, match="w_fused has shape"):
        launch_pingpong_gate(p["x"], plan.w_gemm[1:], 64, 1000 - 64, plan.cold, **kw)


@pytest.mark.gpu
def test_gpu_op_through_the_pingpong_gate_equals_the_shipped_op(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a CUDA GPU of compute capability 9.x")
    p, plan = _problem(4096, 2048, 5632, 576, 0.005, torch.bfloat16, seed=5)
    w_down_t = p["w_down"].t().contiguous()

    def op():
        return hot_cold.launch_hot_cold_ffn(p["x"], plan, p["w_gate"], p["w_up"], w_down_t, tile=128, capacity=16)

    want, want_counts = op()
    monkeypatch.setattr(hot_cold, "PINGPONG_GATE", True)
    got, got_counts = op()
    assert torch.equal(got, want) and torch.equal(got_counts, want_counts)
