"""The per-layer training switch of ``SparseGatedMLP(train_impl="auto")`` (twell.nn.train_dispatch), on CPU.

The shipped table holds the H200 measurement for 2048 x 5632 only, so these tests force a table for the
test shape.
Where the sparse path only needs to be *a* sparse autograd Function, the layer's ``sparse_train_fn`` is
replaced by the fast pure-PyTorch reference; autocast and checkpointing run the real Triton op under
the interpreter.
"""

from __future__ import annotations

import pytest
import torch
from _helpers import make_inputs
from torch.utils.checkpoint import checkpoint

import twell.nn.mlp as mlp_mod
from twell.nn import SparseGatedMLP
from twell.nn.train_dispatch import (
    DEFAULT_TRAIN_POLICY,
    H200_BF16_TRAIN_TABLES,
    TrainDispatchPolicy,
    dense_train_ffn_l1,
)
from twell.ops.training import twell_gated_ffn_l1
from twell.reference.training import dense_gated_ffn_l1, gated_ffn_l1
from twell.tolerances import L0_ABS_TOL_SET_DENSITY, REL_TOL, REL_TOL_FP64_REORDER, REL_TOL_GRAD, rel_error

D, FF = 16, 64
#: Sparse from 0 tokens up to 25 % density, for the test shape only, on every device and dtype.
FORCED = TrainDispatchPolicy(tables={(D, FF): ((0, 0.25),)}, force=True)


def _layer(density: float, *, policy: TrainDispatchPolicy = FORCED, refresh: int = 64, m: int = 8, seed: int = 0):
    x, wg, wu, wd = make_inputs(m, D, FF, density, seed, dtype=torch.float32)
    layer = SparseGatedMLP.from_weights(wg, wu, wd, backend="torch", tile=32, train_impl="auto",
                                        train_policy=policy, l0_refresh_every=refresh).train()
    return layer, x


def _step(layer: SparseGatedMLP, x: torch.Tensor) -> list[torch.Tensor]:
    """One forward+backward from zero gradients: [out, dx, dWg, dWu, dWd]."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    out = layer(x)
    (out.square().sum() + 0.5 * layer.l1_loss()).backward()
    return [out.detach(), x.grad, *(p.grad for p in layer.parameters())]


@pytest.fixture
def reference_sparse(monkeypatch):
    """The layer's sparse path -> the pure-PyTorch sparse reference (same contract, no interpreter)."""
    monkeypatch.setattr(mlp_mod, "sparse_train_fn", lambda device: gated_ffn_l1)


# ---------------------------------------------------------------------------------------- the policy
def test_shipped_table_is_the_h200_measurement():
    assert H200_BF16_TRAIN_TABLES == {(2048, 5632): ((16384, 0.10),)}
    kw = {"device_type": "cuda", "shape": (2048, 5632), "dtype": torch.bfloat16}
    assert not DEFAULT_TRAIN_POLICY.use_sparse(4096, 0.001, **kw)  # lost at every density (0.41-0.54x)
    for m in (16384, 131072):
        assert DEFAULT_TRAIN_POLICY.use_sparse(m, 0.005, **kw) and DEFAULT_TRAIN_POLICY.use_sparse(m, 0.10, **kw)
        assert not DEFAULT_TRAIN_POLICY.use_sparse(m, 0.2, **kw)  # not measured above 10 %
    for shape in ((4096, 14336), (768, 2112)):  # unmeasured shapes: dense, the l0 never read
        assert not DEFAULT_TRAIN_POLICY.may_use_sparse(device_type="cuda", shape=shape, dtype=torch.bfloat16)
    assert not DEFAULT_TRAIN_POLICY.use_sparse(131072, 0.001, **{**kw, "device_type": "cpu"})


def test_policy_reads_its_table_per_shape_device_and_dtype():
    pol = TrainDispatchPolicy(tables={(2048, 5632): ((16384, 0.01), (65536, 0.02))})
    kw = {"device_type": "cuda", "shape": (2048, 5632), "dtype": torch.bfloat16}
    assert not pol.use_sparse(4096, 0.001, **kw)  # below the first row
    assert pol.use_sparse(16384, 0.01, **kw) and not pol.use_sparse(16384, 0.011, **kw)
    assert pol.use_sparse(131072, 0.02, **kw) and not pol.use_sparse(131072, 0.05, **kw)
    assert not pol.use_sparse(65536, 0.001, **{**kw, "device_type": "cpu"})  # not measured there
    assert not pol.use_sparse(65536, 0.001, **{**kw, "dtype": torch.float32})
    assert not pol.use_sparse(65536, 0.001, **{**kw, "shape": (4096, 14336)})  # unmeasured shape: dense
    assert pol.may_use_sparse(**kw) and not pol.may_use_sparse(**{**kw, "shape": (1, 2)})
    assert TrainDispatchPolicy.always_sparse().use_sparse(1, 1.0, device_type="cpu", shape=(3, 5),
                                                          dtype=torch.float64)
    assert not TrainDispatchPolicy.always_dense().use_sparse(1, 0.0, **kw)


def test_policy_refuses_bad_tables():
    with pytest.raises(ValueError, match="sorted"):
        TrainDispatchPolicy(tables={(D, FF): ((16, 0.1), (8, 0.2))})
    with pytest.raises(ValueError, match=r"max_density must lie in \[0, 1\]"):
        TrainDispatchPolicy(tables={(D, FF): ((0, 1.5),)})
    with pytest.raises(TypeError, match="hidden_size, intermediate_size"):
        TrainDispatchPolicy(tables={"2048x5632": ((0, 0.1),)})
    with pytest.raises(TypeError, match="mapping"):
        TrainDispatchPolicy(tables=[((D, FF), ((0, 0.1),))])
    with pytest.raises(TypeError, match="train_policy"):
        SparseGatedMLP(D, FF, train_policy="sparse")


# ---------------------------------------------------------------------------------------- the switch
def test_goes_sparse_under_the_threshold_and_dense_above(reference_sparse):
    layer, x = _layer(0.1)
    _step(layer, x)
    assert layer._train_switch.last_sparse is False  # first call: l0 unknown -> dense, which measures it
    assert float(layer.last_l0) == pytest.approx(0.1 * FF, abs=L0_ABS_TOL_SET_DENSITY)
    got = _step(layer, x)
    assert layer._train_switch.last_sparse is True
    layer.train_impl = "dense"
    ref = _step(layer, x)
    for a, b in zip(got, ref, strict=True):
        assert rel_error(a, b) <= REL_TOL_GRAD[torch.float32]

    dense_layer, x = _layer(0.5)
    for _ in range(3):
        _step(dense_layer, x)
        assert dense_layer._train_switch.last_sparse is False


def test_reads_l0_on_the_host_only_every_n_calls(reference_sparse):
    layer, x = _layer(0.1, refresh=4)
    decisions = []
    for call in range(10):
        if call == 5:  # every gate turns positive (column 0 of x is 1, so w_gate[:, 0] is a bias)
            with torch.no_grad():
                layer.gate_proj.weight[:, 0] = 10.0
        _step(layer, x)
        decisions.append(layer._train_switch.last_sparse)
    # Host reads: call 1 (first estimate, from call 0's l0), then calls 4 and 8 only.
    assert layer._train_switch.host_reads == 3 and layer._train_switch.calls == 10
    # The density jump of call 5 is seen only from the next refresh (call 8) on.
    assert decisions == [False, True, True, True, True, True, True, True, False, False]
    assert float(layer.last_l0) == FF


def test_no_host_read_when_no_table_can_say_sparse(reference_sparse):
    layer, x = _layer(0.01, policy=DEFAULT_TRAIN_POLICY, refresh=1)
    for _ in range(3):
        _step(layer, x)
    assert layer._train_switch.host_reads == 0 and layer._train_switch.last_sparse is False
    layer.reset_l0_estimate()
    assert layer._train_switch.calls == 0 and layer._train_switch.estimate is None


def test_dense_branch_is_the_dense_function():
    x, wg, wu, wd = make_inputs(12, D, FF, 0.3, 1)
    out, l1, l0 = dense_train_ffn_l1(x, wg, wu, wd)
    ref_out, ref_l1, ref_l0 = dense_gated_ffn_l1(x, wg, wu, wd)
    assert rel_error(out, ref_out) < REL_TOL_FP64_REORDER and rel_error(l1, ref_l1) < REL_TOL_FP64_REORDER
    assert l1.dtype == torch.float64 and torch.equal(l0, ref_l0)
    assert dense_train_ffn_l1(x, wg, wu, wd, with_l0=False)[2] is None


# ---------------------------------------------------------------------------------------- autocast, checkpoint
def test_autocast_bf16_runs_the_interpreted_op_in_bf16():
    """fp32 layer under CPU bf16 autocast: the sparse op gets bf16 copies, gradients reach fp32 weights."""
    grads = {}
    for policy in (TrainDispatchPolicy.always_sparse(), TrainDispatchPolicy.always_dense()):
        layer, x = _layer(0.1, policy=policy)
        x = x.detach().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x.to(torch.bfloat16))  # a bf16 input with fp32 weights is accepted under autocast
            loss = out.float().square().sum() + 0.5 * layer.l1_loss()
        loss.backward()
        assert out.dtype == torch.bfloat16 and layer.gate_proj.weight.grad.dtype == torch.float32
        grads[layer._train_switch.last_sparse] = [out, x.grad, *(p.grad for p in layer.parameters())]
    for a, b in zip(grads[True], grads[False], strict=True):
        assert rel_error(a, b) <= REL_TOL_GRAD[torch.bfloat16]


def test_non_reentrant_checkpoint_recomputes_on_the_forward_s_path():
    """refresh every call: without the in-backward guard the recomputation of step 1 (dense, l0 unknown)
    would read l0 and go sparse, and checkpoint would refuse the mismatched recomputed tensors."""
    layer, x0 = _layer(0.1, refresh=1)
    plain, _ = _layer(0.1)
    plain.train_impl = "dense"
    for step in range(2):
        x = x0.detach().clone().requires_grad_(True)
        out = checkpoint(layer, x, use_reentrant=False)
        (out.square().sum() + 0.5 * layer.l1_loss()).backward()
        assert layer._train_switch.last_sparse is (step == 1)
        xr = x0.detach().clone().requires_grad_(True)
        ref = plain(xr)
        (ref.square().sum() + 0.5 * plain.l1_loss()).backward()
        assert rel_error(out, ref) <= REL_TOL[torch.float32]
        assert rel_error(x.grad, xr.grad) <= REL_TOL_GRAD[torch.float32]
        for p, q in zip(layer.parameters(), plain.parameters(), strict=True):
            assert rel_error(p.grad, q.grad) <= REL_TOL_GRAD[torch.float32]
            p.grad = q.grad = None
    assert layer._train_switch.calls == 2 and layer._train_switch.host_reads == 1
    assert mlp_mod.sparse_train_fn(x0.device) is twell_gated_ffn_l1  # the interpreted Triton op ran
