"""SparseGatedMLP's inference path does per call only what it must (scripts/module_overhead.py times it).

What is pinned here, on the CPU, without wall-clock assertions:

* a dense call that is not an l0-refresh call issues exactly the ops of the plain dense chain and no
  host synchronisation (``aten._local_scalar_dense`` is what ``float(t)`` / ``t.item()`` dispatch to);
* a sparse call that is not a refresh call issues the unchecked custom op, the two-op l0 reduction
  and no host synchronisation; refresh calls synchronise exactly once, on the same cadence as before;
* the cached dispatch decision follows the policy and the estimate;
* the unchecked custom ops compute exactly what the public ops compute;
* caches built inside ``torch.inference_mode()`` hold normal tensors, and weights that are inference
  tensors work.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import twell.ops as ops
import twell.ops.custom_ops as custom_ops
import twell.ops.inference as inference
from twell.nn import DispatchPolicy, SparseGatedMLP
from twell.reference.inference import dense_gated_ffn
from twell.tolerances import REL_TOL, rel_error

D, FF = 32, 128
SYNC = "aten._local_scalar_dense.default"


class OpRecorder(TorchDispatchMode):
    """Records the name of every op dispatched while active (a custom op counts once: its inner ops run
    with this mode popped)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's signature
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def record(fn) -> list[str]:  # noqa: ANN001
    with OpRecorder() as rec:
        fn()
    return rec.ops


def _weights(seed: int = 0, f: int = FF) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    wg = torch.randn(f, D, generator=gen) / D**0.5 - 0.1
    wu = torch.randn(f, D, generator=gen) / D**0.5
    wd = torch.randn(D, f, generator=gen) / f**0.5
    return [wg, wu, wd]


def _layer(policy: DispatchPolicy, **kw) -> SparseGatedMLP:  # noqa: ANN003
    kw.setdefault("backend", "torch")
    kw.setdefault("tile", 32)
    return SparseGatedMLP.from_weights(*_weights(), policy=policy, **kw).eval()


def _x(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, D, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------- dense path
@pytest.mark.parametrize("shape", [(5,), (2, 3)])
def test_dense_call_is_the_plain_chain_and_syncs_only_on_refresh(shape):
    layer = _layer(DispatchPolicy(), l0_refresh_every=4)  # the default policy: dense on the CPU
    x = _x(*shape)
    wg, wu, wd = (p.detach() for p in layer.parameters())
    with torch.no_grad():
        plain_ops = record(lambda: F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd))
        expect = F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd)
        per_call = [record(lambda: layer(x)) for _ in range(9)]
        out = layer(x)
    assert SYNC not in plain_ops
    for i, got in enumerate(per_call):
        if i % 4 == 0:  # refresh calls: the dense FFN, then the l0 measurement and its one sync
            assert got[: len(plain_ops)] == plain_ops
            # the count: a Triton kernel under the interpreter (its zeroed workspace), else ne + sum
            assert ("aten.ne.Scalar" in got or "aten.zeros.default" in got) and got.count(SYNC) == 1
        else:
            assert got == plain_ops, f"call {i}"
    assert torch.equal(out, expect)  # same ops on the same input: same bits, any leading shape
    assert layer._infer_calls == 10 and layer._l0_estimate is not None


def test_dense_path_measures_l0_over_all_leading_dims():
    layer = _layer(DispatchPolicy())
    x = _x(2, 3)
    with torch.no_grad():
        layer(x)
    a = torch.relu(x.reshape(-1, D) @ layer.gate_proj.weight.detach().T)
    assert layer._l0_estimate == pytest.approx(torch.count_nonzero(a).item() / 6)


# ---------------------------------------------------------------------------------------- sparse path
def test_sparse_call_ops_and_refresh_cadence():
    layer = _layer(DispatchPolicy.always_sparse(), l0_refresh_every=3)
    x = _x(2, 5)
    with torch.no_grad():
        per_call = [record(lambda: layer(x)) for _ in range(7)]
        out = layer(x)
    # l0 is summed from the counts only when read: on refresh calls (by the estimate's sync), not otherwise
    steady = ["aten.view.default", "twell.sparse_gated_ffn_unchecked.default", "aten.view.default"]
    for i, got in enumerate(per_call):
        assert got.count(SYNC) == (1 if i % 3 == 0 else 0), f"call {i}: {got}"
        if i % 3:
            assert got == steady, f"call {i}"
        else:
            assert "aten.sum.default" in got and "aten.div_.Tensor" in got, f"call {i}: {got}"
    assert "twell.sparse_gated_ffn_unchecked.default" in per_call[0]
    want = dense_gated_ffn(x.reshape(-1, D), *(p.detach() for p in layer.parameters()))
    assert rel_error(out.reshape(-1, D), want) <= REL_TOL[torch.float32]
    g = x.reshape(-1, D) @ layer.gate_proj.weight.detach().T
    reads = record(lambda: (layer.last_l0, layer.last_l0))
    assert reads.count("aten.sum.default") == 1  # summed at the first read, kept for the next
    assert layer.last_l0.dtype == torch.float32
    assert layer.last_l0.item() == pytest.approx((g > 0).sum().item() / 10)
    layer.last_l0 = None  # a model's reset_l0 does this: the pending counts go too
    assert layer.last_l0 is None


def test_sparse_path_checks_replaced_weights_once():
    layer = _layer(DispatchPolicy.always_sparse())
    x = _x(4)
    with torch.no_grad():
        layer(x)
        prep = layer._sparse_prep
        layer(x)
        assert layer._sparse_prep is prep  # nothing re-derived while the weights are unchanged
        layer.up_proj.weight.mul_(2)  # in place: the version counter moves
        layer(x)
        assert layer._sparse_prep is not prep
        layer.down_proj.weight = torch.nn.Parameter(torch.zeros(D, FF + 1))
        with pytest.raises(ValueError, match=r"down_proj.weight has shape \(32, 129\)"):
            layer(x)


def test_triton_backend_refuses_float64_on_the_sparse_path():
    layer = _layer(DispatchPolicy.always_sparse(), backend="triton").double()
    with torch.no_grad(), pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        layer(_x(3).double())


# ---------------------------------------------------------------------------------------- cached decision
def test_cached_decision_follows_policy_and_estimate():
    layer = _layer(DispatchPolicy(table=((4, 0.5),), force=True), l0_refresh_every=2)
    with torch.no_grad():
        layer(_x(6))  # no estimate: dense, measured
        est = layer._l0_estimate
        assert 0 < est < FF / 2
        assert layer._use_sparse(6, "cpu") and not layer._use_sparse(3, "cpu")
        layer.policy = DispatchPolicy.always_dense()  # a new policy applies at once
        assert not layer._use_sparse(6, "cpu")
        layer.policy = DispatchPolicy(table=((4, est / FF * 0.99),), force=True)
        assert not layer._use_sparse(6, "cpu")
        layer._l0_estimate = est * 0.5  # a new estimate (what a refresh call does) applies at once
        assert layer._use_sparse(6, "cpu")
    for n in range(1, 400):  # one entry per token count, bounded
        layer._use_sparse(n, "cpu")
    assert len(layer._state.decisions) <= 256


# ---------------------------------------------------------------------------------------- unchecked ops
def _op_problem(device: torch.device) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 32, generator=gen)
    wg = torch.randn(96, 32, generator=gen) / 6 - 0.15
    wu = torch.randn(96, 32, generator=gen) / 6
    wd = torch.randn(32, 96, generator=gen) / 10
    return tuple(t.to(device) for t in (x, wg, wu, wd))


@pytest.mark.parametrize("backend, block_union_from", [("torch", None), ("triton", None), ("triton", 8)])
def test_unchecked_sparse_op_equals_the_public_op(device, backend, block_union_from, monkeypatch):
    if block_union_from is not None:  # both read the threshold at call time: take the block-union method at 12 tokens
        monkeypatch.setattr(inference, "BLOCK_UNION_MIN_TOKENS", block_union_from)
    x, wg, wu, wd = _op_problem(device)
    wd_t = wd.t().contiguous()
    # The torch reference sums the down projection with index_add_, whose CUDA kernel uses atomics: its bits vary
    # from call to call there unless deterministic algorithms are on (the H200's first native run of this test, session
    # 50, failed on that alone; the reference module's docs say so).  warn_only: cuBLAS's GEMMs would otherwise raise
    # without CUBLAS_WORKSPACE_CONFIG; index_add_ takes its deterministic kernel either way.  The Triton kernels are
    # deterministic as they are.
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if backend == "torch" and device.type == "cuda" and not before[0]:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        out, counts = torch.ops.twell.sparse_gated_ffn_unchecked(x, wg, wu, wd_t, 32, 4, "match", backend)
        ref, ref_counts = torch.ops.twell.sparse_gated_ffn(x, wg, wu, wd_t.t(), 32, 4, "match", "auto", backend)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    assert torch.equal(out, ref) and torch.equal(counts, ref_counts)
    torch.library.opcheck(torch.ops.twell.sparse_gated_ffn_unchecked.default,
                          (x, wg, wu, wd_t, 32, 4, "match", backend), test_utils=("test_schema", "test_faketensor"))


def test_unchecked_gemm_pack_gate_equals_the_public_op(device):
    """The gate the unchecked op takes on CUDA (cuBLAS GEMM, then the pack kernel), here on any device."""
    x, wg, wu, wd = _op_problem(device)
    wd_t = wd.t().contiguous()
    out, counts = custom_ops._triton_sparse_ffn(x, wg, wu, wd_t, 32, 4, True, "gemm+pack")
    ref, ref_counts = ops.sparse_gated_ffn(x, wg, wu, wd_t.t(), tile=32, capacity=4, backend="triton",
                                           impl="gemm+pack", return_counts=True)
    assert torch.equal(out, ref) and torch.equal(counts, ref_counts)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_unchecked_hot_cold_op_equals_the_public_op(device, backend):
    x, wg, wu, wd = _op_problem(device)
    wd_t = wd.t().contiguous()
    plan = ops.build_hot_cold_plan(wg, wu, wd, torch.tensor([3, 10, 50, 95]))
    tensors = (plan.hot, plan.cold, plan.w_gemm, plan.w_down_hot_t)
    out, counts = torch.ops.twell.hot_cold_gated_ffn_unchecked(x, wg, wu, wd_t, *tensors, 32, 4, backend)
    ref, ref_counts = torch.ops.twell.hot_cold_gated_ffn(x, wg, wu, wd_t.t(), *tensors, 32, 4, backend)
    assert torch.equal(out, ref) and torch.equal(counts, ref_counts)
    torch.library.opcheck(torch.ops.twell.hot_cold_gated_ffn_unchecked.default,
                          (x, wg, wu, wd_t, *tensors, 32, 4, backend), test_utils=("test_schema", "test_faketensor"))


# ---------------------------------------------------------------------------------------- inference mode
def _hot_cold_layer() -> SparseGatedMLP:
    """Triton backend (the interpreter on the CPU), 64 units that fire on every token: a hot/cold plan."""
    wg, wu, wd = _weights(f=256)
    wg[:, 0] = -2.5
    wg[:64, 0] = 2.5
    return SparseGatedMLP.from_weights(wg, wu, wd, backend="triton", tile=32,
                                       policy=DispatchPolicy.always_sparse()).eval()


def _bias_x(m: int) -> torch.Tensor:
    x = _x(m)
    x[:, 0] = 1.0
    return x


def test_caches_built_in_inference_mode_hold_normal_tensors():
    layer = _hot_cold_layer()
    x = _bias_x(8)
    with torch.inference_mode():
        layer(x)
    plan = layer._hot_cold._plan
    assert plan is not None and plan.n_hot == 64
    cached = [layer._wd_unit_major, layer._hot_cold._hot, plan.hot, plan.cold, plan.w_gemm, plan.w_down_hot_t]
    assert not any(t.is_inference() for t in cached)
    # What failed with inference tensors in the caches: an in-place update of the buffer outside
    # inference mode (DDP's buffer broadcast does one) and autograd through the cached Wd^T.
    layer._wd_unit_major.add_(0)
    h = torch.randn(3, 256, requires_grad=True)
    (h @ layer.w_down_unit_major()).sum().backward()
    assert h.grad is not None
    # A training step, then inference again, outside inference mode.
    layer.train()
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    (layer(x).square().sum() + layer.l1_loss()).backward()
    opt.step()
    layer.eval()
    with torch.no_grad():
        out = layer(x)
    want = dense_gated_ffn(x, *(p.detach() for p in layer.parameters()))
    assert rel_error(out, want) <= REL_TOL[torch.float32]


def test_weights_created_in_inference_mode_take_the_sparse_path():
    """Inference-tensor weights have no version counter: nothing is cached, the hot/cold split is off."""
    with torch.inference_mode():
        layer = _hot_cold_layer()
        x = _bias_x(8)
        assert layer.gate_proj.weight.is_inference()
        outs = [layer(x) for _ in range(2)]
        layer.down_proj.weight.mul_(2)  # in place, unseen by any version counter
        doubled = layer(x)
    want = dense_gated_ffn(x, *(p.detach() for p in layer.parameters()))
    assert rel_error(doubled, want) <= REL_TOL[torch.float32]
    assert rel_error(outs[1], want / 2) <= REL_TOL[torch.float32]
    assert not layer._hot_cold.chosen and layer._wd_unit_major is None


# ---------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_non_refresh_calls_do_not_synchronise():
    torch.manual_seed(0)
    for policy in (DispatchPolicy.always_dense(), DispatchPolicy.always_sparse()):
        layer = SparseGatedMLP(256, 1024, policy=policy, l0_refresh_every=4, device="cuda",
                               dtype=torch.bfloat16).eval()
        x = torch.randn(2, 8, 256, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            layer(x)  # refresh call 0: builds the caches and syncs
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                for _ in range(3):  # calls 1-3
                    layer(x)
            finally:
                torch.cuda.set_sync_debug_mode("default")
